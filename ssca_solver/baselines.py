"""``solve_fedavg``: the front door of the SGD baselines (FedAvg, FedSGD, server momentum).

The method is :class:`ssca_solver.algorithms.FedAvg`, run by the same runner and client layer
as SSCA (same partition, start, evaluation, callbacks, checkpoints). Only unconstrained problems
with an exact ridge term (or none) are supported: SGD has no way to handle the stochastic
constraints of Problem 3.
"""

from __future__ import annotations

import numpy as np

from . import options as opt
from .algorithms import FedAvg
from .errors import ModelError
from .options import FedAvgOptions
from .result import Result
from .session import Session, describe_schedule, fingerprint

__all__ = ["FedAvgOptions", "solve_fedavg"]


def _parse(problem, options: dict) -> FedAvgOptions:
    o = opt.parse(FedAvgOptions, options, "fedavg")
    if problem.num_constraints:
        raise ModelError("method 'fedavg' cannot handle stochastic constraints; use 'ssca'")
    if problem.objective is None:
        raise ModelError("method 'fedavg' needs a stochastic objective (a SampleFunction)")
    if problem.deterministic.norm2_coefficient() is None:
        raise ModelError("method 'fedavg' supports deterministic terms only of the form "
                         "lambda |w|^2 (no domain)")
    if isinstance(o.lr, (bool, np.bool_, str)) or not (callable(o.lr) or opt.is_real(o.lr)):
        raise ValueError(f"lr must be a PowerStep, a callable t -> value or a number > 0, "
                         f"got {o.lr!r}")
    if not callable(o.lr):
        opt.real("lr", o.lr, low=0.0, low_open=True)
    return o.__class__(**{
        **vars(o), "batch_size": opt.batch_size(o.batch_size, problem.data),
        "local_steps": opt.integer("local_steps", o.local_steps),
        "momentum": opt.real("momentum", o.momentum, low=0.0, high=1.0 - 1e-16)})


def solve_fedavg(problem, **options) -> Result:
    """FedAvg / FedSGD (McMahan et al.), the SGD baselines of Section VI, on ``problem``.

    Status "max_iter" (the method has no stopping test, so ``success`` is False) or "stopped"
    (by the callback). Options: :class:`ssca_solver.options.FedAvgOptions`.
    """
    o = _parse(problem, options)
    algorithm = FedAvg(problem, o.batch_size, o.local_steps, o.lr, o.momentum,
                       problem.deterministic.norm2_coefficient())
    fp = fingerprint(problem, "fedavg", batch_size=o.batch_size, local_steps=o.local_steps,
                     momentum=o.momentum, lr=describe_schedule(o.lr))
    with Session(problem, algorithm, o, fp, algorithm.init) as session:
        state, reason = session.runner.run(session.state, o.max_iter - session.state.t)
        fun, cons, kkt, comm, history = session.final_report(state)
    if reason == "stopped":
        status, message = "stopped", f"stopped by the callback after round {state.t}"
    else:
        status, message = "max_iter", (f"ran max_iter={o.max_iter} rounds of FedAvg "
                                       f"(E = {o.local_steps}, B = {o.batch_size or 'full'}); "
                                       "FedAvg has no stopping test: judge the point by its "
                                       "KKT report")
    return Result(x=state.w.copy(), status=status, message=message, fun=fun,
                  constraints=cons, slack=np.zeros(0), penalty=None, kkt=kkt, history=history,
                  communication=comm, stages=(), nit=state.t, method="fedavg",
                  subproblem=None, time=session.runner.elapsed,
                  extras={"local_steps": o.local_steps, "momentum": o.momentum},
                  dropouts=tuple(session.runner.dropouts))
