"""Method "ssca"'s status rules: the penalty stages' slack, and the evidence behind
"infeasible" (DESIGN.md: only with evidence), from the history and a few more full-data
evaluations at the returned point.

"converged" comes only from the full-data KKT test (:mod:`ssca_solver.status`); "infeasible"
needs every one of: no evaluated iterate feasible, the violation stalled over the last stage at
the largest penalty with a positive subproblem slack, the returned point a stationary point of
the violation (:func:`ssca_solver.diagnostics.kkt.violation_stationarity`) and not a saddle of
it (:func:`violation_curvature`); otherwise "max_iter" with a message naming what is missing.
"""

from __future__ import annotations

import numpy as np

from ... import status as st
from ...diagnostics.evaluation import excess
from ...diagnostics.kkt import PHASE1_TOL, violation_stationarity
from ...diagnostics.result import Stage
from ...errors import UserFunctionError
from .adaptive import MAX_REJECTS
from .step import stage_slack

#: a drop of the violation's second difference above this (relative) makes the point a saddle
SADDLE_TOL = 1e-12
#: the saddle probe's step factors, tried in turn while the functions are not finite at one
#: side (a point near the edge of their domain)
SADDLE_SHRINK = (1.0, 1e-2, 1e-4)


def relative_slack_rows(slack_rows, bound_scale):
    return np.asarray(slack_rows, dtype=float) / bound_scale


def stage_slack_of(recorder, stage, max_iter, bound_scale) -> float:
    rows = relative_slack_rows(recorder.stage_rows("slack", stage), bound_scale)
    return stage_slack(rows, len(rows))


def stages_of(history, max_iter, bound_scale) -> list[Stage]:
    """One :class:`Stage` per stage run, from the history (penalty in force, rounds, slack)."""
    out = []
    for j in np.unique(history.stage):
        sel = history.stage == j
        rows = relative_slack_rows(history.slack[sel], bound_scale)
        out.append(Stage(float(history.penalty[sel][-1]), int(np.count_nonzero(sel)),
                         stage_slack(rows, len(rows))))
    return out


def violation_stalled(history, bound_scale, M, equality=None):
    """(stalled, a, b): a and b are the smallest relative violation over the first and the
    second half of the last stage's evaluations; stalled when b did not improve on a by 0.1 %
    (a run that is still reducing the violation is not called infeasible)."""
    if not M or not len(history.eval_t):
        return False, np.nan, np.nan
    last = history.stage[-1]
    in_stage = np.isin(history.eval_t, history.t[history.stage == last])
    v = np.max(excess(history.constraints[in_stage], equality) / bound_scale, axis=1,
               initial=-np.inf)
    if v.size < 4:
        return False, np.nan, np.nan
    a, b = float(np.min(v[:v.size // 2])), float(np.min(v[v.size // 2:]))
    return b >= (1 - 1e-3) * a, a, b


def decide(reason, state, kkt, history, stages, o, M, bound_scale, phase1=lambda: 0.0,
           saddle=lambda: 0.0, sampled_clients=False, equality=None):
    """(status, message) from why the run ended and the full-data KKT report at the end.
    ``phase1()``: the returned point's relative distance from a stationary point of the
    violation (:func:`ssca_solver.diagnostics.kkt.violation_stationarity`); ``saddle()``: the
    largest drop of the violation's second difference along random directions
    (:func:`violation_curvature`)."""
    if reason == st.CONVERGED:
        return st.converged(kkt, state.t, o.feas_tol, o.kkt_tol)
    if reason == st.STOPPED:
        return st.stopped(state.t, state.penalty if M else None)
    name, value, tol = kkt.residuals(o.feas_tol, o.kkt_tol)[0]
    failing = st.exceeds(name, value, tol)
    evaluated = (excess(history.constraints, equality) / bound_scale if M
                 else np.zeros((0, 0)))
    ever_feasible = bool(M and len(evaluated) and np.any(np.max(evaluated, axis=1)
                                                          <= o.feas_tol))
    stalled, first, second = violation_stalled(history, bound_scale, M, equality)
    # iterates that stopped moving (full batches, unit steps) stalled the violation too,
    # however few evaluations the last stage had
    settled = reason == st.SETTLED
    stalled = stalled or settled
    if settled and np.isfinite(first):
        how = (f"(smallest {first:.4g} in the first half of the last stage's evaluations, "
               f"{second:.4g} in the second, and the iterates stopped moving at round "
               f"{state.t})")
    elif settled:
        how = f"(the iterates stopped moving at round {state.t})"
    else:
        how = (f"(smallest {first:.4g} in the first half of the last stage's evaluations, "
               f"{second:.4g} in the second)")
    at_most = (M and np.max(kkt.feasibility_rel) > o.feas_tol and not ever_feasible and stalled
               and stages and stages[-1].slack_norm > o.slack_tol
               and stages[-1].penalty == o.penalty[-1])
    r1 = phase1() if at_most else np.nan
    # a run whose last stage settled before max_iter: more rounds at that c change nothing
    early = settled and state.t < o.max_iter
    if at_most and not r1 <= PHASE1_TOL:
        return st.MAX_ITER, (
            f"no feasible point was found in {state.t} rounds (relative violation "
            f"{np.max(kkt.feasibility_rel):.3g} at the end) and the violation stopped falling "
            f"at the largest c"
            + (f" (the iterates stopped moving at round {state.t}, with {o.max_iter - state.t} "
               "of max_iter's rounds left)" if early else "")
            + ", but the returned point does not minimise the violation: its "
            f"gradient there is {r1:.3g} of the constraints' gradient at the start (above "
            f"{PHASE1_TOL:g}), so a nearby point violates less and this is no evidence of "
            + ("infeasibility (with a fixed mini-batch the iterates scatter around the "
               "constraint): try batch_size='auto' with the default tau, or more rounds"
               if isinstance(o.batch_size, int) else
               f"infeasibility: the largest c ({o.penalty[-1]:g}) may be below what an exact "
               "penalty needs here (the penalised problem's solution keeps this violation); "
               "give larger penalties (penalty=[..., a larger c])"
               + (", or start elsewhere (x0)" if early else " or more rounds")))
    drop = saddle() if at_most else 0.0
    if at_most and not np.isfinite(drop):
        return st.MAX_ITER, (
            f"no feasible point was found in {state.t} rounds (relative violation "
            f"{np.max(kkt.feasibility_rel):.3g} at the end), and the violation's gradient "
            f"vanishes at the returned point ({r1:.2g} of the constraints' gradient at the "
            "start), but whether it is a minimiser of the violation or a saddle could not be "
            "tested: the functions were not finite (or raised) at every probe point around it. "
            "So this is no evidence of infeasibility: start elsewhere (x0), or give larger "
            "penalties")
    if at_most and drop > SADDLE_TOL * max(1.0, float(np.sum(kkt.feasibility_rel))):
        return st.MAX_ITER, (
            f"no feasible point was found in {state.t} rounds (relative violation "
            f"{np.max(kkt.feasibility_rel):.3g} at the end), and the violation's gradient "
            f"vanishes at the returned point ({r1:.2g} of the constraints' gradient at the "
            f"start), but it is a saddle of the violation, not a minimiser: along a random "
            f"direction the violation's second difference drops by {drop:.3g}. So this is no "
            "evidence of infeasibility (a network at w = 0 is such a point): start elsewhere "
            "(x0), or give smaller penalties first")
    if at_most:
        m = int(np.argmax(kkt.feasibility_rel))
        return st.INFEASIBLE, (
            f"no feasible point was found: none of the run's {len(evaluated)} full-data "
            f"evaluations nor the returned point satisfied the constraints "
            f"(constraint {m + 1} violated by {kkt.feasibility[m]:.3g} at the end); at the "
            f"largest penalty c = {stages[-1].penalty:g} the subproblem kept a positive slack "
            f"({stages[-1].slack_norm:.3g}, relative) and the violation stopped decreasing "
            f"{how}, and the returned point is a stationary point of "
            f"the violation (its gradient {r1:.2g} of the constraints' gradient at the "
            f"start) and not a saddle of it: the constraints cannot be met near this point. "
            "When they are convex they cannot be met at all; when they are not, this may be "
            "a local minimum of the violation with feasible points elsewhere (start from "
            "another x0), or their multipliers exceed c (give larger penalties)")
    if not o.eval_every:
        return st.untested(state.t, (name, value, tol), kkt)
    violated = bool(M and np.max(kkt.feasibility_rel) > o.feas_tol)
    if reason == st.SETTLED and violated and not ever_feasible:
        pass                          # the no-feasible-point messages below say what happened
    elif reason == st.SETTLED and violated:
        return st.MAX_ITER, (f"the iterates stopped moving at round {state.t} at c = "
                            f"{state.penalty:g} with the constraints violated and the "
                            f"full-data KKT test failing ({failing}), although an earlier "
                            "evaluated iterate was feasible: c may be below the multipliers "
                            "(give larger penalties), or the point is a stationary point of "
                            "the penalised problem that is no KKT point of the constrained "
                            "one (start elsewhere)")
    elif reason == st.SETTLED and getattr(state, "rejects", 0) >= MAX_REJECTS:
        return st.MAX_ITER, (f"the iterates stopped moving at round {state.t}: no step improved "
                            "the exact penalty F_0 + R + c (violation) in "
                            f"{state.rejects} tries in a row (tau doubled or a second-order "
                            "correction at each), and the "
                            f"full-data KKT test did not pass: {failing}; "
                            "the point may sit at a kink of a nonsmooth function, "
                            "the penalised problem's rounding may hide the decrease, or c "
                            f"= {state.penalty:g} may be below the multipliers: try larger "
                            "penalties" if M else
                            f"the iterates stopped moving at round {state.t}: no step improved "
                            f"the objective in {state.rejects} tries in a row (tau doubled at "
                            f"each), and the full-data KKT test did not pass: {failing}; "
                            "the point may sit at a kink of "
                            "a nonsmooth function, or rounding may hide the decrease")
    elif reason == st.SETTLED:
        solved = "the penalised problem is solved" if M else "a fixed point of the surrogates"
        return st.MAX_ITER, (f"the iterates stopped moving at round {state.t} (full batches: "
                            f"{solved}) but the full-data KKT test did not "
                            f"pass: {failing}; the point may "
                            "sit at a kink of a nonsmooth function, or the tolerance is "
                            "below what rounding allows for this problem")
    if M and not ever_feasible and np.max(kkt.feasibility_rel) > o.feas_tol and stalled:
        missing = (f"the last stage's slack estimate ({stages[-1].slack_norm:.3g}) is within "
                   f"slack_tol={o.slack_tol:g}: the surrogate constraints can be met at c = "
                   f"{state.penalty:g}" if stages and stages[-1].slack_norm <= o.slack_tol
                   else f"c = {state.penalty:g} is not the largest penalty")
        return st.MAX_ITER, (
            f"no feasible point was found in {state.t} rounds (relative violation "
            f"{np.max(kkt.feasibility_rel):.3g} at the end); the violation stopped falling "
            f"{how} but {missing}, so this is no evidence of "
            "infeasibility: try more rounds (max_iter), a larger batch or larger penalties")
    if (M and not ever_feasible and np.max(kkt.feasibility_rel) > o.feas_tol
            and not np.isfinite(first)):
        return st.MAX_ITER, (
            f"no feasible point was found in {state.t} rounds (relative violation "
            f"{np.max(kkt.feasibility_rel):.3g} at the end); the last stage had fewer than 4 "
            "full-data evaluations, too few to tell whether the violation still falls, so "
            "this is no evidence of infeasibility: try more rounds (max_iter) or larger "
            "penalties")
    if M and not ever_feasible and np.max(kkt.feasibility_rel) > o.feas_tol:
        return st.MAX_ITER, (
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
    elif (o.batch_size == "auto" and len(history.t) and np.isnan(history.batch_size[-1])
          and getattr(o, "hessian", "none") == "lbfgs" and getattr(state, "qn_s", ()).size):
        advice = ("more rounds (max_iter); the batches are already full and the steps are "
                  "quasi-Newton (L-BFGS) SQP steps, whose progress the rounds limit; a "
                  "nearly flat direction (an invariance of the model, a tiny ridge term) "
                  "makes them slow")
    elif o.batch_size == "auto" and len(history.t) and np.isnan(history.batch_size[-1]):
        advice = ("more rounds (max_iter); the batches are already full, so the steps are "
                  "deterministic SCA's (first order, their length set by tau) and the "
                  "rounds limit the progress")
    elif o.batch_size is None:
        advice = ("more rounds, or the default tau='auto' (with full batches it is adapted "
                  "by backtracking)" if o.tau != "auto" else "more rounds (max_iter)")
    elif o.batch_size == "auto":
        advice = "more rounds (max_iter): the batch grows to the full data as the run goes on"
    else:
        advice = ("batch_size='auto' (or 'full') with the default tau, rho and gamma: a fixed "
                  "mini-batch ends at its noise floor")
    return st.not_passed(state.t, (name, value, tol), advice)


def violation_curvature(session, state, probes: int = 8, step: float = 1e-2) -> float:
    """The largest drop of the relative violation sum_m (F_m - U_m)_+ / max(1, |U_m|)
    (|F_m - U_m| for an equality)
    found along ``probes`` random directions u (both signs, size ``step`` max(1, |w|)),
    as the mean of the two sides minus the value at w (a second difference: the first
    order cancels). A drop means negative curvature: w is a saddle of the violation, not a
    minimiser (e.g. w = 0 of a network), so a zero gradient there is no evidence of
    infeasibility. 2 ``probes`` full-data evaluations (values only), counted with the
    evaluations; directions from the run's seed."""
    terms = session.evaluator.terms
    scale = np.maximum(1.0, np.abs(terms.bounds))

    def violation(values):
        k = 1 if terms.stochastic_objective else 0
        cons = np.asarray(values[k:], dtype=float) - terms.bounds
        return float(np.sum(np.maximum(terms.excess(cons), 0.0) / scale))

    w = state.w
    base = violation(session.final_evaluation.values)
    rng = np.random.default_rng(np.random.SeedSequence(session.seed,
                                                       spawn_key=(2 ** 31 - 1,)))
    h = step * max(1.0, float(np.linalg.norm(w)))
    drop, probed = 0.0, 0
    for _ in range(probes):
        u = rng.standard_normal(w.size)
        u *= h / np.linalg.norm(u)
        for shrink in SADDLE_SHRINK:       # shorter when a side is outside a domain
            try:
                sides = [violation(session.runner.evaluate(w + s * shrink * u,
                                                           with_grad=False).values)
                         for s in (1.0, -1.0)]
            except UserFunctionError:       # a function not finite (or raising) there
                continue
            drop, probed = max(drop, base - 0.5 * (sides[0] + sides[1])), probed + 1
            break
    return drop if probed else float("nan")

def violation_stationarity_at(session, state, feas_tol: float, solver: str = "CLARABEL"):
    """:func:`ssca_solver.diagnostics.kkt.violation_stationarity` at the returned point (after
    :meth:`~ssca_solver.engine.session.Session.final_report`), relative to the constraints' gradient scale at the start."""
    return violation_stationarity(state.w, session.final_evaluation, session.evaluator.terms,
                                  feas_tol, session.constraint_scale, solver)
