"""Algorithms 1 and 2 (mini-batch SSCA) as a method of the one front door and round loop.

The round itself is :mod:`.step` (eqs. (Fs0bar)/(Fsmbar), Problem 2/5, eq. (updatew)); the
client's side is :mod:`.client`. This module adds what the runner needs (the request, the
history row, the state's checkpoint form), the defaults that need no tuning (:mod:`.adaptive`:
adaptive batches, tau from the data, backtracking on full batches) and the front door's hooks:
the probe before round 1 (:meth:`SSCA.prepare`), the full-data KKT test, the penalty
continuation of Theorem 2 as stages (:meth:`SSCA.next_stage` = :meth:`SSCA.with_penalty` when
the last stage's slack says c is too small) and the status rules (:mod:`.status`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping, Optional

import warnings

import numpy as np

from ...diagnostics.evaluation import excess
from ...diagnostics.kkt import force_multipliers as kkt_forces
from ...errors import SubproblemError, UserFunctionError
from ...federated.messages import AGGREGATE, Request, array
from ...model.surrogates import check_strongly_convex
from ...schedules import at_epochs, step_value
from . import adaptive as ad
from . import step as ssca_step
from .client import NONFINITE, REJECT_NONFINITE, TASK, SSCARoundTask
from .front import FrontDoor
from . import quasi_newton as qn
from .quasi_newton import LBFGSModel

CHECK_RTOL = ad.CHECK_RTOL


class SSCA(FrontDoor):
    """Mini-batch SSCA over the runner's protocol.

    Args:
      problem: the :class:`~ssca_solver.Problem`.
      builders: the surrogate builders of its stochastic functions, read when the solve starts.
      subproblem: the subproblem solver (closed form or CVXPY).
      batch_size: B (None: full batch; "auto": adaptive, see :mod:`.adaptive`).
      tau: the proximal weight (a number, or "auto": from the probe, adapted on full batches).
      rho: the step-size schedule rho_t of the recursive averages, as in
        :class:`~ssca_solver.SSCAOptions` (an :class:`~ssca_solver.EpochStep` runs on the
        clock of passes over the data).
      gamma: the step-size schedule gamma_t of the iterate update, as ``rho``.
      surrogate_init: Fbar^(0), the start of the averaged surrogates: "tau" (tau |w|^2) or
        "zero", as in :class:`~ssca_solver.SSCAOptions`.
      check_gradients: check every function's gradient in the probe before round 1.
      unit_steps: rho = gamma = 1 on full batches (with the adaptive batch size or tau).
      participation: the expected fraction of the clients in a round (K / I), for that clock.
      sampled_clients: K < I clients per round, or proportional draws (the rounds' statistics
        are random even on full batches: ``tau="auto"`` is then :meth:`sampled_tau`).
      penalties: c_1 < c_2 < ... of the continuation (Algorithm 2; (0,) for Algorithm 1).
      hessian: ``"lbfgs"`` (the quasi-Newton model of the full-batch rounds) or ``"none"``
        (the paper's first-order surrogates).
    """

    supports_secure_aggregation = True     # the server reads only weighted sums of replies

    def __init__(self, problem, builders, subproblem, batch_size, tau, rho, gamma,
                 surrogate_init: str, check_gradients: bool = False,
                 unit_steps: bool = True, participation: float = 1.0,
                 sampled_clients: bool = False, penalties=(0.0,), hessian: str = "lbfgs"):
        self.opts = None
        self.penalties = tuple(float(c) for c in penalties)
        self.sampled_clients = bool(sampled_clients)
        self.bound_scale = np.maximum(1.0, np.abs(problem.bounds))
        self.equality = problem.equality
        self.problem = problem
        self.builders = tuple(builders)
        self.subproblem = subproblem
        self.auto_batch = batch_size == "auto"
        self.batch_size = None if self.auto_batch else batch_size
        self.auto_tau = tau == "auto"
        # sampled rounds: a fixed B, or a random set of clients (K < I, proportional draws)
        self.sampled = (not self.auto_batch and batch_size is not None) or bool(sampled_clients)
        self.tau = 0.1 if self.auto_tau else float(tau)
        self.adapt_tau = self.auto_tau and ad.adaptable(self.builders)
        # a diagonal curvature where the data's scales differ: on full batches (where the
        # backtracking guards every step) the server swaps the proximal term of the round's
        # statistics for a diagonal one; closed form only. On mini-batches it made the
        # paper's network diverge (cost 2.22 after 100 rounds against 0.78 without)
        self.metric_ok = (bool(unit_steps) and self.adapt_tau and hasattr(subproblem,
                                                                           "with_metric")
                          and (self.auto_batch or batch_size is None))
        # the quasi-Newton model of the full-batch phase (issue 19, :mod:`.quasi_newton`): in
        # the backtracking regime (which keeps every accepted step monotone in the exact
        # penalty), closed form only
        self.model_ok = (hessian == "lbfgs" and bool(unit_steps) and self.adapt_tau
                         and hasattr(subproblem, "with_model")
                         and (self.auto_batch or batch_size is None))
        # the quasi-Newton pairs kept, and the rows of d floats they take in a checkpoint
        self.qn_memory = qn.memory_for(problem.dim)
        self.state_rows = 2 * self.qn_memory
        self.rho, self.gamma = rho, gamma
        self.participation = float(participation)
        self.surrogate_init = surrogate_init
        self.check_gradients = bool(check_gradients)
        self.unit_steps = bool(unit_steps)     # rho = gamma = 1 on full batches (adaptive)
        self.num_samples = problem.data.num_samples
        self.sizes = problem.data.client_sizes
        self.M = problem.num_constraints
        # lambda when the deterministic part is lambda |w|^2: its value and gradient without
        # CVXPY, which the adaptive defaults need every round
        self.ridge = problem.deterministic.norm2_coefficient()
        #: the builders with a curvature of their own (scaled by kappa under tau="auto")
        self.own_curvature = tuple(m for m, b in enumerate(self.builders)
                                   if ad.own_curvature(b))
        self.columns = {"rho": (), "gamma": (), "penalty": (), "slack": (self.M,),
                        "multipliers": (self.M,), "surrogate_value": (), "step_norm": (),
                        "retries": (), "inaccurate": (), "batch_size": (), "tau": (),
                        "noise_ratio": (), "rejected": ()}

    # -- the runner's members (the front door's hooks: .front.FrontDoor) ---------------------
    def tasks(self) -> Mapping:
        return {TASK: SSCARoundTask(self.problem.functions, self.builders),
                ad.PROBE_TASK: ad.ProbeTask(self.problem.functions),
                ad.METRIC_TASK: ad.MetricTask(self.problem.functions)}

    def init(self, x0: np.ndarray, penalty: Optional[float] = None,
             tau: Optional[float] = None, metric: Optional[np.ndarray] = None):
        """The state before round 1 (eq. (fs0bar)'s Fbar^(0)), at penalty c_1 unless given;
        ``tau`` and ``metric``: the probe's (:meth:`prepare`)."""
        penalty = self.penalties[0] if penalty is None else penalty
        tau = self.tau if tau is None else float(tau)
        state = ssca_step.init(x0, self.builders, tau, self.surrogate_init, self.M, penalty)
        batch = min(ad.START_BATCH, max(self.sizes)) if self.auto_batch else 0
        state = state._replace(batch=batch, tau=tau)
        return state if metric is None else state._replace(metric=np.asarray(metric))

    def measure_metric(self, exchange, x0: np.ndarray) -> Optional[np.ndarray]:
        """The diagonal metric of the adaptive defaults (:func:`adaptive.diagonal_metric`), from
        squared per-sample gradients at x0; None when it does not apply or one scalar
        curvature serves."""
        if not self.metric_ok:
            return None
        replies = exchange(Request(ad.METRIC_TASK, 0, x0, {}))
        D = ad.diagonal_metric(replies, len(self.problem.functions), self.num_samples)
        return D if D.size else None

    def _solver(self, state, center):
        if state.metric.size:
            return self.subproblem.with_metric(state.metric, center)
        if self._model_on(state):
            return self.subproblem.with_model(self._model(state), center)
        if (self.model_ok and self._backtracking(state)
                and hasattr(self.subproblem, "with_zero_model")):
            # CVXPY: the model's compiled problem with B = 0 until the first pair (one
            # compile per run instead of two; the same subproblem)
            return self.subproblem.with_zero_model(center)
        return self.subproblem

    def _model_on(self, state) -> bool:
        """The quasi-Newton model is in the round's surrogate: it applies (``model_ok``), it
        holds a pair, and no diagonal metric is in force (which takes precedence)."""
        return bool(self.model_ok and state.qn_s.size and not state.metric.size)

    def _model(self, state) -> LBFGSModel:
        """The compact form of the state's pairs, built once per set of pairs (the solver, the
        rejection's tau and the fallback read it in the same round)."""
        cached = getattr(self, "_model_cache", None)
        if cached is None or cached[0] is not state.qn_s:
            cached = (state.qn_s, LBFGSModel(state.qn_s, state.qn_y))
            self._model_cache = cached
        return cached[1]

    def _with_pair(self, state, stats):
        """The state with the quasi-Newton pair of the accepted step prev_w -> w added: s the
        step, y the change of the gradient of the Lagrangian F_0 + sum_m nu_m F_m (nu: the
        multipliers of the subproblem that gave w) read from the full-batch statistics at both
        points (:mod:`.quasi_newton`; no extra communication)."""
        if not (self.model_ok and not state.metric.size and len(state.prev_w)
                and len(state.prev_stats)):
            # with a diagonal metric (features of very different scales) the model is not
            # used: from B_0 = delta I it ended a badly scaled Neyman-Pearson problem 2.0 from
            # the optimum in 46 rounds, where the metric's first-order steps are 3e-4 from it
            return state
        s = state.w - state.prev_w
        if float(np.linalg.norm(s)) <= qn.MIN_STEP * max(1.0, float(np.linalg.norm(state.w))):
            return state
        weights = np.concatenate(([1.0] if self.problem.objective is not None else [],
                                  np.asarray(state.nu, dtype=float)))
        y = np.zeros_like(s)
        for c, new, old in zip(weights, stats, state.prev_stats):
            g1, g0 = ad.surrogate_gradient(new, state.w), ad.surrogate_gradient(old, state.prev_w)
            if g1 is None or g0 is None:
                return state
            if c != 0.0:
                y += c * (g1 - g0)
        kept = qn.extend(self._model(state), s, y, memory=self.qn_memory)
        if kept is None:
            return state
        self._model_cache = (kept.S, kept)
        return state._replace(qn_s=kept.S, qn_y=kept.Y)

    def with_penalty(self, state: ssca_step.SSCAState, penalty: float) -> ssca_step.SSCAState:
        """The state with penalty c (a new stage of the continuation, warm-started); the merit
        changes with c, so backtracking starts afresh, from the last accepted point when the
        pending trial step is a long one computed after a rejection (:meth:`_unsafe_trial`).
        Starting at such a trial took, on the digits network with c_1 = 1, a step of length
        76 rejected all through the previous stage as the next stage's start (|w|^2 from
        0.003 to 5,847, the violation from 2 to 38)."""
        if self._unsafe_trial(state):
            state = state._replace(w=state.prev_w.copy(), rejects=0)
        return state._replace(penalty=float(penalty), merit=float("nan"),
                              prev_w=np.zeros(0), prev_stats=())

    def _unsafe_trial(self, state) -> bool:
        """In the backtracking regime the state's w is a trial step not yet judged and prev_w
        the last accepted point. The trial is not to be adopted unjudged (at a stage change,
        or as the returned point) when it was computed after a rejection and is longer than
        SETTLE_STEP max(1, |prev_w|) (a stage that settled in rejections of steps lost in
        rounding leaves a trial as good as its base: adopting it kept HS75's certificate,
        which judging it at the new c lost), unless the rejection was of a non-finite point
        (the run then ends on that value's error, which names the function)."""
        if not (self._backtracking(state) and state.rejects > 0 and len(state.prev_w)
                and state.prev_w.shape == state.w.shape
                and not getattr(self, "_nonfinite_trial", False)):
            return False
        step = float(np.linalg.norm(state.w - state.prev_w))
        return step > ad.SETTLE_STEP * max(1.0, float(np.linalg.norm(state.prev_w)))

    def returned_state(self, state: ssca_step.SSCAState) -> ssca_step.SSCAState:
        """The state whose point a run that did not converge returns: the last accepted point
        in place of an unsafe pending trial (:meth:`_unsafe_trial`). With the stages' starts
        fixed alone, the digits network with c_1 = 1 still returned such a trial: |w|^2 =
        40,622, F - U = 99, where the run had accepted no point worse than |w|^2 = 0.003,
        F - U = 2.05."""
        if self._unsafe_trial(state):
            return state._replace(w=state.prev_w.copy())
        return state

    def request(self, state) -> Request:
        config = {"batch_size": self._batch(state), "tau": self._tau(state)}
        if self.auto_batch and not self._full(state):
            config["noise"] = True
        elif self.tentative(state):
            # a trial point where a function is not finite is a rejected step, not an error:
            # the backtracking goes back to the last accepted point (which has statistics)
            config[REJECT_NONFINITE] = True
        return Request(TASK, state.t + 1, state.w, config)

    def tentative(self, state) -> bool:
        """In the backtracking regime w_t is a trial point until the next round's merit test
        accepts it."""
        return (self._backtracking(state) or self._guarded(state)) and len(state.prev_stats) > 0

    def round_work(self, request) -> float:
        """Rows the round reads: sum_i min(B, N_i) (every row on full batches), times K / I
        with partial participation (the evaluations' budget, :attr:`eval_budget`)."""
        B = request.config.get("batch_size")
        rows = float(sum(n if B is None else min(int(B), int(n)) for n in self.sizes))
        return rows * self.participation

    def round_evaluation(self, before, after, info):
        """In the backtracking regime a round that accepted its point ``before.w`` holds the
        full-data values and gradients there: its statistics are full-batch sums, and the
        proximal-linear ones give F_m(w) = p_m(q, w) and grad F_m(w) = 2 quad w + lin at the
        point they were taken at (tau's rescaling keeps both). That is the evaluation the KKT
        test needs, without the second pass over the data a scheduled one costs (issue 19).
        The state returned is ``after`` at that point (the run's result if the test passes)."""
        if not (self._backtracking(before) and info.rejected == 0 and len(after.prev_stats)
                and len(after.prev_w) == len(before.w)
                and np.array_equal(after.prev_w, before.w)):
            return None
        from ...diagnostics.evaluation import Evaluation

        w = after.prev_w
        grads = [ad.surrogate_gradient(st, w) for st in after.prev_stats]
        if any(g is None for g in grads):
            return None
        values = np.array([b.evaluate(st, w) for b, st in zip(self.builders, after.prev_stats)])
        if not self._round_evaluation_exact(after.prev_stats, w, values, grads):
            return None
        return after._replace(w=w.copy()), Evaluation(values, np.array(grads), 0, 0, True)

    def _round_evaluation_exact(self, stats, w, values, grads) -> bool:
        """Whether the values and gradients read from the statistics are exact enough for the
        KKT test: they are sums of terms as large as quad |w|^2 and 2 quad |w| that cancel, so
        their rounding error is about ROUND_EVAL_EPS times those terms. Each constraint value
        must be within ROUND_EVAL_SHARE of feas_tol (in the test's units, max(1, |U_m|)), and
        every gradient within that share of kkt_tol times the largest gradient; else a paid
        evaluation (the clients' own values) decides. At tau = 6.5e8 and |w| = 1.2e3 the
        statistics' values were 0.015 off: a constraint violated by 0.015 read as met, and a
        point with relative stationarity 0.048 was certified (S2MPJ's HS75, with a memory of
        64 pairs)."""
        o = self.opts
        wn = float(np.linalg.norm(w))
        k = 1 if self.problem.objective is not None else 0
        gmax = max(float(np.linalg.norm(g)) for g in grads)
        for m, st in enumerate(stats):
            quad = float(np.max(np.abs(st["quad"])))
            lin = float(np.linalg.norm(st["lin"]))
            const = float(np.max(np.abs(st.get("const", 0.0))))
            value_err = ad.ROUND_EVAL_EPS * (quad * wn * wn + lin * wn + const)
            grad_err = ad.ROUND_EVAL_EPS * (2.0 * quad * wn + lin)
            if grad_err > ad.ROUND_EVAL_SHARE * o.kkt_tol * gmax:
                return False
            if m >= k and value_err > (ad.ROUND_EVAL_SHARE * o.feas_tol
                                       * float(self.bound_scale[m - k])):
                return False
        return True

    def _backtracking(self, state) -> bool:
        """Full batches with the adaptive tau and unit steps: the backtracking regime."""
        return self._full(state) and self.adapt_tau and self.unit_steps

    def _batch(self, state) -> Optional[int]:
        if not self.auto_batch:
            return self.batch_size
        return None if state.batch >= max(self.sizes) else int(state.batch)

    def _tau(self, state) -> float:
        return float(state.tau) if state.tau > 0 else self.tau

    def _full(self, state) -> bool:
        return self._batch(state) is None

    # -- the probe before round 1 -----------------------------------------------------------------
    def probe(self, exchange, x0: np.ndarray) -> float:
        """Check every function's gradient on each client's batch (when asked:
        :func:`.adaptive.check_gradient` on the first comparison and, from a client whose first
        comparison failed, its further steps) and estimate the curvature along it; return the
        starting tau (``tau="auto"``) or the fixed tau."""
        batch = min(ad.START_BATCH, max(self.sizes)) if self.auto_batch else self.batch_size
        failed = {}
        fixed = self.problem.deterministic.bound_fixed(x0)
        curvature = self._probe_at(exchange, x0, batch, failed,
                                   fixed=",".join(str(int(i)) for i in fixed))
        self._probe_curvature = curvature
        norms = self._probe_norms             # x0's, for the first step's bound
        if failed:
            self._recheck_elsewhere(exchange, x0, batch, failed)
        self._probe_norms = norms
        if not self.auto_tau:
            self._warn_unstable_tau(curvature, batch)
            return self.tau
        if self.sampled:
            return self.sampled_tau(curvature, batch)
        if not self.adapt_tau and any(ad.own_curvature(b) for b in self.builders):
            # a builder that carries its own curvature (DiagonalCurvature's h): tau only keeps
            # its surrogate strongly convex, and nothing adapts it later; the probe's
            # curvature along the gradient (1e12 with one column scaled by 1e6) added to every
            # coordinate froze the flat ones (error 1.0 after 200 rounds where 0.1 gives 2e-9)
            return self.tau
        tau = curvature if np.isfinite(curvature) and curvature > 0 else self.tau
        return max(tau, self._first_step_tau(x0))

    def _recheck_elsewhere(self, exchange, x0, batch, failed) -> None:
        """The gradients that disagreed with their values at x0 (``failed``: function index
        -> its UserFunctionError), checked again at a point x1 = x0 + ad.RECHECK_DISTANCE
        max(1, |x0|_inf) r (r a fixed random unit vector). A wrong gradient is wrong almost
        everywhere; one that agrees at x1 was compared across a kink or a jump of the function
        at x0 (|x| at 0, a branch cut of atan2, sqrt at 0: S2MPJ's HELIXNE and S365 start
        on one), which the run can live with: a warning, not an error. Fails at x1 too (or
        its values are not finite there): the error from x0, which names the comparison."""
        fixed = self.problem.deterministic.fixed_coordinates(x0)
        if fixed.size:
            # the domain fixes some coordinates: the gradient is compared along the others
            # only (a function need not be differentiable off the domain: S2MPJ's QCNEW has
            # x log x at two variables fixed at 0, where S2MPJ's gradient is finite)
            again = {}
            try:
                self._probe_at(exchange, x0, batch, again, only=set(failed),
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
            self._probe_at(exchange, x1, batch, again, only=set(failed))
        except UserFunctionError:
            again = failed
        for m, exc in failed.items():
            if m in again:
                raise exc
        names = ", ".join(self.problem.functions[m].name for m in sorted(failed))
        warnings.warn(f"{names}: the gradient disagrees with the values at x0 but agrees at a "
                      f"point {np.linalg.norm(x1 - x0):.3g} away: the function has a kink or a "
                      "jump at x0 (it is not differentiable there); the run goes on",
                      RuntimeWarning, stacklevel=4)

    def _first_step_tau(self, x0) -> float:
        """The least starting tau on full batches: the one at which the first step,
        |grad F_0| / (2 tau) (the proximal-linear surrogate's), is at most max(1, |x0|) --
        the initial trust radius of SQP codes' identity Hessian. Where the curvature along the
        gradient vanishes at x0 (sin at 0: S2MPJ's HS9 from (0, 0)) the probe measured tau =
        8e-9, the first step went 1e7 away and the run never came back. 0 when the probe gave
        no gradient norms (secure aggregation) or the objective is deterministic (exact in the
        subproblem: it bounds the step itself). |grad F_0| is the mean of the clients' batch
        gradient norms, weighted by their batch sizes."""
        norms = [(b, g) for m, b, g in getattr(self, "_probe_norms", ()) if m == 0]
        if self.problem.objective is None or not norms:
            return 0.0
        g = sum(b * g for b, g in norms) / max(sum(b for b, _ in norms), 1e-300)
        if not np.isfinite(g):
            return 0.0
        return g / (2.0 * max(1.0, float(np.linalg.norm(x0))))

    def _probe_at(self, exchange, x0, batch, failed, only=None, fixed: str = "") -> float:
        """One probe exchange at ``x0``: the largest secant curvature; the gradient check's
        failures go into ``failed`` (function index -> UserFunctionError) instead of raising
        (``only``: the functions to check, None: all; ``fixed``: "i,j,..." the coordinates
        left out of the direction of the comparison)."""
        config = {"batch_size": batch, "check": self.check_gradients}
        if fixed:
            config["fixed"] = fixed
        replies = exchange(Request(ad.PROBE_TASK, 0, x0, config))
        curvature = 0.0
        self._probe_norms = []
        for reply in replies:
            if reply.client == AGGREGATE:
                # secure aggregation: the clients checked their gradients themselves and the
                # server learns only the data-weighted mean of their secant curvatures
                for m in range(len(self.problem.functions)):
                    curvature = max(curvature, reply.weight * float(
                        array(reply, f"probe:{m}")[0]))
                continue
            for m, fn in enumerate(self.problem.functions):
                an, fd, value, secant = (float(v) for v in array(reply, f"probe:{m}"))
                self._probe_norms.append((m, float(reply.batch_size or 1), an))
                if self.check_gradients and not np.isfinite(fd):
                    warnings.warn(
                        f"{fn.name}: its gradient was not checked on client {reply.client}: "
                        "its values are not finite on either side of x0 along the gradient, "
                        f"at steps from {ad.fd_step(x0):.3g} down to "
                        f"{ad.fd_step(x0) * 10.0 ** -ad.FINITE_TRIES:.3g} (x0 on the edge of "
                        "its domain?)", RuntimeWarning, stacklevel=2)
                elif self.check_gradients and (only is None or m in only):
                    try:
                        ad.check_gradient(fn, reply.client, reply.batch_size, x0, an, fd,
                                          value, reply.arrays.get(f"recheck:{m}"))
                    except UserFunctionError as exc:
                        failed.setdefault(m, exc)
                curvature = max(curvature, secant)
        return curvature

    def _warn_unstable_tau(self, curvature: float, batch) -> None:
        """A fixed tau below the heavy-ball stability bound of round 1 (:meth:`sampled_tau`'s
        formula without its floor) for the curvature the probe measured: the first steps are
        longer than the curvature allows, and the iterates may diverge before the schedules
        shorten them (on full batches with tau = 1e-3 and curvature 1: DivergenceError at
        round 6). A warning before round 1 says so, and a DivergenceError later names it
        (:meth:`divergence_cause`)."""
        self.unstable_tau = None
        if not (np.isfinite(curvature) and curvature > 0):
            return
        r, g = self._steps_at(batch, 1)
        bound = g * r * curvature / (4.0 * (1.0 + (1.0 - r) * (1.0 - g)))
        if self.tau < bound:
            self.unstable_tau = (self.tau, float(bound), float(curvature))
            guarded = batch is None and not self.sampled_clients
            what = ("on full batches the steps that raise the objective (the exact penalty) "
                    "are taken back and shortened, which costs rounds" if guarded else
                    "the iterates may diverge before the schedules shorten the steps")
            warnings.warn(
                f"tau={self.tau:g} is below {bound:.3g}, the smallest tau at which round 1's "
                f"step (rho_1 = {r:.3g}, gamma_1 = {g:.3g}) is stable for the curvature "
                f"measured at x0 ({curvature:.3g}): {what}; tau='auto' measures and adapts "
                "it", RuntimeWarning, stacklevel=4)

    def divergence_cause(self):
        """What made the iterates diverge, when the method knows (a fixed tau below round 1's
        stability bound, :meth:`_warn_unstable_tau`), else None."""
        u = getattr(self, "unstable_tau", None)
        if u is None:
            return None
        tau, bound, curvature = u
        return (f"the fixed tau={tau:g} is {bound / tau:.3g} times below {bound:.3g}, the "
                f"smallest tau at which round 1's step is stable for the curvature measured "
                f"at x0 ({curvature:.3g}), as the warning before round 1 said: give a tau of "
                f"at least {bound:.2g}, or tau='auto' (measured and adapted)")

    def sampled_tau(self, curvature: float, batch) -> float:
        """tau="auto" on sampled rounds (a fixed B, or K < I clients): the smallest tau at
        which round 1 is a stable step (``batch``: round 1's rows per client, None: all).

        With Fbar^(0) = tau |w|^2 and no domain, eqs. (fs0bar)-(w update) are the heavy-ball
        iteration  w_{t+1} - w_t = beta_t (w_t - w_{t-1}) - eta_t g_t  with
        eta_t = gamma_t rho_t / (2 tau) and beta_t = (1 - rho_t)(1 - gamma_t) (constant steps;
        docs/solver-settings.md, "SSCA as heavy ball"). On a quadratic of curvature L it is
        stable iff eta L < 2 (1 + beta), i.e. tau > gamma rho L / (4 (1 + beta)). That bound
        at round 1's steps and the probe's curvature along the gradient is used, but never below
        ``ad.SAMPLED_TAU_FLOOR`` (0.05): the measured curvature is a majorization scale, far
        too conservative for a network (a tau of the curvature itself, 5.6 on the paper's
        network, ends at 2.22 after 100 rounds at B = 100, where 0.05 gives 0.48)."""
        r, g = self._steps_at(batch, 1)
        bound = g * r * curvature / (4.0 * (1.0 + (1.0 - r) * (1.0 - g)))
        return float(bound) if np.isfinite(bound) and bound > ad.SAMPLED_TAU_FLOOR else (
            ad.SAMPLED_TAU_FLOOR)

    # -- one round ---------------------------------------------------------------------------------
    def step(self, state, replies):
        # the memory as it was at the round's start: a failure inside the round leaves the
        # state of round t - 1 as the last good one, and its checkpoint takes this
        self._memory_at = (state.t, self._memory())
        t = state.t + 1
        full = self._full(state)
        r, g = self._round_steps(state, t)
        noise = np.zeros(len(self.builders))
        nonfinite = []
        replies = self._screened(replies, t, noise, nonfinite)
        guarded = self._guarded(state)
        stats = ssca_step.average_with_messages(state.stats, replies, self.num_samples,
                                                1.0 if guarded else r, allow_empty=True)
        if stats is None and not nonfinite:
            raise ValueError("average_with_messages: no client messages")
        if stats is not None and (guarded or r == 1.0):
            state, stats = self._own_curvature(state, stats)
        if full and self.adapt_tau and self.unit_steps:
            return self._backtracking_step(state, stats, bool(nonfinite))
        if guarded:
            return self._guarded_step(state, stats, r, g, bool(nonfinite))
        new, info = ssca_step.move(state, stats, r, g, self.subproblem)
        ratio = 0.0
        if self.auto_batch and not full:
            new, ratio = self._adapt_batch(new, state.w, stats, noise, info.solution)
        return new, _Info(info, self._batch(state), self._tau(state), ratio, 0)

    def _own_curvature(self, state, stats):
        """With tau="auto", the statistics of builders with a curvature of their own
        (DiagonalCurvature) scaled by the state's kappa (:func:`.adaptive.rescale_tau`: the
        same value and gradient at w_t), kappa set at round 1 from the probe's curvature
        (:func:`.adaptive.curvature_factor`). ``stats``: the round's own, not averaged."""
        own = self.own_curvature
        if not (own and self.auto_tau):
            return state, stats
        if state.t == 0:
            curvature = getattr(self, "_probe_curvature", float("nan"))
            kappa = max(ad.curvature_factor(stats[m], state.w, curvature) for m in own)
            state = state._replace(kappa=float(kappa))
        if state.kappa == 1.0:
            return state, stats
        stats = tuple(ad.rescale_tau(st, state.w, state.kappa) if m in own else st
                      for m, st in enumerate(stats))
        return state, stats

    def _guarded(self, state) -> bool:
        """Full batches from every client outside the backtracking regime (a numeric tau, a
        builder with its own curvature such as DiagonalCurvature, or rho/gamma given): each
        round's statistics are the full data's at w_t, so the exact-penalty merit there is
        known and a step that raised it is taken back (:meth:`_guarded_step`)."""
        return (self._full(state) and not self.sampled_clients
                and not (self.adapt_tau and self.unit_steps))

    def _round_steps(self, state, t: int) -> tuple:
        """rho_t, gamma_t of round t from ``state``: 1, 1 with unit steps where adaptive
        sampling controls the noise (constant steps, as in Byrd et al. 2012) or, on full
        batches with tau="auto", deterministic SCA (majorization-minimization); else
        :meth:`_steps`."""
        if self.unit_steps and (self.auto_batch or (self._full(state) and self.auto_tau)):
            return 1.0, 1.0
        return self._steps(state, t)

    def _guarded_step(self, state, fresh, r, g, nonfinite: bool):
        """A full-batch round outside the backtracking regime, kept monotone in the exact
        penalty F_0 + R + c sum (F_m - U_m)_+ (Problem 5's merit) by the step fraction alone:
        the user's tau, surrogates and schedules stay as given. ``fresh``: this round's
        statistics, the full data's at w_t (not yet averaged with rho_t).

        If the merit at w_t is not above the last accepted point's (up to the rounding of the
        merit and the subproblem solver's accuracy), w_t is accepted and eq. (updatew) moves
        from it with gamma_t times ``shrink``; else w_t is taken back and the step from the
        last accepted point is retried with ``shrink`` halved (one round per halving: the
        merit at the new trial point is only known from the next round's replies). A fixed
        tau far below the curvature (tau = 1e-6 against 1.26: steps 6e5 times too long at
        gamma_1 = 0.9) raised DivergenceError at round 3; a DiagonalCurvature whose diagonal
        is no majoriser (uncentred features: the Hessian's top eigenvalue about d times the
        diagonal) at round 31. Now the steps are shortened until they descend: gradient
        descent with a line search on gamma, slow where tau is far too small, never
        divergent."""
        if nonfinite and not len(state.prev_stats):
            # clients reject non-finite values only at a tentative point, which has one
            raise RuntimeError("a function was not finite at w_t and no accepted point "
                               "exists to step back to")
        merit = np.inf if nonfinite else self._merit(fresh, state.w, state.penalty)
        reference = state.merit
        worse = (len(state.prev_stats) > 0 and np.isfinite(reference)
                 and (np.isnan(merit) or self._merit_rose(merit, reference, fresh, state.w)))
        if worse:
            # the retry starts the averages afresh from the accepted point's own statistics
            # (rho = 1: a surrogate with F's gradient there, so its step descends; averaged
            # ones need not, and halving gamma along them did not help: 34 rejections in a
            # row at tau = 0.1). The first rejection of a step that came from averages only
            # restarts them; each later one also halves gamma.
            base_w, base = state.prev_w, state.prev_stats
            self._rejected_length = (float(np.linalg.norm(state.w - base_w))
                                     / max(1.0, float(np.linalg.norm(base_w))))
            # (rho of the rejected step's round, from the state: a resume decides the same)
            averaged = (state.rejects == 0 and state.t >= 1
                        and self._round_steps(state, state.t)[0] < 1.0)
            shrink = state.shrink if averaged else 0.5 * state.shrink
            new, info = ssca_step.move(state._replace(w=base_w), base, 1.0, g * shrink,
                                       self.subproblem)
            new = new._replace(prev_w=base_w.copy(), prev_stats=base, merit=reference,
                               rejects=state.rejects + 1, shrink=shrink)
            return new, _Info(info, None, self._tau(state), 0.0, 1)
        stats = fresh if r == 1.0 else ssca_step.average_statistics(state.stats, fresh, r)
        new, info = ssca_step.move(state, stats, r, g * state.shrink, self.subproblem)
        new = new._replace(prev_w=state.w.copy(), prev_stats=fresh, merit=merit, rejects=0)
        return new, _Info(info, None, self._tau(state), 0.0, 0)

    def _steps(self, state, t):
        """rho_t and gamma_t of eqs. (rho)/(gamma) (the solve resolved "auto" to the defaults
        of its regime, :func:`ssca_solver.schedules.resolve`); an EpochStep counts passes over
        the data: R = N / (rows read per round) rounds per epoch, at the batch in force (with
        batch_size="auto" the batch grows, and so does the clock's speed)."""
        return self._steps_at(self._batch(state), t)

    def _steps_at(self, batch, t):
        """rho_t, gamma_t with ``batch`` rows per client (None: all): the EpochStep clock runs
        R = N / ((K/I) sum_i min(B, N_i)) rounds per epoch."""
        rows = (float(self.num_samples) if batch is None
                else float(sum(min(int(batch), int(n)) for n in self.sizes)))
        R = self.num_samples / max(rows * self.participation, 1e-300)
        return (step_value(at_epochs(self.rho, R), t, "rho"),
                step_value(at_epochs(self.gamma, R), t, "gamma"))

    def _screened(self, replies, t, noise, nonfinite):
        """Strip and add up the noise numbers; leave out (and list in ``nonfinite``) the
        replies of clients whose functions were not finite at the trial point; at round 1
        check the first message's surrogates for strong convexity (Assumption 2)."""
        p = self.problem
        key = ad.NOISE.rstrip(":")
        for i, reply in enumerate(replies):
            if NONFINITE in reply.arrays:
                nonfinite.append(reply.client)
                continue
            if key in reply.arrays and reply.client == AGGREGATE:     # already the shares
                noise += reply.weight ** 2 * np.asarray(reply.arrays[key], dtype=float)
            elif key in reply.arrays:
                # h_i^2: the variance of h_i x_i is h_i^2 that of x_i
                noise += [reply.weight ** 2 * ad.variance_share(
                    float(v), reply.num_rows, reply.batch_size, self.num_samples)
                    for v in reply.arrays[key]]
            if key in reply.arrays:
                reply = replace(reply, arrays={k: v for k, v in reply.arrays.items()
                                               if k != key})
            if t == 1 and i == 0:
                for m, (fn, b) in enumerate(zip(p.functions, self.builders)):
                    if not b.strongly_convex:        # an equality's affine surrogate
                        continue
                    st = {k: array(reply, ssca_step.stat_key(m, k))
                          for k in (s.name for s in b.statistic_specs(p.dim))}
                    check_strongly_convex(b, st, p.dim, fn.name)
            yield reply
            del reply

    def _adapt_batch(self, new, w, stats, noise, sol):
        """The norm test: double the batch while the Lagrangian's noise exceeds its size."""
        weights = np.concatenate(([1.0] if self.problem.objective is not None else [],
                                  np.asarray(sol.multipliers, dtype=float)))
        grad = self._lagrangian_gradient(stats, w, weights)
        if grad is None:
            return new, 0.0
        variance = float(np.sum(weights ** 2 * noise))
        ratio = variance / max(float(grad @ grad), 1e-300)
        avg = (1 - ad.NOISE_AVERAGING) * new.noise + ad.NOISE_AVERAGING * ratio
        since = new.since + 1
        if (avg > ad.NOISE_RATIO and since >= ad.MIN_ROUNDS) or since >= ad.GROW_EVERY:
            return new._replace(batch=int(new.batch * ad.GROWTH), noise=0.0, since=0), ratio
        return new._replace(noise=avg, since=since), ratio

    def _lagrangian_gradient(self, stats, w, weights):
        total = None
        for c, st in zip(weights, stats):
            gm = ad.surrogate_gradient(st, w)
            if gm is None:
                return None
            total = c * gm if total is None else total + c * gm
        det = self.problem.deterministic
        if self.ridge is not None:
            total = total + 2.0 * self.ridge * w
        elif det.smooth:
            total = total + det.grad(w)
        return total

    def _merit(self, stats, w, penalty) -> float:
        """F_0 + R + c sum (F_m - U_m)_+ (c |F_m - U_m| for an equality) at w from full-batch
        statistics taken at w: the exact penalty of Problem 5."""
        values = [b.evaluate(st, w) for b, st in zip(self.builders, stats)]
        k = 1 if self.problem.objective is not None else 0
        det = (self.ridge * float(w @ w) if self.ridge is not None
               else self.problem.deterministic.value(w))
        obj = (values[0] if k else 0.0) + det
        violation = excess(np.asarray(values[k:]) - self.problem.bounds, self.equality)
        return float(obj + penalty * np.sum(np.maximum(violation, 0.0)))

    def _merit_rose(self, merit: float, reference: float, stats, w) -> bool:
        """The merit at w (from ``stats`` taken there) is above ``reference`` by more than
        rounding: an increase within the subproblem solver's accuracy (MERIT_RTOL) is rounding,
        not a bad step; and so is one within the rounding of the merit itself, which the
        statistics give as const + lin.w + quad |w|^2, terms far larger than the value when
        tau is large (MERIT_ROUNDING of their size)."""
        rtol = ad.MERIT_RTOL.get(getattr(self.subproblem, "name", ""), 1e-9)
        noise = ad.MERIT_ROUNDING * self._merit_size(stats, w) if np.isfinite(merit) else 0.0
        return merit > reference + max(rtol * max(1.0, abs(reference)), noise)

    def _merit_size(self, stats, w) -> float:
        """The size of the terms the merit is computed from (its rounding is ~1e-16 of it)."""
        size = 0.0
        for b, st in zip(self.builders, stats):
            form = b.quadratic_form(st)
            if form is None:
                return 0.0
            a, lin, const = form
            size += abs(a) * float(w @ w) + abs(float(lin @ w)) + abs(const)
        return size

    def _backtracking_step(self, state, stats, nonfinite: bool = False):
        """Full batches: accept the step to w_t if the merit did not increase (then tau shrinks),
        else retry from the last accepted point with tau doubled; a step to a point where
        some function is not finite (``nonfinite``: a client said so) is rejected too."""
        # whether this round rejects a step to a non-finite point (:meth:`_unsafe_trial`)
        self._nonfinite_trial = bool(nonfinite)
        if nonfinite:
            k, base_w, base, base_merit = ad.TAU_UP, state.prev_w, state.prev_stats, state.merit
            return self._retry(state, k, base_w, base, base_merit, True)
        c_merit = self._merit_penalty(state)
        merit = self._merit(stats, state.w, c_merit)
        reference = state.merit
        if (self.M and self._model_on(state) and len(state.prev_stats)
                and np.isfinite(state.merit)):
            # both points judged by the same exact penalty (the stored merit may have been
            # computed with another weight)
            reference = self._merit(state.prev_stats, state.prev_w, c_merit)
        worse = (np.isfinite(state.merit) and len(state.prev_stats)
                 and self._merit_rose(merit, reference, stats, state.w))
        corrected, self._corrected = getattr(self, "_corrected", False), False
        if worse and not corrected and self._model_on(state):
            # a quasi-Newton step rejected: first the second-order correction (a full SQP step
            # near a curved active constraint raises the exact penalty to second order, the
            # Maratos effect; Nocedal & Wright, sec. 15.6), then a tau that shortens it
            correction = self._second_order_correction(state, stats)
            if correction is not None:
                return correction
        if worse:                                    # reject w_t
            self._rejected_length = (float(np.linalg.norm(state.w - state.prev_w))
                                     / max(1.0, float(np.linalg.norm(state.prev_w))))
            if not corrected and self._pinned(state):
                # doubling tau did not shorten the trial steps: without the diagonal metric
                # if there is one, else one second-order correction before tau doubles again
                if state.metric.size:
                    state = state._replace(metric=np.zeros((0, 0)))
                else:
                    correction = self._second_order_correction(state, stats)
                    if correction is not None:
                        return correction
            k, base_w, base, base_merit = ad.TAU_UP, state.prev_w, state.prev_stats, state.merit
            if self._model_on(state):
                # tau far below the model's curvature does not shorten the step when doubled
                # (a run of 8 rejections at tau 1e-8 against curvatures of 1e-1 settled a point
                # 7e-4 from stationary): at least the model's scale delta / 2 on the curvature
                delta = self._model(state).delta
                k = max(k, ad.MODEL_REJECT * delta / max(self._tau(state), 1e-300))
        else:
            self._track_progress(state, merit, stats, c_merit)
            state = self._with_pair(state, stats)
            # with a curvature model tau is the regularisation of a quasi-Newton step, not the
            # curvature: it falls faster while steps are accepted
            k = ad.TAU_DOWN_MODEL if self._model_on(state) else ad.TAU_DOWN
            base_w, base, base_merit = state.w, stats, merit
            self._rejected_trial = None
            step = (float(np.linalg.norm(state.w - state.prev_w))
                    / max(1.0, float(np.linalg.norm(state.w))) if len(state.prev_w) else 1.0)
            if step <= ad.TINY_STEP:
                # an accepted step lost in rounding: a fixed point, or a tau far above the
                # curvature (w of size 1e-6 on features scaled by 1e6: steps of 1e-13 are
                # progress there); tau falls by TAU_TINY, not TAU_DOWN, and the point is
                # settled only after TINY_ROUNDS such steps with none longer than
                # 100 TINY_STEP in between (at a kink the steps hover about TINY_STEP)
                k = ad.TAU_TINY
                self._tiny = getattr(self, "_tiny", 0) + 1
            elif step > 100 * ad.TINY_STEP:
                self._tiny = 0
        return self._retry(state, k, base_w, base, base_merit, worse)

    def _merit_penalty(self, state) -> float:
        """The exact penalty's weight in the merit test: c (Problem 5's), or with the model
        min(c, max(MERIT_MULTIPLIERS max_m |nu_m|, MERIT_FLOOR c)), nu the multipliers of the
        step's subproblem. Any weight above the multipliers makes the merit exact (Nocedal &
        Wright, Thm 17.3); the smallest safe one lets an SQP step along a curved active
        constraint through, where c = 100 against a multiplier of 0.8 rejected every second
        step (a second-order correction each time) on least squares on diabetes. The floor
        MERIT_FLOOR c = c / 10^4 (c / 100 before): at c = 100 a floor of 1 against a
        multiplier of 0.026 (logistic regression on breast cancer s.t. mean (x.w)^2 <= 4)
        rejected every full step and took 87 second-order corrections in 197 rounds; with
        the weight 2 |nu| = 0.05, 110 rounds and 5 rejections. Both points of a comparison
        are judged with the same weight."""
        c = state.penalty
        if not (self.M and self._model_on(state)) or not state.nu.size:
            return c
        nu = float(np.max(np.abs(state.nu)))
        return min(c, max(ad.MERIT_MULTIPLIERS * nu, ad.MERIT_FLOOR * c))

    def _track_progress(self, state, merit: float, stats, c_merit: float) -> None:
        """With the model: rounds since the merit last fell by more than MERIT_PROGRESS of its
        size below the best point's. At a kink of F (|w| at 0) the quasi-Newton steps hover at
        1e-11 without settling by step length; STALL_ROUNDS accepted rounds without progress
        settle the point (:meth:`settled`). The best point's merit is recomputed with this
        round's weight ``c_merit`` (from its statistics): the weight follows the multipliers,
        and a best merit kept from a round with a smaller weight made 30 rounds of progress
        look like none (S2MPJ's TENBARS1 settled at round 96 of 800 at c = 1e5 while its
        violation was still falling)."""
        if not self._model_on(state) or not np.isfinite(state.merit):
            self._best, self._stall = (state.w, stats), 0
            return
        best = getattr(self, "_best", None)
        best_merit = (np.inf if best is None or len(best[0]) != len(state.w)
                      else self._merit(best[1], best[0], c_merit))
        if (not np.isfinite(best_merit)
                or merit < best_merit - ad.MERIT_PROGRESS * max(1.0, abs(best_merit))):
            self._best, self._stall = (state.w, stats), 0
        else:
            self._stall = getattr(self, "_stall", 0) + 1

    def _second_order_correction(self, state, stats):
        """After a rejected step that made the constraints' violation worse than the model
        said: the same subproblem at the last accepted point and the same tau, with every
        constraint's surrogate shifted by its model error at the trial point, F_m(w_t) -
        p_m(w_t) (the statistics at w_t give F_m(w_t); the base statistics give the model).
        This is the second-order correction of SQP methods (Fletcher; Nocedal & Wright,
        Numerical Optimization, sec. 15.6): near a curved constraint the linearised step
        restores feasibility only to first order, the exact penalty then rises, and a larger
        tau does not shorten a step that the linearised constraints pin (S2MPJ's ALLINITC:
        8 rejections with trial steps of 0.02 to 0.05 at tau 41 to 5300, then c raised three
        times and tau 2e13, then a subproblem the solver called unbounded). One round; if its
        point is rejected too, the backtracking doubles tau as before. None when it does not
        apply (no constraints, a builder without a constant statistic, or the violation did
        not grow)."""
        k0 = 1 if self.problem.objective is not None else 0
        if not self.M or not len(state.prev_stats) or len(state.prev_w) == 0:
            return None
        base = state.prev_stats
        if not all("const" in base[m] for m in range(k0, len(self.builders))):
            return None
        true = np.array([self.builders[m].evaluate(stats[m], state.w)
                         for m in range(k0, len(self.builders))])
        model = np.array([self.builders[m].evaluate(base[m], state.w)
                          for m in range(k0, len(self.builders))])
        before = np.array([self.builders[m].evaluate(base[m], state.prev_w)
                           for m in range(k0, len(self.builders))])
        bounds = self.problem.bounds

        def violation(v):
            return float(np.sum(np.maximum(excess(v - bounds, self.equality), 0.0)
                                / self.bound_scale))

        if not (np.all(np.isfinite(true)) and violation(true) > violation(before)
                and violation(true) > violation(model)):
            return None
        corrected = list(base)
        for j, m in enumerate(range(k0, len(self.builders))):
            st = dict(base[m])
            st["const"] = np.asarray(np.asarray(st["const"], dtype=float) + (true[j] - model[j]))
            corrected[m] = st
        start = state._replace(w=state.prev_w)
        try:
            new, info = ssca_step.move(start, tuple(corrected), 1.0, 1.0,
                                       self._solver(state, state.prev_w))
        except SubproblemError:
            return None        # no correction: the backtracking goes on with tau

        new = new._replace(tau=self._tau(state), merit=state.merit,
                           prev_w=state.prev_w.copy(), prev_stats=base,
                           rejects=state.rejects + 1)
        self._corrected = True
        return new, _Info(info, None, self._tau(state), 0.0, 1)

    def _pinned(self, state) -> bool:
        """After a rejected step: doubling tau did not shorten the rejected trial steps (the
        second rejection in a row, or later, with a trial step above METRIC_SHRINK of the one
        before). Backtracking rests on steps that shrink as tau grows. Two things pin them:
        a diagonal metric entry near 0 (squared gradients that vanish along a coordinate: an
        objective linear in it), along which moving costs nothing, and linearised constraints
        that the step must restore (min -x_1 s.t. |x|^2 = 1 from (1.1, 0.1) with the metric:
        every trial about 1.1 long, 8 rejections, a stop at violation 1.2 -- S2MPJ's MARATOS;
        ALLINITC without one). The caller drops the metric, or else tries a second-order
        correction."""
        trial = float(np.linalg.norm(state.w - state.prev_w))
        before = getattr(self, "_rejected_trial", None)
        self._rejected_trial = trial
        if state.rejects >= 1 and before is not None and trial > ad.METRIC_SHRINK * before:
            self._rejected_trial = None
            return True
        return False

    def _retry(self, state, k, base_w, base, base_merit, worse):
        """The subproblem at ``base_w`` with tau multiplied by ``k`` (the backtracking's next
        step from the accepted or the last accepted point)."""
        if self._model_on(state):
            # tau stays above MODEL_TAU_FLOOR of the model's scale: 1e-132 against curvatures
            # of 1e-1 left Clarabel's Problem 5 so badly scaled that it called it infeasible
            floor = ad.MODEL_TAU_FLOOR * self._model(state).delta
            k = max(k, floor / max(self._tau(state), 1e-300))
        scaled = tuple(ad.rescale_tau(st, base_w, k) for st in base)
        start = state._replace(w=base_w)
        try:
            new, info = ssca_step.move(start, scaled, 1.0, 1.0, self._solver(state, base_w))
        except SubproblemError:
            if not self._model_on(state):
                raise
            # the subproblem with the model failed every retry of the solver (a tau far
            # below the model's curvature leaves the solver an ill-posed problem): this
            # round's step without the model at a tau of the model's scale (the paper's
            # surrogate), and the model starts afresh
            delta = self._model(state).delta
            k = max(k, delta / max(self._tau(state), 1e-300))
            scaled = tuple(ad.rescale_tau(st, base_w, k) for st in base)
            start = start._replace(qn_s=np.zeros((0, 0)), qn_y=np.zeros((0, 0)))
            new, info = ssca_step.move(start, scaled, 1.0, 1.0, self.subproblem)
            warnings.warn(f"round {state.t + 1}: the subproblem with the quasi-Newton model "
                          "failed; the round's step was taken without it and the model was "
                          "reset", RuntimeWarning, stacklevel=2)
        new = new._replace(tau=self._tau(state) * k, merit=base_merit, prev_w=base_w.copy(),
                           prev_stats=scaled, rejects=state.rejects + 1 if worse else 0)
        return new, _Info(info, None, self._tau(state) * k, 0.0, int(bool(worse)))

    def settled(self, state, info) -> bool:
        """Deterministic SCA (full batches, unit steps) at a fixed point: TINY_ROUNDS accepted
        steps of relative length <= TINY_STEP (1e-12) with none above 100 TINY_STEP in
        between (tau cut by TAU_TINY after each), or MAX_REJECTS rejected steps in a row.
        More rounds at this c change nothing. In the guarded full-batch regime
        (:meth:`_guarded_step`): MAX_REJECTS rejections in a row whose last trial step was at
        most TINY_STEP max(1, |w|) long (gamma shrunk to rounding), or GUARD_REJECTS."""
        if self._guarded(state) and info.batch is None:
            return bool(state.rejects >= ad.GUARD_REJECTS
                        or (state.rejects >= ad.MAX_REJECTS
                            and getattr(self, "_rejected_length", 1.0) <= ad.TINY_STEP))
        if not (info.batch is None and self.unit_steps and (self.auto_batch or self.auto_tau)):
            return False
        if state.rejects >= ad.MAX_REJECTS:
            # no step improves the merit at this precision: the trial steps have become short,
            # or tau grew long enough that they should have. Eight rejections alone settled
            # trial steps of 0.6 relative (half of them second-order corrections at the same
            # tau, so tau grew 16-fold): logistic regression on iris with |w|^2 = 4 ended
            # 'max_iter' at objective 0.99 where SLSQP finds 0.245
            if (state.rejects >= ad.MAX_REJECTS_LONG
                    or getattr(self, "_rejected_length", 0.0) <= ad.SETTLE_STEP):
                return True
        if self._saturated(state, info):
            return True
        if info.rejected == 0 and getattr(self, "_stall", 0) >= ad.STALL_ROUNDS:
            self._stall = 0
            return True
        return info.rejected == 0 and getattr(self, "_tiny", 0) >= ad.TINY_ROUNDS

    def _saturated(self, state, info) -> bool:
        """The penalty follows the multipliers (issue 19): with the quasi-Newton model (tau a
        small regularisation, so the linearised constraints are nearly what the step sees), an
        accepted step whose subproblem keeps a slack above ``slack_tol`` with a multiplier at
        the box bound |nu_m| = c says that c is below what an exact penalty needs; SATURATED
        such rounds in a row end the stage (when a larger c is left), and :meth:`next_stage`
        counts them as evidence. A digits network spent its whole first stage (1000 rounds)
        infeasible at c = 100 below its multiplier 144 before c was raised."""
        sol = info.step.solution
        if not (self.M and self._model_on(state)
                and state.penalty < max(self.penalties)):
            self._saturation = 0
            return False
        if info.rejected:
            return False
        nu = np.abs(np.asarray(sol.multipliers, dtype=float))
        slack = np.asarray(sol.slack, dtype=float) / self.bound_scale
        tol = self.opts.slack_tol if self.opts is not None else 1e-3
        at_c = nu >= state.penalty * (1.0 - 1e-9)
        # and the full-data KKT fit of this round agrees (a multiplier of at least c / 2):
        # the subproblem alone saturates while the model is still poor (least squares on
        # diabetes, multiplier 0.82: c went from 100 to 10^4 in 30 rounds, and the run then
        # took 120 more at a badly conditioned c)
        mu = getattr(self, "_last_multipliers", np.zeros(0))
        fitted = mu.size == nu.size and np.any(mu >= 0.5 * state.penalty)
        # or the forces that balance the gradients at the last accepted point say so: at a
        # point that violates the constraint the KKT fit, which also asks mu (F - U) = 0, is
        # pulled toward 0 (a network on digits at c = 30: a fit of 7 while the forces were
        # 30, and the stage spent its budget at c = 30)
        if not fitted and np.any(at_c & (slack > tol)):
            force = self._force_multipliers(state)
            fitted = force is not None and bool(np.any(
                at_c & (slack > tol) & (np.abs(force) >= 0.5 * state.penalty)))
        if fitted and np.any(at_c & (slack > tol)):
            self._saturation = getattr(self, "_saturation", 0) + 1
        else:
            self._saturation = 0
        if self._saturation >= ad.SATURATED:
            self._saturation = 0
            self._c_too_small = True
            return True
        return False

    def _force_multipliers(self, state) -> Optional[np.ndarray]:
        """The multipliers that balance the gradients alone at the last accepted full-batch
        point (:func:`ssca_solver.diagnostics.kkt.force_multipliers`, from the statistics the
        round already has: no evaluation), when they explain at least three quarters of
        |grad F_0 + grad R|^2 (else the point is far from stationary for any c and they say
        nothing); None without full-batch statistics or with a domain or a nonsmooth term
        (whose multipliers enter the balance)."""
        w, stats = state.prev_w, state.prev_stats
        if not (len(stats) and len(w) == len(state.w)) or self.M == 0:
            return None
        det = self.problem.deterministic
        if self.ridge is None and not det.smooth:
            return None
        k = 1 if self.problem.objective is not None else 0
        grads = [ad.surrogate_gradient(st, w) for st in stats[k:]]
        g = self._lagrangian_gradient(stats, w, [1.0] * k + [0.0] * self.M)
        if g is None or any(gm is None for gm in grads):
            return None
        G = np.column_stack(grads)
        size = float(np.linalg.norm(g))
        if not (size > 0.0 and np.isfinite(size) and np.all(np.isfinite(G))):
            return None                  # nothing to balance (no objective, or at its minimum)
        try:
            force = kkt_forces(g, G, self.equality)
        except (RuntimeError, ValueError, np.linalg.LinAlgError):
            return None                  # a fit that fails is no evidence; the run goes on
        if not (np.linalg.norm(g + G @ force) <= 0.5 * size):
            return None
        return force

    def record(self, info) -> dict:
        sol = info.step.solution
        return {"rho": info.step.rho, "gamma": info.step.gamma, "penalty": info.step.penalty,
                "slack": sol.slack, "multipliers": sol.multipliers,
                "surrogate_value": sol.value, "step_norm": info.step.step_norm,
                "retries": sol.retries, "inaccurate": float(sol.inaccurate),
                "batch_size": np.nan if info.batch is None else info.batch,
                "tau": info.tau, "noise_ratio": info.noise_ratio,
                "rejected": info.rejected}

    def describe(self, info) -> str:
        s = info.step
        text = f"round {s.t:>5d}  B={'full' if info.batch is None else info.batch}"
        if self.M:
            text += f"  c={s.penalty:<8.2g} |slack|={np.linalg.norm(s.solution.slack):.3g}"
        return text + f"  surrogate={s.solution.value:.5g}"

    # -- checkpoints -------------------------------------------------------------------------------
    def state_arrays(self, state: ssca_step.SSCAState) -> dict:
        out = {"t": np.asarray(state.t), "w": state.w, "penalty": np.asarray(state.penalty),
               "nu": state.nu, "batch": np.asarray(state.batch), "tau": np.asarray(state.tau),
               "noise": np.asarray(state.noise), "since": np.asarray(state.since),
               "merit": np.asarray(state.merit), "prev_w": state.prev_w,
               "rejects": np.asarray(state.rejects), "metric": state.metric,
               "qn_s": state.qn_s, "qn_y": state.qn_y, "shrink": np.asarray(state.shrink),
               "kappa": np.asarray(state.kappa)}
        for name, group in (("stats", state.stats), ("prev_stats", state.prev_stats)):
            for m, st in enumerate(group):
                for k, v in st.items():
                    out[f"{name}/{m}/{k}"] = np.asarray(v)
        at = getattr(self, "_memory_at", None)
        out.update(at[1] if at is not None and at[0] == state.t else self._memory())
        return out

    def state_from_arrays(self, arrays) -> ssca_step.SSCAState:
        def group(name, required):
            out = []
            for m, b in enumerate(self.builders):
                st = {}
                for spec in b.statistic_specs(self.problem.dim):
                    key = f"{name}/{m}/{spec.name}"
                    if key not in arrays:
                        if not required:
                            return ()
                        raise ValueError(f"resume: the checkpoint has no statistic {key!r}: "
                                         "it was written for other surrogate builders")
                    st[spec.name] = np.array(arrays[key], dtype=float).reshape(spec.shape)
                out.append(st)
            return tuple(out)

        state = ssca_step.SSCAState(
            int(arrays["t"]), np.array(arrays["w"], dtype=float), group("stats", True),
            float(arrays["penalty"]), np.array(arrays["nu"], dtype=float),
            int(arrays["batch"]), float(arrays["tau"]), float(arrays["noise"]),
            int(arrays["since"]), float(arrays["merit"]),
            np.array(arrays["prev_w"], dtype=float), group("prev_stats", False),
            int(arrays["rejects"]),
            np.array(arrays["metric"], dtype=float) if "metric" in arrays else np.zeros((0, 0)),
            *(np.array(arrays[k], dtype=float) if k in arrays else np.zeros((0, 0))
              for k in ("qn_s", "qn_y")),
            _shrink(arrays), _kappa(arrays))
        self._restore_memory(arrays)
        return state

    # what the method remembers from round to round outside the state (counters of the
    # settling and penalty tests, the backtracking's last trial, the best point and the last
    # KKT fit): checkpointed with the state, so that a resumed run takes the decisions the
    # uninterrupted one takes (resumed in the middle of a count of saturated rounds, a run
    # raised c two to four rounds late and took 49 or 51 rounds instead of 48)
    _COUNTS = ("_tiny", "_stall", "_saturation")
    _FLAGS = ("_c_too_small", "_corrected", "_nonfinite_trial")
    _LENGTHS = ("_rejected_length", "_rejected_trial")

    def _memory(self) -> dict:
        """The memory as checkpoint arrays (prefix ``mem/``; absent attributes absent)."""
        out = {}
        for name in self._COUNTS + self._FLAGS + self._LENGTHS:
            value = getattr(self, name, None)
            if value is not None:
                out[f"mem/{name[1:]}"] = np.asarray(float(value))
        best = getattr(self, "_best", None)
        if best is not None:
            out["mem/best_w"] = np.asarray(best[0], dtype=float)
            for m, st in enumerate(best[1]):
                for k, v in st.items():
                    out[f"mem/best/{m}/{k}"] = np.asarray(v)
        if hasattr(self, "_last_multipliers"):
            out["mem/report_multipliers"] = self._last_multipliers
        return out

    def _restore_memory(self, arrays) -> None:
        """The memory from :meth:`_memory`'s arrays (none in an older checkpoint: a fresh
        memory)."""
        for name in self._COUNTS + self._FLAGS + self._LENGTHS + ("_best", "_last_multipliers",
                                                                 "_memory_at"):
            self.__dict__.pop(name, None)
        for name in self._COUNTS + self._FLAGS + self._LENGTHS:
            key = f"mem/{name[1:]}"
            if key in arrays:
                value = float(arrays[key])
                setattr(self, name, int(value) if name in self._COUNTS
                        else bool(value) if name in self._FLAGS else value)
        if "mem/best_w" in arrays:
            stats = {}
            for key, v in arrays.items():
                if key.startswith("mem/best/"):
                    m, k = key[len("mem/best/"):].split("/", 1)
                    stats.setdefault(int(m), {})[k] = np.array(v, dtype=float)
            self._best = (np.array(arrays["mem/best_w"], dtype=float),
                          tuple(stats[m] for m in sorted(stats)))
        if "mem/report_multipliers" in arrays:
            self._last_multipliers = np.array(arrays["mem/report_multipliers"], dtype=float)


def _shrink(arrays) -> float:
    """The guarded rounds' factor on gamma from a checkpoint (1 in one written before it)."""
    if "shrink" not in arrays:
        return 1.0
    value = float(arrays["shrink"])
    if not 0.0 < value <= 1.0:
        raise ValueError(f"resume: the checkpoint's state/shrink is {value!r}; it must be in "
                         "(0, 1]")
    return value


def _kappa(arrays) -> float:
    """The own-curvature factor from a checkpoint (1 in one written before it)."""
    if "kappa" not in arrays:
        return 1.0
    value = float(arrays["kappa"])
    if not (np.isfinite(value) and value >= 1.0):
        raise ValueError(f"resume: the checkpoint's state/kappa is {value!r}; it must be a "
                         "finite number >= 1")
    return value


class _Info:
    """A round's StepInfo with what the adaptive defaults did."""

    __slots__ = ("step", "batch", "tau", "noise_ratio", "rejected")

    def __init__(self, step, batch, tau, noise_ratio, rejected):
        self.step, self.batch, self.tau = step, batch, tau
        self.noise_ratio, self.rejected = noise_ratio, rejected

    @property
    def t(self):
        return self.step.t

    @property
    def solution(self):
        return self.step.solution

    @property
    def step_norm(self):
        return self.step.step_norm

