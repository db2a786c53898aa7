"""Step acceptance on full batches: each round's statistics are the full data's at w_t, so the
exact-penalty merit F_0 + R + c sum (F_m - U_m)_+ (Problem 5's) is known there, and a step
that raised it is taken back.

* :func:`backtracking_step` (tau="auto" with unit steps: deterministic SCA, or SQP steps with
  the quasi-Newton model): accept w_t when the merit did not rise (tau then falls), else retry
  from the last accepted point with tau raised, after a second-order correction where a
  curved constraint is to blame (before the model's first pair, and under the Newton model
  where a larger tau would not shorten the step: at half the rejected length along the
  step's direction, a line search);
* :func:`guarded_step` (a fixed tau, a builder with its own curvature, or given schedules):
  the user's tau and surrogates stay, and the step fraction gamma is halved instead.

Each function returns (state, :class:`~.step.RoundInfo`); what they remember between rounds
is in the state's :class:`~.state.Memory`.
"""

from __future__ import annotations

import warnings
from typing import Optional

import numpy as np

from ...errors import SubproblemError
from . import adaptive as ad
from . import merit as mt
from . import newton
from . import quasi_newton as qn
from . import step as ssca_step
from .settings import Settings
from .state import SSCAState, remember
from .step import RoundInfo


def solver(cfg: Settings, state: SSCAState, center: np.ndarray):
    """The subproblem solver of the round's surrogate at ``center``: with the diagonal metric,
    with the quasi-Newton model, the model's compiled problem with a zero model before the
    first pair (one compilation per run), or the plain solver."""
    sub = cfg.subproblem
    if state.metric.size:
        return sub.with_metric(state.metric, center)
    if cfg.model_on(state):
        return sub.with_model(cfg.model(state), center)
    if cfg.model_ok and cfg.backtracking(state) and sub.compiles_zero_model:
        return sub.with_zero_model(center)
    return sub


def with_pair(cfg: Settings, state: SSCAState, stats) -> SSCAState:
    """The state with the quasi-Newton pair of the accepted step prev_w -> w added: s the step,
    y the change of the gradient of the Lagrangian F_0 + sum_m nu_m F_m (nu: the multipliers
    of the subproblem that gave w) read from the full-batch statistics at both points
    (:mod:`.quasi_newton`; no extra communication)."""
    if not (cfg.model_ok and not state.metric.size and len(state.prev_w)
            and len(state.prev_stats)):
        # with a diagonal metric (features of very different scales) the model is not used:
        # from B_0 = delta I it is as badly scaled as the features, where the metric's
        # first-order steps are not
        return state
    s = state.w - state.prev_w
    if float(np.linalg.norm(s)) <= qn.MIN_STEP * max(1.0, float(np.linalg.norm(state.w))):
        return state
    weights = np.concatenate(([1.0] * cfg.first, np.asarray(state.nu, dtype=float)))
    now, before = (mt.stacked_quadratics(cfg, stats),
                   mt.stacked_quadratics(cfg, state.prev_stats))
    if now is not None and before is not None:
        # y = sum_m nu_m (2 a_m w + b_m - 2 a'_m w' - b'_m), as two products
        y = (2.0 * float(weights @ now[0]) * state.w + weights @ now[1]
             - 2.0 * float(weights @ before[0]) * state.prev_w - weights @ before[1])
        return _with_model_pair(cfg, state, s, y)
    y = np.zeros_like(s)
    for c, new, old in zip(weights, stats, state.prev_stats):
        g1, g0 = ad.surrogate_gradient(new, state.w), ad.surrogate_gradient(old, state.prev_w)
        if g1 is None or g0 is None:
            return state
        if c != 0.0:
            y += c * (g1 - g0)
    return _with_model_pair(cfg, state, s, y)


def _with_model_pair(cfg: Settings, state: SSCAState, s, y) -> SSCAState:
    """The state with (s, y) added to its quasi-Newton pairs (unchanged when the pair carries
    no curvature)."""
    kept = qn.extend(cfg.model(state), s, y, memory=cfg.qn_memory)
    if kept is None:
        return state
    cfg.models.put(kept)
    return state._replace(qn_s=kept.S, qn_y=kept.Y)


def sketch_of(cfg: Settings, state: SSCAState) -> np.ndarray:
    """The k directions (rows) whose Hessian products the round at ``state`` asks for
    (:func:`.newton.sketch_directions`; the same in the request and in the step)."""
    rows = state.hess if state.hess_eig.size else np.zeros((0, state.w.size))
    return newton.sketch_directions(cfg.sketch_rank, state.t + 1, state.w, state.prev_w, rows)


#: an inactive inequality's curvature is asked for again when its surrogate's slack at w_t is
#: at most NEAR_SLACK times its last known largest curvature times the squared length of the
#: step to w_t (:func:`curvature_wanted`): twice the second-order term a step as long could
#: take from it
NEAR_SLACK = 1.0


def curvature_wanted(cfg: Settings, state: SSCAState) -> Optional[np.ndarray]:
    """The indices of the functions whose curvature at w_t the round at ``state`` asks for
    (:data:`.client.CURVATURE_OF`), None for all of them. The Newton model of w_t reads the
    objective's Hessian, every equality's, and those of the active inequalities (a multiplier
    of the last subproblem, ``state.nu``, at least INACTIVE_SHARE of the largest: the
    Lagrangian's weights, :func:`with_curvature`), and the largest curvature of each inactive
    inequality (:func:`constraint_curvature`), which it keeps from the last round that
    measured it (``state.curv_top``). So a round asks for all of them while no largest
    curvature is known, and then for the objective, the equalities, the active inequalities,
    and each inactive inequality whose surrogate's slack at w_t (U_m minus the last
    subproblem's surrogate there) is within NEAR_SLACK times its last known largest curvature
    times |w_t - w_{t-1}|^2: a constraint near enough to be reached within the second-order
    term of a step as long (a weakly active one, slack 0, among them).
    The others' Hessians would have weight 0 in the model; with a function's curvature
    from differences of its gradient (2 d evaluations) they are the round's cost that grows
    with the number of constraints."""
    M, k = cfg.M, cfg.first
    nu = np.asarray(state.nu, dtype=float)
    if (not M or state.curv_top.size != M or nu.size != M or len(state.prev_w) != state.w.size
            or len(state.stats) != len(cfg.builders)):
        return None
    keep = ~inactive_inequalities(cfg, nu, state.penalty)   # the equalities, the active
    s2 = float(np.sum((state.w - state.prev_w) ** 2))
    with np.errstate(all="ignore"):
        values = np.asarray(mt._function_values(cfg, state.stats, state.w)[k:], dtype=float)
        slack = cfg.bounds - values
        keep |= ~(slack > NEAR_SLACK * state.curv_top * s2)     # (NaN: asked for)
    return np.concatenate([np.arange(k), k + np.flatnonzero(keep)]).astype(np.int64)


def with_curvature(cfg: Settings, state: SSCAState, curvature) -> SSCAState:
    """The state with the Newton model of the accepted point w_t: the Hessian of the
    Lagrangian F_0 + sum_m nu_m F_m there (nu: the multipliers of the subproblem that gave
    w_t) from the round's full-data Hessians (:func:`.newton.lagrangian_hessian`), or its
    sketch from their products with the round's directions (:func:`.newton.sketch_model`);
    the state as it was when the round brought none (a client without them) or not those of
    every function the model weighs. ``curvature`` may hold only some functions'
    (:func:`curvature_wanted`): each inactive inequality not among them keeps its last
    largest curvature."""
    if not curvature or state.metric.size:
        return state
    # an inequality the last subproblem left inactive gets its curvature in its own surrogate
    # (constraint_curvature), not in the Lagrangian's: in both, a weakly active constraint
    # (a multiplier far below the others' but not 0) is curved twice, the model's curvature
    # along the directions where it dominates is double the Lagrangian's, and the steps
    # towards it are half of Newton's (linear convergence at rate 1/2)
    nu = np.where(inactive_inequalities(cfg, state.nu, state.penalty), 0.0,
                  np.asarray(state.nu, dtype=float))
    weighed = list(range(cfg.first)) + [cfg.first + j for j in np.flatnonzero(nu)]
    if any(m not in curvature for m in weighed):
        return state
    top = (np.array(state.curv_top, dtype=float) if state.curv_top.size == cfg.M
           else np.zeros(cfg.M))
    H = newton.lagrangian_hessian(curvature, nu, cfg.first, state.w.size)
    fixed = cfg.problem.deterministic.bound_fixed(state.w)
    if fixed.size and not cfg.sketch_rank:
        # a coordinate the domain's simple bounds fix never moves: its curvature (x log x at
        # a variable fixed at 0, a huge one) is no part of the step's model, and kept there it
        # set the model's scale, whose eigenvalue floor (EIGEN_FLOOR of the largest) then
        # lifted the free coordinates' curvature 1e4-fold (S2MPJ's EQC: 200 rounds of steps
        # 1e-4 long)
        H[fixed, :] = 0.0            # (lagrangian_hessian returns a new array)
        H[:, fixed] = 0.0
    omega = sketch_of(cfg, state) if cfg.sketch_rank else None
    have = [j for j in range(cfg.M) if cfg.first + j in curvature]
    if have:
        # each constraint's largest curvature (on the sketch's directions: a Ritz value, at
        # most its largest eigenvalue), one batched eigenvalue call for all of them
        mats = [curvature[cfg.first + j] for j in have]
        if omega is not None:
            mats = [_symmetric(omega @ P.T) for P in mats]
        top[have] = np.maximum(0.0, np.linalg.eigvalsh(np.stack(mats))[:, -1])
    if omega is not None:
        U, eig = newton.sketch_model(omega, H)
        return state._replace(hess=U, hess_eig=eig, curv_top=top)
    return state._replace(hess=H, curv_top=top)


def _symmetric(A: np.ndarray) -> np.ndarray:
    return 0.5 * (A + A.T)


#: a constraint whose multiplier is below this share of the largest counts as inactive for
#: :func:`constraint_curvature`
INACTIVE_SHARE = 1e-3
#: ... and so does one whose multiplier is below this share of the penalty c in force
#: (:func:`inactive_inequalities`)
NEGLIGIBLE_MULTIPLIER = 1e-9


def inactive_inequalities(cfg: Settings, nu, penalty: float = 0.0) -> np.ndarray:
    """(M,) booleans: the inequalities of Problem 5 whose multiplier ``nu`` (the last
    subproblem's) is below INACTIVE_SHARE of the largest, or below NEGLIGIBLE_MULTIPLIER
    times the penalty c in force (``penalty``; the multipliers of Problem 5 lie in [0, c]):
    an interior-point subproblem (CVXPY) leaves multipliers of the order of its tolerance
    on constraints that are not active, ~1e-15 c, which by their share alone would all count
    as active where none is. All of them when every multiplier is 0 or none is known yet;
    equalities never. Their curvature goes into their own surrogates
    (:func:`constraint_curvature`), the others' into the Lagrangian's Hessian
    (:func:`with_curvature`)."""
    nu = np.abs(np.asarray(nu, dtype=float))
    active = (nu > INACTIVE_SHARE * float(np.max(nu)) if nu.size == cfg.M and np.any(nu > 0)
              else np.zeros(cfg.M, dtype=bool))
    if penalty > 0.0 and active.size == nu.size:
        active &= nu > NEGLIGIBLE_MULTIPLIER * penalty
    return ~active & ~np.asarray(cfg.equality, dtype=bool).reshape(cfg.M)


def constraint_curvature(cfg: Settings, state: SSCAState, stats, center) -> tuple:
    """Under the Newton model, each inequality that the last subproblem left inactive
    (:func:`inactive_inequalities`) gets a surrogate with a curvature of at least half the
    largest eigenvalue of its Hessian at the accepted point (``state.curv_top``; the same
    value and gradient at ``center``, :func:`.adaptive.rescale_tau`): a local majoriser of a
    convex constraint, so that the step stays inside it to second order. An active
    constraint's curvature is in the model already (its multiplier times its Hessian, as SQP
    has it); an inactive one's is not, and with its linearisation alone (tau small) a step
    that ends near it leaves it by its second-order term: the exact penalty rises, and the
    step is rejected and corrected round after round."""
    if not (cfg.newton and state.curv_top.size == cfg.M and cfg.M):
        return stats
    top = np.asarray(state.curv_top, dtype=float)
    q = _largest_quads(cfg, stats)[cfg.first:]
    with np.errstate(all="ignore"):
        raised = (inactive_inequalities(cfg, state.nu, state.penalty) & (top > 0.0) & (q > 0.0)
                  & (q < 0.5 * top))
        k = np.where(raised, 0.5 * top / np.where(raised, q, 1.0), 1.0)
    # tau fallen to a subnormal number (1e-309 on S2MPJ's HS106) makes k overflow: then
    # every coordinate's curvature is raised to 0.5 top directly
    direct = raised & ~np.isfinite(k)
    if not np.any(raised):
        return stats
    ks = np.ones(len(stats))
    ks[cfg.first:] = np.where(direct, 1.0, k)
    out = ad.rescale_each(stats, center, ks)
    if np.any(direct):
        out = list(out)
        for j in np.flatnonzero(direct):
            m = cfg.first + j
            out[m] = ad.raise_curvature(out[m], center, 0.5 * top[j])
        out = tuple(out)
    return out


def _largest_quads(cfg: Settings, stats) -> np.ndarray:
    """Each function's largest surrogate curvature ``quad`` (its largest entry), NaN for a
    function whose statistics have none; from the stacked array where the statistics carry
    it (:func:`.merit.stacked_quadratics`: scalar curvatures)."""
    forms = mt.stacked_quadratics(cfg, stats)       # (cached, as the merit reads them)
    if forms is not None:
        return forms[0]
    return np.array([float(np.max(np.asarray(st["quad"], dtype=float))) if "quad" in st
                     else np.nan for st in stats])


def guarded_step(cfg: Settings, state: SSCAState, fresh, r: float, g: float, nonfinite: bool):
    """A full-batch round outside the backtracking regime, kept monotone in the exact penalty
    by the step fraction alone: the user's tau, surrogates and schedules stay as given.
    ``fresh``: this round's statistics, the full data's at w_t (not yet averaged with rho_t).

    If the merit at w_t is not above the last accepted point's (up to the rounding of the
    merit and the subproblem solver's accuracy), w_t is accepted and eq. (updatew) moves from
    it with gamma_t times ``shrink``; else w_t is taken back and the step from the last
    accepted point is retried with ``shrink`` halved (one round per halving: the merit at the
    new trial point is only known from the next round's replies). A fixed tau far below the
    curvature, or a DiagonalCurvature whose diagonal is no majoriser, gives steps too long to
    descend; shortening them until they do is gradient descent with a line search on gamma:
    slow where tau is far too small, never divergent."""
    if nonfinite and not len(state.prev_stats):
        # clients reject non-finite values only at a tentative point, which has one
        raise RuntimeError("a function was not finite at w_t and no accepted point "
                           "exists to step back to")
    value = np.inf if nonfinite else mt.merit(cfg, fresh, state.w, state.penalty)
    reference = state.merit
    worse = (len(state.prev_stats) > 0 and np.isfinite(reference)
             and (np.isnan(value) or mt.rose(cfg, value, reference, fresh, state.w)))
    if worse:
        # the retry starts the averages afresh from the accepted point's own statistics
        # (rho = 1: a surrogate with F's gradient there, so its step descends; averaged ones
        # need not, and halving gamma along them need not help). The first rejection of a
        # step that came from averages only restarts them; each later one also halves gamma.
        base_w, base = state.prev_w, state.prev_stats
        state = remember(state, rejected_length=_relative_step(state))
        # (rho of the rejected step's round, from the state: a resume decides the same)
        averaged = (state.rejects == 0 and state.t >= 1
                    and round_steps(cfg, state, state.t)[0] < 1.0)
        shrink = state.shrink if averaged else 0.5 * state.shrink
        new, info = ssca_step.move(state._replace(w=base_w), base, 1.0, g * shrink,
                                   cfg.subproblem)
        new = new._replace(prev_w=base_w.copy(), prev_stats=base, merit=reference,
                           rejects=state.rejects + 1, shrink=shrink)
        return new, RoundInfo(info, None, cfg.tau_of(state), 0.0, 1)
    stats = fresh if r == 1.0 else ssca_step.average_statistics(state.stats, fresh, r)
    new, info = ssca_step.move(state, stats, r, g * state.shrink, cfg.subproblem)
    new = new._replace(prev_w=state.w.copy(), prev_stats=fresh, merit=value, rejects=0)
    return new, RoundInfo(info, None, cfg.tau_of(state), 0.0, 0)


def round_steps(cfg: Settings, state: SSCAState, t: int) -> tuple:
    """rho_t, gamma_t of round t from ``state``: 1, 1 with unit steps where adaptive sampling
    controls the noise (constant steps, as in Byrd et al. 2012) or, on full batches with
    tau="auto", deterministic SCA (majorization-minimization); else the schedules at the
    batch in force (:meth:`Settings.steps_at`)."""
    if cfg.unit_steps and (cfg.auto_batch or (cfg.full(state) and cfg.auto_tau)):
        return 1.0, 1.0
    return cfg.steps_at(cfg.batch(state), t)


def backtracking_step(cfg: Settings, state: SSCAState, stats, nonfinite: bool = False,
                      curvature=None):
    """Full batches: accept the step to w_t if the merit did not increase (then tau shrinks),
    else retry from the last accepted point with tau doubled (or, :func:`_line_search`, at half
    the length with tau unchanged); a step to a point where some
    function is not finite (``nonfinite``: a client said so) is rejected too. ``curvature``:
    the round's full-data Hessians at w_t (the Newton model's, :mod:`.newton`)."""
    state = remember(state, nonfinite_trial=bool(nonfinite))
    if nonfinite:
        # a rejection like any other: its trial's length is what the settling rule reads (a
        # long trial into a function's undefined region is no fixed point), and with the model
        # tau is at least half its scale
        state = remember(state, rejected_length=_relative_step(state))
        return _retry(cfg, state, _reject_factor(cfg, state), state.prev_w, state.prev_stats,
                      state.merit, True)
    c_merit = mt.weight(cfg, state)
    value = mt.merit(cfg, stats, state.w, c_merit)
    reference = state.merit
    if cfg.M and cfg.model_on(state) and len(state.prev_stats) and np.isfinite(state.merit):
        # both points judged by the same exact penalty (the stored merit may have been
        # computed with another weight)
        reference = mt.merit(cfg, state.prev_stats, state.prev_w, c_merit)
    worse = (np.isfinite(state.merit) and len(state.prev_stats)
             and mt.rose(cfg, value, reference, stats, state.w))
    corrected = state.memory.corrected
    state = remember(state, corrected=False)
    if worse and not corrected and cfg.model_on(state):
        # a quasi-Newton step rejected: first the second-order correction (a full SQP step
        # near a curved active constraint raises the exact penalty to second order, the
        # Maratos effect; Nocedal & Wright, sec. 15.6), then a tau that shortens it
        correction = second_order_correction(cfg, state, stats,
                                             at_most=ad.SOC_MOVE if cfg.newton else None)
        if correction is not None:
            return correction
    if worse:                                    # reject w_t
        state = remember(state, rejected_length=_relative_step(state))
        if not corrected:
            state, pinned = _pinned(state)
            if pinned:
                # doubling tau did not shorten the trial steps: without the diagonal metric
                # if there is one, else one second-order correction before tau doubles again
                if state.metric.size:
                    state = state._replace(metric=np.zeros((0, 0)))
                else:
                    correction = second_order_correction(cfg, state, stats)
                    if correction is not None:
                        return correction
        k, base_w, base, base_merit = (_reject_factor(cfg, state), state.prev_w,
                                       state.prev_stats, state.merit)
        if cfg.newton and cfg.model_on(state) and k > ad.TAU_UP:
            k = radius_factor(cfg, state, base_w, base, k)
        if _line_search(cfg, state) or _tau_cannot_shorten(cfg, state, base_w, base, k):
            return _retry(cfg, state, 1.0, base_w, base, base_merit, worse, shorten=True)
    else:
        # (the model the step was taken with: before this step's pair joins it)
        ratio = (agreement(cfg, state, reference, value, c_merit)
                 if cfg.model_on(state) and not cfg.newton else float("nan"))
        state = track_progress(cfg, state, value, stats, c_merit)
        state = with_anchor(cfg, state, stats)
        if cfg.newton:
            state = with_curvature(cfg, state, curvature)
        else:
            state = with_pair(cfg, state, stats)
        # with a curvature model tau is the regularisation of a quasi-Newton step, not the
        # curvature: it falls faster while steps are accepted, as fast as the model agrees
        k = ((ad.TAU_DOWN_NEWTON if cfg.newton else ad.TAU_DOWN_MODEL) if cfg.model_on(state)
             else ad.TAU_DOWN)
        if ratio >= ad.AGREE_HIGH:
            k = ad.TAU_DOWN_AGREE
        elif ratio < ad.AGREE_LOW:
            k = 1.0
        base_w, base, base_merit = state.w, stats, value
        state = remember(state, rejected_trial=float("nan"))
        step = (float(np.linalg.norm(state.w - state.prev_w))
                / max(1.0, float(np.linalg.norm(state.w))) if len(state.prev_w) else 1.0)
        if step <= ad.TINY_STEP:
            # an accepted step lost in rounding: a fixed point, or a tau far above the
            # curvature (tiny steps are then progress); tau falls by TAU_TINY, not TAU_DOWN,
            # and the point is settled only after TINY_ROUNDS such steps with none longer
            # than 100 TINY_STEP in between (at a kink the steps hover about TINY_STEP)
            k = ad.TAU_TINY
            state = remember(state, tiny=state.memory.tiny + 1)
        elif step > 100 * ad.TINY_STEP:
            state = remember(state, tiny=0)
    return _retry(cfg, state, k, base_w, base, base_merit, worse)


def agreement(cfg: Settings, state: SSCAState, reference: float, value: float,
              c_merit: float) -> float:
    """r = (m(x) - m(w)) / (m(x) - q(w)): the exact penalty m (weight ``c_merit``) fell from
    ``reference`` at the last accepted point x to ``value`` at the trial point w, against the
    fall predicted by the round's model q(w) = the same penalty of the surrogates at x (the
    statistics x's round left, eq. (fsmbar) with their tau) plus s' B s / 2, s = w - x, B the
    quasi-Newton model the step was taken with: the actual-to-predicted ratio of trust-region
    methods (Nocedal & Wright, Numerical Optimization, sec. 4.1), read from the statistics the
    round has (no evaluation). NaN where the model predicted no decrease or the merits are not
    finite."""
    if not (len(state.prev_stats) and len(state.prev_w) == len(state.w)):
        return float("nan")
    s = state.w - state.prev_w
    predicted = (mt.merit(cfg, state.prev_stats, state.w, c_merit)
                 + 0.5 * float(s @ cfg.model(state).matvec(s)))
    fall = reference - predicted
    if not (np.isfinite(fall) and fall > 0.0 and np.isfinite(value)):
        return float("nan")
    return (reference - value) / fall


def with_anchor(cfg: Settings, state: SSCAState, stats) -> SSCAState:
    """The state with the accepted point w_t as the run's anchor when its largest relative
    violation (from the round's full-batch statistics) is at most the anchor's, or within
    ``feas_tol``, with the tau of the round that took w_t's statistics: the point the next
    stage restarts from if this stage's iterates run away
    (:func:`.continuation.restart_point`)."""
    if not cfg.M:
        return state
    v = mt.relative_violation(cfg, stats, state.w)
    if not (np.isfinite(v) and v <= max(state.memory.anchor_violation, cfg.options.feas_tol)):
        return state
    return remember(state, anchor_w=state.w.copy(), anchor_violation=v,
                    anchor_tau=cfg.tau_of(state))


def track_progress(cfg: Settings, state: SSCAState, value: float, stats,
                   c_merit: float) -> SSCAState:
    """With the model: the state with the rounds since the merit last fell by more than
    MERIT_PROGRESS of its size below the best point's. At a kink of F (|w| at 0) the
    quasi-Newton steps hover at 1e-11 without settling by step length; STALL_ROUNDS accepted
    rounds without progress settle the point (:func:`.continuation.settle`). The best point's
    merit is recomputed with this round's weight ``c_merit`` (from its statistics): the weight
    follows the multipliers, and a best merit kept from a round with a smaller weight makes
    progress look like none."""
    if not cfg.model_on(state) or not np.isfinite(state.merit):
        return remember(state, best_w=state.w, best_stats=stats, stall=0)
    mem = state.memory
    best_merit = (np.inf if len(mem.best_w) != len(state.w)
                  else mt.merit(cfg, mem.best_stats, mem.best_w, c_merit))
    if (not np.isfinite(best_merit)
            or value < best_merit - ad.MERIT_PROGRESS * max(1.0, abs(best_merit))):
        return remember(state, best_w=state.w, best_stats=stats, stall=0)
    return remember(state, stall=mem.stall + 1)


def second_order_correction(cfg: Settings, state: SSCAState, stats,
                            at_most: Optional[float] = None):
    """After a rejected step that made the constraints' violation worse than the model said:
    the same subproblem at the last accepted point and the same tau, with every constraint's
    surrogate shifted by its model error at the trial point, F_m(w_t) - p_m(w_t) (the
    statistics at w_t give F_m(w_t); the base statistics give the model). This is the
    second-order correction of SQP methods (Fletcher; Nocedal & Wright, Numerical
    Optimization, sec. 15.6): near a curved constraint the linearised step restores
    feasibility only to first order, the exact penalty then rises, and a larger tau does not
    shorten a step that the linearised constraints pin. One round; if its point is rejected
    too, the backtracking raises tau as before. None when it does not apply (no constraints,
    a builder without a constant statistic, or the violation did not grow), and with
    ``at_most`` when the corrected point is farther from the trial point than ``at_most``
    times the trial step: near a solution the correction is of second order in the step
    (Nocedal & Wright, sec. 15.6), and one as long as the step itself says the linearisation
    errs at first order along it, where a larger tau (a shorter step) is the remedy."""
    k0 = cfg.first
    if not cfg.M or not len(state.prev_stats) or len(state.prev_w) == 0:
        return None
    base = state.prev_stats
    if not all("const" in base[m] for m in range(k0, len(cfg.builders))):
        return None
    true = np.array([cfg.builders[m].evaluate(stats[m], state.w)
                     for m in range(k0, len(cfg.builders))])
    model = np.array([cfg.builders[m].evaluate(base[m], state.w)
                      for m in range(k0, len(cfg.builders))])
    before = np.array([cfg.builders[m].evaluate(base[m], state.prev_w)
                       for m in range(k0, len(cfg.builders))])

    def violation(v):
        return float(np.sum(mt.relative_excess(cfg, v)))

    if not (np.all(np.isfinite(true)) and violation(true) > violation(before)
            and violation(true) > violation(model)):
        return None
    corrected = list(base)
    for j, m in enumerate(range(k0, len(cfg.builders))):
        st = dict(base[m])
        st["const"] = np.asarray(np.asarray(st["const"], dtype=float) + (true[j] - model[j]))
        corrected[m] = st
    start = state._replace(w=state.prev_w)
    try:
        new, info = ssca_step.move(start, tuple(corrected), 1.0, 1.0,
                                   solver(cfg, state, state.prev_w))
    except SubproblemError:
        return None        # no correction: the backtracking goes on with tau
    if at_most is not None and (float(np.linalg.norm(new.w - state.w))
                                > at_most * float(np.linalg.norm(state.w - state.prev_w))):
        return None
    new = new._replace(tau=cfg.tau_of(state), merit=state.merit, prev_w=state.prev_w.copy(),
                       prev_stats=base, rejects=state.rejects + 1)
    return remember(new, corrected=True), RoundInfo(info, None, cfg.tau_of(state), 0.0, 1)


def _reject_factor(cfg: Settings, state: SSCAState) -> float:
    """tau's factor after a rejected step: TAU_UP, and with the model at least what brings tau
    to MODEL_REJECT times the model's scale delta (a tau far below the model's curvature does
    not shorten the step when doubled)."""
    k = ad.TAU_UP
    if cfg.model_on(state):
        delta = cfg.model(state).delta
        k = max(k, ad.MODEL_REJECT * delta / max(cfg.tau_of(state), 1e-300))
    return k


def _floored(cfg: Settings, state: SSCAState, k: float) -> float:
    """tau's factor ``k`` raised so that tau stays above MODEL_TAU_FLOOR of the model's scale
    while the model is on: far below it the solver's Problem 5 is too badly scaled to be
    solved."""
    if cfg.model_on(state):
        k = max(k, ad.MODEL_TAU_FLOOR * cfg.model(state).delta / max(cfg.tau_of(state), 1e-300))
    return k


def _step_length(cfg: Settings, state: SSCAState, base_w, base, k: float) -> float:
    """|w - base_w| for the subproblem at ``base_w`` with tau multiplied by ``k`` (inf when
    it cannot be solved): :func:`_retry`'s step, without a round."""
    scaled = ad.rescale_all(base, base_w, _floored(cfg, state, k))
    try:
        new, _ = ssca_step.move(state._replace(w=base_w),
                                constraint_curvature(cfg, state, scaled, base_w),
                                1.0, 1.0, solver(cfg, state, base_w))
    except SubproblemError:
        return float("inf")
    return float(np.linalg.norm(new.w - base_w))


def radius_factor(cfg: Settings, state: SSCAState, base_w, base, k_max: float) -> float:
    """tau's factor after a rejected step with the Newton model: the factor in
    [TAU_UP, ``k_max``] (``k_max``: :func:`_reject_factor`'s, which lifts tau to MODEL_REJECT
    times the model's scale) whose step from ``base_w`` is RADIUS_SHARE times the rejected
    one's, by bisection on log tau. It is the trust-region radius update (Nocedal & Wright,
    Numerical Optimization, Algorithm 4.1: the radius shrinks by a fixed share after a poor
    step) in the Levenberg-Marquardt parameter that tau is here, and the surrogate of eq.
    (fsmbar) with the model's curvature. Lifting tau to the model's scale at once shortens the
    step by orders of magnitude: with the exact Hessians of S2MPJ's HS109 (six nonlinear
    equalities), every long step was rejected and tau went from 8e-4 to 8e2, then fell 10x a
    round, a cycle of 9 rounds that ended in max_iter at 800 rounds 0.016 % above the
    optimum. Costs up to RADIUS_BISECTIONS + 2 subproblem solves on the server, no round."""
    target = ad.RADIUS_SHARE * float(np.linalg.norm(state.w - base_w))
    if _step_length(cfg, state, base_w, base, ad.TAU_UP) <= target:
        return ad.TAU_UP
    if _step_length(cfg, state, base_w, base, k_max) >= target:
        return k_max
    lo, hi = np.log(ad.TAU_UP), np.log(k_max)
    for _ in range(ad.RADIUS_BISECTIONS):
        mid = 0.5 * (lo + hi)
        if _step_length(cfg, state, base_w, base, float(np.exp(mid))) > target:
            lo = mid
        else:
            hi = mid
    return float(np.exp(hi))


def _relative_step(state: SSCAState) -> float:
    """|w_t - prev_w| / max(1, |prev_w|): the relative length of the trial step."""
    return (float(np.linalg.norm(state.w - state.prev_w))
            / max(1.0, float(np.linalg.norm(state.prev_w))))


def _pinned(state: SSCAState) -> tuple:
    """(state, pinned) after a rejected step: pinned when doubling tau did not shorten the
    rejected trial steps (the second rejection in a row, or later, with a trial step above
    METRIC_SHRINK of the one before). Backtracking rests on steps that shrink as tau grows.
    Two things pin them: a diagonal metric entry near 0 (squared gradients that vanish along
    a coordinate: an objective linear in it), along which moving costs nothing, and
    linearised constraints that the step must restore (min -x_1 s.t. |x|^2 = 1 started off
    the circle: every trial about as long as the last). The caller drops the metric, or else
    tries a second-order correction."""
    trial = float(np.linalg.norm(state.w - state.prev_w))
    before = state.memory.rejected_trial
    if state.rejects >= 1 and np.isfinite(before) and trial > ad.METRIC_SHRINK * before:
        return remember(state, rejected_trial=float("nan")), True
    return remember(state, rejected_trial=trial), False


def _line_search(cfg: Settings, state: SSCAState) -> bool:
    """Whether a rejected trial is retried along its own direction at half its length with tau
    unchanged (a backtracking line search, one round per trial) rather than with tau raised:
    in a run with a model of the Hessian, on the first-order rounds before the model holds a
    pair (no diagonal metric), while tau is at least LINE_SEARCH_TAU of the probe's curvature
    at x0. There the step is the linearised problem's with tau's proximal term, a descent
    direction of the exact penalty, and a shorter step along it descends; raising tau shortens
    it only slowly (by half per round at best, and not at all when the linearised constraints
    fix it: a square system of equations), and each doubling is undone one accepted round at
    a time (tau falls by TAU_DOWN). A tau far below the curvature (an iterate where the
    surrogates lost their scale) keeps the doubling, which restores it. So does a run on the
    first-order surrogates throughout (``hessian="none"``): tau is then the curvature
    estimate, and keeping it after a rejection lets the next steps overshoot again (6 % more
    rounds on the golden runs' ridge and Neyman-Pearson problems)."""
    return (cfg.model_ok and not cfg.model_on(state) and not state.metric.size
            and np.isfinite(state.curvature)
            and cfg.tau_of(state) >= ad.LINE_SEARCH_TAU * state.curvature)


def _tau_cannot_shorten(cfg: Settings, state: SSCAState, base_w, base, k: float) -> bool:
    """Whether a rejected trial under the Newton model is retried along its own direction at
    half its length with tau unchanged (as :func:`_line_search` does before the model holds a
    pair) rather than with tau multiplied by ``k`` (the trust radius of :func:`radius_factor`):
    when the step at tau times ``k`` (one subproblem solve on the server, no round) would still
    be longer than METRIC_SHRINK of the rejected one, and fewer than PINNED_HALVINGS steps
    have been rejected in a row. The linearised constraints of a square system of equations
    fix the step whatever tau, so a retry with tau raised repeats the rejected trial (S2MPJ's
    HIMMELBC with exact Hessians: x1^2 + x2 = 11, x1 + x2^2 = 7 from (1, 1)); a shorter
    trial along a descent direction of the exact penalty lowers it. After
    PINNED_HALVINGS rejections (a trial 1 / 2^PINNED_HALVINGS of the step) the direction
    itself is suspect and tau is raised as before; the bound also keeps the two remedies
    from taking turns within one run of rejections."""
    if not (cfg.newton and cfg.model_on(state) and state.rejects < ad.PINNED_HALVINGS):
        return False
    rejected = float(np.linalg.norm(state.w - base_w))
    step = _step_length(cfg, state, base_w, base, k)
    return bool(np.isfinite(step) and rejected > 0.0 and step > ad.METRIC_SHRINK * rejected)


def _retry(cfg: Settings, state: SSCAState, k, base_w, base, base_merit, worse,
           shorten: bool = False):
    """The subproblem at ``base_w`` with tau multiplied by ``k`` (the backtracking's next step
    from the accepted or the last accepted point); ``shorten``: the step from ``base_w`` half
    as long as the rejected trial's, along the new solution (:func:`_line_search`)."""
    k = _floored(cfg, state, k)
    scaled = ad.rescale_all(base, base_w, k)
    start = state._replace(w=base_w)
    try:
        new, info = ssca_step.move(start, constraint_curvature(cfg, state, scaled, base_w),
                                   1.0, 1.0, solver(cfg, state, base_w))
    except SubproblemError:
        if not cfg.model_on(state):
            raise
        # the subproblem with the model failed every retry of the solver (a tau far below
        # the model's curvature leaves the solver an ill-posed problem): this round's step
        # without the model at a tau of the model's scale (the paper's surrogate), and the
        # model starts afresh
        delta = cfg.model(state).delta
        k = max(k, delta / max(cfg.tau_of(state), 1e-300))
        scaled = ad.rescale_all(base, base_w, k)
        start = start._replace(qn_s=np.zeros((0, 0)), qn_y=np.zeros((0, 0)),
                               hess=np.zeros((0, 0)), hess_eig=np.zeros(0),
                               curv_top=np.zeros(0))
        new, info = ssca_step.move(start, scaled, 1.0, 1.0, cfg.subproblem)
        warnings.warn(f"round {state.t + 1}: the subproblem with the quasi-Newton model "
                      "failed; the round's step was taken without it and the model was "
                      "reset", RuntimeWarning, stacklevel=2)
    if shorten:
        full = float(np.linalg.norm(new.w - base_w))
        rejected = float(np.linalg.norm(state.w - base_w))
        if full > 0.0:
            gamma = min(1.0, 0.5 * rejected / full)
            new = new._replace(w=base_w + gamma * (new.w - base_w))
            info = info._replace(gamma=gamma * info.gamma)
    new = new._replace(tau=cfg.tau_of(state) * k, merit=base_merit, prev_w=base_w.copy(),
                       prev_stats=scaled, rejects=state.rejects + 1 if worse else 0)
    return new, RoundInfo(info, None, cfg.tau_of(state) * k, 0.0, int(bool(worse)))
