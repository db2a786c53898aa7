"""The probe before round 1: every function's gradient checked on each client's batch, the
curvature along the gradient measured (the starting tau of ``tau="auto"``), and the diagonal
metric of the adaptive defaults (:mod:`.adaptive` has the clients' side and the formulas).
"""

from __future__ import annotations

import warnings
from typing import NamedTuple, Optional

import numpy as np

from ...errors import ModelError, UserFunctionError
from ...federated.messages import AGGREGATE, Request, array
from . import adaptive as ad
from .settings import Settings


class Probe(NamedTuple):
    """What the probe found at x0.

    Attributes:
      tau: the starting tau (the measured one under ``tau="auto"``, else the fixed one).
      curvature: the largest secant curvature along the gradient (NaN when not measured).
      unstable: with a fixed tau below round 1's stability bound, (tau, bound, curvature);
        else None (:func:`divergence_cause` quotes it).
      model_tau: the starting tau of a run whose rounds will carry the model of the
        Lagrangian's Hessian, where it differs from ``tau`` (:func:`model_start_tau`), else
        None; it applies when no diagonal metric replaces the model.
    """

    tau: float
    curvature: float
    unstable: Optional[tuple] = None
    model_tau: Optional[float] = None


def run(cfg: Settings, exchange, x0: np.ndarray) -> Probe:
    """Check every function's gradient on each client's batch (when asked:
    :func:`.adaptive.check_gradient` on the first comparison and, from a client whose first
    comparison failed, its further steps) and estimate the curvature along it; the starting
    tau (``tau="auto"``) or the fixed tau."""
    batch = cfg.rows(cfg.first_batch)
    failed = {}
    fixed = cfg.problem.deterministic.bound_fixed(x0)
    curvature, norms, own = _probe_at(cfg, exchange, x0, batch, failed,
                                      fixed=",".join(str(int(i)) for i in fixed))
    _refuse_a_dead_default_start(cfg, x0, norms)
    if failed:
        _recheck_elsewhere(cfg, exchange, x0, batch, failed)
    if not cfg.auto_tau:
        return Probe(cfg.tau, curvature, _unstable_tau(cfg, curvature, batch))
    if cfg.sampled:
        return Probe(sampled_tau(cfg, curvature, batch), curvature)
    if not cfg.adapt_tau and cfg.own_curvature:
        # a builder that carries its own curvature (DiagonalCurvature's h): tau only keeps its
        # surrogate strongly convex and nothing adapts it later, so the probe's curvature
        # along the gradient (dominated by the steepest coordinate) must not be added to every
        # coordinate: the flat ones would freeze
        return Probe(cfg.tau, curvature)
    tau = curvature if np.isfinite(curvature) and curvature > 0 else cfg.tau
    first = _first_step_tau(cfg, x0, norms)
    return Probe(max(tau, first), curvature,
                 model_tau=None if batch is not None else model_start_tau(cfg, x0, own, first))


def model_start_tau(cfg: Settings, x0: np.ndarray, objective_curvature: float,
                    first: float) -> Optional[float]:
    """Round 1's tau (on full batches) in a run whose later rounds carry the quasi-Newton
    model of the Lagrangian's Hessian (:mod:`.quasi_newton`) on a problem with inequality
    constraints only, where the objective sets it as in SQP's first step: the stochastic
    objective's own curvature along its gradient at x0 (``objective_curvature``; ``cfg.tau``
    where it vanishes, a linear objective), at least ``first`` (:func:`_first_step_tau`,
    SQP's initial trust radius |grad F_0| / (2 max(1, |x0|))); with a deterministic
    objective (the library's F_0 = 0 in the stochastic one's place) whose gradient at x0 is
    not 0 (a linear one: min u s.t. g_i(x) <= u), the same trust radius with that gradient,
    at least ``cfg.tau``. None elsewhere: round 1's tau is then the largest curvature of
    every function.

    Every inequality's surrogate carries tau's proximal term, and a step lowers it by at most
    |grad F_m|^2 / (4 tau): with the constraints' largest curvature as tau a far point's
    linearised constraints are out of reach, the subproblem keeps slack at multiplier c for
    rounds, and the model's pairs, weighted by those multipliers, learn a curvature c / nu*
    times too large (a minimax problem: 7 rounds at nu = c, the model's scale 4,700 against 4
    at the solution). SQP's first step (an identity Hessian, the constraints linearised) has
    no such bound; the constraints' curvature enters through the pairs, and a rejected first
    step is shortened by the line search of the rounds before the first pair. With
    equalities the constraints' curvature stays in tau (on S2MPJ the rounds rose on problems
    with equalities: a step along a curved equality from a tau without its curvature
    overshoots), and so it does for a feasibility problem (no objective to set it). Under the
    Newton model (the clients' Hessians) the rule was measured neutral on the same problems
    (as many rounds taken off as added, some doubled), so it does not apply there."""
    if not (cfg.model_ok and not cfg.newton and cfg.M and cfg.objective_stochastic
            and not np.any(cfg.equality)):
        return None
    radius = max(1.0, float(np.linalg.norm(x0)))
    if cfg.problem.anchored:         # the library's F_0 = 0 (anchor_objective)
        try:
            g = float(np.linalg.norm(cfg.problem.deterministic.grad(x0)))
        except Exception:       # a term without a gradient at x0: the rule for every function
            return None
        return max(cfg.tau, g / (2.0 * radius)) if np.isfinite(g) and g > 0 else None
    tau = (objective_curvature if np.isfinite(objective_curvature) and objective_curvature > 0
           else cfg.tau)
    return max(tau, first)


def _refuse_a_dead_default_start(cfg: Settings, x0: np.ndarray, norms) -> None:
    """A start nobody chose (x0 defaulted to zeros: neither the solve nor the problem gave
    one) at which every function's gradient vanishes on every client's batch is a stationary
    point of every penalised problem (a network whose weights are all 0: its hidden units are
    dead): the iterates could not leave it, so the solve refuses it (ModelError) and asks for
    an x0."""
    if (cfg.options.x0 is not None or cfg.problem.x0 is not None or np.any(x0)
            or not norms or any(g != 0.0 for _, _, g in norms)):
        return
    raise ModelError(
        "x0 defaulted to zeros, where the gradient of every function vanishes on every "
        "client's batch: a stationary point of every penalised problem (a network whose "
        "weights are all 0 has dead hidden units), which the iterates cannot leave. Pass "
        "x0= to solve (e.g. the model's own initialisation), or Problem(..., x0=...)")


def measure_metric(cfg: Settings, exchange, x0: np.ndarray) -> Optional[np.ndarray]:
    """The diagonal metric of the adaptive defaults (:func:`.adaptive.diagonal_metric`), from
    squared per-sample gradients at x0; None when it does not apply or one scalar curvature
    serves. With one row in all the per-sample gradients cannot vary, so no function has a
    metric (:func:`.adaptive.diagonal_metric`): the exchange is skipped (a deterministic
    problem written over one row would otherwise pay a gradient call per function for
    nothing)."""
    if not cfg.metric_ok or cfg.num_samples <= 1:
        return None
    replies = exchange(Request(ad.METRIC_TASK, 0, x0, {}))
    D = ad.diagonal_metric(replies, len(cfg.problem.functions), cfg.num_samples)
    return D if D.size else None


def sampled_tau(cfg: Settings, curvature: float, batch) -> float:
    """tau="auto" on sampled rounds (a fixed B, or K < I clients): the smallest tau at which
    round 1 is a stable step (``batch``: round 1's rows per client, None: all).

    With Fbar^(0) = tau |w|^2 and no domain, eqs. (fs0bar)-(w update) are the heavy-ball
    iteration  w_{t+1} - w_t = beta_t (w_t - w_{t-1}) - eta_t g_t  with
    eta_t = gamma_t rho_t / (2 tau) and beta_t = (1 - rho_t)(1 - gamma_t) (constant steps;
    docs/solver-settings.md, "SSCA as heavy ball"). On a quadratic of curvature L it is
    stable iff eta L < 2 (1 + beta), i.e. tau > gamma rho L / (4 (1 + beta)). That bound at
    round 1's steps and the probe's curvature along the gradient is used, but never below
    ``ad.SAMPLED_TAU_FLOOR``: the measured curvature is a majorization scale, far too
    conservative for a network, whose steps it would shorten for no gain."""
    bound = _stability_bound(cfg, curvature, batch)
    return float(bound) if np.isfinite(bound) and bound > ad.SAMPLED_TAU_FLOOR else (
        ad.SAMPLED_TAU_FLOOR)


def divergence_cause(unstable: Optional[tuple]) -> Optional[str]:
    """What made the iterates diverge, when the probe knows (a fixed tau below round 1's
    stability bound, :func:`run`'s ``unstable``), else None."""
    if unstable is None:
        return None
    tau, bound, curvature = unstable
    return (f"the fixed tau={tau:g} is {bound / tau:.3g} times below {bound:.3g}, the "
            f"smallest tau at which round 1's step is stable for the curvature measured "
            f"at x0 ({curvature:.3g}), as the warning before round 1 said: give a tau of "
            f"at least {bound:.2g}, or tau='auto' (measured and adapted)")


def _stability_bound(cfg: Settings, curvature: float, batch) -> float:
    """gamma rho L / (4 (1 + beta)) at round 1's steps (:func:`sampled_tau`)."""
    r, g = cfg.steps_at(batch, 1)
    return g * r * curvature / (4.0 * (1.0 + (1.0 - r) * (1.0 - g)))


def _unstable_tau(cfg: Settings, curvature: float, batch) -> Optional[tuple]:
    """A fixed tau below the heavy-ball stability bound of round 1 (:func:`sampled_tau`'s
    formula without its floor) for the curvature the probe measured: the first steps are
    longer than the curvature allows, and the iterates may diverge before the schedules
    shorten them. A warning before round 1 says so, and (tau, bound, curvature) is returned
    for a DivergenceError to name later (:func:`divergence_cause`); None when tau is stable."""
    if not (np.isfinite(curvature) and curvature > 0):
        return None
    r, g = cfg.steps_at(batch, 1)
    bound = _stability_bound(cfg, curvature, batch)
    if not cfg.tau < bound:
        return None
    guarded = batch is None and not cfg.sampled_clients
    what = ("on full batches the steps that raise the objective (the exact penalty) "
            "are taken back and shortened, which costs rounds" if guarded else
            "the iterates may diverge before the schedules shorten the steps")
    warnings.warn(
        f"tau={cfg.tau:g} is below {bound:.3g}, the smallest tau at which round 1's "
        f"step (rho_1 = {r:.3g}, gamma_1 = {g:.3g}) is stable for the curvature "
        f"measured at x0 ({curvature:.3g}): {what}; tau='auto' measures and adapts "
        "it", RuntimeWarning, stacklevel=4)
    return (cfg.tau, float(bound), float(curvature))


def _recheck_elsewhere(cfg: Settings, exchange, x0, batch, failed) -> None:
    """The gradients that disagreed with their values at x0 (``failed``: function index ->
    its UserFunctionError), checked again at a point x1 = x0 + ad.RECHECK_DISTANCE
    max(1, |x0|_inf) r (r a fixed random unit vector). A wrong gradient is wrong almost
    everywhere; one that agrees at x1 was compared across a kink or a jump of the function at
    x0 (|x| at 0, a branch cut of atan2, sqrt at 0), which the run can live with: a warning,
    not an error. Fails at x1 too (or its values are not finite there): the error from x0,
    which names the comparison."""
    fixed = cfg.problem.deterministic.fixed_coordinates(x0)
    if fixed.size:
        # the domain fixes some coordinates: the gradient is compared along the others only
        # (a function need not be differentiable off the domain, e.g. x log x at a variable
        # fixed at 0)
        again = {}
        try:
            _probe_at(cfg, exchange, x0, batch, again, only=set(failed),
                      fixed=",".join(str(int(i)) for i in fixed))
        except UserFunctionError:
            again = dict(failed)
        failed = {m: exc for m, exc in failed.items() if m in again}
        if not failed:
            return
    rng = np.random.default_rng(20261126)
    r = rng.standard_normal(x0.size)
    x1 = x0 + ad.RECHECK_DISTANCE * max(1.0, float(np.max(np.abs(x0)))) * r / np.linalg.norm(r)
    again = {}
    try:
        _probe_at(cfg, exchange, x1, batch, again, only=set(failed))
    except UserFunctionError:
        again = failed
    for m, exc in failed.items():
        if m in again:
            raise exc
    names = ", ".join(cfg.problem.functions[m].name for m in sorted(failed))
    warnings.warn(f"{names}: the gradient disagrees with the values at x0 but agrees at a "
                  f"point {np.linalg.norm(x1 - x0):.3g} away: the function has a kink or a "
                  "jump at x0 (it is not differentiable there); the run goes on",
                  RuntimeWarning, stacklevel=4)


def _first_step_tau(cfg: Settings, x0, norms) -> float:
    """The least starting tau on full batches: the one at which the first step,
    |grad F_0| / (2 tau) (the proximal-linear surrogate's), is at most max(1, |x0|) -- the
    initial trust radius of SQP codes' identity Hessian. Where the curvature along the
    gradient vanishes at x0 (sin at 0) the measured tau is tiny and the first step would go
    far away, from where the run may never come back. 0 when the probe gave no gradient norms
    (secure aggregation) or the objective is deterministic (exact in the subproblem: it bounds
    the step itself). |grad F_0| is the mean of the clients' batch gradient norms at x0
    (``norms``: (function, rows, norm) per client), weighted by their batch sizes."""
    norms = [(b, g) for m, b, g in norms if m == 0]
    if not cfg.objective_stochastic or not norms:
        return 0.0
    g = sum(b * g for b, g in norms) / max(sum(b for b, _ in norms), 1e-300)
    if not np.isfinite(g):
        return 0.0
    return g / (2.0 * max(1.0, float(np.linalg.norm(x0))))


def _probe_at(cfg: Settings, exchange, x0, batch, failed, only=None, fixed: str = ""):
    """One probe exchange at ``x0``: (the largest secant curvature, the clients' gradient
    norms as (function, rows, norm), the objective's secant curvature: 0 without a
    stochastic objective); the gradient check's failures go into ``failed``
    (function index -> UserFunctionError) instead of raising (``only``: the functions to
    check, None: all; ``fixed``: "i,j,..." the coordinates left out of the direction of the
    comparison)."""
    check = cfg.options.check_gradients
    config = {"batch_size": batch, "check": check}
    if fixed:
        config["fixed"] = fixed
    replies = exchange(Request(ad.PROBE_TASK, 0, x0, config))
    curvature, norms, own = 0.0, [], 0.0
    functions = cfg.problem.functions
    count = len(functions)
    for reply in replies:
        if reply.client == AGGREGATE:
            # secure aggregation: the clients checked their gradients themselves and the
            # server learns only the data-weighted mean of their secant curvatures
            secant = reply.weight * _probe_rows(reply, (count,))
        else:
            an, fd, value, secant = _probe_rows(reply, (count, 4)).T
            size = float(reply.batch_size or 1)
            norms.extend((m, size, g) for m, g in enumerate(an.tolist()))
            if check:
                # every comparison at once; a function whose first comparison does not plainly
                # agree, or that sent further steps, goes through check_gradient one by one
                finite = np.isfinite(fd)
                plain = (finite & np.isfinite(an) & np.isfinite(value)
                         & ad.agree_all(an, fd, value, ad.fd_step(x0)))
                again = set(np.flatnonzero(~plain).tolist())
                again.update(m for m in range(count) if f"recheck:{m}" in reply.arrays)
                for m in sorted(again):
                    fn = functions[m]
                    if not finite[m]:
                        warnings.warn(
                            f"{fn.name}: its gradient was not checked on client {reply.client}: "
                            "its values are not finite on either side of x0 along the gradient, "
                            f"at steps from {ad.fd_step(x0):.3g} down to "
                            f"{ad.fd_step(x0) * 10.0 ** -ad.FINITE_TRIES:.3g} (x0 on the edge of "
                            "its domain?)", RuntimeWarning, stacklevel=2)
                    elif only is None or m in only:
                        try:
                            ad.check_gradient(fn, reply.client, reply.batch_size, x0,
                                              float(an[m]), float(fd[m]), float(value[m]),
                                              reply.arrays.get(f"recheck:{m}"))
                        except UserFunctionError as exc:
                            failed.setdefault(m, exc)
        # NaN secants are passed over, as max(curvature, NaN) keeps curvature
        curvature = float(np.max(secant[~np.isnan(secant)], initial=curvature))
        own = float(np.max(secant[:cfg.first][~np.isnan(secant[:cfg.first])], initial=own))
    return curvature, norms, own


def _probe_rows(reply, shape: tuple) -> np.ndarray:
    """The reply's probe array (a row per function), of ``shape``; another shape is the
    client's fault: a ReplyError naming it."""
    P = np.asarray(array(reply, ad.PROBE), dtype=float)
    if P.shape != shape:
        from ...errors import ReplyError

        raise ReplyError(reply.client, reply.round, f"its reply to task {reply.task!r} has "
                         f"array {ad.PROBE!r} of shape {P.shape}, not {shape} (a row per "
                         "function)", kind="shape", array=ad.PROBE)
    return P
