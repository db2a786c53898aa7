"""Method "ssca"'s side of the front door (:class:`FrontDoor`, a base of
:class:`~ssca_solver.methods.ssca.algorithm.SSCA`): parsing and building from the options,
the checkpoint fingerprint, the probe before round 1, the full-data KKT test, the penalty
continuation of Theorem 2 as stages, the status rules and the Result's SSCA-only fields. The
round itself is in :mod:`.algorithm`.
"""

from __future__ import annotations

import warnings

import numpy as np

from ...engine.method import Method
from ...engine.options import describe_schedule
from ...schedules import check_schedules, resolve
from ...subproblems import CvxpySubproblem, make_subproblem
from . import status as ssca_status
from .options import SSCAOptions


class FrontDoor(Method):
    """The hooks of :class:`~ssca_solver.engine.method.Method` for SSCA (see the module
    docstring); the attributes they read are set by ``SSCA.__init__``."""

    name = "ssca"
    Options = SSCAOptions

    @classmethod
    def parse(cls, problem, options: dict) -> SSCAOptions:
        return super().parse(problem, options).checked(problem, options)

    @classmethod
    def build(cls, problem, o: SSCAOptions, given: dict) -> "FrontDoor":
        """Algorithm 1, or Algorithm 2 inside the penalty continuation of Theorem 2, with the
        step-size regime the options ask for."""
        # with K < I clients per round even full batches give a random estimate (the draw of
        # the clients): the paper's diminishing rho and gamma, not deterministic SCA's unit
        # steps (proportional draws are with replacement: random even with K = I)
        sampled = o.clients_per_round is not None and (
            o.clients_per_round < problem.data.num_clients or o.participation == "proportional")
        # "auto" schedules: the round-counted ones when every round has exact statistics (full
        # rows of every client), the epoch-counted ones otherwise (fixed B, "auto", K < I)
        exact = o.batch_size is None and not sampled
        rho, gamma = resolve(o.rho, "rho", exact), resolve(o.gamma, "gamma", exact)
        check_schedules(rho, gamma, stochastic=o.batch_size is not None)
        unit_steps = "rho" not in given and "gamma" not in given and not sampled
        builders = problem.builders             # the functions' surrogates as they are now
        subproblem = make_subproblem(problem, builders, o.subproblem, o.solver,
                                     o.solver_options)
        # the expected fraction of the clients in a round, for the epoch clock of EpochStep:
        # K/I (proportional draws: K with replacement, distinct clients fewer; K/I is near)
        participation = (1.0 if o.clients_per_round is None
                         else min(1.0, o.clients_per_round / problem.data.num_clients))
        method = cls(problem, builders, subproblem, o.batch_size, o.tau, rho, gamma,
                     o.surrogate_init, o.check_gradients, unit_steps, participation,
                     sampled_clients=sampled, penalties=o.penalty, hessian=o.hessian)
        method.opts = o
        method.kkt_solver = o.solver
        method.eval_budget = o.eval_budget
        return method

    def fingerprint(self) -> dict:
        o = self.opts
        return {"batch_size": o.batch_size, "tau": o.tau, "penalty": list(o.penalty),
                # the stages' lengths; Algorithm 1 may extend
                "max_iter": o.max_iter if self.M else None,
                "surrogate_init": o.surrogate_init, "subproblem": self.subproblem.name,
                "hessian": o.hessian,
                "rho": describe_schedule(self.rho), "gamma": describe_schedule(self.gamma),
                "slack_tol": o.slack_tol, "solver": o.solver,
                "solver_options": o.solver_options,
                "builders": [repr(b) for b in self.builders]}

    def prepare(self, state, session):
        """Before round 1: check the gradients and measure the curvature (the probe: the
        starting tau) and the diagonal metric, when the options ask for them."""
        if self.opts.check_gradients or self.opts.tau == "auto":
            exchange = session.runner.exchange
            tau0 = self.probe(exchange, state.w)
            metric = self.measure_metric(exchange, state.w)
            state = self.init(state.w, self.penalties[0], tau0, metric)
        return state

    def kkt_test(self, report) -> bool:
        # its multipliers guide the continuation
        self._last_multipliers = np.abs(np.asarray(report.multipliers, dtype=float))
        return report.passed(self.opts.feas_tol, self.opts.kkt_tol)

    def kkt_metric(self, state):
        return state.metric

    @property
    def num_stages(self) -> int:
        return len(self.penalties)

    def next_stage(self, state, stage: int, recorder):
        """The continuation of Theorem 2: c_j (this stage's c of the sequence) when the last
        stage's slack estimate exceeds ``slack_tol`` and (after full-batch rounds; after
        sampled ones the slack alone decides) there is evidence that c is too small for an
        exact penalty: a multiplier estimate of the last full-data KKT test, or of the
        forces that balance the gradients at the last accepted full-batch point
        (:meth:`_force_multipliers`), at least c / 2 (c must exceed the multipliers), a
        violation that stopped falling, or no evidence either way (no test yet, fewer than 4
        evaluations in the stage); else the same state. With max_iter shared among the
        stages a stage can end while the iterates are still on their way to the constraint
        set, with a positive slack that only says the proximal step is short: a nonconvex
        equality with multiplier 0.04 was certified at round 1100 at c = 100, and not in 1000
        rounds when c was raised after 250."""
        previous = ssca_status.stage_slack_of(recorder, stage - 1, self.opts.max_iter,
                                              self.bound_scale)
        if previous <= self.opts.slack_tol:
            return state
        batches = recorder.stage_rows("batch_size", stage - 1)
        if len(batches) and not np.isnan(batches[-1]):
            # sampled rounds (a mini-batch): the slack estimate alone, as Theorem 2's
            # continuation has it (the KKT fit at a noisy point says little about c)
            return self.with_penalty(state, self.penalties[stage])
        mu = getattr(self, "_last_multipliers", np.zeros(0))
        stalled, first, _ = ssca_status.violation_stalled(
            recorder.history(), self.bound_scale, self.M, self.equality)
        saturated, self._c_too_small = getattr(self, "_c_too_small", False), False
        force = self._force_multipliers(state)
        evidence = (saturated or not mu.size or not np.all(np.isfinite(mu))
                    or float(np.max(mu)) >= 0.5 * state.penalty
                    or (force is not None and float(np.max(np.abs(force), initial=0.0))
                        >= 0.5 * state.penalty)
                    or stalled or not np.isfinite(first))
        if evidence:
            state = self.with_penalty(state, self.penalties[stage])
        return state

    def penalty_of(self, state):
        return state.penalty if self.M else None

    def status(self, outcome) -> tuple[str, str]:
        o, state, session = self.opts, outcome.state, outcome.session
        stages = ssca_status.stages_of(outcome.history, o.max_iter, self.bound_scale)
        return ssca_status.decide(
            outcome.reason, state, outcome.kkt, outcome.history, stages, o, self.M,
            self.bound_scale,
            lambda: ssca_status.violation_stationarity_at(session, state, o.feas_tol, o.solver),
            lambda: ssca_status.violation_curvature(session, state),
            sampled_clients=self.sampled_clients, equality=self.equality)

    def result_fields(self, outcome) -> dict:
        o, state, history = self.opts, outcome.state, outcome.history
        inaccurate = tuple(int(t) for t in history.t[history.inaccurate > 0])
        if inaccurate:
            warnings.warn(f"{len(inaccurate)} subproblem solves were flagged inaccurate "
                          f"(rounds {list(inaccurate[:5])}...); see res.solver_info",
                          RuntimeWarning, stacklevel=4)
        last_slack = history.slack[-1] if len(history.t) else np.zeros(self.M)
        return {"slack": np.array(last_slack),
                "penalty": float(state.penalty) if self.M else None,
                "stages": tuple(ssca_status.stages_of(history, o.max_iter, self.bound_scale)),
                "subproblem": self.subproblem.name,
                "extras": ({"diagonal_metric": float(1.0 / np.min(state.metric))}
                           if state.metric.size else {}),
                "solver_info": {
                    "solver": (o.solver if isinstance(self.subproblem, CvxpySubproblem)
                               else "closed_form"),
                    "retries": int(history.retries.sum()),
                    "parametrized": getattr(self.subproblem, "parametrize", None),
                    "direct_solves": getattr(self.subproblem, "direct_solves", None),
                    "inaccurate_rounds": inaccurate}}
