"""``solve_ssca``: the front door of Algorithms 1 and 2 with the penalty continuation.

Options are parsed once (:mod:`ssca_solver.options`); the rounds are the one runner
(:mod:`ssca_solver.runner`) driving :class:`ssca_solver.algorithms.SSCA`; the penalty
continuation of Theorem 2 is the short loop over stages below.
"""

from __future__ import annotations

import warnings

import numpy as np

from . import options as opt
from .algorithms import SSCA
from .driver import stage_slack
from .errors import ModelError
from .result import Result, Stage
from .schedules import as_schedule, check_schedules
from .session import Session, describe_schedule, fingerprint
from .subproblems import CvxpySubproblem, make_subproblem


def _parse(problem, options: dict) -> opt.SSCAOptions:
    o = opt.parse(opt.SSCAOptions, options, "ssca")
    if not problem.functions:
        raise ModelError("the problem has no SampleFunction: there is nothing stochastic to "
                         "solve by SSCA; solve it with CVXPY directly")
    if problem.num_constraints == 0 and "penalty" in options:
        warnings.warn("penalty has no effect: the problem has no stochastic constraints",
                      UserWarning, stacklevel=4)
    if o.solver_options is not None and not isinstance(o.solver_options, dict):
        raise ValueError(f"solver_options must be a dict, got {o.solver_options!r}")
    if not isinstance(o.solver, str):
        raise ValueError(f"solver must be a CVXPY solver name, got {o.solver!r}")
    return o.__class__(**{
        **vars(o),
        "batch_size": opt.batch_size(o.batch_size, problem.data),
        "tau": opt.real("tau", o.tau, low=0.0, low_open=True),
        "rho": as_schedule(o.rho, "rho"), "gamma": as_schedule(o.gamma, "gamma"),
        "penalty": opt.penalties(o.penalty) if problem.num_constraints else (0.0,),
        "slack_tol": opt.real("slack_tol", o.slack_tol, low=0.0),
        "subproblem": opt.choice("subproblem", o.subproblem, ("auto", "closed_form", "cvxpy")),
        "surrogate_init": opt.choice("surrogate_init", o.surrogate_init, ("tau", "zero"))})


def solve_ssca(problem, **options) -> Result:
    """Solve ``problem`` by mini-batch SSCA: Algorithm 1 (no stochastic constraint) or
    Algorithm 2 (Problem 5 with slacks and penalty c) inside the penalty continuation of
    Theorem 2, then report KKT diagnostics on the full data. Options:
    :class:`ssca_solver.options.SSCAOptions`.

    Status: "converged" when a stage's slack estimate is <= slack_tol (Algorithm 2),
    "infeasible" when the slack stayed positive at the largest penalty, "stopped" when the
    callback stopped the run, else "max_iter" (Algorithm 1 has no stopping test of its own).
    """
    o = _parse(problem, options)
    check_schedules(o.rho, o.gamma, stochastic=o.batch_size is not None)
    M = problem.num_constraints
    builders = problem.builders                 # the functions' surrogates as they are now
    subproblem = make_subproblem(problem, builders, o.subproblem, o.solver, o.solver_options)
    algorithm = SSCA(problem, builders, subproblem, o.batch_size, o.tau, o.rho, o.gamma,
                     o.surrogate_init)
    fp = fingerprint(problem, "ssca", batch_size=o.batch_size, tau=o.tau,
                     penalty=list(o.penalty),
                     max_iter=o.max_iter if M else None,   # stages' lengths; Alg. 1 may extend
                     surrogate_init=o.surrogate_init, subproblem=subproblem.name,
                     rho=describe_schedule(o.rho), gamma=describe_schedule(o.gamma),
                     slack_tol=o.slack_tol, solver=o.solver, solver_options=o.solver_options,
                     builders=[repr(b) for b in builders])
    penalties = o.penalty
    status = message = None
    with Session(problem, algorithm, o,  fp,
                 lambda x0: algorithm.init(x0, penalties[0]),
                 penalty_of=(lambda s: s.penalty) if M else (lambda s: None)) as session:
        runner, state = session.runner, session.state
        stages = []
        for j in range(session.stage, len(penalties)):
            if not (session.resumed and j == session.stage):
                state = algorithm.with_penalty(state, penalties[j])
            done = int(np.count_nonzero(runner.recorder.columns["stage"].view() == j))
            state, reason = runner.run(state, o.max_iter - done, stage=j)
            stages = _stages(runner.recorder, penalties, o.max_iter)
            if reason == "stopped":
                status, message = "stopped", (f"stopped by the callback after round {state.t}"
                                              + (f" (stage {j + 1}, c = {penalties[j]:g})"
                                                 if M else ""))
                break
            if M and stages[-1].slack_norm <= o.slack_tol:
                status = "converged"
                message = (f"mean slack norm over the stage's last rounds "
                           f"{stages[-1].slack_norm:.3g} <= slack_tol={o.slack_tol:g} at "
                           f"penalty c = {penalties[j]:g} (stage {j + 1} of {len(penalties)}), "
                           f"{state.t} rounds")
                break
        if status is None and M:
            status = "infeasible"
            message = (f"the slack stayed positive (|s| = {stages[-1].slack_norm:.3g} > "
                       f"slack_tol={o.slack_tol:g}) at the largest penalty c = "
                       f"{penalties[-1]:g}: the constraints may be infeasible, or c or "
                       "max_iter too small (see docs/modelling.md)")
        elif status is None:
            status = "max_iter"
            message = (f"ran max_iter={o.max_iter} rounds of Algorithm 1 (SSCA has no "
                       "internal stopping test; judge the point by its KKT report)")
        fun, cons, kkt, comm, history = session.final_report(state, state.nu, o.solver)
    inaccurate = tuple(int(t) for t in history.t[history.inaccurate > 0])
    if inaccurate:
        warnings.warn(f"{len(inaccurate)} subproblem solves were flagged inaccurate (rounds "
                      f"{list(inaccurate[:5])}...); see res.solver_info", RuntimeWarning,
                      stacklevel=3)
    stage_now = int(history.stage[-1]) if len(history.stage) else 0
    last_slack = history.slack[-1] if len(history.t) else np.zeros(M)
    return Result(
        x=state.w.copy(), status=status, message=message, fun=fun, constraints=cons,
        slack=np.array(last_slack), penalty=(penalties[stage_now] if M else None), kkt=kkt,
        history=history, communication=comm, stages=tuple(stages), nit=state.t,
        method="ssca", subproblem=subproblem.name, time=runner.elapsed,
        constraint_names=tuple(c.name for c in problem.constraints),
        solver_info={"solver": (o.solver if isinstance(subproblem, CvxpySubproblem)
                                else "closed_form"),
                     "retries": int(history.retries.sum()),
                     "parametrized": getattr(subproblem, "parametrize", None),
                     "inaccurate_rounds": inaccurate})


def _stages(recorder, penalties, max_iter) -> list[Stage]:
    """One :class:`Stage` per penalty value run so far, from the history."""
    stage = recorder.columns["stage"].view()
    out = []
    for j in np.unique(stage):
        rows = recorder.stage_rows("slack", int(j))
        out.append(Stage(penalties[int(j)], int(len(rows)), stage_slack(rows, max_iter)))
    return out
