"""Algorithms 1 and 2 (mini-batch SSCA) as a method of the one front door and round loop.

:class:`SSCA` holds only what a solve fixes before round 1 (:class:`.settings.Settings`);
everything it carries from round to round is its state (:class:`.state.SSCAState`). It
delegates by concern:

* :mod:`.step`: one round's arithmetic (eqs. (Fs0bar)/(Fsmbar), Problem 2/5, eq. (updatew));
* :mod:`.probe`: before round 1, the gradient check and the curvature (the starting tau);
* :mod:`.acceptance`: on full batches, the exact-penalty merit test and backtracking;
* :mod:`.continuation`: the penalty stages of Theorem 2 and when a stage ends;
* :mod:`.evidence`: the status at the end;
* :mod:`.adaptive`: the defaults that need no tuning (constants, client tasks, formulas).
"""

from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Mapping, Optional

import numpy as np

from ... import status as st
from ...engine.method import Method
from ...engine.options import describe_schedule
from ...federated.accounting import DP_EXEMPT, DP_NOISE
from ...federated.messages import AGGREGATE, SELECTS, Request, aggregation_weight, array
from ...model.surrogates import check_all_strongly_convex
from ...schedules import check_schedules, resolve
from ...subproblems import make_subproblem
from . import acceptance
from . import adaptive as ad
from . import continuation
from . import evidence
from . import newton
from . import privacy
from . import probe
from . import quasi_newton as qn
from . import state as ssca_state
from . import step as ssca_step
from . import merit as merit_mod
from .merit import lagrangian_gradient
from .client import (CURVATURE_OF, DP_CLIP, DP_LEVEL, NONFINITE, REJECT_NONFINITE, SKETCH,
                     TASK, SSCARoundTask)
from .options import SSCAOptions
from .settings import Settings
from .state import SSCAState
from .step import RoundInfo

CHECK_RTOL = ad.CHECK_RTOL


class SSCA(Method):
    """Mini-batch SSCA: Algorithm 1, or Algorithm 2 inside the penalty continuation of
    Theorem 2, over the runner's protocol.

    Args:
      problem: the :class:`~ssca_solver.Problem`.
      options: its parsed :class:`~ssca_solver.SSCAOptions`.
      builders: the surrogate builders of its stochastic functions, read when the solve starts.
      subproblem: the subproblem solver (closed form or CVXPY).
      rho: the resolved step-size schedule of eq. (rho) (an :class:`~ssca_solver.EpochStep`
        runs on the clock of passes over the data).
      gamma: the resolved step-size schedule of eq. (gamma), as ``rho``.
      unit_steps: rho = gamma = 1 on full batches (with the adaptive batch size or tau).
      participation: the expected fraction of the clients in a round (K / I), for that clock.
      sampled_clients: K < I clients per round, or proportional draws (the rounds' statistics
        are random even on full batches: ``tau="auto"`` is then :func:`.probe.sampled_tau`).
    """

    name = "ssca"
    Options = SSCAOptions
    supports_secure_aggregation = True     # the server reads only weighted sums of replies
    certifies = True

    def __init__(self, problem, *, options: SSCAOptions, builders, subproblem, rho, gamma,
                 unit_steps: bool = True, participation: float = 1.0,
                 sampled_clients: bool = False):
        self.problem = problem
        self.opts = options
        self.config = Settings.build(problem, builders=builders, subproblem=subproblem,
                                     options=options, rho=rho, gamma=gamma,
                                     unit_steps=unit_steps, participation=participation,
                                     sampled_clients=sampled_clients)
        self.kkt_solver = options.solver
        self.eval_budget = options.eval_budget
        # the quasi-Newton pairs take 2 * memory rows of d floats in a checkpoint, the Newton
        # model's Hessian d rows, its sketch k
        self.state_rows = max(2 * self.config.qn_memory,
                              (self.config.sketch_rank or problem.dim) + 2
                              if self.config.newton else 0)
        self.columns = {"rho": (), "gamma": (), "penalty": (), "slack": (self.config.M,),
                        "multipliers": (self.config.M,), "surrogate_value": (),
                        "step_norm": (), "retries": (), "inaccurate": (), "batch_size": (),
                        "tau": (), "noise_ratio": (), "rejected": ()}
        #: what the probe found before round 1 about a fixed tau (for a DivergenceError)
        self.unstable_tau: Optional[tuple] = None
        #: differential privacy's mechanism and accountant (None without privacy)
        self.privacy: Optional[privacy.Plan] = None
        if options.privacy is not None:
            K = options.clients_per_round
            I = problem.data.num_clients
            self.privacy = privacy.Plan(options.privacy, problem.data.client_sizes,
                                        options.batch_size, options.max_iter,
                                        weight_factor=1.0 if K is None else I / K,
                                        noised=len(problem.functions) * (problem.dim + 1),
                                        secure_range=options.secure_range,
                                        parties=I if K is None else K, per_round=K)
            self.columns["epsilon"] = ()
            self.evaluates_result = False

    # -- building (the front door) --------------------------------------------------------------
    @classmethod
    def parse(cls, problem, options: dict) -> SSCAOptions:
        return super().parse(problem, options).checked(problem, options)

    @classmethod
    def build(cls, problem, o: SSCAOptions, given: dict) -> "SSCA":
        """Algorithm 1, or Algorithm 2 inside the penalty continuation of Theorem 2, with the
        step-size regime the options ask for."""
        # with K < I clients per round even full batches give a random estimate (the draw of
        # the clients): the paper's diminishing rho and gamma, not deterministic SCA's unit
        # steps (proportional draws are with replacement: random even with K = I)
        sampled = o.clients_per_round is not None and (
            o.clients_per_round < problem.data.num_clients or o.participation == "proportional")
        # under differential privacy every round's statistics carry noise: the schedules of
        # sampled rounds, whatever the batch
        private = o.privacy is not None
        # "auto" schedules: the round-counted ones when every round has exact statistics (full
        # rows of every client), the epoch-counted ones otherwise (fixed B, "auto", K < I)
        exact = o.batch_size is None and not sampled and not private
        rho, gamma = resolve(o.rho, "rho", exact), resolve(o.gamma, "gamma", exact)
        check_schedules(rho, gamma, stochastic=o.batch_size is not None or private)
        builders = problem.builders             # the functions' surrogates as they are now
        subproblem = make_subproblem(problem, builders, o.subproblem, o.solver,
                                     o.solver_options)
        # the expected fraction of the clients in a round, for the epoch clock of EpochStep:
        # K/I (proportional draws: K with replacement, distinct clients fewer; K/I is near)
        participation = (1.0 if o.clients_per_round is None
                         else min(1.0, o.clients_per_round / problem.data.num_clients))
        return cls(problem, options=o, builders=builders, subproblem=subproblem, rho=rho,
                   gamma=gamma,
                   unit_steps=("rho" not in given and "gamma" not in given and not sampled
                               and not private),
                   participation=participation, sampled_clients=sampled)

    @property
    def builders(self) -> tuple:
        return self.config.builders

    @property
    def subproblem(self):
        return self.config.subproblem

    def fingerprint(self) -> dict:
        o, cfg = self.opts, self.config
        return {"batch_size": o.batch_size, "tau": o.tau, "penalty": list(o.penalty),
                # the stages' lengths; Algorithm 1 may extend
                "max_iter": o.max_iter if cfg.M else None,
                "surrogate_init": o.surrogate_init, "subproblem": cfg.subproblem.name,
                "hessian": o.hessian,
                "rho": describe_schedule(cfg.rho), "gamma": describe_schedule(cfg.gamma),
                "slack_tol": o.slack_tol, "solver": o.solver,
                "solver_options": o.solver_options,
                "builders": [repr(b) for b in cfg.builders],
                **({} if o.privacy is None else {"privacy": {
                    "epsilon": o.privacy.epsilon, "delta": o.privacy.delta,
                    "clip": o.privacy.clip, "mechanism": o.privacy.mechanism,
                    "level": o.privacy.level,
                    "noise_multiplier": self.privacy.noise_multiplier}})}

    # -- before round 1 --------------------------------------------------------------------------
    def tasks(self) -> Mapping:
        functions = self.problem.functions
        return {TASK: SSCARoundTask(functions, self.config.builders),
                ad.PROBE_TASK: ad.ProbeTask(functions),
                ad.METRIC_TASK: ad.MetricTask(functions)}

    def init(self, x0: np.ndarray, penalty: Optional[float] = None,
             tau: Optional[float] = None, metric: Optional[np.ndarray] = None,
             curvature: float = float("nan")) -> SSCAState:
        """The state before round 1 (eq. (fs0bar)'s Fbar^(0)), at penalty c_1 unless given;
        ``tau``, ``metric`` and ``curvature``: the probe's (:meth:`prepare`)."""
        cfg = self.config
        penalty = cfg.penalties[0] if penalty is None else penalty
        tau = cfg.tau if tau is None else float(tau)
        state = ssca_step.init(x0, cfg.builders, tau, self.opts.surrogate_init, cfg.M, penalty)
        batch = cfg.first_batch if cfg.auto_batch else 0
        state = state._replace(batch=batch, tau=tau, curvature=float(curvature))
        return state if metric is None else state._replace(metric=np.asarray(metric))

    def prepare(self, state, session):
        """Before round 1: check the gradients and measure the curvature (the probe: the
        starting tau) and the diagonal metric, when the options ask for them."""
        if self.opts.check_gradients or self.opts.tau == "auto":
            exchange = session.runner.exchange
            found = probe.run(self.config, exchange, state.w)
            self.unstable_tau = found.unstable
            metric = probe.measure_metric(self.config, exchange, state.w)
            # a diagonal metric replaces the model, and with it the reason for model_tau
            tau = found.tau if metric is not None or found.model_tau is None else found.model_tau
            state = self.init(state.w, self.config.penalties[0], tau, metric, found.curvature)
        return state

    def client_seed(self, seed):
        """Under privacy the batches are drawn from the mechanism's secret
        (:attr:`.privacy.Plan.batch_seed`), not from the run's seed, which the server knows."""
        return seed if self.privacy is None else self.privacy.batch_seed

    def divergence_cause(self, state=None) -> Optional[str]:
        return (probe.divergence_cause(self.unstable_tau)
                or (None if state is None else evidence.no_minimiser(self.config, state)))

    # -- one round -------------------------------------------------------------------------------
    def request(self, state) -> Request:
        cfg = self.config
        config = {"batch_size": cfg.batch(state), "tau": cfg.tau_of(state)}
        if self.privacy is not None:
            config[DP_CLIP] = float(self.privacy.privacy.clip)
            if self.privacy.privacy.level == "client":
                config[DP_LEVEL] = "client"
            if self.privacy.privacy.mechanism == "distributed":
                # the participants of the secure sum add the noise (secagg.MaskedTask)
                config[DP_NOISE], config[DP_EXEMPT] = self.privacy.sigma, ":quad"
            return Request(TASK, state.t + 1, state.w, config, {})
        if cfg.auto_batch and not cfg.full(state):
            config["noise"] = True
        elif self.tentative(state):
            # a trial point where a function is not finite is a rejected step, not an error:
            # the backtracking goes back to the last accepted point (which has statistics)
            config[REJECT_NONFINITE] = True
        arrays = {}
        if cfg.newton and cfg.backtracking(state):
            config["curvature"] = True         # the Newton model's statistics
            if cfg.sketch_rank:                # ... as products with these directions
                arrays[SKETCH] = acceptance.sketch_of(cfg, state)
            wanted = self._curvature_of(state)
            if wanted is not None:               # ... of these functions only
                arrays[CURVATURE_OF] = wanted
                config[SELECTS] = CURVATURE_OF     # replies differ with the list
        return Request(TASK, state.t + 1, state.w, config, arrays)

    def _curvature_of(self, state) -> Optional[np.ndarray]:
        """The functions whose curvature the round at ``state`` lists in its request
        (:func:`.acceptance.curvature_wanted`), None for all of them (none wanted: all, so
        that the model is rebuilt, 0, and not kept from an earlier round)."""
        wanted = acceptance.curvature_wanted(self.config, state)
        if wanted is not None and 0 < wanted.size < len(self.config.builders):
            return wanted
        return None

    def _curvature_rows(self, state):
        """The functions, in the order of the rows of the replies' curvature array, of the
        round at ``state`` (the request's list, or all)."""
        wanted = self._curvature_of(state)
        return range(len(self.config.builders)) if wanted is None else np.sort(wanted)

    def tentative(self, state) -> bool:
        """On full batches w_t is a trial point until the next round's merit test accepts
        it."""
        cfg = self.config
        return (cfg.backtracking(state) or cfg.guarded(state)) and len(state.prev_stats) > 0

    def round_work(self, request) -> float:
        """Rows the round reads: sum_i min(B, N_i) (every row on full batches), times K / I
        with partial participation (the evaluations' budget, :attr:`eval_budget`)."""
        return self.config.rows_read(request.config.get("batch_size")) * \
            self.config.participation

    def step(self, state, replies):
        cfg = self.config
        t = state.t + 1
        full = cfg.full(state)
        r, g = acceptance.round_steps(cfg, state, t)
        noise = np.zeros(len(cfg.builders))
        nonfinite = []
        curvature = (newton.CurvatureSum(self._curvature_rows(state), self.problem.dim)
                     if self.privacy is None and cfg.newton and cfg.backtracking(state)
                     else None)
        if self.privacy is not None:
            replies = self._private_statistics(replies, state)
        replies = self._screened(replies, t, noise, nonfinite, curvature, state.stats)
        guarded = cfg.guarded(state)
        stats = ssca_step.average_with_messages(state.stats, replies, cfg.num_samples,
                                                1.0 if guarded else r, allow_empty=True)
        curvature = {} if curvature is None else curvature.by_function()
        if stats is None and not nonfinite:
            raise ValueError("average_with_messages: no client messages")
        if self.privacy is not None and self.privacy.privacy.mechanism == "central":
            # the Gaussian mechanism on this round's weighted sum (in the average with
            # weight rho), before anything reads it
            stats = privacy.add_noise(stats, state.w, self.privacy.sigma,
                                      1.0 if guarded else r, self.privacy.rng(t))
        if stats is not None and (guarded or r == 1.0):
            state, stats = self._own_curvature(state, stats)
        if full and cfg.adapt_tau and cfg.unit_steps:
            return acceptance.backtracking_step(cfg, state, stats, bool(nonfinite), curvature)
        if guarded:
            return acceptance.guarded_step(cfg, state, stats, r, g, bool(nonfinite))
        new, info = ssca_step.move(state, stats, r, g, cfg.subproblem)
        ratio = 0.0
        if cfg.auto_batch and not full:
            new, ratio = self._adapt_batch(new, state.w, stats, noise, info.solution)
        return new, RoundInfo(info, cfg.batch(state), cfg.tau_of(state), ratio, 0)

    def _screened(self, replies, t, noise, nonfinite, curvature, template):
        """Strip and add up the noise numbers and the curvature (into ``curvature``, a
        :class:`.newton.CurvatureSum`, None where the round asks for none); leave out (and
        list in ``nonfinite``) the replies of clients whose functions were not finite at the trial
        point; at round 1 check the first message's surrogates for strong convexity
        (Assumption 2), its statistics read in the layout of ``template`` (the state's)."""
        p, cfg = self.problem, self.config
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
                    float(v), reply.num_rows, reply.batch_size, cfg.num_samples)
                    for v in reply.arrays[key]]
            if key in reply.arrays:
                reply = replace(reply, arrays={k: v for k, v in reply.arrays.items()
                                               if k != key})
            if curvature is not None:
                reply = replace(reply, arrays=newton.take_curvature(
                    reply, aggregation_weight(reply, cfg.num_samples), curvature))
            if t == 1 and i == 0:
                try:
                    first = ssca_step.unpack_statistics(reply.arrays, template)
                except KeyError as exc:
                    array(reply, exc.args[0])          # the client's fault: ReplyError
                    raise
                check_all_strongly_convex(cfg.builders, first, p.dim,
                                          [fn.name for fn in p.functions])
            yield reply
            del reply

    def _private_statistics(self, replies, state):
        """Under privacy the replies carry the clipped value and gradient sums
        (:func:`.privacy.clipped_arrays`); their statistics at w_t, as a reply without
        privacy would carry them (the map is linear, so a weighted sum converts alike)."""
        for reply in replies:
            try:
                arrays = privacy.to_statistics(reply.arrays, state.w, state.stats)
            except KeyError as exc:
                array(reply, exc.args[0])          # the client's fault: ReplyError
                raise
            yield replace(reply, arrays=arrays)
            del reply

    def _own_curvature(self, state, stats):
        """With tau="auto", the statistics of builders with a curvature of their own
        (DiagonalCurvature) scaled by the state's kappa (:func:`.adaptive.rescale_tau`: the
        same value and gradient at w_t), kappa set at round 1 from the probe's curvature
        (:func:`.adaptive.curvature_factor`). ``stats``: the round's own, not averaged."""
        own = self.config.own_curvature
        if not (own and self.config.auto_tau):
            return state, stats
        if state.t == 0:
            kappa = max(ad.curvature_factor(stats[m], state.w, state.curvature) for m in own)
            state = state._replace(kappa=float(kappa))
        if state.kappa == 1.0:
            return state, stats
        stats = tuple(ad.rescale_tau(st, state.w, state.kappa) if m in own else st
                      for m, st in enumerate(stats))
        return state, stats

    def _adapt_batch(self, new, w, stats, noise, sol):
        """The norm test: double the batch while the Lagrangian's noise exceeds its size."""
        weights = np.concatenate(([1.0] * self.config.first,
                                  np.asarray(sol.multipliers, dtype=float)))
        grad = lagrangian_gradient(self.config, stats, w, weights)
        if grad is None:
            return new, 0.0
        variance = float(np.sum(weights ** 2 * noise))
        ratio = variance / max(float(grad @ grad), 1e-300)
        avg = (1 - ad.NOISE_AVERAGING) * new.noise + ad.NOISE_AVERAGING * ratio
        since = new.since + 1
        if (avg > ad.NOISE_RATIO and since >= ad.MIN_ROUNDS) or since >= ad.GROW_EVERY:
            return new._replace(batch=int(new.batch * ad.GROWTH), noise=0.0, since=0), ratio
        return new._replace(noise=avg, since=since), ratio

    def round_evaluation(self, before, after, info):
        """In the backtracking regime a round that accepted its point ``before.w`` holds the
        full-data values and gradients there: its statistics are full-batch sums, and the
        proximal-linear ones give F_m(w) = p_m(q, w) and grad F_m(w) = 2 quad w + lin at the
        point they were taken at (tau's rescaling keeps both). That is the evaluation the KKT
        test needs, without the second pass over the data a scheduled one costs. The state
        returned is ``after`` at that point (the run's result if the test passes)."""
        cfg = self.config
        if not (cfg.backtracking(before) and info.rejected == 0 and len(after.prev_stats)
                and len(after.prev_w) == len(before.w)
                and np.array_equal(after.prev_w, before.w)):
            return None
        from ...diagnostics.evaluation import Evaluation

        w = after.prev_w
        read = merit_mod.read_quadratics(cfg, after.prev_stats, w)
        if read is None:
            grads = [ad.surrogate_gradient(st, w) for st in after.prev_stats]
            if any(g is None for g in grads):
                return None
            values = np.array([b.evaluate(st, w)
                               for b, st in zip(cfg.builders, after.prev_stats)])
            grads = np.array(grads)
        else:
            values, grads = read
        if not round_evaluation_exact(cfg, after.prev_stats, w, values, grads):
            return None
        return after._replace(w=w.copy()), Evaluation(values, grads, 0, 0, True)

    # -- the end of a round, of a stage and of the run --------------------------------------------
    def settle(self, state, info):
        return continuation.settle(self.config, state, info)

    def remember_report(self, state, report):
        """The state with the report's multipliers |mu| (the continuation's evidence)."""
        return ssca_state.remember(
            state, multipliers=np.abs(np.asarray(report.multipliers, dtype=float)))

    def kkt_metric(self, state):
        return state.metric

    def kkt_hessian(self, state):
        return (state.hess if self.config.newton and not self.config.sketch_rank
                and np.size(state.hess) else None)

    def kkt_model_hessian(self, state):
        """A function forming the quasi-Newton model's matrix B (of the Hessian of Problem 3's
        Lagrangian, :mod:`.quasi_newton`) while it is on, at most qn.SMALL_DIM variables
        (where a d x d matrix is worth forming; the KKT report calls it only where it reads
        it): in a flat valley the gradient falls below the floor that stands in for it, whose
        curvature is the secant's from the start, far from the minimum, where B's Newton step
        is long."""
        cfg = self.config
        if cfg.newton or not cfg.model_on(state) or state.w.size > qn.SMALL_DIM:
            return None
        return lambda: cfg.model(state).matmat(np.eye(state.w.size))

    @property
    def num_stages(self) -> int:
        return len(self.config.penalties)

    def next_stage(self, state, stage: int, recorder):
        return continuation.next_stage(self.config, state, stage, recorder)

    def returned_state(self, state: SSCAState) -> SSCAState:
        return continuation.returned_state(self.config, state)

    def penalty_of(self, state):
        return state.penalty if self.config.M else None

    def status(self, outcome) -> tuple[str, str]:
        if self.privacy is not None and outcome.reason != st.STOPPED:
            spent = self.privacy.spent(outcome.state.t)
            return st.private(outcome.state.t, spent)
        stages = continuation.stages_of(outcome.history, self.config.bound_scale)
        return evidence.decide(outcome, self.config, stages, bool(self.opts.eval_every))

    def result_fields(self, outcome) -> dict:
        o, state, history, cfg = self.opts, outcome.state, outcome.history, self.config
        inaccurate = tuple(int(t) for t in history.t[history.inaccurate > 0])
        if inaccurate:
            warnings.warn(f"{len(inaccurate)} subproblem solves were flagged inaccurate "
                          f"(rounds {list(inaccurate[:5])}...); see res.solver_info",
                          RuntimeWarning, stacklevel=4)
        last_slack = history.slack[-1] if len(history.t) else np.zeros(cfg.M)
        sub = cfg.subproblem
        extras = ({"diagonal_metric": float(1.0 / np.min(state.metric))}
                  if state.metric.size else {})
        if self.privacy is not None:
            extras["privacy"] = self.privacy.spent(state.t).as_dict()
        return {"slack": np.array(last_slack),
                "penalty": float(state.penalty) if cfg.M else None,
                "stages": tuple(continuation.stages_of(history, cfg.bound_scale)),
                "subproblem": sub.name,
                "extras": extras,
                "solver_info": {
                    "solver": o.solver if sub.name == "cvxpy" else "closed_form",
                    "retries": int(history.retries.sum()),
                    "parametrized": sub.parametrize,
                    "direct_solves": sub.direct_solves,
                    "inaccurate_rounds": inaccurate}}

    # -- history, progress and checkpoints --------------------------------------------------------
    def record(self, info) -> dict:
        sol = info.step.solution
        return {"rho": info.step.rho, "gamma": info.step.gamma, "penalty": info.step.penalty,
                "slack": sol.slack, "multipliers": sol.multipliers,
                "surrogate_value": sol.value, "step_norm": info.step.step_norm,
                "retries": sol.retries, "inaccurate": float(sol.inaccurate),
                "batch_size": np.nan if info.batch is None else info.batch,
                "tau": info.tau, "noise_ratio": info.noise_ratio,
                "rejected": info.rejected,
                **({} if self.privacy is None else
                   {"epsilon": self.privacy.epsilon_after(info.step.t)})}

    def describe(self, info) -> str:
        s = info.step
        text = f"round {s.t:>5d}  B={'full' if info.batch is None else info.batch}"
        if self.config.M:
            text += f"  c={s.penalty:<8.2g} |slack|={np.linalg.norm(s.solution.slack):.3g}"
        return text + f"  surrogate={s.solution.value:.5g}"

    def state_arrays(self, state: SSCAState) -> dict:
        return ssca_state.to_arrays(state)

    def state_from_arrays(self, arrays) -> SSCAState:
        dim = self.problem.dim
        return ssca_state.from_arrays(arrays, [b.statistic_specs(dim)
                                               for b in self.config.builders])


def round_evaluation_exact(cfg: Settings, stats, w, values, grads) -> bool:
    """Whether the values and gradients read from a round's statistics are exact enough for
    the KKT test: they are sums of terms as large as quad |w|^2 and 2 quad |w| that cancel, so
    their rounding error is about ROUND_EVAL_EPS times those terms. Each constraint value
    must be within ROUND_EVAL_SHARE of feas_tol (in the test's units, max(1, |U_m|)), and
    every gradient within that share of kkt_tol times the largest gradient; else a paid
    evaluation (the clients' own values) decides: with a large tau and a large |w| the read
    values can be off by more than the tolerances."""
    o = cfg.options
    wn = float(np.linalg.norm(w))
    k = cfg.first
    gmax = float(np.max(np.linalg.norm(np.asarray(grads), axis=1)))
    forms = merit_mod.stacked_quadratics(cfg, stats)
    if forms is not None:                                      # the same tests, at once
        quad, lin, const = np.abs(forms[0]), np.linalg.norm(forms[1], axis=1), np.abs(forms[2])
        value_err = ad.ROUND_EVAL_EPS * (quad * wn * wn + lin * wn + const)
        grad_err = ad.ROUND_EVAL_EPS * (2.0 * quad * wn + lin)
        return bool(np.all(grad_err <= ad.ROUND_EVAL_SHARE * o.kkt_tol * gmax)
                    and np.all(value_err[k:] <= (ad.ROUND_EVAL_SHARE * o.feas_tol
                                                 * np.asarray(cfg.bound_scale, dtype=float))))
    for m, st in enumerate(stats):
        quad = float(np.max(np.abs(st["quad"])))
        lin = float(np.linalg.norm(st["lin"]))
        const = float(np.max(np.abs(st.get("const", 0.0))))
        value_err = ad.ROUND_EVAL_EPS * (quad * wn * wn + lin * wn + const)
        grad_err = ad.ROUND_EVAL_EPS * (2.0 * quad * wn + lin)
        if grad_err > ad.ROUND_EVAL_SHARE * o.kkt_tol * gmax:
            return False
        if m >= k and value_err > (ad.ROUND_EVAL_SHARE * o.feas_tol
                                   * float(cfg.bound_scale[m - k])):
            return False
    return True

