"""A solve in progress, for every method: clients and transport, a fresh or resumed start,
the method's stages through the one runner, and the final full-data report. The front door
(:mod:`ssca_solver.engine.solve`) drives it; what is particular to a method comes through the
hooks of :class:`ssca_solver.engine.method.Method`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import warnings
from typing import Optional

import cvxpy as cp
import numpy as np


from .. import status as st
from ..errors import CheckpointError, ModelError, SSCAError, SubproblemError
from ..diagnostics.evaluation import Evaluator
from ..diagnostics.kkt import (StationarityFloor, feasibility_exceeds, kkt_report,
                                objective_gap, stationarity_exceeds)
from ..diagnostics.certificate import Certificate, KKTReport
from ..diagnostics.result import Communication
from ..federated import build_clients, make_transport
from ..federated.gather import Gatherer
from ..federated.sampling import Sampler
from . import checkpoint as ckpt
from ..diagnostics.history import Recorder
from .options import check_clients, run_fingerprint, seed_entropy, start_point
from .runner import Runner, Tally, dropouts_from, state_arrays_from


def library_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a numerical failure of the library's own convex problems (a
    subproblem no attempt could solve, a diagnostic's solver), which a solve turns into status
    "error" or a failed KKT report instead of raising: ``SubproblemError`` (but not one that
    is also a ``ValueError``, the user's model, such as an empty domain) and CVXPY's
    ``SolverError``. User errors (a plain ``RuntimeError`` from a callback among them),
    client failures, divergence and Ctrl-C are not."""
    if isinstance(exc, ValueError):
        return False
    return isinstance(exc, (SubproblemError, cp.error.SolverError))


def diagnostic_failure(exc: BaseException) -> bool:
    """A failure of the KKT report's own numerics (it runs no user code): a
    :func:`library_failure`, or a plain ``RuntimeError`` of SciPy or NumPy (e.g. an iteration
    limit of the multipliers' fit)."""
    return library_failure(exc) or (type(exc) is RuntimeError and not isinstance(exc,
                                                                                 SSCAError))


def fingerprint(problem, method: str, **options) -> dict:
    """What must match between a checkpoint and the solve that resumes it (JSON values): the
    method, the problem's shape, the constraints' bounds and the method's ``options``."""
    fp = {"method": method, "dim": problem.dim, "client_sizes": list(problem.data.client_sizes),
          "constraints": [c.name for c in problem.constraints],
          "bounds": [float(b) for b in problem.bounds],
          "functions": [f.name for f in problem.functions],
          "function_code": [code_hash(f.value, f.grad, getattr(f, "value_and_grad", None),
                                      getattr(f, "loss", None))
                            for f in problem.functions], **options}
    return json.loads(json.dumps(fp, default=repr))


def code_hash(*functions, depth: int = 3) -> str:
    """A hash of what the user's callables compute, as far as Python shows it: each one's
    bytecode, constants and names, and (to ``depth``) the callables, numbers, strings and
    small arrays its closure holds, so that a resume with a function whose code was edited
    under the same name is refused instead of continuing the old run silently; a change the
    hash cannot see (a module-level global, a C extension) still can continue it."""
    import hashlib

    h = hashlib.blake2b(digest_size=16)

    def feed(obj, d):
        if obj is None:
            h.update(b"N")
            return
        if isinstance(obj, (bool, int, float, complex, str, bytes)):
            h.update(repr(obj).encode())
            return
        if isinstance(obj, np.ndarray):
            h.update(obj.tobytes() if obj.size <= 10_000 else repr(obj.shape).encode())
            return
        code = getattr(obj, "__code__", None)
        if code is None:
            h.update(type(obj).__qualname__.encode())
            return
        feed_code(code)
        if d > 0:
            for cell in getattr(obj, "__closure__", None) or ():
                try:
                    feed(cell.cell_contents, d - 1)
                except ValueError:          # an empty cell
                    h.update(b"E")
            for default in getattr(obj, "__defaults__", None) or ():
                feed(default, d - 1)

    def feed_code(code):
        h.update(code.co_code)
        h.update(repr(code.co_names).encode())
        for const in code.co_consts:
            if hasattr(const, "co_code"):
                feed_code(const)
            else:
                h.update(repr(const).encode())

    for fn in functions:
        feed(fn, depth)
    return h.hexdigest()


def _point_hash(x0: np.ndarray) -> str:
    """The start point's hash kept in a checkpoint (metadata ``x0``), so that a resume given
    another x0 is refused rather than silently continued from the checkpoint's point."""
    import hashlib

    return hashlib.blake2b(np.ascontiguousarray(x0, dtype=np.float64).tobytes(),
                           digest_size=16).hexdigest()


class Session:
    """A solve in progress: the clients, the transport, the runner, and where to start.

    Args:
      problem: the :class:`~ssca_solver.Problem`.
      algorithm: the method object (:class:`~ssca_solver.engine.method.Method`): its
        ``fingerprint()``, ``init``, ``penalty_of``, ``certificate()`` (when it
        ``certifies``), ``num_stages``/``next_stage`` and ``kkt_solver`` are read here.
      opts: its parsed options (a :class:`~ssca_solver.engine.options.RunOptions`).
      started: when the solve began (``time.perf_counter()``; default: now), from which the
        run's elapsed time counts.

    Attributes:
      runner: the :class:`~ssca_solver.engine.runner.Runner`.
      state: the state to start from (fresh, or restored from ``opts.resume``).
      stage: the stage to start in (0, or the checkpoint's).
      resumed: whether the state came from a checkpoint.
      seed: the run's seed (an int; read from the checkpoint on resume).
    """

    def __init__(self, problem, algorithm, opts, started: Optional[float] = None):
        self.problem, self.algorithm, self.opts = problem, algorithm, opts
        self.solver = algorithm.kkt_solver
        #: the certificate's rules at the method's tolerances (None: it does not certify)
        self.certificate = algorithm.certificate()
        self.evaluator = Evaluator(problem)
        recorder = Recorder(algorithm.columns, problem.num_constraints)
        tally = Tally()
        seed, stage, elapsed = None, 0, 0.0
        state = None
        dropouts = []
        check_clients(opts, problem.data.num_clients)
        fp, layout = None, None
        if opts.checkpoint or opts.resume:
            # what a checkpoint of this solve must agree on (the problem with every function's
            # code and closure hashed, the options, the data's hash), computed only where a
            # checkpoint is written or read: with hundreds of functions the hashes cost
            # milliseconds a solve
            fp = {**fingerprint(problem, algorithm.name, **algorithm.fingerprint()),
                  **run_fingerprint(opts), "data": ckpt.data_fingerprint(problem.data)}
            layout = ckpt.Layout(
                algorithm.state_arrays(algorithm.init(np.zeros(problem.dim))),
                {k: c.shape for k, c in recorder.columns.items()}, problem.dim,
                len(problem.functions), problem.num_constraints, problem.data.num_clients,
                algorithm.num_stages, algorithm.state_rows)
        if opts.checkpoint:          # before round 1: a path the run can write to
            ckpt.check_writable(opts.checkpoint, layout.estimate(
                opts.max_iter * algorithm.num_stages, len(json.dumps(fp))))
        if opts.resume:
            arrays, meta = ckpt.load(opts.resume, layout, fp)
            saved_seed = int(meta["seed"])
            if opts.seed is not None and seed_entropy(opts.seed) != saved_seed:
                raise ValueError(f"resume: the checkpoint {opts.resume!r} was written with "
                                 "another seed; omit seed= (it is read from the checkpoint) "
                                 "or give the same one")
            start = meta.get("x0")
            if opts.x0 is not None and start is not None and start != _point_hash(
                    self.start_point()):
                # x0 given again on resume: the run goes on from the checkpoint's point, so an
                # x0 other than the first run's would be silently ignored
                raise CheckpointError(
                    f"resume: the checkpoint {opts.resume!r} was written by a run that started "
                    "from another x0; omit x0= (the run continues from the checkpoint's point) "
                    "or give the same one", opts.resume, "x0")
            seed, stage, elapsed = saved_seed, int(meta["stage"]), float(meta["elapsed"])
            self.floor = StationarityFloor.from_meta(meta)
            self.constraint_scale = float(meta.get("constraint_scale", 0.0))
            try:
                state = algorithm.state_from_arrays(state_arrays_from(arrays))
                recorder.load(arrays)
                tally.load(arrays)
                dropouts = dropouts_from(arrays)
            except (KeyError, ValueError, TypeError, IndexError) as exc:
                raise CheckpointError(f"resume: the checkpoint {opts.resume!r} cannot be "
                                      f"restored: {exc}", opts.resume) from exc
        else:
            seed = seed_entropy(opts.seed)
            start = _point_hash(self.start_point())
            state = algorithm.init(self._inside_domain(self.start_point()))
            self.floor = StationarityFloor()
            self.constraint_scale = 0.0
        self.seed = seed
        self.state, self.stage, self.resumed = state, stage, bool(opts.resume)
        # the checkpoint's last round ended its stage (a stop requested at that round)
        self.stage_ended = bool(opts.resume and meta.get("stage_ended", False))
        tasks = {**algorithm.tasks(), **self.evaluator.tasks}
        secure = None
        if opts.secure_aggregation:
            if not algorithm.supports_secure_aggregation:
                raise ValueError(
                    f"method {algorithm.name!r} does not support secure_aggregation: its "
                    "server must combine replies only as sum_i weight_i N_i/(B_i N) x_i (see "
                    "docs/architecture.md, 'Secure aggregation'); methods that do: ssca, fedavg, "
                    "primal_dual, augmented_lagrangian")
            try:
                from ..federated import secagg      # needs the cryptography package
            except ImportError as exc:
                raise ImportError(f"secure_aggregation needs the cryptography package ({exc}): "
                                  "pip install 'ssca-solver[secure]'") from None
            secure = secagg.SecureAggregation(problem.data.client_sizes, opts.secure_range)
            if opts.shards is None and opts.transport != "ray":
                tasks = secagg.client_tasks(tasks)     # (shards mask their clients' sums)
        clients = build_clients(problem.data, algorithm.client_seed(seed), tasks)
        if opts.shards is not None or opts.transport == "ray":
            if not algorithm.supports_secure_aggregation:
                raise ValueError(
                    f"method {algorithm.name!r} does not support shards: its server must "
                    "combine replies only as sum_i weight_i N_i/(B_i N) x_i (see "
                    "docs/architecture.md, 'Secure aggregation'); methods that do: ssca, "
                    "fedavg, primal_dual, augmented_lagrangian")
        self.transport = make_transport(opts.transport, clients, opts.client_timeout, opts)
        sizes = problem.data.client_sizes
        gatherer = Gatherer(self.transport, sizes, drop=opts.on_client_failure == "drop",
                            secure=secure, tally=tally)
        sampler = (None if opts.clients_per_round is None else
                   Sampler(sizes, opts.clients_per_round, opts.participation, seed))
        self.runner = Runner(algorithm, gatherer=gatherer, evaluator=self.evaluator,
                             opts=opts, recorder=recorder, tally=tally, meta={},
                             penalty_of=algorithm.penalty_of, elapsed=elapsed,
                             started=started,
                             stop_test=self._stop_test if self.certificate else None,
                             sampler=sampler, dropouts=dropouts)
        if opts.resume:
            # the evaluations' schedule where the checkpoint left it (absent in older files)
            free = meta.get("free_since")
            self.runner.free_since = None if free is None else int(free)
            self.runner.work_since = float(meta.get("work_since", 0.0))
        self.runner.meta = {"method": algorithm.name, "seed": str(seed), "fingerprint": fp,
                            "stage": stage, **self.floor.meta(),
                            **({} if start is None else {"x0": start}),
                            "constraint_scale": self.constraint_scale}
        self.checkpoints = None
        if opts.checkpoint:          # a failed write warns once and the run goes on
            same = bool(opts.resume) and (os.path.abspath(opts.resume)
                                          == os.path.abspath(opts.checkpoint))
            self.checkpoints = ckpt.Writer(opts.checkpoint, int(meta["round"]) if same else None)
            self.runner.save = self.checkpoints.guard(self.runner.save)

    def start_point(self) -> np.ndarray:
        """x0: the solve's, else the problem's own (``Problem(x0=...)``), else zeros."""
        given = self.opts.x0 if self.opts.x0 is not None else self.problem.x0
        return start_point(given, self.problem.dim)

    # -- the sequence of the front door ---------------------------------------------------------
    def start(self):
        """The state round 1 starts from: on a fresh start the method's ``prepare`` (probes)
        and, for a method with a KKT test and ``eval_every``, the scale of the relative
        stationarity measured at it; on resume the checkpoint's state. A failure here
        carries the start as the last good state (and its checkpoint)."""
        state = self.state
        if self.resumed:
            return state
        try:
            state = self.algorithm.prepare(state, self)
            if self.certificate and self.opts.eval_every:
                self.measure_scale(state.w)
        except BaseException as exc:     # before round 1: the start is the last good state
            self.runner.failed(exc, state)
            raise
        return state

    def run_stages(self, state):
        """(state, reason): the method's stages within ``max_iter`` rounds in all (resuming in
        the saved stage and round, or with the next stage when the saved round ended its
        stage); the next stage starts only when the last ended with reason
        "max_iter" or "settled". The rounds left are shared equally among the stages left
        (:func:`stage_budget`): a stage that settles early leaves its rounds to the later ones,
        and the last stage runs to the end of the budget."""
        reason = st.MAX_ITER
        alg, recorder = self.algorithm, self.runner.recorder
        first, within = self.stage, self.resumed
        if self.resumed and self.stage_ended:
            # the checkpoint was written at the round that ended its stage: the next stage
            # starts (none left: the run had settled)
            first, within, reason = self.stage + 1, False, st.SETTLED
        for j in range(first, alg.num_stages):
            if j > 0 and not (within and j == first):
                try:
                    state = alg.next_stage(state, j, recorder)
                except BaseException as exc:   # the last stage's end is the last good state
                    self.runner.failed(exc, state)
                    raise
            stages = recorder.columns["stage"].view()
            done = int(np.count_nonzero(stages == j))
            before = int(np.count_nonzero(stages < j))
            budget = stage_budget(self.opts.max_iter - before, alg.num_stages - j)
            state, reason = self.runner.run(state, max(budget - done, 0), stage=j)
            if reason not in (st.MAX_ITER, st.SETTLED):
                break
        return state, reason

    def measure_scale(self, w) -> float:
        """|grad (F_0 + R)| at the start point on the full data: the scale of the relative
        stationarity test (one full-data evaluation, counted with the evaluations, and
        recorded in the history as round 0's); kept with the point for the secant curvature
        of :meth:`kkt`."""
        ev = self.runner.evaluate(w, with_grad=True)
        g = self.evaluator.objective_gradient(ev, w)
        value, cons = self.evaluator.split(ev.values, w)
        if ev.complete:
            self.runner.recorder.evaluation(0, value, cons)
        self.floor.start(w, g, value)
        self.runner.meta.update(self.floor.meta())
        first = self.evaluator.terms.first_constraint
        self.constraint_scale = float(max((np.linalg.norm(g) for g in ev.grads[first:]),
                                          default=0.0))
        self.runner.meta["constraint_scale"] = self.constraint_scale
        return self.grad_scale

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.transport.close()

    def _stop_test(self, state, ev, evidence: bool = True):
        """The runner's stop test: the KKT report at the state, judged by the certificate.
        Where the report is no evidence for the method (``evidence`` False) and the test
        cannot pass whatever the multipliers -- a constraint's relative violation exceeds
        ``feas_tol`` (:func:`feasibility_exceeds`), or a lower bound on the relative
        stationarity of any multipliers that pass complementarity exceeds ``kkt_tol``
        (:func:`stationarity_exceeds`) -- (False, None): the multiplier fit (hundreds of
        columns with hundreds of constraints; a CVXPY solve with a domain) is not computed.
        The stationarity floor still sees the point, as when the report is computed, so that
        later reports do not depend on the skipped ones."""
        if not evidence:
            terms, cert = self.evaluator.terms, self.certificate
            floor = self._floor(state.w, ev)
            if (feasibility_exceeds(ev, terms, cert.feas_tol)
                    or self._stationarity_exceeds(state.w, ev, floor)):
                return False, None
            report = self.kkt(state, ev, floor)
        else:
            report = self.kkt(state, ev)
        return self.certificate.passes(report), report

    def _stationarity_exceeds(self, w, ev, floor: float) -> bool:
        """:func:`stationarity_exceeds` at the certificate's ``kkt_tol``; False where it
        fails (the report, computed then, says why)."""
        try:
            return stationarity_exceeds(w, ev, self.evaluator.terms, self.certificate.kkt_tol,
                                        floor)
        except (ValueError, ArithmeticError, np.linalg.LinAlgError):
            return False

    def _inside_domain(self, x0):
        """x0, or its projection onto the domain (:meth:`DeterministicPart.project`) with a
        warning when x0 is outside it: the functions may not be defined there (a start below
        a bound x >= 0 of log x raised 'non-finite value' in the gradient check)."""
        det = self.problem.deterministic
        if not det.has_domain:
            return x0
        violation = det.domain_violation(x0)
        if not violation > 0.0:
            return x0
        try:
            x = det.project(x0, self.solver)
        except ModelError as exc:
            # an empty domain, or a solver failure: the run's first subproblem meets an empty
            # domain too and says so (EmptyDomainError with the state after round 0); a
            # failure of the projection alone is said here, since the run then starts outside
            # the domain, where every step into it may be rejected
            warnings.warn(f"x0 is outside the domain (violation {violation:.3g}) and its "
                          f"projection onto the domain failed ({exc}); starting from x0",
                          RuntimeWarning, stacklevel=2)
            return x0
        moved = float(np.linalg.norm(x - x0))
        if moved > 1e-9 * max(1.0, float(np.linalg.norm(x0))):
            warnings.warn(f"x0 is outside the domain (violation {violation:.3g}): starting "
                          f"from its projection onto the domain, {moved:.3g} away",
                          RuntimeWarning, stacklevel=2)
        return x

    @property
    def grad_scale(self) -> float:
        """|grad (F_0 + R)| at the start point (0 before :meth:`measure_scale`)."""
        return self.floor.grad_scale

    def _floor(self, w, ev) -> float:
        """The stationarity scale's floor at ``w`` (:class:`StationarityFloor`: the start
        gradient, the secant curvatures from the start and between the last two tested
        points, the objective's size), updated from this evaluation and kept in the
        checkpoints' metadata."""
        g = self.evaluator.objective_gradient(ev, w)
        value = self.evaluator.split(ev.values, w)[0]
        floor = self.floor.at(w, g, value)
        self.runner.meta.update(self.floor.meta())
        return floor

    def kkt(self, state, ev, floor: Optional[float] = None):
        """The KKT report at ``state.w`` from a full-data evaluation with gradients; a report
        marked failed (:meth:`KKTReport.failed_at`: NaN stationarity and multipliers, the
        failure named in ``multiplier_source``) when the library's own solver failed on it
        (:func:`diagnostic_failure`), so a diagnostic never loses the run; it then fails the
        stopping test."""
        try:
            return kkt_report(state.w, ev, self.evaluator.terms, self.solver,
                              metric=self.algorithm.kkt_metric(state),
                              hessian=self.algorithm.kkt_hessian(state),
                              model_hessian=self.algorithm.kkt_model_hessian(state),
                              floor=self._floor(state.w, ev) if floor is None else floor,
                              feas_tol=self.certificate.feas_tol if self.certificate
                              else None)
        except Exception as exc:
            if not diagnostic_failure(exc):
                raise
            return self.failed_kkt(state.w, ev, f"{type(exc).__name__}: {exc}")

    def failed_kkt(self, w, ev, why: str):
        """The failed KKT report at ``w`` (``ev``: its evaluation, or None when there is
        none), with what could still be computed: the feasibility and the domain's
        violation."""
        terms = self.evaluator.terms
        M = self.problem.num_constraints
        cons = None if ev is None else self.evaluator.split(ev.values, w)[1]
        try:
            dv = terms.deterministic.domain_violation(w)
        except Exception:
            dv = float("nan")
        return KKTReport.failed_at(why, M, cons, terms.bounds, dv)

    def communication(self, rounds: int) -> Communication:
        """The floats counted so far, for a Result after ``rounds`` rounds."""
        t = self.runner.tally
        return Communication(rounds=rounds, num_clients=self.transport.num_clients,
                             up_per_client_round=t.up_per_client_round,
                             down_per_client_round=t.down_per_client_round or self.problem.dim,
                             up_total=t.up, down_total=t.down, eval_up_total=t.eval_up,
                             eval_down_total=t.eval_down,
                             clients_per_round=self.opts.clients_per_round)

    def final_report(self, state, reason=None):
        """(fun, constraints, kkt, communication, history) at ``state.w`` on the full data.
        A run that converged ends at the point its stopping test passed: that test's
        full-data evaluation and KKT report are the final ones (a second evaluation of the
        same point on the same data would repeat them). Otherwise a new evaluation; when its
        KKT report cannot be computed but the stopping test passed at this same point, that
        test's report stands in."""
        if not self.algorithm.evaluates_result:
            fun, cons, kkt = self.unevaluated()
            self.final_evaluation = None
            return fun, cons, kkt, self.communication(state.t), self.runner.recorder.history()
        last = self.runner.last_test
        passed_here = (reason == st.CONVERGED and last is not None and not last.report.failed
                       and np.array_equal(last.w, state.w))
        if passed_here and last.evaluation.complete:
            final, kkt = last.evaluation, last.report
        else:
            try:
                final = self.runner.evaluate(state.w, with_grad=True, round=state.t)
            except BaseException as exc:
                self.runner.failed(exc, state)
                raise
            kkt = self.kkt(state, final)
            if kkt.failed and passed_here:
                kkt = last.report
        fun, cons = self.evaluator.split(final.values, state.w)
        if self.evaluator.terms.convex and not kkt.failed:
            gap, note = objective_gap(state.w, final, self.evaluator.terms, kkt.multipliers,
                                      self.solver)
            kkt = dataclasses.replace(kkt, objective_gap=gap, objective_gap_note=note)
        self.final_evaluation = final
        return fun, cons, kkt, self.communication(state.t), self.runner.recorder.history()

    def unevaluated(self):
        """(fun, constraints, kkt) of a method that does not evaluate its result
        (``evaluates_result`` False: differential privacy): NaN values and a report that
        says why it was not computed."""
        M = self.problem.num_constraints
        kkt = KKTReport.failed_at("not evaluated: under differential privacy nothing reads "
                                  "the data without noise", M)
        return float("nan"), np.full(M, np.nan), kkt

    def error_report(self, state):
        """(fun, constraints, kkt, communication, history, note) for a run that ended with
        status "error" at ``state`` (its last good state): a full-data evaluation at
        ``state.w`` when one is possible (else NaN values, a failed KKT report, and ``note``
        says why; Ctrl-C still raises)."""
        M = self.problem.num_constraints
        note = ""
        if not self.algorithm.evaluates_result:
            fun, cons, kkt = self.unevaluated()
            return (fun, cons, kkt, self.communication(state.t),
                    self.runner.recorder.history(), note)
        try:
            final = self.runner.evaluate(state.w, with_grad=True, round=state.t)
        except Exception as exc:
            note = f"; the point could not be evaluated ({type(exc).__name__}: {exc})"
            fun, cons = float("nan"), np.full(M, np.nan)
            kkt = self.failed_kkt(state.w, None, f"no evaluation: {type(exc).__name__}")
        else:
            fun, cons = self.evaluator.split(final.values, state.w)
            kkt = self.kkt(state, final)
        return fun, cons, kkt, self.communication(state.t), self.runner.recorder.history(), note


def stage_budget(rounds_left: int, stages_left: int) -> int:
    """The rounds of the next stage when ``rounds_left`` rounds of ``max_iter`` remain for
    ``stages_left`` stages: an equal share (the last stage: all of them)."""
    if stages_left <= 1:
        return max(int(rounds_left), 0)
    return max(int(rounds_left) // int(stages_left), 0)
