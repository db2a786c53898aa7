"""Problem 2 / Problem 5 through CVXPY, compiled once (DPP) and re-solved with new values.

    minimise   Fbar_0(w) + R(w) + c sum_m s_m
    subject to Fbar_m(w) - U_m <= s_m,  s_m >= 0,  m = 1..M,   w in D,   |w|^2 <= r,

where each Fbar_m is its builder's expression of the averaged statistics (CVXPY Parameters), R
the deterministic terms and D the domain. Only Parameter values change between rounds, so CVXPY
reuses its compiled parametrised program (see ``tests/test_subproblem_cvxpy.py``). For
d > DPP_MAX_DIM the problem is instead rebuilt with constant data every round (see below).

r is the shared epigraph variable the surrogates of Problem 5 use for |w|^2 (see
:meth:`SurrogateBuilder.expression`): with it, Clarabel solves the QCQP of the proximal-linear
surrogates reliably, where one cone per surrogate left it "almost solved" whenever the
constraint surrogate cannot be met (Lemma 1's nu = c case); keeping the objective's |w|^2 a
quadratic term next to constraint cones made Clarabel fail more often. In Problem 2 (no
stochastic constraint) the objective's |w|^2 is a quadratic term, which Clarabel takes
natively and solves to ~1e-9 (an epigraph costs the square root of the duality gap in
accuracy there, ~1e-5).

A round the solver cannot solve is retried, each attempt counted in the history's ``retries``
(:meth:`CvxpySubproblem._solve_with_retries` lists the chain): Clarabel at its own defaults
and two fallback settings, then the problem rebuilt around a centre (w = centre + D v, which
removes the cancellation of the expanded surrogates' large constants when |w| is large), then
the other installed solvers (SCS; OSQP when the problem is a QP), whose answers are flagged
inaccurate. Only when every attempt fails does the round raise :class:`SubproblemError`; the
front door then returns the last good point with status "error"
(:mod:`ssca_solver.engine.solve`).
"""

from __future__ import annotations

import warnings
from typing import Optional, Sequence

import cvxpy as cp
import numpy as np

from ..errors import ModelError, SubproblemError
from .base import BoundSolver, SubproblemSolution, SubproblemSolver
from .box_qp import BoxProblem5


#: Above this size the subproblem is rebuilt with constants each round instead of compiled once
#: with Parameters: CVXPY's DPP compilation grows like d^2 in time and memory (beyond the
#: memory of a machine at a network's hundred thousand weights), while a plain build and solve
#: stays affordable there.
DPP_MAX_DIM = 4096

_CLARABEL_FALLBACKS = [{"static_regularization_enable": False}, {"equilibrate_enable": False}]

#: Clarabel's tolerances for Problem 5 unless the user's ``solver_options`` set them. Clarabel's
#: defaults (1e-8 gap, 1e-8 feasibility, relative to its scaled data) can leave w accurate to
#: only ~1e-5: the full-batch backtracking then rejects most steps and the run stalls above
#: the stationarity the KKT test asks for (tests/test_examples.py).
#: Where Clarabel cannot reach them (noisy mini-batch statistics, a large c: it then reports
#: "AlmostSolved"), the round is retried at Clarabel's own defaults before being called
#: inaccurate.
CLARABEL_TOLERANCES = {"tol_gap_abs": 1e-9, "tol_gap_rel": 1e-9, "tol_feas": 1e-9}
_CLARABEL_DEFAULTS = {"tol_gap_abs": 1e-8, "tol_gap_rel": 1e-8, "tol_feas": 1e-8}

#: least columns of the quasi-Newton term's factor (twice the model's memory of 8 pairs); a
#: model with more directions (a larger memory at small d) rebuilds the term with twice as
#: many columns (up to d), so a run compiles it a few times at most
MODEL_RANK = 16

#: up to this d the term has d columns from the start (the model's rank reaches min(d, 128)
#: at d <= 512: starting from MODEL_RANK columns, a small problem would compile the term again
#: at each doubling)
FULL_RANK_DIM = 64

#: The other solvers tried, at these settings, when every attempt of the chosen solver failed
#: (answers of these first-order methods are flagged inaccurate; OSQP only for QPs).
OTHER_SOLVERS = {"CLARABEL": dict(CLARABEL_TOLERANCES),
                 "SCS": {"eps_abs": 1e-7, "eps_rel": 1e-7, "max_iters": 100_000},
                 "OSQP": {"eps_abs": 1e-7, "eps_rel": 1e-7, "max_iter": 100_000}}
#: solvers whose answers count as accurate when they say "optimal" (interior point)
_ACCURATE = {"CLARABEL", "ECOS", "MOSEK", "GUROBI", "CPLEX", "CVXOPT", "PIQP", "QPALM"}


class EmptyDomainError(ModelError, SubproblemError):
    """The subproblem is infeasible because the problem's domain (its deterministic
    constraints) is empty: the user's model, so a solve raises it at once (a ``ModelError``;
    also a ``SubproblemError`` for code that caught that before)."""


def installed(solver: str) -> bool:
    """Whether CVXPY can run ``solver`` here."""
    return solver.upper() in cp.installed_solvers()


def _parameter(spec, m: int) -> cp.Parameter:
    return cp.Parameter(spec.shape, nonneg=spec.nonneg, PSD=spec.psd, name=f"{spec.name}_{m}")


def _placeholder(spec) -> np.ndarray:
    if spec.psd:
        return np.eye(spec.shape[0])
    return np.full(spec.shape, 1.0 if spec.nonneg else 0.0)


class _Model:
    """One CVXPY model of Problem 5: the problem, w (the variable, or ``centre + D v``), the
    slacks and the surrogate constraints whose duals are the multipliers."""

    __slots__ = ("problem", "w", "s", "sur_cons", "low_cons")

    def __init__(self, problem, w, s, sur_cons, low_cons=None):
        self.problem, self.w, self.s, self.sur_cons = problem, w, s, sur_cons
        # an equality's second side U_m - p_m(w) <= s_m: its multiplier is the difference
        self.low_cons = low_cons or {}

    def answer(self):
        """(w, slack, duals, value) as NumPy values after a solve, or None when the solver left
        no point (or no duals)."""
        w = self.w.value
        if w is None or not np.all(np.isfinite(w)):
            return None
        duals = [c.dual_value for c in self.sur_cons]
        low = {m: c.dual_value for m, c in self.low_cons.items()}
        if any(d is None for d in duals) or any(d is None for d in low.values()):
            return None
        duals = [np.asarray(d, dtype=float) - (np.asarray(low[m], dtype=float) if m in low
                                               else 0.0) for m, d in enumerate(duals)]
        s = None if self.s is None else np.array(self.s.value)
        return (np.array(w, dtype=float), s, [np.array(d) for d in duals],
                float(self.problem.value))


class CvxpySubproblem(SubproblemSolver):
    """Problem 5 in CVXPY: built once with Parameters when d <= DPP_MAX_DIM, else rebuilt with
    constants every round (``parametrize`` overrides the choice).

    Args:
      dim: size of w.
      builders: one surrogate builder per stochastic function, objective first if stochastic.
      stochastic_objective: whether builders[0] is the objective's.
      bounds: U_m of the M stochastic constraints.
      deterministic: the :class:`DeterministicPart` of the problem.
      solver: a CVXPY solver name (default Clarabel, an interior-point method); one that is
        not installed is a ``ValueError`` at once.
      solver_options: keyword arguments passed to ``Problem.solve``.
      direct: whether a round whose subproblem is a QP over a box (and Clarabel the solver
        at the library's settings) goes to Clarabel directly first
        (:class:`~ssca_solver.subproblems.box_qp.BoxProblem5`; ``subproblem="auto"``); False
        keeps every round on the CVXPY model (``subproblem="cvxpy"``).
    """

    name = "cvxpy"
    supports_model = True
    compiles_zero_model = True

    def __init__(self, dim: int, builders: Sequence, stochastic_objective: bool,
                 bounds: Sequence[float], deterministic, solver: str = "CLARABEL",
                 solver_options: Optional[dict] = None, parametrize: Optional[bool] = None,
                 equality=None, direct: bool = False):
        if not installed(solver):
            raise ValueError(f"solver={solver!r} is not an installed CVXPY solver; installed: "
                             f"{', '.join(cp.installed_solvers())}")
        self.dim = dim
        self.solver = solver
        # CVXPY's warm start hands Clarabel new data through solver.update(), which keeps the
        # first round's equilibration; later rounds then failed with "InsufficientProgress"
        # where a fresh Clarabel solve succeeds. Clarabel has no iterate warm start to lose.
        clarabel = solver.upper() == "CLARABEL"
        tight = CLARABEL_TOLERANCES if clarabel else {}
        self.solver_options = {"warm_start": False, **tight, **(solver_options or {})}
        own = clarabel and not set(CLARABEL_TOLERANCES) & set(solver_options or {})
        base = _CLARABEL_DEFAULTS if own else {}
        self._fallbacks = ([base] if own else []) + [{**base, **fb} for fb in
                                                     _CLARABEL_FALLBACKS] if clarabel else []
        self.num_constraints = len(bounds)
        self._builders = tuple(builders)
        self._stochastic_objective = stochastic_objective
        self._bounds = [float(U) for U in bounds]
        self._equality = (np.zeros(len(bounds), dtype=bool) if equality is None
                          else np.asarray(equality, dtype=bool).reshape(len(bounds)))
        self._deterministic = deterministic
        self.parametrize = dim <= DPP_MAX_DIM if parametrize is None else bool(parametrize)
        if self.parametrize:
            self._params = [{s.name: _parameter(s, m) for s in b.statistic_specs(dim)}
                            for m, b in enumerate(builders)]
            self._c = cp.Parameter(nonneg=True, name="penalty")
        # the local form: every builder can recentre its statistics
        zero = np.zeros(dim)
        self._recentres = all(b.recentre({s.name: _placeholder(s)
                                          for s in b.statistic_specs(dim)}, zero) is not None
                              for b in builders)
        self._local = {}                 # qn (bool) -> the parametrised local model or None
        self._center_param = None
        self._qn_params = None
        self._first_order_solved = False     # a round solved without a quasi-Newton term
        self._model_solved = False           # a round solved with a model's term
        self._main_model = None
        self.dpp = self.parametrize
        # a QP over a box with the library's Clarabel settings: the rounds go to Clarabel
        # directly (box_qp), CVXPY's problems are compiled only should that fail
        direct = (BoxProblem5.applies(dim, builders, deterministic, solver, solver_options)
                  if direct else None)
        self.direct_solves = 0           # rounds the direct form solved
        self._direct = None if direct is None else BoxProblem5(
            dim, stochastic_objective, self._bounds, self._equality, direct[0], direct[1],
            (CLARABEL_TOLERANCES, _CLARABEL_DEFAULTS)
            + tuple({**_CLARABEL_DEFAULTS, **fb} for fb in _CLARABEL_FALLBACKS))
        # the rounds' problem is built now (a model the surrogates cannot express raises
        # here, before round 1): the local form when it applies, else Problem 5 in w; the
        # latter, which then serves only rounds without a centre, is built on first use
        # (with the direct form, whose proximal-linear surrogates need no check, on first
        # use too)
        if self._direct is None and not (self.parametrize and self._recentres
                                         and self._local_main(False) is not None):
            self._main_model = self._build_main()

    def _build_main(self) -> "_Model":
        """Problem 5 in w: on the Parameters (with a warning when CVXPY cannot parametrise
        it), or, when not parametrised, on placeholder values (which checks the model once;
        each solve then rebuilds it)."""
        if self.parametrize:
            model = self._build(self._params, self._c)
            self.dpp = model.problem.is_dpp()
            if not self.dpp:
                warnings.warn("the subproblem is not DPP (a custom surrogate builder multiplies "
                              "parameters in a way CVXPY cannot parametrise); CVXPY will "
                              "recompile it every round, which is slow", stacklevel=4)
            return model
        self.dpp = False
        return self._build([{s.name: cp.Constant(_placeholder(s))
                             for s in b.statistic_specs(self.dim)} for b in self._builders],
                           cp.Constant(1.0))

    @property
    def _main(self) -> "_Model":
        """The model the next solve uses (Problem 5 in w unless a solve swapped in another)."""
        if self._main_model is None:
            self._main_model = self._build_main()
        return self._main_model

    @_main.setter
    def _main(self, model: "_Model") -> None:
        self._main_model = model

    @property
    def problem(self) -> cp.Problem:
        """The CVXPY problem of the rounds (the parametrised one, or the last rebuilt)."""
        return self._main.problem

    def _build(self, stats: Sequence[dict], penalty, center=None, scale=None,
               qn: Optional[dict] = None, local: bool = False) -> _Model:
        """Problem 5 on ``stats`` (Parameters, or Constants when not parametrised).

        With a ``center`` (and a positive diagonal ``scale`` D), the same problem in the
        variable v of w = center + D v, built with constants: |w|^2 is then written
        |center|^2 + 2 center.(D v) + |D v|^2, so the solver sees the surrogates' terms around
        the centre instead of the expanded constants (tau |w_t|^2 and more) that cancel there.

        ``local``: the form the rounds use when every builder can recentre its statistics
        (:meth:`SurrogateBuilder.recentre`): ``stats`` are already those of v -> p(q, x + v)
        about the round's point x = ``center`` (a Parameter), the surrogates and the
        quasi-Newton term are written in the step v, and only the deterministic terms and the
        domain see w = x + v.
        """
        if local:
            v = cp.Variable(self.dim, name="dw")       # the step from the round's point
            step = v
            w = center + v
            w_sq_exact = cp.sum_squares(v)
        elif center is None:
            w = cp.Variable(self.dim, name="w")
            w_sq_exact = cp.sum_squares(w)
        else:
            v = cp.Variable(self.dim, name="v")
            step = v if scale is None else cp.multiply(scale, v)
            w = center + step
            w_sq_exact = float(center @ center) + 2 * (center @ step) + cp.sum_squares(step)
        r = cp.Variable(name="w_sq")
        # in Problem 5 every surrogate shares the epigraph r >= |w|^2 (recentred: r >= |D v|^2)
        r_sq = (r if center is None or local
                else float(center @ center) + 2 * (center @ step) + r)
        surrogates = []
        for m, (b, st) in enumerate(zip(self._builders, stats)):
            # Problem 2 keeps |w|^2 a quadratic objective term (Clarabel takes it natively, as
            # P); in Problem 5 every surrogate shares the epigraph variable r
            sq = w_sq_exact if (self.num_constraints == 0 and m == 0) else r_sq
            expr = b.expression(st, v if local else w, sq)
            if not (expr.is_dcp() and expr.is_convex() and expr.size == 1):
                raise ModelError(f"surrogate builder {b!r} for function #{m} returned an "
                                 f"expression that is not a convex scalar under DCP: {expr}")
            surrogates.append(expr)
        det, domain = self._deterministic.instantiate(w)
        obj_terms = []
        k = 0
        if self._stochastic_objective:
            obj_terms.append(surrogates[0])
            k = 1
        if det is not None:
            obj_terms.append(det)
        cons = list(domain)
        if qn is not None:
            # the quasi-Newton model (w - x)' B (w - x) / 2 with B = delta (I - V V') +
            # V diag(h) V' (V orthonormal, MODEL_RANK columns, zero-padded): through v = w - x
            # and u = V' v every product is a Parameter times a Variable (DPP)
            # (u = V'(w - x) with V'x and sqrt(delta) x given as their own values: no copy
            # of w among the variables)
            # (in the local form the model's centre is the round's point: w - x = v)
            u = cp.Variable(qn["sh"].shape[0], name="qn_coords")
            if local:
                cons += [u == qn["V"].T @ v]
                obj_terms.append(0.5 * cp.sum_squares(qn["sd"] * v - qn["Vs"] @ u)
                                 + 0.5 * cp.sum_squares(cp.multiply(qn["sh"], u)))
            else:
                cons += [u == qn["V"].T @ w - qn["Vx"]]
                obj_terms.append(0.5 * cp.sum_squares(qn["sd"] * w - qn["sdx"] - qn["Vs"] @ u)
                                 + 0.5 * cp.sum_squares(cp.multiply(qn["sh"], u)))
        if self.num_constraints:  # Problem 2 never uses r (see the module docstring)
            cons.append(cp.sum_squares(w if center is None else step) <= r)
        sur_cons = []
        if self.num_constraints:
            s = cp.Variable(self.num_constraints, nonneg=True, name="slack")
            obj_terms.append(penalty * cp.sum(s))
            low_cons = {}
            for m, U in enumerate(self._bounds):
                sur_cons.append(surrogates[k + m] - U <= s[m])
                if self._equality[m]:              # |p_m(w) - U_m| <= s_m: p_m is affine
                    low_cons[m] = U - surrogates[k + m] <= s[m]
            cons = sur_cons + list(low_cons.values()) + cons
        else:
            s = None
        problem = cp.Problem(cp.Minimize(cp.sum(cp.hstack(obj_terms))), cons)
        if not problem.is_dcp():
            raise ModelError("the subproblem is not DCP; check the surrogate builders and "
                             "deterministic terms")
        return _Model(problem, w, s, sur_cons, low_cons if self.num_constraints else None)

    @staticmethod
    def _attempt(model: _Model, solver: str, options: dict,
                 rescue: bool = False) -> tuple[str, Optional[str]]:
        """Solve ``model`` once: (status, error text or None). A rescue attempt (another
        solver, the library's settings) also turns any other exception of the solver into a
        failed attempt; with the user's settings only CVXPY's SolverError is the solver's
        (a setting the solver refuses raises at once)."""
        try:
            with warnings.catch_warnings():  # the status is checked here, not by CVXPY
                warnings.filterwarnings("ignore", message="Solution may be inaccurate")
                model.problem.solve(solver=solver, **options)
        except cp.error.SolverError as exc:
            return "solver_error", str(exc)
        except Exception as exc:
            if not rescue:
                raise
            return "solver_error", f"{type(exc).__name__}: {exc}"
        return model.problem.status, None

    def _solve_with_retries(self, round: int, values: Sequence[dict],
                            penalty: float) -> tuple[tuple, str, int, bool]:
        """Solve; on a failure retry, then raise SubproblemError. Returns (answer, status,
        retries, inaccurate) with answer = (w, slack, duals, value).

        The chain, each attempt after the first counted as a retry:

        1. the chosen solver with the library's settings (Clarabel: CLARABEL_TOLERANCES);
        2. with the library's tight tolerances, Clarabel at its own defaults; then Clarabel
           without static regularisation, and without equilibration: Clarabel sometimes stalls
           ("InsufficientProgress", "AlmostSolved") after it has converged, when either interacts
           badly with the degenerate optimum of an unsatisfiable constraint surrogate; turning
           it off solves those instances to full accuracy. If none is "optimal", the first
           "optimal_inaccurate" answer is kept (flagged inaccurate);
        3. only when no attempt left an answer: the same problem rebuilt around a centre
           (:meth:`_center`), w = centre + v, then w = centre + D v with D = max(1, |centre|):
           a badly scaled subproblem (a large |w_t| with bounds: large constants that cancel)
           that Clarabel called "solver_error" or "unbounded" is solved to full accuracy so;
        4. the other installed solvers of ``OTHER_SOLVERS`` (SCS; OSQP when the problem is a
           QP; Clarabel when another solver was chosen), on the recentred problem when there
           is a centre: an "optimal" answer of a first-order method is flagged inaccurate.

        A larger proximal weight tau for the round is not tried here: the solver is stateless
        and sees only the averaged statistics, not the centre w_t of a proximal term, so a
        consistent one (tau' |w - w_t|^2) belongs to the method's step, not to this retry.
        If every attempt fails, and one of them said "infeasible", the domain alone is checked:
        when it is empty the error is :class:`EmptyDomainError` (the user's model).
        """
        attempts = [{}] + self._fallbacks
        statuses, errors, fallback = [], [], None
        for k, extra in enumerate(attempts):
            status, error = self._attempt(self._main, self.solver,
                                          {**self.solver_options, **extra})
            statuses.append(status)
            if error is not None:
                errors.append(error)
                continue
            answer = self._main.answer()
            if answer is None:
                continue
            if status == cp.OPTIMAL:
                return answer, status, k, False
            if status == cp.OPTIMAL_INACCURATE and fallback is None:
                fallback = answer
        if fallback is not None:  # keep the first inaccurate answer if nothing better came
            return fallback, cp.OPTIMAL_INACCURATE, len(attempts) - 1, True
        # nothing usable from the chosen solver's settings: the rescue chain
        rescue, k = [], len(attempts) - 1
        for label, model, solver, options, accurate in self._rescue(values, penalty):
            k += 1
            if isinstance(model, str):          # building it failed: name why
                rescue.append(f"{label} {model}")
                continue
            status, error = self._attempt(model, solver, options, rescue=solver != self.solver)
            rescue.append(f"{label} '{status}'")
            if error is not None:
                errors.append(f"{label}: {error}")
                continue
            answer = model.answer()
            if answer is None:
                continue
            if status == cp.OPTIMAL:
                return answer, status, k, not accurate
            if status == cp.OPTIMAL_INACCURATE and fallback is None:
                fallback = answer
        if fallback is not None:
            return fallback, cp.OPTIMAL_INACCURATE, k, True
        tried = ", ".join(f"'{st}'" for st in statuses)
        detail = f" ({errors[-1]})" if errors else ""
        which = "Problem 5" if self.num_constraints else "Problem 2"
        then = f"; then {', '.join(rescue)}" if rescue else ""
        text = (f"round {round}: solver {self.solver} returned status '{statuses[0]}' on the "
                f"subproblem ({which}); statuses of the {len(attempts)} attempt(s): {tried}"
                f"{then}{detail}")
        if any("infeasible" in x for x in statuses + rescue) and self._domain_is_empty():
            raise EmptyDomainError(f"{text}. The problem's domain alone (its deterministic "
                                   "constraints) is infeasible: no point satisfies them; "
                                   "check domain=")
        raise SubproblemError(text)

    def _rescue(self, values: Sequence[dict], penalty: float):
        """The attempts after the chosen solver's settings: (label, model or why it could not
        be built, solver, options, accurate), built lazily."""
        center = self._center(values)
        consts = [{k: cp.Constant(v) for k, v in vals.items()} for vals in values]
        c = cp.Constant(float(penalty))
        recentred = None
        if center is not None:
            scale = np.maximum(1.0, np.abs(center))
            # the second at the first fallback's tolerances (Clarabel's own defaults)
            relaxed = {**self.solver_options, **(self._fallbacks[0] if self._fallbacks else {})}
            for label, D, options in (("recentred", None, self.solver_options),
                                      ("recentred and scaled", scale, relaxed)):
                try:
                    model = self._build(consts, c, center, D)
                except Exception as exc:       # e.g. a domain written for a Variable only
                    yield label, f"(could not be built: {exc!r})", None, None, False
                    continue
                recentred = model
                yield f"{label} {self.solver}", model, self.solver, options, True
        for name, options in OTHER_SOLVERS.items():
            if name == self.solver.upper() or not installed(name):
                continue
            model = recentred if recentred is not None else self._main
            if name == "OSQP" and not model.problem.is_qp():
                continue
            yield name, model, name, options, name in _ACCURATE

    def _center(self, values: Sequence[dict]) -> Optional[np.ndarray]:
        """Where the problem is recentred: the minimiser -lin / (2 quad) of the objective's
        surrogate (of the sum of all surrogates when the objective has none of that form),
        for builders with statistics ``lin`` (d,) and ``quad`` (scalar or (d,), > 0), as the
        proximal-linear and diagonal builders have, projected onto the domain
        (:meth:`_into_domain`); None when no builder has them."""
        k = 1 if self._stochastic_objective else 0
        groups = ([values[:1]] if k else []) + [values]
        for group in groups:
            lin, quad = np.zeros(self.dim), 0.0
            for vals in group:
                if "lin" not in vals or "quad" not in vals:
                    break
                b, a = np.asarray(vals["lin"], dtype=float), np.asarray(vals["quad"], dtype=float)
                if b.shape != (self.dim,) or a.shape not in ((), (self.dim,)):
                    break
                lin, quad = lin + b, quad + a
            else:
                if np.all(quad > 0):
                    center = -lin / (2.0 * quad)
                    if np.all(np.isfinite(center)):
                        return self._into_domain(center)
        return None

    def _into_domain(self, center: np.ndarray) -> np.ndarray:
        """``center`` projected onto the domain (itself when there is none, or when the
        projection fails): with scalar curvature and no deterministic terms this is the
        minimiser of the objective's surrogate over the domain, near the answer even when a
        small tau puts the unconstrained minimiser far outside (a box far from 0)."""
        if not self._deterministic.has_domain:
            return center
        v = cp.Variable(self.dim)
        try:
            _, dom = self._deterministic.instantiate(center + v)
            prob = cp.Problem(cp.Minimize(cp.sum_squares(v)), dom)
            prob.solve(solver="CLARABEL" if installed("CLARABEL") else self.solver)
        except Exception:
            return center
        if v.value is None or not np.all(np.isfinite(v.value)):
            return center
        return center + np.asarray(v.value, dtype=float)

    def _domain_is_empty(self) -> bool:
        """Whether the deterministic constraints alone have no point (checked by Clarabel
        when available, else by the chosen solver)."""
        if not self._deterministic.has_domain:
            return False
        u = cp.Variable(self.dim)
        try:
            _, dom = self._deterministic.instantiate(u)
            prob = cp.Problem(cp.Minimize(0), dom)
            prob.solve(solver="CLARABEL" if installed("CLARABEL") else self.solver)
        except Exception:
            return False
        return prob.status in (cp.INFEASIBLE, cp.INFEASIBLE_INACCURATE)

    def with_model(self, model, center: np.ndarray) -> BoundSolver:
        """This solver with the quasi-Newton ``model`` added to the objective's surrogate about
        ``center``, the point the round's statistics were taken at (:meth:`solve_model`), as
        the closed form's ``with_model``."""
        return BoundSolver(self, center, lambda stats, penalty, round, nu0:
                           self.solve_model(stats, penalty, round, nu0, model, center))

    def solve_model(self, stats, penalty: float, round: int, nu0, model,
                    center: np.ndarray) -> SubproblemSolution:
        """:meth:`solve` with the quasi-Newton ``model``'s term centred at the round's point
        ``center``; once a model's round was solved, the later rounds without a pair are the
        first-order problem's (:meth:`solve_zero_model`)."""
        self._model_solved = True
        return self.solve(stats, penalty, round, nu0, model=model, center=center)

    def with_zero_model(self, center: np.ndarray) -> BoundSolver:
        """This solver for a round of the full-batch phase before its quasi-Newton model holds
        a pair: the model's compiled problem with B = 0 (:meth:`solve_zero_model`), so that a
        run compiles one subproblem instead of two."""
        return BoundSolver(self, center, lambda stats, penalty, round, nu0:
                           self.solve_zero_model(stats, penalty, round, nu0, center))

    def solve_zero_model(self, stats, penalty: float, round: int, nu0,
                         center: np.ndarray) -> SubproblemSolution:
        """A full-batch round before the quasi-Newton model holds a pair: the compiled problem
        of :meth:`solve_model` with its term at B = 0 (the same subproblem as the first-order
        one), so that a run compiles one problem, not two. Where the local form does not
        apply, or the solver fails on it, the round is the first-order problem's."""
        # (once the first-order problem was compiled, by the sampled rounds of batch_size=
        # "auto", there is no compile to save: it serves, as Clarabel needed a retry with the
        # zero term in a round its first attempt solves with the first-order problem)
        # (and only before the run's first model: after a reset of the model, the rounds
        # without it are the first-order problem's)
        # (the direct form over a box compiles nothing: the first-order round is the same
        # problem)
        if (self._direct is None and self.parametrize and self._recentres
                and not self._first_order_solved
                and not self._model_solved and self._local_main(True) is not None):
            try:
                return self.solve(stats, penalty, round, nu0, qn=self._zero_model_values(),
                                  center=center)
            except EmptyDomainError:
                raise
            except SubproblemError:
                # every attempt failed on the zero term: the first-order problem, the failed
                # attempt counted as one retry
                sol = self.solve(stats, penalty, round, nu0, center=center)
                sol.retries += 1
                return sol
        return self.solve(stats, penalty, round, nu0, center=center)

    def _zero_model_values(self) -> dict:
        """The values of :meth:`_build`'s quasi-Newton term for B = 0 (every factor zero)."""
        rank = self._model_rank(0)
        return {"Vx": np.zeros(rank), "sdx": np.zeros(self.dim),
                "V": np.zeros((self.dim, rank)), "Vs": np.zeros((self.dim, rank)), "sd": 0.0,
                "sh": np.zeros(rank)}

    def _model_values(self, model, center: np.ndarray) -> dict:
        """The model B = delta I - Psi N^{-1} Psi' as the factor values of :meth:`_build`'s
        quasi-Newton term: V an orthonormal basis of Psi's span that diagonalises B there
        (eigenvalues h), zero-padded to MODEL_RANK columns."""
        P = model.directions()
        Q, _ = np.linalg.qr(P.T)
        rank = self._model_rank(Q.shape[1])
        H = Q.T @ model.matmat(Q)
        h, E = np.linalg.eigh(0.5 * (H + H.T))
        V = np.zeros((self.dim, rank))
        sh = np.zeros(rank)
        V[:, :h.size] = Q @ E
        sh[:h.size] = np.sqrt(np.maximum(h, 0.0))
        sd = float(np.sqrt(max(model.delta, 0.0)))
        x = np.asarray(center, dtype=float)
        return {"Vx": V.T @ x, "sdx": sd * x, "V": V, "Vs": sd * V, "sd": sd, "sh": sh}

    def _model_rank(self, needed: int) -> int:
        """The columns of the quasi-Newton term: MODEL_RANK, doubled (up to d) until ``needed``
        fit; a change drops the compiled problems that hold the term (rebuilt on next use)."""
        rank = getattr(self, "_qn_rank", None) or (
            self.dim if self.dim <= FULL_RANK_DIM else min(self.dim, MODEL_RANK))
        while rank < needed:
            rank = min(self.dim, 2 * rank)
        if rank != getattr(self, "_qn_rank", None):
            self._qn_rank = rank
            self._qn_main = None
            self._local.pop(True, None)
        return rank

    def _qn_parameters(self) -> dict:
        """The Parameters of the quasi-Newton term at the current rank (made on first use,
        and again after the rank changed)."""
        rank = self._model_rank(0)
        if self._qn_params is None or self._qn_params["Vx"].shape != (rank,):
            self._qn_params = {
                "Vx": cp.Parameter(rank, name="qn_Vx"),
                "sdx": cp.Parameter(self.dim, name="qn_sdx"),
                "V": cp.Parameter((self.dim, rank), name="qn_V"),
                "Vs": cp.Parameter((self.dim, rank), name="qn_Vs"),
                "sd": cp.Parameter(nonneg=True, name="qn_sd"),
                "sh": cp.Parameter(rank, nonneg=True, name="qn_sh")}
        return self._qn_params

    def _model_main(self) -> _Model:
        """The parametrised Problem 5 with the quasi-Newton term (built on first use)."""
        if getattr(self, "_qn_main", None) is None:
            self._qn_main = self._build(self._params, self._c, qn=self._qn_parameters())
        return self._qn_main

    def _local_main(self, with_qn: bool) -> Optional[_Model]:
        """The parametrised Problem 5 in the local form of :meth:`_build` (with or without the
        quasi-Newton term), built on first use; None where it does not apply (a builder that
        cannot recentre, no Parameters, or a domain that is not DPP in x + v)."""
        if with_qn not in self._local:
            model = None
            if self.parametrize and self._recentres:
                if self._center_param is None:
                    self._center_param = cp.Parameter(self.dim, name="center")
                try:
                    model = self._build(self._params, self._c, center=self._center_param,
                                        qn=self._qn_parameters() if with_qn else None,
                                        local=True)
                    if not model.problem.is_dpp():
                        model = None
                except Exception:       # e.g. a domain written for a Variable only
                    model = None
            self._local[with_qn] = model
        return self._local[with_qn]

    def solve(self, stats: Sequence[dict], penalty: float, round: int,
              nu0=None, qn: Optional[dict] = None,
              center: Optional[np.ndarray] = None, model=None) -> SubproblemSolution:
        """Set the Parameters to ``stats`` and ``penalty`` (or rebuild with them) and solve,
        retrying as :meth:`_solve_with_retries` says; raise SubproblemError when every attempt
        fails. ``nu0`` is accepted for the common contract and unused (Clarabel has no dual
        warm start through CVXPY). ``qn``: the values of a quasi-Newton term
        (:meth:`_model_values`), added to the objective (the rescue attempts of
        :meth:`_solve_with_retries` go without it). ``center``: the round's point w_t; the
        problem is then solved in the step w - w_t (the local form of :meth:`_build`) when
        every builder can recentre its statistics; a quasi-Newton term is centred there.
        ``model``: the quasi-Newton model itself (instead of ``qn``, whose values are then
        computed only if the CVXPY form is used).

        A QP over a box (:class:`~ssca_solver.subproblems.box_qp.BoxProblem5`) goes to
        Clarabel directly first, at the settings of the first stage of
        :meth:`_solve_with_retries` (the library's tolerances, Clarabel's defaults, without
        static regularisation, without equilibration); only when none is "Solved" does the
        round take the CVXPY path below, those attempts counted as retries."""
        values = []
        for b, st in zip(self._builders, stats):
            vals = {}
            for spec in b.statistic_specs(self.dim):
                v = np.asarray(st[spec.name], dtype=float)
                # guards round-off below 0 in a nonnegative statistic, asymmetry in a PSD one
                if spec.nonneg:
                    v = np.maximum(v, 0.0)
                if spec.psd:
                    v = 0.5 * (v + v.T)
                vals[spec.name] = v
            values.append(vals)
        plain, swapped = None, False
        x = None if center is None else np.asarray(center, dtype=float)
        local = None
        if x is not None and x.shape == (self.dim,) and np.all(np.isfinite(x)) \
                and self._recentres:
            local = [b.recentre(vals, x) for b, vals in zip(self._builders, values)]
            if any(v is None for v in local):
                local = None
        retried = 0
        if local is not None and self._direct is not None and qn is None:
            # (the model's factor values ``qn`` are the CVXPY form's: given them, it is used)
            B = model.matmat(np.eye(self.dim)) if model is not None and len(model) else None
            got = self._direct.solve(local, float(penalty), x, B)
            if got is not None:
                w, slack, mult, value, retries = got
                self._first_order_solved |= model is None
                self.direct_solves += 1
                return SubproblemSolution(self._deterministic.clip(w), slack, mult, value,
                                          retries=retries)
            retried = len(self._direct.attempts)
        if qn is None and model is not None:
            qn = self._model_values(model, x)
        if local is not None and self.parametrize and self._local_main(qn is not None):
            for ps, vals in zip(self._params, local):
                for name, p in ps.items():
                    p.value = vals[name]
            self._c.value = float(penalty)
            self._center_param.value = x
            if qn is not None:
                for name, p in self._qn_params.items():
                    p.value = qn[name]
            # (Problem 5 in w, possibly not built yet, comes back after the solve)
            plain, swapped = self._main_model, True
            self._main = self._local_main(qn is not None)
        elif local is not None and not self.parametrize:
            self._main = self._build([{k: cp.Constant(v) for k, v in vals.items()}
                                      for vals in local], cp.Constant(float(penalty)),
                                     center=cp.Constant(x), local=True,
                                     qn=None if qn is None else {
                                         k: cp.Constant(v) for k, v in qn.items()})
        elif self.parametrize:
            for ps, vals in zip(self._params, values):
                for name, p in ps.items():
                    p.value = vals[name]
            self._c.value = float(penalty)
            if qn is not None:
                plain, swapped = self._main, True
                self._main = self._model_main()
                for name, p in self._qn_params.items():
                    p.value = qn[name]
        else:
            self._main = self._build([{k: cp.Constant(v) for k, v in vals.items()}
                                      for vals in values], cp.Constant(float(penalty)),
                                     qn=None if qn is None else {
                                         k: cp.Constant(v) for k, v in qn.items()})
        self._first_order_solved |= qn is None
        try:
            (w, s, duals, value), status, retries, inaccurate = self._solve_with_retries(
                round, values, penalty)
        finally:
            if swapped:
                self._main_model = plain
        retries += retried
        M = self.num_constraints
        slack = np.maximum(s, 0.0) if M else np.zeros(0)
        mult = (np.array([float(np.atleast_1d(d)[0]) for d in duals]) if M else np.zeros(0))
        # an inequality's multiplier is >= 0 (rounding below 0 clipped); an equality's has
        # either sign
        mult = np.where(self._equality, mult, np.maximum(mult, 0.0)) if M else mult
        # inside the domain's simple bounds (the interior point answer can be 1e-12 outside)
        w = self._deterministic.clip(np.array(w, dtype=float))
        return SubproblemSolution(w, slack, mult, value, retries=retries,
                                  inaccurate=inaccurate)
