"""The one front door: every method is run by the same sequence.

``Problem.solve(method=name, **options)`` finds the registered method and calls
:func:`solve`, which parses the options once, builds the method, opens a
:class:`~ssca_solver.engine.session.Session` (clients, transport, fresh start or resume), lets
the method prepare the start, runs the method's stages through the one
:class:`~ssca_solver.engine.runner.Runner`, makes the final full-data report, asks the method
for its status and assembles the :class:`~ssca_solver.Result` (like scipy's ``minimize``
dispatching on a method string, and jaxopt's ``IterativeSolver.run`` owning the loop).

No failure of the library's own numerics loses a run (:func:`ssca_solver.engine.session.
library_failure`): when a round's subproblem cannot be solved after its retries, the solve
returns the last good state (the runner attaches it to the exception) as a Result with status
"error", its history and a message naming what failed and where; a KKT report that cannot be
computed is marked failed (the session) and the run keeps the status it earned; a status
decision whose own diagnostics fail gives status "error" at the returned point. User errors,
client failures, divergence and Ctrl-C still raise.
"""

from __future__ import annotations

import contextlib
import re
import time
import warnings

import numpy as np

from .. import status as st
from ..diagnostics.certificate import kkt_failed
from ..diagnostics.evaluation import EVALUATE
from ..diagnostics.result import Result
from ..model import problem as problem_module
from .method import Method, Outcome
from .session import Session, library_failure


def solve(problem, method: type, options: dict) -> Result:
    """Solve ``problem`` by ``method`` (a :class:`~ssca_solver.engine.method.Method`
    subclass) with the user's ``options``; see the module docstring for the sequence. Each
    kind of warning raised during the run is shown once, with how often it came
    (:func:`once_per_kind`); ``res.time`` counts the whole call, the engine's start-up
    included."""
    started = time.perf_counter()
    opts = method.parse(problem, options)
    algorithm = method.build(problem, opts, options)
    with once_per_kind():
        return _run(problem, algorithm, opts, started)


def _run(problem, algorithm, opts, started: float) -> Result:
    extras = {}
    with Session(problem, algorithm, opts, started=started) as session:
        try:
            state = session.start()
            state, reason = session.run_stages(state)
        except Exception as exc:
            if not library_failure(exc) or getattr(exc, "state", None) is None:
                raise
            state, reason, failure = exc.state, st.ERROR, exc
        else:
            failure = None
        certificate = session.certificate
        if failure is None:
            if reason != st.CONVERGED:
                state = algorithm.returned_state(state)
            fun, cons, kkt, comm, history = session.final_report(state, reason)
            complete = (session.final_evaluation is not None
                        and session.final_evaluation.complete)
            if certificate is not None:
                reason = certificate.promote(reason, kkt, complete, bool(opts.eval_every))
            outcome = Outcome(reason, state, kkt, history, session)
            try:
                status, message = algorithm.status(outcome)
            except Exception as exc:
                if not library_failure(exc):
                    raise
                status, message = st.error("the status decision (its diagnostics at the "
                                           "returned point)", state.t, exc)
                extras["error"] = exc
            if kkt.failed and status not in (st.ERROR, st.PRIVATE):
                message = kkt_failed(message, kkt)
            elif not complete and status == st.MAX_ITER and certificate is not None:
                missing = sorted({d.client for d in session.runner.dropouts
                                  if d.round == state.t and d.task == EVALUATE})
                message = certificate.incomplete(message, kkt, missing)
        else:
            fun, cons, kkt, comm, history, note = session.error_report(state)
            outcome = Outcome(reason, state, kkt, history, session)
            status, message = st.error(f"round {state.t + 1}", state.t, failure,
                                       getattr(failure, "checkpoint", None))
            message += note
            extras["error"] = failure
        fields = {"slack": np.zeros(problem.num_constraints), "penalty": None, "stages": (),
                  "subproblem": None, **_fields(algorithm, outcome, failure is not None)}
    if extras:
        fields["extras"] = {**fields.get("extras", {}), **extras}
    if status == st.ERROR:
        warnings.warn(f"solve ended with status 'error': {message}", RuntimeWarning,
                      stacklevel=4)          # Problem.solve's caller
    return Result(x=state.w.copy(), status=status, message=message, fun=fun, constraints=cons,
                  kkt=kkt, history=history, communication=comm, nit=state.t,
                  method=algorithm.name, time=session.runner.elapsed,
                  constraint_names=tuple(c.name for c in problem.constraints),
                  dropouts=tuple(session.runner.dropouts),
                  tolerances=({} if certificate is None else
                              {"feas_tol": certificate.feas_tol,
                               "kkt_tol": certificate.kkt_tol}), **fields)


#: digits in a warning's text (masked when grouping warnings by kind)
_NUMBER = re.compile(r"[-+]?\d+(\.\d+)?([eE][-+]?\d+)?")


@contextlib.contextmanager
def once_per_kind():
    """Collect the warnings raised inside and show each kind once when it ends (also when it
    ends with an exception): the first of a kind (same category, same text once its numbers
    are masked), with "(N times in this solve)" when it came more than once. A warning that
    the caller's filters turn into an error raises then, at the end of the solve (not over an
    exception already on its way)."""
    kinds: dict = {}
    failed = False
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                yield
            finally:
                for w in caught:
                    key = (w.category, _NUMBER.sub("#", str(w.message)))
                    kinds.setdefault(key, []).append(w)
    except BaseException:
        failed = True
        raise
    finally:
        for ws in kinds.values():
            try:
                _show(ws)
            except Exception:
                if not failed:
                    raise


def _show(ws) -> None:
    """The first warning of a kind again, with its count when there were more."""
    first = ws[0]
    message = first.message
    if len(ws) > 1:
        try:
            message = first.category(f"{first.message} ({len(ws)} times in this solve)")
        except Exception:              # a category with another constructor: as it came
            message = first.message
    warnings.warn_explicit(message, first.category, first.filename, first.lineno,
                           source=first.source)


def _fields(algorithm, outcome, failed: bool) -> dict:
    """The method's own Result fields; after a failure, none rather than a second error."""
    if not failed:
        return algorithm.result_fields(outcome)
    try:
        return algorithm.result_fields(outcome)
    except Exception:
        return {}


def front_door(method: type):
    """``solve_x(problem, **options) -> Result`` for a :class:`Method` subclass (what
    :func:`register_method` registers)."""
    def solve_with(problem, **options) -> Result:
        return solve(problem, method, options)

    solve_with.__name__ = f"solve_{method.name}"
    solve_with.__qualname__ = solve_with.__name__
    solve_with.__doc__ = (f"Solve ``problem`` by method {method.name!r}: "
                          f"{(method.__doc__ or '').strip()}\n\nOptions: "
                          f":class:`{method.Options.__module__}.{method.Options.__qualname__}`.")
    solve_with.method = method
    return solve_with


def register_method(name: str, method) -> None:
    """Make ``Problem.solve(method=name)`` run ``method``: a
    :class:`~ssca_solver.engine.method.Method` subclass (run by the one front door, with
    sessions, stages, checkpoints, dropouts, secure aggregation as it declares), or a plain
    callable ``solver(problem, **options) -> Result``."""
    if isinstance(method, type) and issubclass(method, Method):
        method = front_door(method)
    elif not callable(method):
        raise TypeError(f"register_method: {method!r} is neither a Method subclass nor a "
                        "callable solver(problem, **options)")
    problem_module.register_method(name, method)
