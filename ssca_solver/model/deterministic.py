"""Deterministic convex terms and sets, written by the user as CVXPY expressions of w.

A term is a callable ``w -> cvxpy expression`` (e.g. ``lambda w: 1e-2 * cp.sum_squares(w)``);
a domain is a callable ``w -> list of cvxpy constraints``. They enter the server's subproblem
(Problem 2 / Problem 5) exactly, not through a surrogate (PAPER_NOTES item 5).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

import cvxpy as cp
import numpy as np

from ..errors import ModelError
from . import linearized


def term_label(kind: str, i: int, fn) -> str:
    name = getattr(fn, "__name__", type(fn).__name__)
    return f"{kind} #{i} ({name})" if name != "<lambda>" else f"{kind} #{i}"


#: the linearised KKT problem is compiled once with parameters while d (M + 1) is at most
#: this (its parameter G holds d M numbers)
LINEARIZED_CACHE_SIZE = 20_000


class DeterministicPart:
    """The deterministic terms (objective and regularizers) and domain constraints of a problem.

    Args:
      terms: pairs (label, callable w -> convex scalar CVXPY expression).
      domain: callables w -> constraint or list of constraints (each must be DCP).
      dim: size of w.

    Every term is instantiated once on a probe variable at construction to check convexity, so a
    non-convex term is reported by name before any round runs.
    """

    def __init__(self, terms: Sequence[tuple[str, Callable]], domain: Sequence[Callable],
                 dim: int):
        self.dim = dim
        self._terms = tuple(terms)
        self._domain = tuple(domain)
        self._w = cp.Variable(dim, name="w")
        self._exprs, self._cons = self._build(self._w)
        self._prox = None
        self._linearized: dict = {}
        self._linearized_uses: dict = {}

    def __getstate__(self):
        # compiled CVXPY problems are caches: rebuilt where needed, never pickled
        state = dict(self.__dict__)
        state.update(_prox=None, _linearized={}, _linearized_uses={})
        return state

    # -- building on any variable -----------------------------------------------------------------
    @staticmethod
    def _call(label, fn, w):
        """``fn(w)``; whatever it raises becomes a ModelError naming the term or domain."""
        try:
            return fn(w)
        except Exception as exc:
            raise ModelError(f"{label}: calling it on a CVXPY variable failed: {exc!r}") from exc

    @staticmethod
    def _term_expr(label, fn, w):
        e = DeterministicPart._call(label, fn, w)
        if isinstance(e, (int, float, np.number)):
            e = cp.Constant(float(e))
        if not isinstance(e, cp.Expression):
            raise ModelError(f"{label} must return a CVXPY expression of w, got {type(e).__name__}")
        if e.size != 1:
            raise ModelError(f"{label} must be a scalar expression, got shape {e.shape}")
        if not (e.is_dcp() and e.is_convex()):
            raise ModelError(f"{label} is not convex under CVXPY's DCP rules ({e}); a deterministic "
                             "term is kept exact in the convex subproblem, so it must be convex. "
                             "Model a non-convex term as a SampleFunction instead.")
        return e

    @staticmethod
    def _domain_cons(label, fn, w):
        cons = DeterministicPart._call(label, fn, w)
        if isinstance(cons, cp.constraints.constraint.Constraint):
            cons = [cons]
        cons = list(cons)
        for j, c in enumerate(cons):
            if not isinstance(c, cp.constraints.constraint.Constraint):
                raise ModelError(f"{label}: item {j} is not a CVXPY constraint "
                                 f"({type(c).__name__})")
            if not c.is_dcp():
                raise ModelError(f"{label}: constraint {j} ({c}) is not convex under CVXPY's DCP "
                                 "rules; a domain must be a convex set")
        return cons

    def _build(self, w) -> tuple[list, list]:
        """(the terms' expressions, the domain's constraints), built on ``w`` and checked."""
        exprs = [self._term_expr(label, fn, w) for label, fn in self._terms]
        cons = []
        for i, fn in enumerate(self._domain):
            cons.extend(self._domain_cons(term_label("domain", i, fn), fn, w))
        return exprs, cons

    def instantiate(self, w: cp.Variable):
        """The terms' sum and the domain's constraints, built on variable ``w``."""
        exprs, cons = self._build(w)
        return (cp.sum(cp.hstack(exprs)) if exprs else None), cons

    # -- properties -----------------------------------------------------------------------------
    @property
    def empty(self) -> bool:
        return not self._terms and not self._domain

    @property
    def has_domain(self) -> bool:
        return bool(self._domain)

    @property
    def labels(self) -> list[str]:
        return [label for label, _ in self._terms]

    @property
    def smooth(self) -> bool:
        """True when every term is quadratic (so its gradient is its only subgradient)."""
        return all(e.is_quadratic() for e in self._exprs)

    def norm2_coefficient(self) -> Optional[float]:
        """lambda when the terms add up to lambda |w|^2 (lambda >= 0) and there is no domain."""
        if self._domain:
            return None
        return self.ridge_coefficient()

    def ridge_coefficient(self) -> Optional[float]:
        """lambda when the terms add up to lambda |w|^2 (the paper's deterministic objective in
        (prob:class-con), lambda = 1), whatever the domain (None when not; 0.0 without terms
        or with terms that vanish everywhere): their value at three random points and at 0,
        computed once."""
        if not self._exprs:
            return 0.0
        if "_ridge_value" in self.__dict__:
            return self._ridge_value
        lam = None
        if self.smooth:
            probe = np.random.default_rng(0).standard_normal((3, self.dim))
            vals = np.array([self.value(p) for p in probe])
            c = vals[0] / float(probe[0] @ probe[0])
            ok = np.allclose(vals, c * np.einsum("ij,ij->i", probe, probe), rtol=1e-10,
                             atol=1e-12)
            lam = float(c) if ok and abs(self.value(np.zeros(self.dim))) < 1e-14 else None
        self._ridge_value = lam
        return lam

    # -- numeric evaluation -------------------------------------------------------------------------
    def value(self, w) -> float:
        if not self._exprs:
            return 0.0
        self._w.value = np.asarray(w, dtype=float)
        return float(sum(e.value for e in self._exprs))

    def grad(self, w) -> np.ndarray:
        """Gradient (a subgradient at kinks, as CVXPY gives it) of the terms' sum at ``w``;
        2 lambda w without CVXPY when they are lambda |w|^2 (:meth:`ridge_coefficient`: CVXPY's
        gradient costs a sizeable share of a small problem's KKT test)."""
        g = np.zeros(self.dim)
        if not self._exprs:
            return g
        lam = self.ridge_coefficient()
        if lam is not None:
            return 2.0 * lam * np.asarray(w, dtype=float).reshape(self.dim)
        self._w.value = np.asarray(w, dtype=float)
        for e in self._exprs:
            if e.is_constant():
                continue  # CVXPY gives no gradient for a constant; it is zero
            ge = e.grad.get(self._w)
            if ge is None:
                raise ModelError(f"a deterministic term is not differentiable at w ({e})")
            g += np.asarray(ge.toarray() if hasattr(ge, "toarray") else ge).ravel()
        return g

    def domain_violation(self, w) -> float:
        """max violation of the domain constraints at ``w`` (0 when inside)."""
        if not self._cons:
            return 0.0
        self._w.value = np.asarray(w, dtype=float)
        return float(max(np.max(np.atleast_1d(c.violation())) for c in self._cons))

    def simple_bounds(self) -> tuple:
        """(lo, hi): the bounds on single coordinates that the domain states directly,
        ``w[idx] >= l``, ``w[idx] <= u``, ``w[idx] == b`` (and the same on the whole of w), read
        from its constraints without solving anything (-inf / inf where none; computed once).
        Other constraints of the domain are not summarised here."""
        if getattr(self, "_simple_bounds", None) is not None:
            return self._simple_bounds
        lo = np.full(self.dim, -np.inf)
        hi = np.full(self.dim, np.inf)
        self._simple_bounds = (lo, hi)
        # per domain constraint (in instantiate's order): (indices, kind, values) of the simple
        # bound it states, kind "le", "ge" or "eq"; None for a constraint of another form
        self._bound_rows = []
        if not self._domain:
            return self._simple_bounds
        u = cp.Variable(self.dim)
        try:
            _, dom = self.instantiate(u)
        except Exception:
            self._bound_rows = None
            return self._simple_bounds
        index_types = (cp.atoms.affine.index.index, cp.atoms.affine.index.special_index)

        def selected(expr):
            # the coordinates a pure selection of u picks, in order (None: not one)
            if expr is u:
                return np.arange(self.dim)
            if isinstance(expr, index_types) and expr.args and expr.args[0] is u:
                u.value = np.arange(self.dim, dtype=float)
                try:
                    return np.asarray(expr.value, dtype=float).ravel().astype(int)
                finally:
                    u.value = None
            return None

        for c in dom:
            row = None
            if isinstance(c, (cp.constraints.Equality, cp.constraints.Inequality)):
                a, b = c.args                       # a <= b, or a == b
                for left, right, upper in ((a, b, True), (b, a, False)):
                    idx = selected(left)
                    if idx is None or not right.is_constant():
                        continue
                    val = np.broadcast_to(np.asarray(right.value, dtype=float), idx.shape) \
                        if np.size(right.value) in (1, idx.size) else None
                    if val is None:
                        continue
                    val = np.asarray(val, dtype=float).reshape(idx.shape)
                    equality = isinstance(c, cp.constraints.Equality)
                    if equality or not upper:
                        lo[idx] = np.maximum(lo[idx], val)
                    if equality or upper:
                        hi[idx] = np.minimum(hi[idx], val)
                    row = (idx, "eq" if equality else ("le" if upper else "ge"), val)
                    break
            self._bound_rows.append(row)
        return self._simple_bounds

    def box(self) -> Optional[tuple]:
        """(lo, hi, rows) when the domain is nothing but simple bounds on coordinates
        (:meth:`simple_bounds`; ``rows``: per domain constraint the (indices, kind, values) it
        states, kind "le", "ge" or "eq"), None when some constraint of the domain has another
        form, or the bounds are contradictory (lo > hi: an empty domain, left to the
        solvers' infeasibility reports). Without a domain: (-inf, inf, [])."""
        if "_bound_rows" not in self.__dict__:
            # bounds summarised by a version that kept no rows (an older pickle): read again
            self._simple_bounds = None
        lo, hi = self.simple_bounds()
        rows = self._bound_rows
        if rows is None or any(r is None for r in rows) or np.any(lo > hi):
            return None
        return lo, hi, rows

    def box_duals(self, z_lo: np.ndarray, z_hi: np.ndarray) -> list:
        """The domain's multipliers, one array per domain constraint as CVXPY's dual values
        give them, from the multipliers of the bounds lo <= w (``z_lo`` >= 0) and w <= hi
        (``z_hi`` >= 0) when the domain is a box (:meth:`box`). A coordinate bounded by
        several constraints gives its multiplier to the first that states the tightest bound;
        an equality's multiplier is z_hi - z_lo (CVXPY's sign for ``w == b``)."""
        lo, hi, rows = self.box()
        taken_lo = np.zeros(self.dim, dtype=bool)
        taken_hi = np.zeros(self.dim, dtype=bool)
        out = []
        for idx, kind, val in rows:
            dual = np.zeros(idx.size)
            if kind in ("le", "eq"):
                mine = (val == hi[idx]) & ~taken_hi[idx]
                dual = dual + np.where(mine, z_hi[idx], 0.0)
                taken_hi[idx[mine]] = True
            if kind in ("ge", "eq"):
                mine = (val == lo[idx]) & ~taken_lo[idx]
                dual = dual - np.where(mine, z_lo[idx], 0.0) if kind == "eq" \
                    else dual + np.where(mine, z_lo[idx], 0.0)
                taken_lo[idx[mine]] = True
            out.append(dual)
        return out

    def bound_fixed(self, w) -> np.ndarray:
        """The coordinates the domain fixes by simple bounds (:meth:`simple_bounds`: equal
        lower and upper bounds, or an equality), as indices; empty without a domain. The
        probe's direction leaves them out: a function need not be smooth along a coordinate
        the domain never lets move (x log x at a variable fixed at 0 has an unbounded
        curvature there, which would make tau so large that the statistics lose every digit
        of the step)."""
        lo, hi = self.simple_bounds()
        return np.flatnonzero(np.isfinite(lo) & (lo == hi))

    def free(self, g: np.ndarray) -> np.ndarray:
        """``g`` with the coordinates the domain's simple bounds fix (:meth:`bound_fixed`) set
        to 0 (``g`` itself when there are none). A gradient along a coordinate that cannot
        move is no force to balance: counted in the KKT test's scale |g|, a large component
        along a fixed variable would loosen the relative test enough to certify a point far
        from the minimum in the free variables."""
        fixed = self.bound_fixed(None)
        if not fixed.size:
            return g
        g = np.array(g, dtype=float, copy=True)
        g[fixed] = 0.0
        return g

    def clip(self, w: np.ndarray) -> np.ndarray:
        """``w`` moved into the domain's simple bounds (:meth:`simple_bounds`): an interior
        point solver's answer can sit a rounding error outside them, where a function such as
        x log x at a variable fixed at 0 is not defined (NaN in the next evaluation)."""
        lo, hi = self.simple_bounds()
        return np.clip(w, lo, hi) if self._domain else w

    def fixed_coordinates(self, w, max_dim: int = 200,
                          solver: str = "CLARABEL") -> np.ndarray:
        """The coordinates the domain fixes (min w_i = max w_i over D, to 1e-12 max(1, |w_i|)),
        as indices; empty without a domain, above ``max_dim`` variables (2 d small solves) or
        when a solve fails. For the gradient check: a function need not be differentiable off
        the domain along a fixed coordinate (e.g. x log x at a variable fixed at 0)."""
        if not self._domain or self.dim > max_dim:
            return np.zeros(0, dtype=int)
        u = cp.Variable(self.dim)
        try:
            _, dom = self.instantiate(u)
        except Exception:
            return np.zeros(0, dtype=int)
        w = np.asarray(w, dtype=float)
        fixed = []
        for i in range(self.dim):
            ends = []
            for sense in (cp.Minimize, cp.Maximize):
                prob = cp.Problem(sense(u[i]), dom)
                try:
                    prob.solve(solver=solver)
                except Exception:
                    return np.zeros(0, dtype=int)
                if prob.status != cp.OPTIMAL:
                    break
                ends.append(float(prob.value))
            if len(ends) == 2 and ends[1] - ends[0] <= 1e-12 * max(1.0, abs(float(w[i]))):
                fixed.append(i)
        return np.array(fixed, dtype=int)

    def project(self, w, solver: str = "CLARABEL") -> np.ndarray:
        """The point of the domain D nearest to ``w`` (``w`` itself when it is in D):
        argmin |u - w|^2 subject to u in D, solved with CVXPY in the step v = u - w (no large
        constants when |w| is large). A start point outside D goes here before round 1 (as
        SciPy's minimize clips x0 to its bounds). ModelError when D is empty or the solver
        fails."""
        w = np.asarray(w, dtype=float)
        if not self._domain or self.domain_violation(w) <= 0.0:
            return w
        box = self.box()
        if box is not None:
            # a box: the nearest point is w clipped to it, no solve
            return np.clip(w, box[0], box[1])
        v = cp.Variable(self.dim)
        _, dom = self.instantiate(w + v)
        prob = cp.Problem(cp.Minimize(cp.sum_squares(v)), dom)
        statuses = []
        for options in ({"tol_gap_abs": 1e-12, "tol_gap_rel": 1e-12, "tol_feas": 1e-12}
                        if solver.upper() == "CLARABEL" else {}, {}):
            try:
                # warm_start=False: on a second solve of the same problem CVXPY's warm start
                # hands Clarabel the data through update(), which keeps the first attempt's
                # settings, so the fallback to the defaults would be the tight attempt again
                prob.solve(solver=solver, warm_start=False, **options)
            except cp.error.SolverError as exc:
                statuses.append(f"solver error ({exc})")
                continue
            statuses.append(str(prob.status))
            if prob.status in ("optimal", "optimal_inaccurate") and v.value is not None:
                return w + np.asarray(v.value, dtype=float).ravel()
            if prob.status in ("infeasible", "infeasible_inaccurate"):
                break
        raise ModelError(f"the start point is outside the domain and its projection onto "
                         f"the domain failed ({solver}: {', '.join(statuses)})"
                         + ("; the domain's constraints have no common point"
                            if statuses and statuses[-1].startswith("infeasible") else ""))

    def linearized_step(self, w, g0, G, cons, solver: str = "CLARABEL", equality=None,
                        step: float = 1.0):
        """The KKT step of Problem 3 linearised at ``w``, with its multipliers: (u, mu, domain
        duals, elastic) of :func:`ssca_solver.model.linearized.linearized_step`."""
        return linearized.linearized_step(self, w, g0, G, cons, solver, equality, step)

    def box_terms(self) -> Optional[tuple]:
        """(box, lambda) when the domain is a box (:meth:`box`) and the terms add up to
        lambda |w|^2 or are absent (lambda = 0): the deterministic part of a quadratic program
        over a box; None otherwise."""
        box = self.box()
        lam = self.ridge_coefficient() if box is not None else None
        return None if lam is None else (box, lam)

    def _linearized_problem(self, recentred: bool, eq: np.ndarray, data: tuple,
                            cached: bool):
        """The CVXPY problem of :meth:`linearized_step` for the scaled data ``(w, g0, G,
        cons, t, sigma, P)``: (problem, u, linearised constraints, domain constraints, e).

        ``cached``: the problem of this structure (form, number of constraints, which are
        equalities) compiled at its first use with the data as parameters (CVXPY's DPP: a
        later solve only refills the numbers), while d (M + 1) <= ``LINEARIZED_CACHE_SIZE``
        (a parameter matrix G of d M numbers); None when that does not apply or the domain
        is not DPP with the point as a parameter. A compile with constants at every test
        would be most of a small problem's run; the parametrised problem is compiled once
        and each later test only refills its numbers. Not cached: the same problem with the
        data as constants."""
        w, g0, G, cons, t, sigma, P = data
        M = cons.size
        values = {"w": w, "g0": g0, "half_inv_t": 0.5 / t, "inv_sigma": 1.0 / sigma}
        if M:
            values.update(G=G, c=cons if recentred else cons - G.T @ w, P=P)
        if not cached:
            return linearized.form(self, recentred, eq, M, values)[:5]
        if self.dim * (M + 1) > LINEARIZED_CACHE_SIZE:
            return None
        key = (recentred, M, tuple(np.flatnonzero(eq)))
        self._linearized_uses[key] = self._linearized_uses.get(key, 0) + 1
        if key not in self._linearized:
            params = {"w": cp.Parameter(self.dim), "g0": cp.Parameter(self.dim),
                      "half_inv_t": cp.Parameter(nonneg=True),
                      "inv_sigma": cp.Parameter(nonneg=True)}
            if M:
                params.update(G=cp.Parameter((self.dim, M)), c=cp.Parameter(M),
                              P=cp.Parameter(nonneg=True))
            built = linearized.form(self, recentred, eq, M, params)
            self._linearized[key] = built if built[0].is_dpp() else False
        entry = self._linearized[key]
        if not entry:
            return None
        for name, value in values.items():
            entry[5][name].value = value
        return entry[:5]

    def prox_residual(self, w, g, solver: str = "CLARABEL") -> float:
        """|w - prox_{R + I_D}(w - g)|, the prox-gradient stationarity residual.

        R is the sum of the terms and I_D the indicator of the domain; the residual is zero
        exactly when -g lies in the subdifferential of R + I_D at w (a KKT point when g is the
        gradient of the stochastic part of the Lagrangian).
        """
        if self._prox is None:
            u = cp.Variable(self.dim)
            z = cp.Parameter(self.dim)
            expr, cons = self.instantiate(u)
            obj = 0.5 * cp.sum_squares(u - z) + (expr if expr is not None else 0)
            self._prox = (cp.Problem(cp.Minimize(obj), cons), u, z)
        prob, u, z = self._prox
        z.value = np.asarray(w, dtype=float) - np.asarray(g, dtype=float)
        prob.solve(solver=solver)
        if u.value is None:
            raise ModelError(f"the prox problem of the deterministic terms failed: {prob.status}")
        return float(np.linalg.norm(np.asarray(w) - u.value))
