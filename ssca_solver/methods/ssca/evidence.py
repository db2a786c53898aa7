"""Method "ssca"'s status: what a run's end shows, as a small record (:class:`Evidence`,
:func:`gather`); the decision, a short rule over it (:func:`classify`); and the words, one
table (:data:`MESSAGES`, as scipy's ``TERMINATION_MESSAGES``).

"converged" comes only from the certificate (:mod:`ssca_solver.diagnostics.certificate`);
"infeasible" needs every one of: no evaluated iterate feasible, the violation stalled over the
last stage at the largest penalty with a positive subproblem slack, the returned point a
stationary point of the violation (:func:`ssca_solver.diagnostics.kkt.violation_stationarity`)
and not a saddle of it (:func:`violation_curvature`), and constraints declared convex (else
the point is a local minimum of the violation, status "max_iter" that says so); otherwise
"max_iter" with a message naming what is missing.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from ... import status as st
from ...engine import options as opt
from ...diagnostics.certificate import Certificate
from ...diagnostics.evaluation import excess
from ...diagnostics.kkt import PHASE1_TOL, violation_stationarity
from ...errors import UserFunctionError
from .adaptive import MAX_REJECTS
from .continuation import violation_stalled

#: a drop of the violation's second difference above this (relative) makes the point a saddle
SADDLE_TOL = 1e-12
#: the saddle probe's step factors, tried in turn while the functions are not finite at one
#: side (a point near the edge of their domain)
SADDLE_SHRINK = (1.0, 1e-2, 1e-4)

_NO_FEASIBLE = ("no feasible point was found in {t} rounds (relative violation {violation:.3g} "
                "at the end)")
_VANISHES = (_NO_FEASIBLE + "; the violation's gradient vanishes at the returned point "
             "({phase1:.2g} of the constraints' gradient at the start),\n")

#: the message of each status code (:func:`classify`), filled in from the evidence: its first
#: line says what happened, the next ones why, the last what to try
MESSAGES = {
    "not_minimiser": (
        _NO_FEASIBLE + " and the violation stopped falling at the largest c{early},\n"
        "but the returned point does not minimise the violation: its gradient there is "
        "{phase1:.3g} of the constraints' gradient at the start (above {phase1_tol:g}), so a "
        "nearby point violates less\n"
        "and this is no evidence of {not_minimiser}"),
    "saddle_untested": (
        _VANISHES + "but whether it is a minimiser of the violation or a saddle could not be "
        "tested: the functions were not finite (or raised) at every probe point around it.\n"
        "So this is no evidence of infeasibility: start elsewhere (x0), or give larger "
        "penalties"),
    "saddle": (
        _VANISHES + "but it is a saddle of the violation, not a minimiser: along a random "
        "direction the violation's second difference drops by {saddle:.3g}.\n"
        "So this is no evidence of infeasibility (a network at w = 0 is such a point): start "
        "elsewhere (x0), or give smaller penalties first"),
    "infeasible": (
        "no feasible point was found: none of the run's {evaluations} full-data evaluations "
        "nor the returned point satisfied the constraints (constraint {worst} violated by "
        "{worst_violation:.3g} at the end)\n"
        "evidence: at the largest penalty c = {stage_penalty:g} the subproblem kept a positive "
        "slack ({stage_slack:.3g}, relative); the violation stopped decreasing {how}; the "
        "returned point is a stationary point of the violation (its gradient {phase1:.2g} of "
        "the constraints' gradient at the start) and not a saddle of it\n"
        "and the constraints are declared convex, so they cannot be met at all (or, if no "
        "point violates them less, their multipliers exceed c: give larger penalties)"),
    "local_infeasibility": (
        "no feasible point was found: none of the run's {evaluations} full-data evaluations "
        "nor the returned point satisfied the constraints (constraint {worst} violated by "
        "{worst_violation:.3g} at the end)\n"
        "the returned point is a local minimum of the violation: at the largest penalty c = "
        "{stage_penalty:g} the subproblem kept a positive slack ({stage_slack:.3g}, "
        "relative); the violation stopped decreasing {how}; its gradient is {phase1:.2g} of "
        "the constraints' gradient at the start, and it is not a saddle\n"
        "but the constraints are not declared convex (SampleFunction(convexity=...)), so "
        "feasible points may exist elsewhere and this is no evidence that none does: start "
        "from another x0, or give larger penalties"),
    "settled_violated": (
        "the iterates stopped moving at round {t} at c = {penalty:g} with the constraints "
        "violated and the full-data KKT test failing ({failing}),\n"
        "although an earlier evaluated iterate was feasible: c may be below the multipliers "
        "(give larger penalties), or the point is a stationary point of the penalised problem "
        "that is no KKT point of the constrained one (start elsewhere)"),
    "settled_rejected": (
        "the iterates stopped moving at round {t}: no step improved the exact penalty F_0 + "
        "R + c (violation) in {rejects} tries in a row (tau doubled or a second-order "
        "correction at each),\n"
        "and the full-data KKT test did not pass: {failing}\n"
        "the point may sit at a kink of a nonsmooth function, the penalised problem's "
        "rounding may hide the decrease, or c = {penalty:g} may be below the multipliers: "
        "try larger penalties"),
    "settled_rejected_unconstrained": (
        "the iterates stopped moving at round {t}: no step improved the objective in "
        "{rejects} tries in a row (tau doubled at each),\n"
        "and the full-data KKT test did not pass: {failing}\n"
        "the point may sit at a kink of a nonsmooth function, or rounding may hide the "
        "decrease"),
    "settled": (
        "the iterates stopped moving at round {t} (full batches: {solved}) but the full-data "
        "KKT test did not pass: {failing}\n"
        "the point may sit at a kink of a nonsmooth function, or the steps were lost in "
        "rounding before the test passed (an ill-conditioned problem: this says nothing about "
        "whether the optimum itself meets the tolerance)"),
    "no_feasible_stalled": (
        _NO_FEASIBLE + "; the violation stopped falling {how}\n"
        "but {missing}, so this is no evidence of infeasibility\n"
        "try more rounds (max_iter), a larger batch or larger penalties"),
    "no_feasible_few_evaluations": (
        _NO_FEASIBLE + "; the last stage had fewer than 4 full-data evaluations, too few to "
        "tell whether the violation still falls, so this is no evidence of infeasibility\n"
        "try more rounds (max_iter) or larger penalties"),
    "no_feasible_decreasing": (
        _NO_FEASIBLE + ", but the violation was still decreasing (smallest {first:.4g} in the "
        "first half of the last stage's evaluations, {second:.4g} in the second), so this is "
        "no evidence of infeasibility\n"
        "try more rounds (max_iter) or larger penalties; if the constraints cannot be met, "
        "the violation settles and the status says so"),
}

#: the parts of a message that depend on one more fact of the evidence
PARTS = {
    "early": " (the iterates stopped moving at round {t}, with {rounds_left} of max_iter's "
             "rounds left)",
    "not_minimiser_fixed_batch": (
        "infeasibility (with a fixed mini-batch the iterates scatter around the constraint): "
        "try batch_size='auto' with the default tau, or more rounds"),
    "not_minimiser_penalty": (
        "infeasibility: the largest c ({largest:g}) may be below what an exact penalty needs "
        "here (the penalised problem's solution keeps this violation), or the point may "
        "minimise the sum of the violations, the penalty's measure, though not their squares "
        "(no c leaves such a point: there the linearised constraints cannot all be reduced at "
        "once); give larger penalties (penalty=[..., a larger c]){more}"),
    "how_settled_halves": ("(smallest {first:.4g} in the first half of the last stage's "
                           "evaluations, {second:.4g} in the second, and the iterates stopped "
                           "moving at round {t})"),
    "how_settled": "(the iterates stopped moving at round {t})",
    "how_halves": ("(smallest {first:.4g} in the first half of the last stage's evaluations, "
                   "{second:.4g} in the second)"),
    "missing_slack": ("the last stage's slack estimate ({stage_slack:.3g}) is within "
                      "slack_tol={slack_tol:g}: the surrogate constraints can be met at c = "
                      "{penalty:g}"),
    "missing_largest": "c = {penalty:g} is not the largest penalty",
}

#: what to try when the KKT test did not pass in the rounds allowed, by the run's regime
ADVICE = {
    "feasibility_was_feasible": ("more rounds (max_iter) or larger penalties; a feasible point "
                                 "was found earlier"),
    "feasibility": "more rounds (max_iter) or larger penalties",
    "sampled_clients": (
        "more rounds (max_iter); with a random set of clients per round (clients_per_round "
        "below the number of clients, or proportional draws) the round's statistics stay "
        "random even on full batches, the steps diminish and the point converges only in the "
        "limit; with every client in every round the default options can certify it"),
    "full_newton": (
        "more rounds (max_iter); the batches are already full and the steps are Newton SQP "
        "steps from the clients' Hessians, whose progress the rounds limit; a penalty far "
        "below the multipliers, or a start far from a KKT point, makes them slow"),
    "full_sketch": (
        "more rounds (max_iter); the batches are already full and the steps are SQP steps "
        "from a sketch of the clients' Hessians (hessian='sketch'), whose progress the "
        "rounds limit; many eigenvalues of similar size below the sketch's leading ones slow "
        "them, and hessian='newton' sends the whole Hessians where d allows"),
    "full_lbfgs": (
        "more rounds (max_iter); the batches are already full and the steps are "
        "quasi-Newton (L-BFGS) SQP steps, whose progress the rounds limit; a nearly flat "
        "direction (an invariance of the model, a tiny ridge term) makes them slow"),
    "full_sca": (
        "more rounds (max_iter); the batches are already full, so the steps are "
        "deterministic SCA's (first order, their length set by tau) and the rounds limit the "
        "progress"),
    "full_fixed_tau": ("more rounds, or the default tau='auto' (with full batches it is "
                       "adapted by backtracking)"),
    "full": "more rounds (max_iter)",
    "growing": "more rounds (max_iter): the batch grows to the full data as the run goes on",
    "fixed_batch": ("batch_size='auto' (or 'full') with the default tau, rho and gamma: a "
                    "fixed mini-batch ends at its noise floor"),
}


class Evidence(NamedTuple):
    """What a run's end shows, for its status (:func:`classify`).

    Attributes:
      reason: why the runner returned (:data:`ssca_solver.status.REASONS`).
      t, max_iter: rounds run and allowed. constrained: M > 0.
      penalty, largest: the c in force at the end, and the sequence's largest.
      residual: (name, value, tolerance) of the largest relative KKT residual at the end.
      violation, violation_sum: the largest and the summed relative violation at the end.
      worst, worst_violation: the most violated constraint (1-based) and its violation.
      ever_feasible: some evaluated iterate (or the returned point) met feas_tol.
      stalled, first, second: the violation's stall over the last stage
        (:func:`~.continuation.violation_stalled`; a settled run counts as stalled).
      stage_slack, stage_penalty: the last stage's slack estimate and c (NaN: no stage).
      slack_tol: the option. evaluations: full-data evaluations recorded.
      rejects: rejected steps in a row at the end. advice: a key of :data:`ADVICE`.
      fixed_batch: a numeric batch_size.
      phase1: the returned point's relative distance from a stationary point of the
        violation (NaN: not measured). saddle: the largest drop of the violation's second
        difference around it (0: not measured; NaN: could not be measured).
      convex: the constraints are declared convex (:attr:`Problem.constraints_convex`), so
        a local minimiser of their violation is a global one.
    """

    reason: str
    t: int
    max_iter: int
    constrained: bool
    penalty: float
    largest: float
    residual: tuple
    violation: float
    violation_sum: float
    worst: int
    worst_violation: float
    ever_feasible: bool
    stalled: bool
    first: float
    second: float
    stage_slack: float
    stage_penalty: float
    slack_tol: float
    evaluations: int
    rejects: int
    advice: str
    fixed_batch: bool
    feas_tol: float
    phase1: float = float("nan")
    saddle: float = 0.0
    convex: bool = False

    @property
    def settled(self) -> bool:
        return self.reason == st.SETTLED

    @property
    def violated(self) -> bool:
        return self.constrained and self.violation > self.feas_tol

    @property
    def infeasible_candidate(self) -> bool:
        """Everything "infeasible" needs before the violation's own stationarity and
        curvature are measured."""
        return bool(self.violated and not self.ever_feasible and self.stalled
                    and self.stage_slack > self.slack_tol
                    and self.stage_penalty == self.largest)


def gather(outcome, cfg, stages) -> Evidence:
    """The evidence of ``outcome`` (:class:`~ssca_solver.engine.method.Outcome`) for a run
    of ``cfg`` (:class:`~.settings.Settings`) with penalty ``stages``; the violation's
    stationarity and curvature at the returned point are measured (full-data evaluations,
    counted) only when everything else "infeasible" needs holds."""
    o, state, kkt, history = cfg.options, outcome.state, outcome.kkt, outcome.history
    name, value, tol = kkt.largest(o.feas_tol, o.kkt_tol)
    M = cfg.M
    evaluated = (excess(history.constraints, cfg.equality) / cfg.bound_scale if M
                 else np.zeros((0, 0)))
    ever_feasible = bool(M and len(evaluated) and np.any(np.max(evaluated, axis=1)
                                                          <= o.feas_tol))
    stalled, first, second = violation_stalled(history, cfg.bound_scale, M, cfg.equality)
    feas = np.atleast_1d(kkt.feasibility_rel)
    worst = int(np.argmax(feas)) if feas.size else 0
    e = Evidence(
        reason=outcome.reason, t=state.t, max_iter=o.max_iter, constrained=bool(M),
        penalty=float(state.penalty), largest=float(o.penalty[-1]), residual=(name, value, tol),
        violation=float(np.max(feas)) if feas.size else 0.0,
        violation_sum=float(np.sum(feas)), worst=worst + 1,
        worst_violation=float(np.atleast_1d(kkt.feasibility)[worst]) if feas.size else 0.0,
        ever_feasible=ever_feasible, stalled=bool(stalled or outcome.reason == st.SETTLED),
        first=first, second=second,
        stage_slack=stages[-1].slack_norm if stages else float("nan"),
        stage_penalty=stages[-1].penalty if stages else float("nan"),
        slack_tol=o.slack_tol, evaluations=len(evaluated), rejects=int(state.rejects),
        advice=_advice(cfg, state, history, "feasibility" in name, ever_feasible),
        fixed_batch=isinstance(o.batch_size, int), feas_tol=o.feas_tol,
        convex=bool(getattr(cfg.problem, "constraints_convex", False)))
    if e.infeasible_candidate and outcome.reason not in (st.CONVERGED, st.STOPPED):
        session = outcome.session
        e = e._replace(phase1=violation_stationarity_at(session, state, o.feas_tol, o.solver))
        if e.phase1 <= PHASE1_TOL:
            e = e._replace(saddle=violation_curvature(session, state))
    return e


def classify(e: Evidence, tested: bool) -> str:
    """The status code of the evidence (``tested``: the KKT test ran, ``eval_every`` set):
    a key of :data:`MESSAGES`, or "converged", "stopped", "untested", "not_passed"."""
    if e.reason in (st.CONVERGED, st.STOPPED):
        return e.reason
    if e.infeasible_candidate:
        if not e.phase1 <= PHASE1_TOL:
            return "not_minimiser"
        if not np.isfinite(e.saddle):
            return "saddle_untested"
        if e.saddle > SADDLE_TOL * max(1.0, e.violation_sum):
            return "saddle"
        return "infeasible" if e.convex else "local_infeasibility"
    if not tested:
        return "untested"
    if e.settled and not (e.violated and not e.ever_feasible):
        if e.violated:
            return "settled_violated"
        if e.rejects >= MAX_REJECTS:
            return "settled_rejected" if e.constrained else "settled_rejected_unconstrained"
        return "settled"
    if e.violated and not e.ever_feasible:
        if e.stalled:
            return "no_feasible_stalled"
        if not np.isfinite(e.first):
            return "no_feasible_few_evaluations"
        return "no_feasible_decreasing"
    return "not_passed"


def decide(outcome, cfg, stages, tested: bool) -> tuple[str, str]:
    """(status, message) of a run by SSCA: the certificate's "converged" and "stopped", else
    the code :func:`classify` gives the evidence, in the words of :data:`MESSAGES`."""
    o, state = cfg.options, outcome.state
    certificate = Certificate.of(o)
    if outcome.reason == st.CONVERGED:
        return certificate.converged(outcome.kkt, state.t)
    if outcome.reason == st.STOPPED:
        return st.stopped(state.t, state.penalty if cfg.M else None)
    e = gather(outcome, cfg, stages)
    code = classify(e, tested)
    if code == "untested":
        return st.untested(e.t, e.residual, outcome.kkt)
    if code == "not_passed":
        return st.not_passed(e.t, e.residual, ADVICE[e.advice])
    status = st.INFEASIBLE if code == "infeasible" else st.MAX_ITER
    return status, MESSAGES[code].format(**_fields(e))


def _fields(e: Evidence) -> dict:
    """The values the messages name, the parts that depend on the evidence filled in."""
    f = e._asdict()
    early = e.settled and e.t < e.max_iter
    f.update(failing=st.exceeds(*e.residual), phase1_tol=PHASE1_TOL,
             rounds_left=e.max_iter - e.t,
             solved="the penalised problem is solved" if e.constrained
             else "a fixed point of the surrogates")
    f["early"] = PARTS["early"].format(**f) if early else ""
    f["more"] = ", or start elsewhere (x0)" if early else " or more rounds"
    f["not_minimiser"] = PARTS["not_minimiser_fixed_batch" if e.fixed_batch
                               else "not_minimiser_penalty"].format(**f)
    how = ("how_settled_halves" if e.settled and np.isfinite(e.first) else
           "how_settled" if e.settled else "how_halves")
    f["how"] = PARTS[how].format(**f)
    f["missing"] = PARTS["missing_slack" if e.stage_slack <= e.slack_tol
                         else "missing_largest"].format(**f)
    return f


def _advice(cfg, state, history, feasibility: bool, ever_feasible: bool) -> str:
    """The key of :data:`ADVICE` for the run's regime at its end."""
    o = cfg.options
    full_at_end = bool(len(history.t) and np.isnan(history.batch_size[-1]))
    if feasibility:
        return "feasibility_was_feasible" if ever_feasible else "feasibility"
    adaptive = o.batch_size in opt.ADAPTIVE_BATCHES
    if cfg.sampled_clients and (adaptive or o.batch_size is None):
        return "sampled_clients"
    if adaptive and full_at_end and o.hessian == "newton" and state.hess.size:
        return "full_newton"
    if adaptive and full_at_end and o.hessian == "sketch" and state.hess.size:
        return "full_sketch"
    if adaptive and full_at_end and o.hessian == "lbfgs" and state.qn_s.size:
        return "full_lbfgs"
    if adaptive and full_at_end:
        return "full_sca"
    if o.batch_size is None:
        return "full_fixed_tau" if o.tau != "auto" else "full"
    if adaptive:
        return "growing"
    return "fixed_batch"


# -- the evidence the full-data evaluations give at the returned point ---------------------------
def violation_curvature(session, state, probes: int = 8, step: float = 1e-2) -> float:
    """The largest drop of the relative violation sum_m (F_m - U_m)_+ / max(1, |U_m|)
    (|F_m - U_m| for an equality) found along ``probes`` random directions u (both signs,
    size ``step`` max(1, |w|)), as the mean of the two sides minus the value at w (a second
    difference: the first order cancels). A drop means negative curvature: w is a saddle of
    the violation, not a minimiser (e.g. w = 0 of a network), so a zero gradient there is no
    evidence of infeasibility. 2 ``probes`` full-data evaluations (values only), counted with
    the evaluations; directions from the run's seed. NaN when no probe could be evaluated."""
    terms = session.evaluator.terms
    scale = np.maximum(1.0, np.abs(terms.bounds))

    def violation(values):
        cons = np.asarray(values[terms.first_constraint:], dtype=float) - terms.bounds
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


def violation_stationarity_at(session, state, feas_tol: float,
                              solver: str = "CLARABEL") -> float:
    """:func:`ssca_solver.diagnostics.kkt.violation_stationarity` at the returned point (after
    :meth:`~ssca_solver.engine.session.Session.final_report`), relative to the constraints'
    gradient scale at the start."""
    return violation_stationarity(state.w, session.final_evaluation, session.evaluator.terms,
                                  feas_tol, session.constraint_scale, solver)


def no_minimiser(cfg, state) -> Optional[str]:
    """Why the iterates diverged on full batches with backtracking, where every accepted step
    lowered the merit (the exact penalty F_0 + R + c sum_m (F_m - U_m)_+ of eq. (Problem 4)):
    the penalised problem has no minimiser along the path (unbounded below, or its infimum
    approached at infinity), not a step too long for its curvature. With every constraint's
    multiplier at c the penalty's slack was in use: c is below what an exact penalty needs,
    or the objective falls faster than a linear penalty on the violation rises. None outside
    that regime."""
    if not (cfg.backtracking(state) and np.isfinite(state.merit)):
        return None
    c = float(state.penalty)
    what = "the objective" + (" plus c times the violation" if cfg.M else "")
    text = (f"every accepted step lowered the merit ({what}; {state.merit:.3g} at the last "
            "accepted point) while the steps grew without bound, so the problem the rounds "
            "minimise has no minimiser along this path: it is unbounded below, or approaches "
            "its infimum at infinity (a logistic loss on separable data without a ridge term)")
    nu = np.abs(np.asarray(state.nu, dtype=float))
    if cfg.M and nu.size == cfg.M and c > 0 and np.all(nu >= 0.99 * c):
        text += (f"; every constraint's multiplier sits at c = {c:g}, so the penalty's slack "
                 "is in use: the objective falls faster than c times the violation rises")
    return (text + ". Bound the variables (domain=), add a strongly convex term, or start "
            "nearer a feasible point" + (" with larger penalties (penalty=[...])" if cfg.M
                                         else ""))
