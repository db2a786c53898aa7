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
    subclass) with the user's ``options``; see the module docstring for the sequence."""
    opts = method.parse(problem, options)
    algorithm = method.build(problem, opts, options)
    extras = {}
    with Session(problem, algorithm, opts) as session:
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
            complete = session.final_evaluation.complete
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
            if kkt.failed and status != st.ERROR:
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
                  dropouts=tuple(session.runner.dropouts), **fields)


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
