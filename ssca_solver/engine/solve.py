"""The one front door: every method is run by the same sequence.

``Problem.solve(method=name, **options)`` finds the registered method and calls
:func:`solve`, which parses the options once, builds the method, opens a
:class:`~ssca_solver.engine.session.Session` (clients, transport, fresh start or resume), lets
the method prepare the start, runs the method's stages through the one
:class:`~ssca_solver.engine.runner.Runner`, makes the final full-data report, asks the method
for its status and assembles the :class:`~ssca_solver.Result` (like scipy's ``minimize``
dispatching on a method string, and jaxopt's ``IterativeSolver.run`` owning the loop).
"""

from __future__ import annotations

import numpy as np

from ..diagnostics.result import Result
from ..model import problem as problem_module
from .method import Method, Outcome
from .session import Session


def solve(problem, method: type, options: dict) -> Result:
    """Solve ``problem`` by ``method`` (a :class:`~ssca_solver.engine.method.Method`
    subclass) with the user's ``options``; see the module docstring for the sequence."""
    opts = method.parse(problem, options)
    algorithm = method.build(problem, opts, options)
    with Session(problem, algorithm, opts) as session:
        state = session.start()
        state, reason = session.run_stages(state)
        fun, cons, kkt, comm, history = session.final_report(state)
        outcome = Outcome(reason, state, kkt, history, session)
        status, message = algorithm.status(outcome)
        fields = {"slack": np.zeros(problem.num_constraints), "penalty": None, "stages": (),
                  "subproblem": None, **algorithm.result_fields(outcome)}
    return Result(x=state.w.copy(), status=status, message=message, fun=fun, constraints=cons,
                  kkt=kkt, history=history, communication=comm, nit=state.t,
                  method=algorithm.name, time=session.runner.elapsed,
                  constraint_names=tuple(c.name for c in problem.constraints),
                  dropouts=tuple(session.runner.dropouts), **fields)


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
