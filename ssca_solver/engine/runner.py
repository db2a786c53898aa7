"""ONE round loop for every algorithm and transport.

:class:`Runner` drives any :class:`~ssca_solver.engine.method.Algorithm`: each round it sends
the algorithm's request through the transport, counts the floats that cross, lets the algorithm
step, records the round, evaluates the full-data objective and constraints every ``eval_every``
rounds, calls the user's callback (which can stop the run), prints progress and writes
checkpoints. A method's outer loop (Algorithm 2's penalty continuation) calls :meth:`Runner.run`
once per stage.

On any failure inside a round (a client error, a user-function error, Ctrl-C) the exception
carries the last good state (``exc.state``) and, when ``checkpoint=`` was given, the path of the
checkpoint written with it (``exc.checkpoint``), from which ``solve(..., resume=path)`` goes on.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, Optional

import numpy as np

from .. import status as st
from ..errors import (DivergenceError, ReplyError, SSCAError, UserFunctionError,
                      not_finite_at_point)
from ..federated.gather import Gatherer
from ..federated.messages import Dropout
from . import checkpoint as ckpt
from ..diagnostics.history import Recorder

#: |w| this many times max(1, |w_1|) with non-finite function values is called divergence
DIVERGENCE_FACTOR = 1e3
#: a step longer than this times max(1, |w_1|) is called divergence
DIVERGENCE_STEP = 1e12


class Tested(NamedTuple):
    """The stop test at an evaluation: the point, its full-data evaluation and the KKT report
    the test judged."""
    w: np.ndarray
    evaluation: Any
    report: Any


class Iteration(NamedTuple):
    """What the callback receives after each round (the same for every method).

    Attributes:
      t: rounds done. x: the current point w_{t+1} (read-only view; copy it to keep it).
      method: the method's name. stage: the penalty stage j (0 without one). penalty: c in
      force (None without one). step_norm: the round's step length (method-specific, see
      History). eval_t, objective, constraints: the latest full-data evaluation (None before
      the first). record: the round's history row (dict). state: the algorithm's state.
    """

    t: int
    x: np.ndarray
    method: str
    stage: int
    penalty: Optional[float]
    step_norm: float
    eval_t: Optional[int]
    objective: Optional[float]
    constraints: Optional[np.ndarray]
    record: dict
    state: Any


@dataclass
class Tally:
    """Floats that crossed the client-server line, counted from the messages themselves."""

    up: int = 0
    down: int = 0
    eval_up: int = 0
    eval_down: int = 0
    up_per_client_round: int = 0
    down_per_client_round: int = 0

    def arrays(self) -> dict:
        return {f"tally/{k}": np.asarray(v, dtype=np.int64) for k, v in vars(self).items()}

    def load(self, arrays) -> None:
        for k in vars(self):
            setattr(self, k, int(arrays[f"tally/{k}"]))


#: a round's own evaluation is tested (KKT) at every round; its report's multipliers join
#: the method's evidence between two eval_every-th rounds only when the round's step is at
#: most this times max(1, |w|), and elsewhere the test may skip its fit where it cannot pass
EVIDENCE_STEP = 1e-2


class Runner:
    """The loop. One per solve; :meth:`run` may be called once per stage.

    Args:
      algorithm: the method (see :mod:`ssca_solver.engine.method`).
      gatherer: how requests reach the clients and replies come back
        (:class:`ssca_solver.federated.gather.Gatherer` over a transport: participation,
        dropouts, secure aggregation); the runner never calls a transport itself.
      evaluator: full-data evaluations (:class:`ssca_solver.diagnostics.evaluation.Evaluator`).
      opts: the parsed :class:`ssca_solver.engine.options.RunOptions` (eval_every, callback, progress,
        checkpoint, checkpoint_every).
      recorder: the history so far (restored on resume).
      tally: the communication counts so far.
      meta: metadata saved with every checkpoint (method, seed, fingerprint); the runner adds the
        round, the stage and the elapsed time.
      penalty_of: the penalty c in force for a state (None for methods without one).
      stop_test: ``stop_test(state, evaluation, evidence) -> (passed, report)``, run at every
        evaluation (which then includes gradients); the run stops with reason "converged" when
        it passes. ``evidence`` False: its report will not join the method's evidence, and it
        may return (False, None) without a report where it cannot pass.
        This is the method's own stopping test, the only way to status "converged". It is not
        run on an evaluation that some client failed to answer (``on_client_failure="drop"``).
      sampler: the participants of each round (:class:`ssca_solver.federated.sampling.Sampler`),
        or None for every client.
      dropouts: the dropouts recorded so far (restored on resume).
      started: when the solve began (``time.perf_counter()``; default: now): the elapsed
        time counts from there, plus ``elapsed`` of the parts before a resume.

    Attributes:
      dropouts: every :class:`~ssca_solver.federated.Dropout` of the completed rounds and
        evaluations, in order.
    """

    def __init__(self, algorithm, *, gatherer: Gatherer, evaluator, opts, recorder: Recorder,
                 tally: Tally, meta: dict, penalty_of: Callable = lambda state: None,
                 elapsed: float = 0.0, stop_test: Optional[Callable] = None, sampler=None,
                 dropouts=(), started: Optional[float] = None):
        self.algorithm = algorithm
        self.evaluator = evaluator
        self.opts = opts
        self.recorder = recorder
        self.tally = tally
        self.gatherer = gatherer
        self.gatherer.tally = tally
        self.sampler = sampler
        self.dropouts: list[Dropout] = list(dropouts)
        self.meta = meta
        self.penalty_of = penalty_of
        self.stage = int(meta.get("stage", 0))
        self.stop_test = stop_test
        self.start_norm = None
        self.last_test: Optional[Tested] = None      # the stop test at the latest evaluation
        # the evaluations' schedule, kept in checkpoints (Session restores it, so that a
        # resumed run evaluates at the rounds an uninterrupted one does)
        self.free_since = None       # the round of the latest evaluation a round held
        self.work_since = 0.0        # rows the rounds read since the last paid evaluation
        self.stage_ended = False     # the last round ended its stage (settled)
        self._start = (time.perf_counter() if started is None else started) - elapsed

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self._start

    # -- one round's messages ----------------------------------------------------------------------
    def replies(self, request):
        """The replies to a round's request, from the round's participants (every client, or
        the sampler's draw for ``request.round``), counted with the rounds' traffic."""
        if self.sampler is None:
            return self.gatherer.collect(request)
        participants, factors = self.sampler.draw(request.round)
        return self.gatherer.collect(request, participants, factors)

    def exchange(self, request):
        """One request outside the rounds (e.g. a probe) to every client: all replies, counted
        with the evaluations' traffic; its dropouts are recorded at once."""
        replies = list(self.gatherer.collect(request, kind="eval"))
        self.dropouts.extend(self.gatherer.take())
        return replies

    def evaluate(self, w, with_grad: bool, round: int = 0, commit: bool = True):
        """A full-data evaluation at w (every client), counted with the evaluations' traffic.
        ``commit``: record its dropouts now (else they wait for the round's end)."""
        ev = self.evaluator.evaluate(lambda request: self.gatherer.collect(request, kind="eval"),
                                     w, with_grad, round=round)
        if commit:
            self.dropouts.extend(self.gatherer.take())
        return ev

    # -- the loop ------------------------------------------------------------------------------
    def run(self, state, rounds: int, stage: int = 0):
        """Run up to ``rounds`` rounds from ``state``; return (state, reason) with reason
        "max_iter", "stopped" (by the callback), "converged" (the stop test passed) or
        "settled" (the algorithm's ``settle(state, info)`` says its iterates stopped moving:
        more rounds would not change them)."""
        self.stage, self.stage_ended = stage, False
        alg, opts = self.algorithm, self.opts
        if self.start_norm is None:           # |w_1|, the scale of divergence
            self.start_norm = float(np.linalg.norm(state.w))
        every = max(1, rounds // 10)
        for k in range(rounds):
            try:
                self.gatherer.take()                # a failed round's dropouts are its error's
                request = alg.request(state)
                new, info = alg.step(state, self.replies(request))
                self.work_since += alg.round_work(request)
                record = dict(alg.record(info))
                step = record.get("step_norm", 0.0)
                if not np.isfinite(step) or step > DIVERGENCE_STEP * max(1.0, self.start_norm):
                    raise DivergenceError(self._divergence(
                        new.t, f"the step |w_(t+1) - w_t| = {step:.3g} is not finite or "
                        f"exceeds {DIVERGENCE_STEP:g} max(1, |w_1|)", state))
                evaluated, converged = None, False
                free = (alg.round_evaluation(state, new, info)
                        if opts.eval_every and not self.gatherer.pending else None)
                if free is not None:
                    # the round's own statistics are a full-data evaluation at the point it
                    # accepted (no second pass over the data): tested at every such round
                    point, ev = free
                    self.free_since = new.t
                    evaluated = (new.t, *self.evaluator.split(ev.values, point.w))
                    # tested at every such round: the test costs the server a fit (a CVXPY
                    # solve with a domain), no exchange, and the run ends at the first point
                    # that passes, not at the next short step (the fit is skipped where the
                    # test cannot pass: Session._stop_test). Its multipliers join the
                    # continuation's evidence only at every eval_every-th round and once the
                    # step is short, so the iterates do not depend on the tolerances (a
                    # report from every round moves the penalty's stages: on S2MPJ some runs
                    # took fewer rounds, others up to twice as many)
                    near = (step <= EVIDENCE_STEP * max(1.0, float(np.linalg.norm(point.w)))
                            or new.t % opts.eval_every == 0)
                    if self.stop_test is not None:
                        converged, report = self._test(point, ev, evidence=near)
                        if converged:
                            new = point
                        if near or converged:
                            new = alg.remember_report(new, report)
                elif (opts.eval_every and new.t % opts.eval_every == 0
                      and (self.free_since is None
                           or new.t - self.free_since >= opts.eval_every)
                      and self._evaluation_affordable()):
                    self.work_since = 0.0
                    ev = self._scheduled_evaluation(new)
                    if ev is not None:
                        evaluated = (new.t, *self.evaluator.split(ev.values, new.w))
                    if ev is not None and self.stop_test is not None and ev.complete:
                        converged, report = self._test(new, ev)
                        new = alg.remember_report(new, report)
            except BaseException as exc:
                diverged = self._diverged(exc, state)
                self.failed(diverged or exc, state)
                if diverged is not None:
                    raise diverged from exc
                raise
            # the round counts only once all of it (its evaluation too) went through
            state = new
            self.dropouts.extend(self.gatherer.take())
            self.recorder.round(new.t, stage, record)
            if evaluated is not None:
                self.recorder.evaluation(*evaluated)
            # whether the stage ends here, asked before the callback and the checkpoint: the
            # method's state then holds this round's counters, and a stop requested at the
            # round where the stage ends is a stop whose resume starts the next stage
            settled = False
            if not converged:
                try:
                    state, settled = alg.settle(state, info)
                except BaseException as exc:
                    self.failed(exc, state)
                    raise
            self.stage_ended = bool(settled)
            try:
                stop = self._callback(state, record)
            except BaseException as exc:      # e.g. Ctrl-C in the callback: the round is done
                self.failed(exc, state)
                raise
            if opts.progress and ((k + 1) % every == 0 or k == 0 or stop or converged):
                self._progress(alg.describe(info), k + 1, rounds)
            if opts.checkpoint and (stop or converged or state.t % opts.checkpoint_every == 0):
                self.save(state)
            if converged:
                return state, st.CONVERGED
            if stop:
                return state, st.STOPPED
            if settled:
                return state, st.SETTLED
        if opts.checkpoint and rounds and state.t % opts.checkpoint_every:
            self.save(state)              # the end of a run: resume can extend it
        return state, st.MAX_ITER

    def _test(self, state, ev, evidence: bool = True) -> tuple:
        """(passed, report) of the stop test at ``state`` on the full-data evaluation ``ev``,
        kept as :attr:`last_test`. ``evidence`` False: the report will not join the method's
        evidence, and the test may skip it where it cannot pass (report None, nothing kept)."""
        passed, report = self.stop_test(state, ev, evidence=evidence)
        if report is not None:
            self.last_test = Tested(state.w, ev, report)
        return passed, report

    def _evaluation_affordable(self) -> bool:
        """A scheduled evaluation reads every row (N) with gradients; with the method's
        ``eval_budget`` b it runs only once the rounds since the last one read at least
        N (1 - b) / b rows, so that evaluations take at most the share b of the clients'
        work. No budget (None): every ``eval_every`` rounds."""
        budget = self.algorithm.eval_budget
        if not budget:
            return True
        return self.work_since >= self.evaluator.num_samples * (1.0 - budget) / budget

    def _scheduled_evaluation(self, state):
        """The round's full-data evaluation, or None when the point is a trial point the method
        may still reject (``tentative``) and a function is not finite there: no record and no
        test at that round (the method's next round rejects the point)."""
        try:
            return self.evaluate(state.w, with_grad=self.stop_test is not None,
                                 round=state.t, commit=False)
        except UserFunctionError as exc:
            if not_finite_at_point(exc) and self.algorithm.tentative(state):
                return None      # any dropouts stay pending: the round's end records them
            raise

    def _diverged(self, exc, state):
        """A DivergenceError for ``exc`` when the iterate exploded before the user's functions
        returned non-finite values at it, or a client replied non-finite numbers at it
        (:class:`~ssca_solver.errors.ReplyError`; else None)."""
        if isinstance(exc, DivergenceError):
            return None
        grown = float(np.linalg.norm(state.w))
        text = str(exc).lower()
        user_nonfinite = (not_finite_at_point(exc)
                          or (isinstance(exc, ReplyError) and exc.kind == "nonfinite"))
        # NumPy/SciPy refusing infs or NaNs inside the solver's own arithmetic
        numeric = (isinstance(exc, ValueError) and not isinstance(exc, SSCAError)
                   and ("inf" in text or "nan" in text))
        exploded = not np.isfinite(grown) or grown > DIVERGENCE_FACTOR * max(1.0,
                                                                            self.start_norm)
        if not ((user_nonfinite and exploded) or numeric):
            return None
        return DivergenceError(self._divergence(
            state.t + 1, f"|w| grew from {self.start_norm:.3g} to {grown:.3g} and then: {exc}",
            state))

    def _divergence(self, t: int, what: str, state=None) -> str:
        """The DivergenceError's message for round ``t``; ``state``: the last state, handed to
        the method's diagnosis only when its iterate had itself grown DIVERGENCE_FACTOR times
        past max(1, |w_1|) (the path ran away, not one wild step)."""
        grown = (state is not None and self.start_norm is not None
                 and float(np.linalg.norm(state.w))
                 > DIVERGENCE_FACTOR * max(1.0, self.start_norm))
        cause = self.algorithm.divergence_cause(state if grown else None)
        if cause:
            return f"the iterates diverged at round {t}: {what}; {cause}"
        outlier = self.gatherer.outlier(t)
        if outlier:         # one client's reply, not the steps: say so instead of blaming them
            return f"the iterates diverged at round {t}: {what}. {outlier}"
        return (f"the iterates diverged at round {t}: {what}. This is the solver's failure, "
                "not a fault in your functions (they were finite at the start): the steps are "
                "too long for their curvature. With tau and batch_size left at 'auto' please "
                "report it; with a fixed tau, raise it or use tau='auto'; with fixed rho or "
                "gamma, use smaller values; features of very different scales also cause it "
                "(standardise them)")

    def _callback(self, state, record) -> bool:
        cb = self.opts.callback
        if cb is None:
            return False
        last = self.recorder.last_evaluation()
        x = state.w.view()
        x.flags.writeable = False
        it = Iteration(state.t, x, self.algorithm.name, self.stage, self.penalty_of(state),
                       float(record.get("step_norm", np.nan)), *(last or (None, None, None)),
                       record, state)
        try:
            answer = cb(it)
        except StopIteration:
            return True
        # only an explicit True stops: a lambda that returns what list.append returns, or a
        # tuple of such, must not end the run by accident
        return answer is True or (isinstance(answer, np.bool_) and bool(answer))

    def failed(self, exc: BaseException, state) -> None:
        """Attach the last good state (and its checkpoint) to ``exc``."""
        path = None
        if self.opts.checkpoint:
            try:
                path = self.save(state)
            except Exception as save_exc:  # never hide the original failure
                exc.add_note(f"(writing the checkpoint failed too: {save_exc!r})") \
                    if hasattr(exc, "add_note") else None
        try:
            exc.state, exc.checkpoint = state, path
        except AttributeError:  # exceptions with __slots__
            return
        if hasattr(exc, "add_note"):
            exc.add_note(f"ssca-solver: the last good state is after round {state.t}"
                         + (f"; checkpoint written to {path!r} (resume with "
                            f"solve(..., resume={path!r}))" if path else
                            " (exc.state); pass checkpoint=PATH to be able to resume"))

    # -- checkpoints and progress ----------------------------------------------------------------
    def save(self, state) -> str:
        arrays = {**{f"state/{k}": v for k, v in self.algorithm.state_arrays(state).items()},
                  **self.recorder.arrays(), **self.tally.arrays(),
                  **dropout_arrays(self.dropouts)}
        meta = {**self.meta, "round": int(state.t), "stage": int(self.stage),
                "stage_ended": bool(self.stage_ended),
                "elapsed": self.elapsed, "work_since": float(self.work_since),
                "free_since": None if self.free_since is None else int(self.free_since)}
        return ckpt.save(self.opts.checkpoint, arrays, meta)

    def _progress(self, fragment: str, k: int, rounds: int) -> None:
        parts = [f"[{self.algorithm.name}] {fragment}", f"{k:>5d}/{rounds}"]
        last = self.recorder.last_evaluation()
        if last is not None:
            t, f0, cons = last
            parts.append(f"F0={f0:.5g} (t={t})")
            if cons.size:
                parts.append(f"max F-U={np.max(cons):.3g}")
        print("  ".join(parts), file=sys.stderr, flush=True)


def dropout_arrays(dropouts) -> dict:
    """The dropouts as checkpoint arrays (plain NumPy: ints and unicode strings)."""
    if not dropouts:
        return {}
    return {"dropouts/client": np.array([d.client for d in dropouts], dtype=np.int64),
            "dropouts/round": np.array([d.round for d in dropouts], dtype=np.int64),
            "dropouts/task": np.array([d.task for d in dropouts], dtype=str),
            "dropouts/error": np.array([d.error for d in dropouts], dtype=str)}


def dropouts_from(arrays: dict) -> list[Dropout]:
    """The dropouts saved by :func:`dropout_arrays` (none in a checkpoint without them)."""
    if "dropouts/client" not in arrays:
        return []
    return [Dropout(int(c), str(k), int(r), str(e)) for c, r, k, e in zip(
        arrays["dropouts/client"], arrays["dropouts/round"], arrays["dropouts/task"],
        arrays["dropouts/error"])]


def state_arrays_from(arrays: dict) -> dict:
    """The algorithm-state part of a checkpoint's arrays (prefix ``state/`` removed)."""
    return {k[len("state/"):]: v for k, v in arrays.items() if k.startswith("state/")}
