"""What every method's front door does around the runner: clients and transport, a fresh or
resumed start, and the final full-data report. The method-specific parts stay in the front
doors (:mod:`ssca_solver.solve`, :mod:`ssca_solver.baselines`).
"""

from __future__ import annotations

import json

import numpy as np


from . import checkpoint as ckpt
from .diagnostics import Evaluator, kkt_report, violation_stationarity
from .federated import build_clients, make_transport
from .federated.gather import Gatherer
from .federated.sampling import Sampler
from .history import Recorder
from .options import check_clients, run_fingerprint, seed_entropy, start_point
from .result import Communication
from .runner import Runner, Tally, dropouts_from, state_arrays_from


def fingerprint(problem, method: str, **options) -> dict:
    """What must match between a checkpoint and the solve that resumes it (JSON values)."""
    fp = {"method": method, "dim": problem.dim, "client_sizes": list(problem.data.client_sizes),
          "constraints": [c.name for c in problem.constraints],
          "functions": [f.name for f in problem.functions], **options}
    return json.loads(json.dumps(fp, default=repr))


def describe_schedule(schedule) -> str:
    """A step-size schedule as text for a fingerprint: its value for PowerStep and constants,
    else the callable's qualified name (its repr would hold a memory address)."""
    from .schedules import EpochStep, PowerStep

    if isinstance(schedule, (PowerStep, EpochStep, int, float, str)) or type(schedule).__name__ == "_Constant":
        return repr(schedule)
    return f"{getattr(schedule, '__module__', '?')}.{getattr(schedule, '__qualname__', '?')}"


class Session:
    """A solve in progress: the runner, its transport, and where to start.

    Attributes:
      runner: the :class:`~ssca_solver.runner.Runner`.
      state: the state to start from (fresh, or restored from ``opts.resume``).
      stage: the stage to start in (0, or the checkpoint's).
      resumed: whether the state came from a checkpoint.
    """

    def __init__(self, problem, algorithm, opts, fp: dict, init_state,
                 penalty_of=lambda state: None, kkt_test=None, solver: str = "CLARABEL"):
        self.problem, self.algorithm, self.opts = problem, algorithm, opts
        self.evaluator = Evaluator(problem)
        recorder = Recorder(algorithm.columns, problem.num_constraints)
        tally = Tally()
        seed, stage, elapsed = None, 0, 0.0
        state = None
        dropouts = []
        check_clients(opts, problem.data.num_clients)
        fp = {**fp, **run_fingerprint(opts)}
        if opts.resume:
            arrays, meta = ckpt.load(opts.resume)
            ckpt.check_matches(meta, fp, opts.resume)
            saved_seed = int(meta["seed"])
            if opts.seed is not None and seed_entropy(opts.seed) != saved_seed:
                raise ValueError(f"resume: the checkpoint {opts.resume!r} was written with "
                                 "another seed; omit seed= (it is read from the checkpoint) "
                                 "or give the same one")
            seed, stage, elapsed = saved_seed, int(meta["stage"]), float(meta["elapsed"])
            self.grad_scale = float(meta.get("grad_scale", 0.0))
            self.constraint_scale = float(meta.get("constraint_scale", 0.0))
            state = algorithm.state_from_arrays(state_arrays_from(arrays))
            recorder.load(arrays)
            tally.load(arrays)
            dropouts = dropouts_from(arrays)
        else:
            seed = seed_entropy(opts.seed)
            state = init_state(start_point(opts.x0, problem.dim))
            self.grad_scale = 0.0
            self.constraint_scale = 0.0
        self.seed = seed
        self.state, self.stage, self.resumed = state, stage, bool(opts.resume)
        tasks = {**algorithm.tasks(), **self.evaluator.tasks}
        secure = None
        if opts.secure_aggregation:
            if not getattr(algorithm, "supports_secure_aggregation", False):
                raise ValueError(
                    f"method {algorithm.name!r} does not support secure_aggregation: its "
                    "server must combine replies only as sum_i weight_i N_i/(B_i N) x_i (see "
                    "docs/architecture.md, 'Secure aggregation'); methods that do: ssca, fedavg, "
                    "primal_dual, augmented_lagrangian")
            try:
                from .federated import secagg      # needs the cryptography package
            except ImportError as exc:
                raise ImportError(f"secure_aggregation needs the cryptography package ({exc}): "
                                  "pip install 'ssca-solver[secure]'") from None
            secure = secagg.SecureAggregation(problem.data.client_sizes, opts.secure_range)
            tasks = secagg.client_tasks(tasks)
        clients = build_clients(problem.data, seed, tasks)
        self.transport = make_transport(opts.transport, clients, opts.client_timeout, opts)
        sizes = problem.data.client_sizes
        gatherer = Gatherer(self.transport, sizes, drop=opts.on_client_failure == "drop",
                            secure=secure, tally=tally)
        sampler = (None if opts.clients_per_round is None else
                   Sampler(sizes, opts.clients_per_round, opts.participation, seed))
        self.runner = Runner(algorithm, self.transport, self.evaluator, opts, recorder, tally,
                             {}, penalty_of, elapsed,
                             None if kkt_test is None else self._stop_test(kkt_test, solver),
                             gatherer=gatherer, sampler=sampler, dropouts=dropouts)
        self.runner.meta = {"method": algorithm.name, "seed": str(seed), "fingerprint": fp,
                            "stage": stage, "grad_scale": self.grad_scale,
                            "constraint_scale": self.constraint_scale}

    def measure_scale(self, w) -> float:
        """|grad (F_0 + R)| at the start point on the full data: the scale of the relative
        stationarity test (one full-data evaluation, counted with the evaluations)."""
        ev = self.runner.evaluate(w, with_grad=True)
        self.grad_scale = self.evaluator.objective_gradient_norm(ev, w)
        self.runner.meta["grad_scale"] = self.grad_scale
        k = 1 if self.problem.objective is not None else 0
        self.constraint_scale = float(max((np.linalg.norm(g) for g in ev.grads[k:]),
                                          default=0.0))
        self.runner.meta["constraint_scale"] = self.constraint_scale
        return self.grad_scale

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.transport.close()

    def violation_curvature(self, state, probes: int = 8, step: float = 1e-2) -> float:
        """The largest drop of the relative violation sum_m (F_m - U_m)_+ / max(1, |U_m|)
        found along ``probes`` random directions u (both signs, size ``step`` max(1, |w|)),
        as the mean of the two sides minus the value at w (a second difference: the first
        order cancels). A drop means negative curvature: w is a saddle of the violation, not a
        minimiser (e.g. w = 0 of a network), so a zero gradient there is no evidence of
        infeasibility. 2 ``probes`` full-data evaluations (values only), counted with the
        evaluations; directions from the run's seed."""
        terms = self.evaluator.terms
        scale = np.maximum(1.0, np.abs(terms.bounds))

        def violation(values):
            k = 1 if terms.stochastic_objective else 0
            cons = np.asarray(values[k:], dtype=float) - terms.bounds
            return float(np.sum(np.maximum(cons, 0.0) / scale))

        w = state.w
        base = violation(self.final_evaluation.values)
        rng = np.random.default_rng(np.random.SeedSequence(self.seed, spawn_key=(2 ** 31 - 1,)))
        h = step * max(1.0, float(np.linalg.norm(w)))
        drop = 0.0
        for _ in range(probes):
            u = rng.standard_normal(w.size)
            u *= h / np.linalg.norm(u)
            sides = [violation(self.runner.evaluate(w + s * u, with_grad=False).values)
                     for s in (1.0, -1.0)]
            drop = max(drop, base - 0.5 * (sides[0] + sides[1]))
        return drop

    def violation_stationarity(self, state, feas_tol: float, solver: str = "CLARABEL"):
        """:func:`ssca_solver.diagnostics.violation_stationarity` at the returned point (after
        :meth:`final_report`), relative to the constraints' gradient scale at the start."""
        return violation_stationarity(state.w, self.final_evaluation, self.evaluator.terms,
                                      feas_tol, self.constraint_scale, solver)

    def _stop_test(self, kkt_test, solver):
        """The runner's stop test: the KKT report at the state, judged by ``kkt_test``."""
        def test(state, ev):
            report = self.kkt(state, ev, solver)
            return kkt_test(report), report
        return test

    def kkt(self, state, ev, solver: str = "CLARABEL"):
        """The KKT report at ``state.w`` from a full-data evaluation with gradients."""
        return kkt_report(state.w, ev, self.evaluator.terms, solver, self.grad_scale,
                          getattr(state, "metric", None))

    def final_report(self, state, solver: str = "CLARABEL"):
        """(fun, constraints, kkt, communication, history) at ``state.w`` on the full data."""
        try:
            final = self.runner.evaluate(state.w, with_grad=True, round=state.t)
        except BaseException as exc:
            self.runner.failed(exc, state)
            raise
        fun, cons = self.evaluator.split(final.values, state.w)
        kkt = self.kkt(state, final, solver)
        self.final_evaluation = final
        t = self.runner.tally
        comm = Communication(rounds=state.t, num_clients=self.transport.num_clients,
                             up_per_client_round=t.up_per_client_round,
                             down_per_client_round=t.down_per_client_round or self.problem.dim,
                             up_total=t.up, down_total=t.down, eval_up_total=t.eval_up,
                             eval_down_total=t.eval_down,
                             clients_per_round=self.opts.clients_per_round)
        return fun, cons, kkt, comm, self.runner.recorder.history()
