"""The penalty continuation of Theorem 2 (Algorithm 2 run for c_1 < c_2 < ...) as stages, and
when a stage ends: the iterates settled at the stage's c (:func:`settle`), or the stage's
rounds ran out; the next stage raises c only with evidence that it is too small
(:func:`next_stage`).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ...diagnostics.evaluation import excess
from ...diagnostics.kkt import force_multipliers as kkt_forces
from ...diagnostics.result import Stage
from . import adaptive as ad
from . import merit as mt
from .settings import Settings
from .state import SSCAState, remember
from .step import stage_slack


# -- the stages' slack and violation, from the history ------------------------------------------
def relative_slack_rows(slack_rows, bound_scale) -> np.ndarray:
    """Slack rows s_m / max(1, |U_m|)."""
    return np.asarray(slack_rows, dtype=float) / bound_scale


def stage_slack_of(recorder, stage: int, bound_scale) -> float:
    """|s_j*| of ``stage`` estimated from its rounds' slacks (:func:`.step.stage_slack`)."""
    rows = relative_slack_rows(recorder.stage_rows("slack", stage), bound_scale)
    return stage_slack(rows, len(rows))


def stages_of(history, bound_scale) -> list[Stage]:
    """One :class:`Stage` per stage run, from the history (penalty in force, rounds, slack)."""
    out = []
    for j in np.unique(history.stage):
        sel = history.stage == j
        rows = relative_slack_rows(history.slack[sel], bound_scale)
        out.append(Stage(float(history.penalty[sel][-1]), int(np.count_nonzero(sel)),
                         stage_slack(rows, len(rows))))
    return out


def violation_stalled(history, bound_scale, M: int, equality=None) -> tuple:
    """(stalled, a, b): a and b are the smallest relative violation over the first and the
    second half of the last stage's evaluations; stalled when b did not improve on a by 0.1 %
    (a run that is still reducing the violation is not called infeasible). NaN a and b with
    fewer than 4 evaluations in the stage."""
    if not M or not len(history.eval_t):
        return False, np.nan, np.nan
    last = history.stage[-1]
    in_stage = np.isin(history.eval_t, history.t[history.stage == last])
    v = np.max(excess(history.constraints[in_stage], equality) / bound_scale, axis=1,
               initial=-np.inf)
    if v.size < 4:
        return False, np.nan, np.nan
    a, b = float(np.min(v[:v.size // 2])), float(np.min(v[v.size // 2:]))
    return b >= (1 - 1e-3) * a, a, b


# -- a stage's end ------------------------------------------------------------------------------
def settle(cfg: Settings, state: SSCAState, info) -> tuple:
    """(state, settled): whether deterministic SCA (full batches, unit steps) reached a fixed
    point at this c: TINY_ROUNDS accepted steps of relative length <= TINY_STEP with none
    above 100 TINY_STEP in between, MAX_REJECTS rejected steps in a row (whose last trial was
    short, or MAX_REJECTS_LONG of them), STALL_ROUNDS accepted rounds without progress of the
    merit, or SATURATED rounds whose subproblem says c is too small (:func:`_saturated`).
    More rounds at this c change nothing. In the guarded full-batch regime
    (:func:`.acceptance.guarded_step`): MAX_REJECTS rejections in a row whose last trial step
    was at most TINY_STEP max(1, |w|) long (gamma shrunk to rounding), or GUARD_REJECTS."""
    mem = state.memory
    if cfg.guarded(state) and info.batch is None:
        length = 1.0 if np.isnan(mem.rejected_length) else mem.rejected_length
        return state, bool(state.rejects >= ad.GUARD_REJECTS
                           or (state.rejects >= ad.MAX_REJECTS and length <= ad.TINY_STEP))
    if not (info.batch is None and cfg.unit_steps and (cfg.auto_batch or cfg.auto_tau)):
        return state, False
    if state.rejects >= ad.MAX_REJECTS:
        # no step improves the merit at this precision: the trial steps have become short,
        # or tau grew long enough that they should have; rejections of long trial steps
        # (second-order corrections at the same tau among them) settle nothing until
        # MAX_REJECTS_LONG
        length = 0.0 if np.isnan(mem.rejected_length) else mem.rejected_length
        if state.rejects >= ad.MAX_REJECTS_LONG or length <= ad.SETTLE_STEP:
            return state, True
    state, saturated = _saturated(cfg, state, info)
    if saturated:
        return state, True
    if info.rejected == 0 and state.memory.stall >= ad.STALL_ROUNDS:
        return remember(state, stall=0), True
    return state, bool(info.rejected == 0 and state.memory.tiny >= ad.TINY_ROUNDS)


#: a multiplier within this share of c counts as at the box bound c (:func:`_saturated`)
AT_C_RTOL = 1e-6


def _saturated(cfg: Settings, state: SSCAState, info) -> tuple:
    """(state, saturated): the penalty follows the multipliers. With the quasi-Newton model
    (tau a small regularisation, so the linearised constraints are nearly what the step sees),
    an accepted step whose subproblem keeps a slack above ``slack_tol`` with a multiplier at
    the box bound |nu_m| = c says that c is below what an exact penalty needs, when the
    full-data evidence agrees (the last KKT fit's multiplier, or the forces that balance the
    gradients, at least c / 2); SATURATED such rounds in a row end the stage (when a larger c
    is left), and :func:`next_stage` counts them as evidence (``memory.c_too_small``)."""
    sol = info.step.solution
    if not (cfg.M and cfg.model_on(state) and state.penalty < max(cfg.penalties)):
        return remember(state, saturation=0), False
    if info.rejected:
        return state, False
    nu = np.abs(np.asarray(sol.multipliers, dtype=float))
    slack = np.asarray(sol.slack, dtype=float) / cfg.bound_scale
    # a slack above 0 puts nu at c exactly (the slack's own multiplier c - nu is 0); an
    # interior-point solve (the CVXPY path, Clarabel) leaves nu inside the box by its
    # tolerance, 1e-9 to 1e-8 of c
    at_c = nu >= state.penalty * (1.0 - AT_C_RTOL)
    pinned = at_c & (slack > cfg.options.slack_tol)
    # the subproblem alone saturates while the model is still poor: the full-data KKT fit of
    # the latest test must agree
    mu = state.memory.multipliers
    fitted = mu.size == nu.size and bool(np.any(mu >= 0.5 * state.penalty))
    # or the forces that balance the gradients at the last accepted point (at a point that
    # violates the constraint the KKT fit, which also asks mu (F - U) = 0, is pulled to 0)
    if not fitted and np.any(pinned):
        force = force_multipliers(cfg, state)
        fitted = force is not None and bool(np.any(
            pinned & (np.abs(force) >= 0.5 * state.penalty)))
    count = state.memory.saturation + 1 if fitted and np.any(pinned) else 0
    if count >= ad.SATURATED:
        return remember(state, saturation=0, c_too_small=True), True
    return remember(state, saturation=count), False


def force_multipliers(cfg: Settings, state: SSCAState) -> Optional[np.ndarray]:
    """The multipliers that balance the gradients alone at the last accepted full-batch point
    (:func:`ssca_solver.diagnostics.kkt.force_multipliers`, from the statistics the round
    already has: no evaluation), when they explain at least three quarters of
    |grad F_0 + grad R|^2 (else the point is far from stationary for any c and they say
    nothing); None without full-batch statistics or with a domain or a nonsmooth term (whose
    multipliers enter the balance)."""
    w, stats = state.prev_w, state.prev_stats
    if not (len(stats) and len(w) == len(state.w)) or cfg.M == 0:
        return None
    if cfg.ridge is None and not cfg.problem.deterministic.smooth:
        return None
    k = cfg.first
    grads = [ad.surrogate_gradient(st, w) for st in stats[k:]]
    g = mt.lagrangian_gradient(cfg, stats, w, [1.0] * k + [0.0] * cfg.M)
    if g is None or any(gm is None for gm in grads):
        return None
    G = np.column_stack(grads)
    size = float(np.linalg.norm(g))
    if not (size > 0.0 and np.isfinite(size) and np.all(np.isfinite(G))):
        return None                  # nothing to balance (no objective, or at its minimum)
    try:
        force = kkt_forces(g, G, cfg.equality)
    except (RuntimeError, ValueError, np.linalg.LinAlgError):
        return None                  # a fit that fails is no evidence; the run goes on
    if not (np.linalg.norm(g + G @ force) <= 0.5 * size):
        return None
    return force


# -- the next stage -----------------------------------------------------------------------------
def next_stage(cfg: Settings, state: SSCAState, stage: int, recorder) -> SSCAState:
    """The continuation of Theorem 2: c_j (this stage's c of the sequence) when the last
    stage's slack estimate exceeds ``slack_tol`` and (after full-batch rounds; after sampled
    ones the slack alone decides) there is evidence that c is too small for an exact penalty:
    a multiplier estimate of the last full-data KKT test, or of the forces that balance the
    gradients at the last accepted full-batch point (:func:`force_multipliers`), at least
    c / 2 (c must exceed the multipliers), rounds that saturated the subproblem at c, a
    violation that stopped falling, or no evidence either way (no test yet, fewer than 4
    evaluations in the stage); else the same state, whose iterates go on at the same c. A
    positive slack alone can only say that the proximal steps are still on their way to the
    constraint set."""
    o = cfg.options
    previous = stage_slack_of(recorder, stage - 1, cfg.bound_scale)
    if previous <= o.slack_tol:
        return state
    batches = recorder.stage_rows("batch_size", stage - 1)
    if len(batches) and not np.isnan(batches[-1]):
        # sampled rounds (a mini-batch): the slack estimate alone, as Theorem 2's
        # continuation has it (the KKT fit at a noisy point says little about c)
        return with_penalty(cfg, state, cfg.penalties[stage])
    mu = state.memory.multipliers
    stalled, first, _ = violation_stalled(recorder.history(), cfg.bound_scale, cfg.M,
                                          cfg.equality)
    saturated = state.memory.c_too_small
    state = remember(state, c_too_small=False)
    force = force_multipliers(cfg, state)
    half = 0.5 * state.penalty
    evidence = (saturated or not mu.size or not np.all(np.isfinite(mu))
                or float(np.max(mu)) >= half
                or (force is not None and float(np.max(np.abs(force), initial=0.0)) >= half)
                or stalled or not np.isfinite(first))
    if evidence:
        state = with_penalty(cfg, state, cfg.penalties[stage])
    return state


def with_penalty(cfg: Settings, state: SSCAState, penalty: float) -> SSCAState:
    """The state with penalty c (a new stage of the continuation, warm-started); the merit
    changes with c, so backtracking starts afresh, from the last accepted point when the
    pending trial step is a long one computed after a rejection (:func:`unsafe_trial`), and
    from the run's anchor when the stage's iterates ran away (:func:`restart_point`)."""
    if unsafe_trial(cfg, state):
        state = state._replace(w=state.prev_w.copy(), rejects=0)
    anchor = restart_point(cfg, state)
    tau = state.memory.anchor_tau
    state = state._replace(penalty=float(penalty), merit=float("nan"),
                           prev_w=np.zeros(0), prev_stats=())
    if anchor is None:
        return state
    # the models were learnt along the runaway path: the next stage starts them afresh, at
    # the tau the anchor's round used (at least the current one)
    tau = max(cfg.tau_of(state), tau) if np.isfinite(tau) else cfg.tau_of(state)
    empty = np.zeros((0, 0))
    state = state._replace(w=anchor.copy(), tau=tau, rejects=0, qn_s=empty, qn_y=empty,
                           hess=empty, hess_eig=np.zeros(0), curv_top=np.zeros(0))
    return remember(state, best_w=np.zeros(0), best_stats=(), stall=0, tiny=0, saturation=0,
                    rejected_length=float("nan"), rejected_trial=float("nan"))


def restart_point(cfg: Settings, state: SSCAState) -> Optional[np.ndarray]:
    """The run's anchor (:func:`.acceptance.with_anchor`: its accepted full-batch point of
    least violation) when the stage's iterates ran away from it, else None. They ran away when
    the last accepted point is more than RUNAWAY times farther from 0 than the anchor
    (|w| > RUNAWAY max(1, |anchor|)) and RUNAWAY times more violated (relative violation above
    RUNAWAY max(the anchor's, feas_tol)), and the pending step goes on: the trial point it
    computed is more than twice as far from 0 again. Never where the domain bounds every
    coordinate on both sides (nothing can run away there). The exact penalty is exact only
    near a KKT point and for c above its multipliers: below them, on an objective that falls
    faster than linearly (a cubic, a product of the variables), the penalised problem has no
    minimiser, and the accepted steps grow geometrically while the violation rises
    (min -x1 x2 x3 s.t. x1 + 2 x2 + 2 x3 = 72 from x0 = (1, 1, 1) at c = 100, below the
    multiplier 144: |w| 24 -> 702 -> 8.5e4 in three rounds). A larger c from such a point meets
    the same unbounded penalty; from the anchor it is the continuation's next stage as
    Theorem 2 runs it."""
    anchor = state.memory.anchor_w
    w, stats = state.prev_w, state.prev_stats
    if not (anchor.size and anchor.size == w.size == state.w.size and len(stats)):
        return None
    size = float(np.linalg.norm(w))
    if not (size > ad.RUNAWAY * max(1.0, float(np.linalg.norm(anchor)))
            and float(np.linalg.norm(state.w)) > 2.0 * size):
        return None
    if cfg.problem.deterministic.has_domain:
        lo, hi = cfg.problem.deterministic.simple_bounds()
        if np.all(np.isfinite(lo)) and np.all(np.isfinite(hi)):
            return None
    violated = mt.relative_violation(cfg, stats, w) > ad.RUNAWAY * max(
        state.memory.anchor_violation, cfg.options.feas_tol)
    return anchor if violated else None


def unsafe_trial(cfg: Settings, state: SSCAState) -> bool:
    """In the backtracking regime the state's w is a trial step not yet judged and prev_w the
    last accepted point. The trial is not to be adopted unjudged (at a stage change, or as
    the returned point) when it was computed after a rejection and is longer than
    SETTLE_STEP max(1, |prev_w|) (a stage that settled in rejections of steps lost in rounding
    leaves a trial as good as its base, which may be adopted), unless the rejection was of a
    non-finite point (the run then ends on that value's error, which names the function)."""
    if not (cfg.backtracking(state) and state.rejects > 0
                           and len(state.prev_w) and state.prev_w.shape == state.w.shape
                           and not state.memory.nonfinite_trial):
        return False
    step = float(np.linalg.norm(state.w - state.prev_w))
    return step > ad.SETTLE_STEP * max(1.0, float(np.linalg.norm(state.prev_w)))


def returned_state(cfg: Settings, state: SSCAState) -> SSCAState:
    """The state whose point a run that did not converge returns: the last accepted point in
    place of an unsafe pending trial (:func:`unsafe_trial`)."""
    if unsafe_trial(cfg, state):
        return state._replace(w=state.prev_w.copy())
    return state
