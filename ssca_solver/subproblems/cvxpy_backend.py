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
"""

from __future__ import annotations

import warnings
from typing import Optional, Sequence

import cvxpy as cp
import numpy as np

from ..errors import ModelError, SubproblemError
from .base import SubproblemSolution


#: Above this size the subproblem is rebuilt with constants each round instead of compiled once
#: with Parameters: CVXPY 1.9's DPP compilation grows like d^2 (measured: 0.06 s and 190 MB at
#: d = 1000, 1.6 s and 730 MB at d = 6000, an attempted 77 GiB allocation at d = 101,632),
#: while a plain build and solve of the network's Problem 5 takes ~1 s at d = 101,632.
DPP_MAX_DIM = 4096

_CLARABEL_FALLBACKS = [{"static_regularization_enable": False}, {"equilibrate_enable": False}]

#: Clarabel's tolerances for Problem 5 unless the user's ``solver_options`` set them. Clarabel's
#: defaults (1e-8 gap, 1e-8 feasibility, relative to its scaled data) left the subproblem of the
#: box-domain Neyman-Pearson example accurate to ~1e-5 in w: the full-batch backtracking then
#: rejected most steps and the run stalled at relative stationarity 1.7e-4 > 1e-4 (issue 10).
#: At 1e-9 the same run is certified (tests/test_examples.py).
#: Where Clarabel cannot reach them (noisy mini-batch statistics, a large c: it then reports
#: "AlmostSolved"), the round is retried at Clarabel's own defaults before being called
#: inaccurate: 16 of 50 rounds of a B = 10 Neyman-Pearson run needed that retry.
CLARABEL_TOLERANCES = {"tol_gap_abs": 1e-9, "tol_gap_rel": 1e-9, "tol_feas": 1e-9}
_CLARABEL_DEFAULTS = {"tol_gap_abs": 1e-8, "tol_gap_rel": 1e-8, "tol_feas": 1e-8}


def _parameter(spec, m: int) -> cp.Parameter:
    return cp.Parameter(spec.shape, nonneg=spec.nonneg, PSD=spec.psd, name=f"{spec.name}_{m}")


def _placeholder(spec) -> np.ndarray:
    if spec.psd:
        return np.eye(spec.shape[0])
    return np.full(spec.shape, 1.0 if spec.nonneg else 0.0)


class CvxpySubproblem:
    """Problem 5 in CVXPY: built once with Parameters when d <= DPP_MAX_DIM, else rebuilt with
    constants every round (``parametrize`` overrides the choice).

    Args:
      dim: size of w.
      builders: one surrogate builder per stochastic function, objective first if stochastic.
      stochastic_objective: whether builders[0] is the objective's.
      bounds: U_m of the M stochastic constraints.
      deterministic: the :class:`DeterministicPart` of the problem.
      solver: a CVXPY solver name (default Clarabel, an interior-point method).
      solver_options: keyword arguments passed to ``Problem.solve``.
    """

    name = "cvxpy"

    def __init__(self, dim: int, builders: Sequence, stochastic_objective: bool,
                 bounds: Sequence[float], deterministic, solver: str = "CLARABEL",
                 solver_options: Optional[dict] = None, parametrize: Optional[bool] = None):
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
        self._deterministic = deterministic
        self._value = None
        self.parametrize = dim <= DPP_MAX_DIM if parametrize is None else bool(parametrize)
        if self.parametrize:
            self._params = [{s.name: _parameter(s, m) for s in b.statistic_specs(dim)}
                            for m, b in enumerate(builders)]
            self._c = cp.Parameter(nonneg=True, name="penalty")
            self._build(self._params, self._c)
            self.dpp = self.problem.is_dpp()
            if not self.dpp:
                warnings.warn("the subproblem is not DPP (a custom surrogate builder multiplies "
                              "parameters in a way CVXPY cannot parametrise); CVXPY will "
                              "recompile it every round, which is slow", stacklevel=3)
        else:  # check the model once on placeholder values; each solve rebuilds it
            self._build([{s.name: cp.Constant(_placeholder(s)) for s in b.statistic_specs(dim)}
                         for b in builders], cp.Constant(1.0))
            self.dpp = False

    def _build(self, stats: Sequence[dict], penalty) -> None:
        """Problem 5 on ``stats`` (Parameters, or Constants when not parametrised)."""
        self._w = cp.Variable(self.dim, name="w")
        self._r = cp.Variable(name="w_sq")
        surrogates = []
        for m, (b, st) in enumerate(zip(self._builders, stats)):
            # Problem 2 keeps |w|^2 a quadratic objective term (Clarabel takes it natively, as
            # P); in Problem 5 every surrogate shares the epigraph variable r
            sq = (cp.sum_squares(self._w) if (self.num_constraints == 0 and m == 0)
                  else self._r)
            expr = b.expression(st, self._w, sq)
            if not (expr.is_dcp() and expr.is_convex() and expr.size == 1):
                raise ModelError(f"surrogate builder {b!r} for function #{m} returned an "
                                 f"expression that is not a convex scalar under DCP: {expr}")
            surrogates.append(expr)
        det, domain = self._deterministic.instantiate(self._w)
        obj_terms = []
        k = 0
        if self._stochastic_objective:
            obj_terms.append(surrogates[0])
            k = 1
        if det is not None:
            obj_terms.append(det)
        cons = list(domain)
        if self.num_constraints:  # Problem 2 never uses r (see the module docstring)
            cons.append(cp.sum_squares(self._w) <= self._r)
        self._sur_cons = []
        if self.num_constraints:
            self._s = cp.Variable(self.num_constraints, nonneg=True, name="slack")
            obj_terms.append(penalty * cp.sum(self._s))
            for m, U in enumerate(self._bounds):
                self._sur_cons.append(surrogates[k + m] - U <= self._s[m])
            cons = self._sur_cons + cons
        else:
            self._s = None
        self.problem = cp.Problem(cp.Minimize(cp.sum(cp.hstack(obj_terms))), cons)
        if not self.problem.is_dcp():
            raise ModelError("the subproblem is not DCP; check the surrogate builders and "
                             "deterministic terms")

    def _solve_with_retries(self, round: int) -> tuple[str, int]:
        """Solve; on a failure retry with each fallback setting, then raise SubproblemError.

        With the library's tight tolerances (CLARABEL_TOLERANCES) the first retry is at
        Clarabel's own defaults. Clarabel sometimes stalls ("InsufficientProgress", "AlmostSolved") after it has
        converged, when its static regularisation or equilibration interacts badly with the
        degenerate optimum of an unsatisfiable constraint surrogate; turning either off solves
        those instances to full accuracy. Returns the status and the number of retries.
        """
        attempts = [{}] + self._fallbacks
        statuses, errors, fallback = [], [], None
        for k, extra in enumerate(attempts):
            try:
                with warnings.catch_warnings():  # the status is checked here, not by CVXPY
                    warnings.filterwarnings("ignore", message="Solution may be inaccurate")
                    self.problem.solve(solver=self.solver, **{**self.solver_options, **extra})
                statuses.append(self.problem.status)
            except cp.error.SolverError as exc:
                statuses.append("solver_error")
                errors.append(str(exc))
                continue
            if self._w.value is None:
                continue
            if statuses[-1] == cp.OPTIMAL:
                return statuses[-1], k
            if statuses[-1] == cp.OPTIMAL_INACCURATE and fallback is None:
                fallback = self._snapshot()
        if fallback is not None:  # keep the first inaccurate answer if nothing better came
            self._restore(fallback)
            return cp.OPTIMAL_INACCURATE, len(attempts) - 1
        tried = ", ".join(f"'{st}'" for st in statuses)
        detail = f" ({errors[-1]})" if errors else ""
        which = "Problem 5" if self.num_constraints else "Problem 2"
        raise SubproblemError(f"round {round}: solver {self.solver} returned status '{statuses[0]}'"
                              f" on the subproblem ({which}); statuses of the {len(attempts)} "
                              f"attempt(s): {tried}{detail}")

    def _snapshot(self):
        return (np.array(self._w.value), None if self._s is None else np.array(self._s.value),
                [np.array(c.dual_value) for c in self._sur_cons], float(self.problem.value))

    def _restore(self, snap):
        self._w.value, s, duals, self._value = snap
        if self._s is not None:
            self._s.value = s
        for c, dv in zip(self._sur_cons, duals):
            c.dual_variables[0].value = dv

    def solve(self, stats: Sequence[dict], penalty: float, round: int,
              nu0=None) -> SubproblemSolution:
        """Set the Parameters to ``stats`` and ``penalty`` (or rebuild with them) and solve;
        raise SubproblemError on failure. ``nu0`` is accepted for the common contract and
        unused (Clarabel has no dual warm start through CVXPY)."""
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
        if self.parametrize:
            for ps, vals in zip(self._params, values):
                for name, p in ps.items():
                    p.value = vals[name]
            self._c.value = float(penalty)
        else:
            self._build([{k: cp.Constant(v) for k, v in vals.items()} for vals in values],
                        cp.Constant(float(penalty)))
        status, retries = self._solve_with_retries(round)
        M = self.num_constraints
        slack = np.maximum(self._s.value, 0.0) if M else np.zeros(0)
        mult = (np.array([float(np.atleast_1d(c.dual_value)[0]) for c in self._sur_cons])
                if M else np.zeros(0))
        value = self._value if status == cp.OPTIMAL_INACCURATE else float(self.problem.value)
        return SubproblemSolution(np.array(self._w.value, dtype=float), slack,
                                  np.maximum(mult, 0.0), value, retries=retries,
                                  inaccurate=status == cp.OPTIMAL_INACCURATE)
