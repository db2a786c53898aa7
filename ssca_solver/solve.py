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
from .diagnostics import PHASE1_TOL

#: a drop of the violation's second difference above this (relative) makes the point a saddle
SADDLE_TOL = 1e-12
from .driver import stage_slack
from .errors import ModelError
from .result import Result, Stage
from .schedules import as_schedule, check_schedules, resolve
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
        "batch_size": opt.batch_size(o.batch_size, problem.data, allow_auto=True),
        "tau": _tau(o.tau),
        "rho": as_schedule(o.rho, "rho"), "gamma": as_schedule(o.gamma, "gamma"),
        "penalty": opt.penalties(o.penalty) if problem.num_constraints else (0.0,),
        "slack_tol": opt.real("slack_tol", o.slack_tol, low=0.0),
        "feas_tol": opt.real("feas_tol", o.feas_tol, low=0.0),
        "kkt_tol": opt.real("kkt_tol", o.kkt_tol, low=0.0),
        "check_gradients": opt.flag("check_gradients", o.check_gradients),
        "subproblem": opt.choice("subproblem", o.subproblem, ("auto", "closed_form", "cvxpy")),
        "surrogate_init": opt.choice("surrogate_init", o.surrogate_init, ("tau", "zero"))})


def _tau(value):
    if isinstance(value, str) and value == "auto":
        return value
    if not opt.is_real(value):
        raise ValueError(f"tau must be a number > 0 or 'auto', got {value!r}")
    return opt.real("tau", value, low=0.0, low_open=True)


def solve_ssca(problem, **options) -> Result:
    """Solve ``problem`` by mini-batch SSCA: Algorithm 1 (no stochastic constraint) or
    Algorithm 2 (Problem 5 with slacks and penalty c) inside the penalty continuation of
    Theorem 2, with a full-data KKT test every ``eval_every`` rounds. Options:
    :class:`ssca_solver.options.SSCAOptions`.

    Status: "converged" only when the full-data KKT test passed (feasibility within
    ``feas_tol``, stationarity and complementarity within ``kkt_tol``, all relative); the run
    stops there. "infeasible" when no evaluated iterate was feasible and the subproblem's slack
    stayed positive at the largest penalty; "stopped" when the callback stopped the run; else
    "max_iter", with the residual that failed named in the message.
    """
    o = _parse(problem, options)
    # with K < I clients per round even full batches give a random estimate (the draw of the
    # clients): the paper's diminishing rho and gamma, not deterministic SCA's unit steps
    # (proportional draws are with replacement: random even with K = I)
    sampled = o.clients_per_round is not None and (
        o.clients_per_round < problem.data.num_clients or o.participation == "proportional")
    # "auto" schedules: the round-counted ones when every round has exact statistics (full
    # rows of every client), the epoch-counted ones otherwise (fixed B, "auto" batches, K < I)
    exact = o.batch_size is None and not sampled
    rho, gamma = resolve(o.rho, "rho", exact), resolve(o.gamma, "gamma", exact)
    check_schedules(rho, gamma, stochastic=o.batch_size is not None)
    unit_steps = "rho" not in options and "gamma" not in options and not sampled
    M = problem.num_constraints
    builders = problem.builders                 # the functions' surrogates as they are now
    subproblem = make_subproblem(problem, builders, o.subproblem, o.solver, o.solver_options)
    # the expected fraction of the clients in a round, for the epoch clock of EpochStep: K/I
    # (proportional draws: K with replacement, distinct clients fewer; K/I is near enough)
    participation = (1.0 if o.clients_per_round is None
                     else min(1.0, o.clients_per_round / problem.data.num_clients))
    algorithm = SSCA(problem, builders, subproblem, o.batch_size, o.tau, rho, gamma,
                     o.surrogate_init, o.check_gradients, unit_steps, participation,
                     sampled_clients=sampled)
    fp = fingerprint(problem, "ssca", batch_size=o.batch_size, tau=o.tau,
                     penalty=list(o.penalty),
                     max_iter=o.max_iter if M else None,   # stages' lengths; Alg. 1 may extend
                     surrogate_init=o.surrogate_init, subproblem=subproblem.name,
                     rho=describe_schedule(rho), gamma=describe_schedule(gamma),
                     slack_tol=o.slack_tol, solver=o.solver, solver_options=o.solver_options,
                     builders=[repr(b) for b in builders])
    penalties = o.penalty
    bound_scale = np.maximum(1.0, np.abs(problem.bounds))

    with Session(problem, algorithm, o, fp, lambda x0: algorithm.init(x0, penalties[0]),
                 penalty_of=(lambda s: s.penalty) if M else (lambda s: None),
                 kkt_test=lambda rep: rep.passed(o.feas_tol, o.kkt_tol),
                 solver=o.solver) as session:
        runner, state = session.runner, session.state
        if not session.resumed:
            try:
                if o.check_gradients or o.tau == "auto":
                    tau0 = algorithm.probe(runner.exchange, state.w)
                    metric = algorithm.measure_metric(runner.exchange, state.w)
                    state = algorithm.init(state.w, penalties[0], tau0, metric)
                if o.eval_every:
                    session.measure_scale(state.w)
            except BaseException as exc:     # before round 1: the start is the last good state
                runner.failed(exc, state)
                raise
        reason = "max_iter"
        for j in range(session.stage, len(penalties)):
            if not (session.resumed and j == session.stage) and j > 0:
                previous = _stage_slack(runner.recorder, j - 1, o.max_iter, bound_scale)
                if previous > o.slack_tol:           # c too small: the next c of the sequence
                    state = algorithm.with_penalty(state, penalties[j])
            done = int(np.count_nonzero(runner.recorder.columns["stage"].view() == j))
            state, reason = runner.run(state, o.max_iter - done, stage=j)
            if reason not in ("max_iter", "settled"):
                break
        fun, cons, kkt, comm, history = session.final_report(state, o.solver)
    stages = _stages(history, o.max_iter, bound_scale)
    status, message = _status(reason, state, kkt, history, stages, o, M, bound_scale,
                              lambda: session.violation_stationarity(state, o.feas_tol,
                                                                     o.solver),
                              lambda: session.violation_curvature(state),
                              sampled_clients=sampled)
    inaccurate = tuple(int(t) for t in history.t[history.inaccurate > 0])
    if inaccurate:
        warnings.warn(f"{len(inaccurate)} subproblem solves were flagged inaccurate (rounds "
                      f"{list(inaccurate[:5])}...); see res.solver_info", RuntimeWarning,
                      stacklevel=3)
    last_slack = history.slack[-1] if len(history.t) else np.zeros(M)
    return Result(
        x=state.w.copy(), status=status, message=message, fun=fun, constraints=cons,
        slack=np.array(last_slack), penalty=(float(state.penalty) if M else None), kkt=kkt,
        history=history, communication=comm, stages=tuple(stages), nit=state.t,
        method="ssca", subproblem=subproblem.name, time=runner.elapsed,
        constraint_names=tuple(c.name for c in problem.constraints),
        extras=({"diagonal_metric": float(1.0 / np.min(state.metric))}
                if state.metric.size else {}),
        solver_info={"solver": (o.solver if isinstance(subproblem, CvxpySubproblem)
                                else "closed_form"),
                     "retries": int(history.retries.sum()),
                     "parametrized": getattr(subproblem, "parametrize", None),
                     "inaccurate_rounds": inaccurate},
        dropouts=tuple(runner.dropouts))


def _relative_slack_rows(slack_rows, bound_scale):
    return np.asarray(slack_rows, dtype=float) / bound_scale


def _stage_slack(recorder, stage, max_iter, bound_scale) -> float:
    rows = _relative_slack_rows(recorder.stage_rows("slack", stage), bound_scale)
    return stage_slack(rows, len(rows))


def _stages(history, max_iter, bound_scale) -> list[Stage]:
    """One :class:`Stage` per stage run, from the history (penalty in force, rounds, slack)."""
    out = []
    for j in np.unique(history.stage):
        sel = history.stage == j
        rows = _relative_slack_rows(history.slack[sel], bound_scale)
        out.append(Stage(float(history.penalty[sel][-1]), int(np.count_nonzero(sel)),
                         stage_slack(rows, len(rows))))
    return out


def _violation_stalled(history, bound_scale, M):
    """(stalled, a, b): a and b are the smallest relative violation over the first and the
    second half of the last stage's evaluations; stalled when b did not improve on a by 0.1 %
    (a run that is still reducing the violation is not called infeasible)."""
    if not M or not len(history.eval_t):
        return False, np.nan, np.nan
    last = history.stage[-1]
    in_stage = np.isin(history.eval_t, history.t[history.stage == last])
    v = np.max(history.constraints[in_stage] / bound_scale, axis=1, initial=-np.inf)
    if v.size < 4:
        return False, np.nan, np.nan
    a, b = float(np.min(v[:v.size // 2])), float(np.min(v[v.size // 2:]))
    return b >= (1 - 1e-3) * a, a, b


def _status(reason, state, kkt, history, stages, o, M, bound_scale, phase1=lambda: 0.0,
            saddle=lambda: 0.0, sampled_clients=False):
    """(status, message) from why the run ended and the full-data KKT report at the end.
    ``phase1()``: the returned point's relative distance from a stationary point of the
    violation (:func:`ssca_solver.diagnostics.violation_stationarity`); ``saddle()``: the
    largest drop of the violation's second difference along random directions
    (:meth:`ssca_solver.session.Session.violation_curvature`)."""
    if reason == "converged":
        return "converged", kkt.passed_message(state.t, o.feas_tol, o.kkt_tol)
    if reason == "stopped":
        return "stopped", (f"stopped by the callback after round {state.t}"
                           + (f" (c = {state.penalty:g})" if M else ""))
    name, value, tol = kkt.residuals(o.feas_tol, o.kkt_tol)[0]
    evaluated = history.constraints / bound_scale if M else np.zeros((0, 0))
    ever_feasible = bool(M and len(evaluated) and np.any(np.max(evaluated, axis=1)
                                                          <= o.feas_tol))
    stalled, first, second = _violation_stalled(history, bound_scale, M)
    at_most = (M and np.max(kkt.feasibility_rel) > o.feas_tol and not ever_feasible and stalled
               and stages and stages[-1].slack_norm > o.slack_tol
               and stages[-1].penalty == o.penalty[-1])
    r1 = phase1() if at_most else np.nan
    if at_most and not r1 <= PHASE1_TOL:
        return "max_iter", (
            f"no feasible point was found in {state.t} rounds (relative violation "
            f"{np.max(kkt.feasibility_rel):.3g} at the end) and the violation stopped falling "
            f"at the largest c, but the returned point does not minimise the violation: its "
            f"gradient there is {r1:.3g} of the constraints' gradient at the start (above "
            f"{PHASE1_TOL:g}), so a nearby point violates less and this is no evidence of "
            "infeasibility (with a fixed mini-batch the iterates scatter around the "
            "constraint): try batch_size='auto' with the default tau, or more rounds")
    drop = saddle() if at_most else 0.0
    if at_most and drop > SADDLE_TOL * max(1.0, float(np.sum(kkt.feasibility_rel))):
        return "max_iter", (
            f"no feasible point was found in {state.t} rounds (relative violation "
            f"{np.max(kkt.feasibility_rel):.3g} at the end), and the violation's gradient "
            f"vanishes at the returned point ({r1:.2g} of the constraints' gradient at the "
            f"start), but it is a saddle of the violation, not a minimiser: along a random "
            f"direction the violation's second difference drops by {drop:.3g}. So this is no "
            "evidence of infeasibility (a network at w = 0 is such a point): start elsewhere "
            "(x0), or give smaller penalties first")
    if at_most:
        m = int(np.argmax(kkt.feasibility_rel))
        return "infeasible", (
            f"no feasible point was found: none of the {len(evaluated)} full-data evaluations "
            f"(every {o.eval_every} rounds) nor the returned point satisfied the constraints "
            f"(constraint {m + 1} violated by {kkt.feasibility[m]:.3g} at the end); at the "
            f"largest penalty c = {stages[-1].penalty:g} the subproblem kept a positive slack "
            f"({stages[-1].slack_norm:.3g}, relative) and the violation stopped decreasing "
            f"(smallest {first:.4g} in the first half of the last stage's evaluations, "
            f"{second:.4g} in the second), and the returned point is a stationary point of "
            f"the violation (its gradient {r1:.2g} of the constraints' gradient at the "
            f"start). Either the constraints cannot be met (certain when they are convex), "
            "or their multipliers exceed c: if they can be met, give larger penalties")
    if not o.eval_every:
        return "max_iter", (f"ran {state.t} rounds without a stopping test (eval_every=None): "
                            f"at the end {name} = {value:.3g} (tolerance {tol:g})")
    if reason == "settled":
        return "max_iter", (f"the iterates stopped moving at round {state.t} (full batches: the "
                            "penalised problem is solved) but the full-data KKT test did not "
                            f"pass: {name} = {value:.3g} > {tol:g} (relative); the point may "
                            "sit at a kink of a nonsmooth function, or the tolerance is "
                            "below what rounding allows for this problem")
    if M and not ever_feasible and np.max(kkt.feasibility_rel) > o.feas_tol and stalled:
        missing = (f"the last stage's slack estimate ({stages[-1].slack_norm:.3g}) is within "
                   f"slack_tol={o.slack_tol:g}: the surrogate constraints can be met at c = "
                   f"{state.penalty:g}" if stages and stages[-1].slack_norm <= o.slack_tol
                   else f"c = {state.penalty:g} is not the largest penalty")
        return "max_iter", (
            f"no feasible point was found in {state.t} rounds (relative violation "
            f"{np.max(kkt.feasibility_rel):.3g} at the end); the violation stopped falling "
            f"(smallest {first:.4g} in the first half of the last stage's evaluations, "
            f"{second:.4g} in the second) but {missing}, so this is no evidence of "
            "infeasibility: try more rounds (max_iter), a larger batch or larger penalties")
    if (M and not ever_feasible and np.max(kkt.feasibility_rel) > o.feas_tol
            and not np.isfinite(first)):
        return "max_iter", (
            f"no feasible point was found in {state.t} rounds (relative violation "
            f"{np.max(kkt.feasibility_rel):.3g} at the end); the last stage had fewer than 4 "
            "full-data evaluations, too few to tell whether the violation still falls, so "
            "this is no evidence of infeasibility: try more rounds (max_iter) or larger "
            "penalties")
    if M and not ever_feasible and np.max(kkt.feasibility_rel) > o.feas_tol:
        return "max_iter", (
            f"no feasible point was found in {state.t} rounds (relative violation "
            f"{np.max(kkt.feasibility_rel):.3g} at the end), but the violation was still "
            f"decreasing (smallest {first:.4g} in the first half of the last stage's "
            f"evaluations, {second:.4g} in the second), so this is no evidence of "
            "infeasibility: try more rounds (max_iter) or larger penalties; if the "
            "constraints cannot be met, the violation settles and the status says so")
    if "feasibility" in name:
        advice = ("more rounds (max_iter) or larger penalties; a feasible point was found "
                  "earlier" if ever_feasible else "more rounds (max_iter) or larger penalties")
    elif sampled_clients and o.batch_size in ("auto", None):
        advice = ("more rounds (max_iter); with a random set of clients per round "
                  "(clients_per_round below the number of clients, or proportional draws) the "
                  "round's statistics stay random even on full batches, the steps diminish and "
                  "the point converges only in the limit; with every client in every round the "
                  "default options can certify it")
    elif o.batch_size == "auto" and len(history.t) and np.isnan(history.batch_size[-1]):
        advice = ("more rounds (max_iter); the batches are already full, so the steps are "
                  "deterministic SCA's and their length limits the progress (a large "
                  "nonconvex model needs many rounds; if the features have very different "
                  "scales, standardise them or give the functions ss.DiagonalCurvature "
                  "surrogates)")
    elif o.batch_size is None:
        advice = ("more rounds, or the default tau='auto' (with full batches it is adapted "
                  "by backtracking)" if o.tau != "auto" else "more rounds (max_iter)")
    elif o.batch_size == "auto":
        advice = "more rounds (max_iter): the batch grows to the full data as the run goes on"
    else:
        advice = ("batch_size='auto' (or 'full') with the default tau, rho and gamma: a fixed "
                  "mini-batch ends at its noise floor")
    return "max_iter", (f"the full-data KKT test did not pass in {state.t} rounds: {name} "
                        f"= {value:.3g} > {tol:g} (relative) at the returned point; try "
                        f"{advice}")
