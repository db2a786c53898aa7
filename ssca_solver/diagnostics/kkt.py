"""KKT diagnostics of Problem 3 (Theorem 2's KKT point) at a point, from a full-data
evaluation (:mod:`.evaluation`): multipliers, the relative residuals of the stopping test
that decides ``success``, and the violation's stationarity behind "infeasible".
"""

from __future__ import annotations

from typing import Optional

import cvxpy as cp
import numpy as np
from scipy.linalg import LinAlgError, cho_solve, cholesky, solve_triangular
from scipy.optimize import lsq_linear, nnls

from .._blas import one_blas_thread
from .evaluation import Evaluation, ProblemTerms, split_values
from .certificate import KKTReport


#: the floor of the stationarity scale: this fraction of |grad (F_0 + R)| at the start point
START_FLOOR = 1e-2
#: the objective's typical size in the floor's value term: max(|f(w)|, VALUE_FLOOR |f(x0) -
#: f(w)|) (Dennis and Schnabel's typf, from the decrease achieved)
VALUE_FLOOR = 1e-1


def stationarity_floor(grad_scale: float, curvature: Optional[float], w,
                       local: Optional[float] = None, value: Optional[float] = None) -> float:
    """The floor of the stationarity scale (see ``kkt_report``): the smallest of

    * START_FLOOR |grad (F_0 + R)(x0)| (``grad_scale``);
    * L max(1, |w|) for the secant curvatures L of F_0 + R that are known: ``curvature``
      (from the start to the first tested point) and ``local`` (between the last two tested
      points): |g| <= kkt_tol L max(1, |w|) says the Newton step |g| / L is below kkt_tol
      max(1, |w|);
    * ``value``: a size of F_0 + R itself over max(1, |w|) (:class:`StationarityFloor` gives
      max(|f(w)|, VALUE_FLOOR |f(x0) - f(w)|)), Dennis & Schnabel's relative gradient
      (Numerical Methods for Unconstrained Optimization, 1983, sec. 7.2): a relative change
      of w changes f by a small fraction of f.

    Each candidate alone can let a wrong point pass (a far start makes 1 % of the start
    gradient large against the gradient near the optimum; across a narrow curved valley the
    secant curvatures are large where the gradient along the valley is not small), so the
    floor is their minimum: it can only make the test stricter.

    When the start point is a stationary point of F_0 + R (``grad_scale`` 0: the objective is
    flat there, e.g. a zero-residual least-squares objective that starts at zero and only the
    constraints move the iterates), the start floor is 0, the start secant runs between two
    vanishing gradients and the objective's size is its rounding at a zero-residual solution:
    those candidates measure nothing (a KKT point whose |g| is the rounding of F_0 would be
    refused at a relative stationarity of order 1). The floor is then the local secant
    candidate alone, and 0 until it is known."""
    size = max(1.0, float(np.linalg.norm(w)))
    if not float(grad_scale) > 0.0:
        if local is not None and np.isfinite(local):
            return float(local) * size
        return 0.0
    floor = START_FLOOR * float(grad_scale)
    for L in (curvature, local):
        if L is not None and np.isfinite(L):
            floor = min(floor, float(L) * size)
    if value is not None and np.isfinite(value):
        floor = min(floor, float(value) / size)
    return floor


class StationarityFloor:
    """What the stationarity floor (:func:`stationarity_floor`) is computed from, gathered
    as the run goes (no extra evaluation: every quantity is read from the full-data
    evaluations the KKT test makes anyway): |grad (F_0 + R)| and F_0 + R at the start point
    (:meth:`start`), the secant curvature from there to the first tested point, and the
    secant curvature between the last two tested points (:meth:`at`). Kept in checkpoints
    (:meth:`meta`, :meth:`from_meta`)."""

    KEYS = ("grad_scale", "curvature", "local_curvature", "value_start")

    def __init__(self, grad_scale: float = 0.0, curvature: Optional[float] = None,
                 local_curvature: Optional[float] = None,
                 value_start: Optional[float] = None):
        self.grad_scale = float(grad_scale)
        self.curvature = curvature
        self.local_curvature = local_curvature
        self.value_start = value_start
        self._start = None            # (w, g) at x0: the start secant's end
        self._last = None             # (w, g) at the last tested point

    @classmethod
    def from_meta(cls, meta: dict) -> "StationarityFloor":
        return cls(float(meta.get("grad_scale", 0.0)), meta.get("curvature"),
                   meta.get("local_curvature"), meta.get("value_start"))

    def meta(self) -> dict:
        return {k: getattr(self, k) for k in self.KEYS}

    def start(self, w, g, value: float) -> None:
        """At the start point: its objective gradient ``g`` and value F_0 + R."""
        self.grad_scale = float(np.linalg.norm(g))
        self._start = (np.array(w, dtype=float), np.array(g, dtype=float))
        self.value_start = float(value) if np.isfinite(value) else None

    @staticmethod
    def _secant(a, b) -> Optional[float]:
        d = b[0] - a[0]
        dd = float(d @ d)
        if not dd > (1e-12 * max(1.0, float(np.linalg.norm(b[0])))) ** 2:
            return None               # the same point, to rounding: no secant
        L = abs(float((b[1] - a[1]) @ d)) / dd
        return L if np.isfinite(L) else None

    def at(self, w, g, value: float) -> float:
        """The floor at a tested point ``w`` with objective gradient ``g`` and value F_0 + R;
        updates the secants."""
        here = (np.array(w, dtype=float), np.array(g, dtype=float))
        if self.curvature is None and self._start is not None:
            self.curvature = self._secant(self._start, here)
        if self._last is not None:
            L = self._secant(self._last, here)
            if L is not None:
                self.local_curvature = L
        self._last = here
        size = None
        if np.isfinite(value):
            size = abs(float(value))
            if self.value_start is not None:
                size = max(size, VALUE_FLOOR * abs(self.value_start - float(value)))
        return stationarity_floor(self.grad_scale, self.curvature, w, self.local_curvature,
                                  size)


#: eps of the multiplier fit's regularisation rows eps |grad F_m| mu_m (see kkt_report)
MULTIPLIER_REGULARIZATION = 1e-4


def _parts(w: np.ndarray, ev: Evaluation, terms: ProblemTerms) -> tuple:
    """(F_0's stochastic value or 0, F_m - U_m, grad F_0 (zeros without a stochastic
    objective), the constraints' gradients as columns (d, M)) from a full-data evaluation."""
    k = terms.first_constraint
    f0, cons = split_values(ev.values, terms)
    g0 = ev.grads[0] if k else np.zeros(w.size)
    G = ev.grads[k:].T if cons.size else np.zeros((w.size, 0))
    return f0, cons, g0, G


def feasibility_exceeds(ev: Evaluation, terms: ProblemTerms, feas_tol: float) -> bool:
    """Whether some constraint's relative violation at the evaluated point, the
    ``feasibility_rel`` of :func:`kkt_report` (max(F_m - U_m, 0) / max(1, |U_m|), |F_m - U_m|
    for an equality: Problem 3's constraints), exceeds ``feas_tol``: the KKT test cannot pass
    there whatever the multipliers, and its fit need not be computed. False where a value is
    not finite (the full report says what it is)."""
    _, cons = split_values(ev.values, terms)
    if not cons.size:
        return False
    violation, bound_scale = _violation(cons, terms)
    relative = violation / bound_scale
    return bool(np.all(np.isfinite(relative)) and np.max(relative) > feas_tol)


#: :func:`stationarity_exceeds` says "cannot pass" only when its lower bound exceeds the
#: tolerance by this factor (room for the rounding of its small least-squares fit)
SCREEN_MARGIN = 10.0


def stationarity_exceeds(w: np.ndarray, ev: Evaluation, terms: ProblemTerms, kkt_tol: float,
                         floor: float) -> bool:
    """Whether no multipliers can make :func:`kkt_report`'s relative stationarity and every
    complementarity (the KKT conditions of Problem 3) at ``w`` pass ``kkt_tol`` (``floor``:
    the stationarity floor :func:`kkt_report` would be given): its multiplier fit need not be
    computed. Decided only
    where the report's stationarity is |g + G mu| / scale (no domain, a smooth deterministic
    part; g = grad (F_0 + R), G the constraints' gradients as columns) and with fewer
    near-active constraints than coordinates; False elsewhere and where a value or gradient
    is not finite.

    The bound. Let A be the equalities and the inequalities within ``kkt_tol`` of their
    bound (|F_m - U_m| / max(1, |U_m|) <= kkt_tol); any other inequality passes its
    complementarity test only with mu_m |grad F_m| <= kkt_tol scale. Let r = g + G_A mu_A
    with mu_A minimising |g + G_A mu_A| (mu_m >= 0 on A's inequalities, a nonnegative least
    squares problem in |A| unknowns) and v = r / |r|: G_m'v >= 0 on A's inequalities and
    G_m'v = 0 on its equalities (the fit's optimality conditions), so for every mu that
    passes complementarity,

        |g + G mu| >= v'(g + G mu) >= v'g - kkt_tol scale sum_{m not in A} max(0, -cos_m),

    cos_m the cosine of grad F_m and v. The fit is skipped when that bound, over scale,
    exceeds SCREEN_MARGIN kkt_tol (and where the fit's conditions hold on A to rounding)."""
    det = terms.deterministic
    if det.has_domain or not det.smooth:
        return False
    _, cons, g0, G = _parts(w, ev, terms)
    M = cons.size
    if not M:
        return False
    eq = _equalities(terms, M)
    g = g0 + det.grad(w)
    col = np.linalg.norm(G, axis=0)
    if not (np.all(np.isfinite(g)) and np.all(np.isfinite(col)) and np.all(np.isfinite(cons))):
        return False
    scale = max(float(np.linalg.norm(det.free(g))), floor, 1e-300)
    near = np.abs(cons) / np.maximum(1.0, np.abs(terms.bounds))
    A = eq | (near <= kkt_tol)
    if int(np.count_nonzero(A)) >= w.size:
        return False             # the near-active gradients may span R^d: no bound
    r = g
    if A.any():
        ineq, equal = np.flatnonzero(A & ~eq), np.flatnonzero(eq)
        cols = np.hstack([G[:, ineq], G[:, equal], -G[:, equal]])
        try:
            x = nnls(cols, -g, maxiter=NNLS_ITERATIONS * max(1, cols.shape[1]))[0]
        except RuntimeError:
            return False
        r = g + cols @ x
    size = float(np.linalg.norm(r))
    if not size > 0.0:
        return False
    v = r / size
    cos = (G.T @ v) / np.where(col > 0.0, col, 1.0)
    # the fit's conditions on A, to rounding: otherwise an unbounded multiplier there could
    # lower the bound
    rounding = 1e-10
    if np.any(cos[A & ~eq] < -rounding) or np.any(np.abs(cos[eq]) > rounding):
        return False
    lower = float(v @ g) - kkt_tol * scale * float(np.sum(np.maximum(0.0, -cos[~A])))
    return bool(lower > SCREEN_MARGIN * kkt_tol * scale)


def _equalities(terms: ProblemTerms, M: int) -> np.ndarray:
    """M booleans: which constraints are equalities."""
    return (np.zeros(M, dtype=bool) if terms.equality is None
            else np.asarray(terms.equality, dtype=bool).reshape(M))


def _violation(cons: np.ndarray, terms: ProblemTerms) -> tuple:
    """(max(F_m - U_m, 0), |F_m - U_m| for an equality; max(1, |U_m|)): each constraint's
    violation and the scale of its relative one."""
    return np.maximum(terms.excess(cons), 0.0), np.maximum(1.0, np.abs(terms.bounds))


def kkt_report(w: np.ndarray, ev: Evaluation, terms: ProblemTerms, solver: str = "CLARABEL",
               grad_scale: float = 0.0, metric: Optional[np.ndarray] = None,
               curvature: Optional[float] = None,
               floor: Optional[float] = None,
               feas_tol: Optional[float] = None,
               hessian: Optional[np.ndarray] = None,
               model_hessian=None) -> KKTReport:
    """KKT residuals and multipliers of Problem 3 at ``w``, from full-data values and gradients.

    Multipliers come from the KKT conditions at ``w`` (never from a penalty c):

    * no domain, smooth (quadratic) deterministic terms: mu solves the nonnegative
      least-squares fit  min_{mu >= 0} |g + G mu|^2 + sum_m (mu_m g_m)^2
      + eps^2 sum_m (mu_m |grad F_m|)^2  of stationarity and complementarity together
      (g = grad F_0 + grad R, g_m = F_m(w) - U_m, eps = ``MULTIPLIER_REGULARIZATION``, 1e-4:
      the smallest forces that balance g, so that nearly dependent constraints cannot absorb
      an unbalanced gradient with huge cancelling multipliers), and stationarity is
      |g + G mu|;
    * otherwise (a domain or a nonsmooth term): the linearised KKT step
      (:meth:`DeterministicPart.linearized_step`) gives mu, the domain's multipliers, and the
      residual |u - w|; ``feas_tol`` (the run's, relative): the violation within it is not
      asked of the step (the constraint is linearised as active at w), only its excess.

    Relative residuals (what :meth:`KKTReport.passed` tests): stationarity over
    ``scale = max(|g|, min(START_FLOOR grad_scale, L max(1, |w|)))``, the size of the
    objective's side of the balance g + sum_m mu_m grad F_m = 0 (with a nonsmooth
    deterministic term, |g| is at least the size of its subgradient), with a floor that stands in
    when |g| vanishes, at an unconstrained minimum: 1 % of |g| at the starting point
    (``grad_scale``), but never more than ``curvature`` L (the secant curvature of F_0 + R
    from the start, measured by the session) times max(1, |w|), so that a far start cannot
    make the test loose: |g| <= kkt_tol L max(1, |w|) says the Newton step |g| / L is below
    kkt_tol max(1, |w|) (from w = 5e7 the start floor alone certified a point 5.3 from the
    minimum of a quadratic); so the test does not depend on the
    units of the objective or the constraints, and multipliers cannot inflate it (fitted to
    nearly dependent constraints, e.g. the two halves of an equality, they can be huge and
    cancel each other). ``report.stationarity / report.scale`` recomputes it. With a diagonal ``metric`` (the default options' D_m, rows
    scaled to max 1) the relative stationarity is the larger of that ratio and the same ratio
    with every vector divided elementwise by sqrt(max_m D_m), which makes it invariant to the
    units of each coordinate; feasibility
    max(F_m - U_m, 0) / max(1, |U_m|) (|F_m - U_m| / max(1, |U_m|) for an equality, whose
    multiplier has either sign); complementarity min(mu_m |grad F_m| / scale,
    |F_m - U_m| / max(1, |U_m|)) (0 for an equality). With a domain the relative stationarity
    is also at least the step's root-mean-square relative change of the coordinates
    (:func:`coordinate_step`); without one and with ``hessian`` (the Lagrangian's Hessian of
    the Newton model), at least Newton's step to the KKT point over max(1, |w|)
    (:func:`newton_step`). ``model_hessian`` (a function of no arguments that forms the
    quasi-Newton model's matrix, called only where it is read) serves as ``hessian`` at a
    minimum of the objective alone where the floor sets the scale (:func:`_floor_model`),
    without a domain or with a box (the coordinates at its bounds held:
    :func:`_box_newton_step`): there the test's curvature is the secant's from the start, and
    in a flat valley the gradient falls below the floor far from the minimum (a run on S2MPJ's
    SINROSNB that crawled along the valley: |g| = 0.002 under a floor of 48.5, 0.42 from the
    minimiser along a curvature of 1.8e-3). Elsewhere a quasi-Newton matrix is not trusted
    that far: at points whose independent KKT residual was 1e-9 its flattest directions made
    Newton's step exceed the tolerance (S2MPJ's LUKVLE13, where the gradient set the
    scale).
    """
    det = terms.deterministic
    _, cons, g0, G = _parts(w, ev, terms)
    M = cons.size
    eq = _equalities(terms, M)
    domain_duals: tuple = ()
    g = g0 + (det.grad(w) if det.smooth else 0.0)
    col = np.linalg.norm(G, axis=0) if M else np.zeros(0)
    if M and not (np.isfinite(np.linalg.norm(g)) and np.all(np.isfinite(col))):
        # finite gradients whose squares overflow (a trial point far out, where an exp
        # reached 1e235): no fit can be computed there, and the point is no KKT point
        return KKTReport.failed_at("the gradients' squares overflow (entries up to "
                                   f"{float(np.max(np.abs(G), initial=0.0)):.2g}): no "
                                   "multipliers can be fitted", M, cons, terms.bounds,
                                   det.domain_violation(w))
    # the scale is the objective's side of the balance only, never the multipliers': fitted
    # to two nearly opposite halves of an equality, huge multipliers that cancel each other
    # make max_m mu_m |grad F_m| huge and would let points pass that are far from
    # stationary; at a KKT point |sum_m mu_m grad F_m| = |g| anyway. The floor stands in
    # when |g| vanishes (an unconstrained minimum): see stationarity_floor
    if floor is None:
        floor = stationarity_floor(grad_scale, curvature, w)
    # the objective's side of the balance, without the coordinates the domain's simple bounds
    # fix (their components are no force to balance: see DeterministicPart.free)
    g_free = float(np.linalg.norm(det.free(g)))
    if not det.smooth:
        # a nonsmooth term (an l1 norm) is a force on the objective's side as well: the size
        # of its subgradient (CVXPY's, at a kink the one it gives) counts. Without it an
        # objective that is only such a term (min |w|_1 s.t. a stochastic constraint: F_0 = 0)
        # had a scale of 0, and the linearised step that measures stationarity was taken at a
        # length of 1e300 (its problem then failed)
        sub = det.grad(w)
        if np.all(np.isfinite(sub)):
            g_free = max(g_free, float(np.linalg.norm(det.free(sub))))
    scale = max(g_free, floor, 1e-300)
    modelled = _floor_model(model_hessian, floor > g_free, cons, eq, terms.bounds)
    if not det.has_domain and det.smooth:
        if M:
            # the rows eps |grad F_m| mu_m make the fit well posed: among multipliers that
            # balance g equally well it takes the smallest forces, and nearly dependent
            # constraints (gradients within eps of parallel, e.g. the two halves of an
            # equality) cannot absorb an unbalanced gradient with huge multipliers that cancel
            # each other; a genuine multiplier shrinks by a factor 1 / (1 + eps^2)
            mu = _best_fit(g, G, cons, eq, scale, np.maximum(1.0, np.abs(terms.bounds)))
        else:
            mu = np.zeros(0)
        res = g + G @ mu
        stat = float(np.linalg.norm(res))
        kind, source = "gradient", "nnls"
        H = hessian if hessian is not None and np.size(hessian) else modelled
        # the quasi-Newton model's step holds no constraint (see above _box_newton_step); the Newton
        # model's every one with a multiplier
        held = np.zeros(M, dtype=bool) if H is modelled else None
        newton = newton_step(res, g, G, mu, eq, H, w, held=held) if H is not None else 0.0
    else:
        # the step length t at which the objective's gradient alone would move w by
        # max(1, |w|): (u - w) / t is then in gradient units, and stat / scale =
        # |u - w| / max(1, |w|). With t = 1 the step's length in the units of w would be
        # divided by a gradient scale, and a point far from the bound a large gradient pushes
        # it to would pass
        t = max(1.0, float(np.linalg.norm(w))) / scale
        # the step measures stationarity, not the violation the feasibility test judges: a
        # constraint violated at w within ``feas_tol`` (relative, as that test reads it) is
        # linearised as active there, G_m.(u - w) <= 0 (= 0 for an equality), as the plain
        # fit above treats it. Asked to remove such a violation too, the step can move far
        # along a direction the violated constraint's gradient barely sees, and a KKT point
        # would be refused on stationarity. Beyond feas_tol the test fails anyway and the step
        # still removes the excess, whose force is the multiplier estimate that tells the
        # penalty continuation c is too small. feas_tol None: no allowance.
        lin = cons
        if feas_tol is not None and M:
            allowance = float(feas_tol) * np.maximum(1.0, np.abs(terms.bounds))
            lin = np.where(eq, np.sign(cons) * np.maximum(np.abs(cons) - allowance, 0.0),
                           np.where(cons > 0.0, np.maximum(cons - allowance, 0.0), cons))
        fixed = det.bound_fixed(w)
        if fixed.size:
            # the domain fixes some coordinates by simple bounds: the multipliers (and the
            # domain's duals) come from the step with every gradient as it is, at the length
            # the whole gradient sets (a large component along a fixed variable, balanced by
            # the domain, would leave the free part of the step below the solver's tolerance
            # at the length the free part sets); the residual from the same step with those
            # components removed, at the free part's length
            t_all = max(1.0, float(np.linalg.norm(w))) / max(float(np.linalg.norm(g)),
                                                             floor, 1e-300)
            _, mu, duals, _ = det.linearized_step(w, g0, G, lin, solver=solver, equality=eq,
                                                  step=t_all)
            Gf = G.copy()
            Gf[fixed, :] = 0.0
            u, _, _, _ = det.linearized_step(w, det.free(g0), Gf, lin, solver=solver,
                                             equality=eq, step=t)
        else:
            u, mu, duals, _ = det.linearized_step(w, g0, G, lin, solver=solver, equality=eq,
                                                  step=t)
        res = (u - w) / t
        stat = float(np.linalg.norm(res))
        domain_duals = tuple(duals)
        kind, source = "linearized step", "linearized"
        newton = (_box_newton_step(w, u, res, g, G, mu, eq, det, modelled,
                                   held=np.zeros(M, dtype=bool))
                  if modelled is not None else 0.0)
    relative = stat / scale
    if kind == "linearized step" and w.size:
        relative = max(relative, coordinate_step(u - w, w))
    relative = max(relative, newton)
    if metric is not None and np.size(metric):
        # the same ratio in the diagonal metric's units (each coordinate divided by the square
        # root of its curvature estimate): without it the large coordinates set both the
        # residual and the scale, and one large column would let a point far from the
        # optimum in the other coordinates pass
        inv = 1.0 / np.sqrt(np.max(np.atleast_2d(metric), axis=0))
        relative = max(relative, float(np.linalg.norm(res * inv))
                       / max(float(np.linalg.norm(det.free(g) * inv)), floor * float(np.min(inv)),
                             1e-300))
    violation, bound_scale = _violation(cons, terms)
    # an equality has no complementarity condition (its multiplier has either sign)
    comp = np.where(eq, 0.0, np.abs(mu * cons))
    comp_rel = np.where(eq, 0.0, np.minimum(np.abs(mu) * col / scale,
                                            np.abs(cons) / bound_scale))
    return KKTReport(multipliers=mu, multiplier_source=source, stationarity=stat,
                     stationarity_kind=kind, feasibility=violation,
                     complementarity=comp,
                     domain_violation=det.domain_violation(w),
                     domain_multipliers=domain_duals, scale=scale,
                     stationarity_rel=relative,
                     feasibility_rel=violation / bound_scale,
                     complementarity_rel=comp_rel)


#: units of rounding in the Lagrangian's gradient that :func:`newton_step` allows for, relative
#: to |g| + sum_m |mu_m grad F_m|: each gradient is a sum over the rows, whose rounding grows
#: with their number and with terms that cancel; 16 units left kkt_tol=1e-8 unreachable at
#: condition numbers 1e5 and 1e6 of the features (2,000 rows) at points 1e-11 from x*
NEWTON_ROUNDING = 1024


def newton_step(res: np.ndarray, g: np.ndarray, G: np.ndarray, mu: np.ndarray,
                eq: np.ndarray, hessian: np.ndarray, w: np.ndarray,
                held: Optional[np.ndarray] = None) -> float:
    """The length of Newton's step to the KKT point of Problem 3 (Theorem 2's conditions),
    relative to max(1, |w|): with the
    Lagrangian's Hessian H (the Newton model's, eigenvalues by their absolute values, at
    least 1e-12 of the largest) and the constraints with a multiplier (or equalities) kept
    linearised,  dx = -Z (Z' H Z)^-1 Z' r,  Z a basis of their gradients' null space, r the
    Lagrangian's gradient g + G mu (g the objective's). Near a KKT point dx is the distance to it to second order, where
    |r| / |g| alone is not: with the objective's curvature spread over 1e8, r can be 1e-4 of
    g at a point 1e-3 from the optimum (the ill-conditioned family at condition 1e4). The
    length rounding in r can account for (NEWTON_ROUNDING units of it, times 1 / min(lam)) is
    taken off: at condition 1e6 it is most of the step, and no tolerance below it could pass.
    ``held``: the constraints kept linearised (none under the quasi-Newton model:
    see the comment above :func:`_box_newton_step`); by default the equalities and every constraint with a multiplier."""
    d = w.size
    if held is not None and mu.size:
        keep = np.asarray(held, dtype=bool)
    else:
        keep = eq | (np.abs(mu) > 0.0) if mu.size else np.zeros(0, dtype=bool)
    A = G[:, keep] if mu.size else np.zeros((d, 0))
    if A.shape[1]:
        U, sv, _ = np.linalg.svd(A, full_matrices=True)
        rank = int(np.sum(sv > 1e-12 * max(float(sv[0]), 1e-300)))
        Z = U[:, rank:]
    else:
        Z = np.eye(d)
    if not Z.shape[1]:
        return 0.0
    H = 0.5 * (hessian + hessian.T)
    lam, V = np.linalg.eigh(Z.T @ H @ Z)
    lam = np.abs(lam)
    top = float(np.max(lam)) if lam.size else 0.0
    if not top > 0.0:
        return 0.0
    lam = np.maximum(lam, 1e-12 * top)
    step = Z @ (V @ ((V.T @ (Z.T @ res)) / lam))
    # the part of the step that rounding in r alone could make: r is a difference of terms of
    # size |g| + sum_m |mu_m grad F_m|, each known to a few units of rounding, and the step
    # multiplies r by up to 1 / min(lam) (1e12 at condition number 1e6 of the features)
    terms = float(np.linalg.norm(g)) + float(np.sum(np.abs(mu) * np.linalg.norm(G, axis=0)))
    noise = NEWTON_ROUNDING * np.finfo(float).eps * terms / float(np.min(lam))
    return max(float(np.linalg.norm(step)) - noise, 0.0) / max(1.0, float(np.linalg.norm(w)))


#: with the quasi-Newton model, Newton's step is measured only where no constraint is within
#: this share of max(1, |U_m|) of its bound (:func:`_floor_model`)
MODEL_INACTIVE = 1e-3


def _floor_model(model_hessian, floor_set: bool, cons, eq, bounds):
    """``model_hessian()`` (a quasi-Newton matrix) where the floor, not the gradient, sets the
    test's scale and no constraint is an equality or within MODEL_INACTIVE of its bound: a
    minimum of the objective alone, where the floor stands in for |g| with the secant's
    curvature from the start; else None. With active constraints the floor also sets the
    scale where the objective's gradient vanishes at the solution (S2MPJ's LUKVLI15), and
    there the model's flattest directions made Newton's step exceed the tolerance at points
    whose independent KKT residual was 1e-8."""
    if model_hessian is None or not floor_set:
        return None
    if np.any(eq) or np.any(cons > -MODEL_INACTIVE * np.maximum(1.0, np.abs(bounds))):
        return None
    H = model_hessian()
    return H if H is not None and np.size(H) else None


# Why the quasi-Newton model's Newton step (asked only where :func:`_floor_model` gives the
# model: no equality, every constraint more than MODEL_INACTIVE from its bound) holds no
# constraint, though the multiplier fit may leave small multipliers on some (forces within the
# complementarity tolerance): held, each takes a direction out of the step, and with as many
# of them as variables the step vanished at a point 2 % from the minimum of an
# ill-conditioned quadratic objective (S2MPJ's S268: four of five inequalities, each 0.55 or
# more above its bound of 0, with multipliers of 2e-4 to 5e-4; the step measured 1e-8, 0.022
# without them). The Newton model's step (the clients' Hessians) still holds every
# constraint with a multiplier: holding only those within MODEL_INACTIVE of their bound
# refused correct points on S2MPJ's LUKVLI family there, where such a constraint bounds a
# flat direction of the Lagrangian (LUKVLI16 certified in 29 rounds, then not in 800);
# telling the two apart needs the step's own inequalities.


def _box_newton_step(w, u, res, g, G, mu, eq, det, hessian,
                     held: Optional[np.ndarray] = None) -> float:
    """:func:`newton_step` where the domain is a box (:meth:`DeterministicPart.box`), from the
    linearised step's residual ``res`` = (u - w) / t: the coordinates at a bound after the
    step (within BOUND_ACTIVE of it, relative) are held like active constraints; 0 for a
    domain of another form, where which of its constraints bind is not known here."""
    box = det.box()
    if box is None:
        return 0.0
    lo, hi = box[0], box[1]
    tol = BOUND_ACTIVE * np.maximum(1.0, np.abs(u))
    at = np.flatnonzero((np.isfinite(lo) & (u - lo <= tol)) | (np.isfinite(hi) & (hi - u <= tol)))
    E = np.zeros((w.size, at.size))
    E[at, np.arange(at.size)] = 1.0
    # held as equalities (their multipliers 0: no force of theirs enters the rounding)
    bound_eq = np.ones(at.size, dtype=bool)
    return newton_step(res, g, np.hstack([G, E]), np.concatenate([mu, np.zeros(at.size)]),
                       np.concatenate([eq, bound_eq]), hessian, w,
                       held=None if held is None else np.concatenate([held, bound_eq]))


#: a coordinate within this share of max(1, |u_j|) of a bound after the linearised KKT step
#: is held at it by the Newton step of :func:`_box_newton_step`
BOUND_ACTIVE = 1e-9


def coordinate_step(v: np.ndarray, w: np.ndarray) -> float:
    """The linearised KKT step ``v`` of Problem 3 at ``w`` as a relative change of each
    coordinate, the largest: max_j |v_j| / max(1, |w_j|).

    The step's length over max(1, |w|) (the stationarity test's own ratio) is a relative
    change of w as a whole, which the largest coordinates set: with coordinates of 1e4 and
    of 10 beside each other, the step can change the smaller ones by several times the
    tolerance while moving w by less than it (a point 1.3e-3 from the optimum's objective
    passed that way). A root mean square over the coordinates still let one coordinate
    move by more than the tolerance (S2MPJ's HS114: x_5 = 1999.79 below its bound 2000,
    1.1e-4 from the optimum's objective); the largest change does not, and it is never
    below the ratio of the whole step when every coordinate has the same size. The larger
    of the two is a test invariant to rescaling single coordinates (of size 1 and more)."""
    s = np.maximum(1.0, np.abs(np.asarray(w, dtype=float)))
    return float(np.max(np.abs(np.asarray(v, dtype=float) / s), initial=0.0))


def objective_gap(w: np.ndarray, ev: Evaluation, terms: ProblemTerms, mu: np.ndarray,
                  solver: str = "CLARABEL") -> tuple[float, str]:
    """An upper bound on (F_0 + R)(w) - p* on a convex Problem 3 (``terms.convex``), by weak
    duality: (the bound, how it was obtained), or (NaN, why there is none).

    With F_0 and every inequality's F_m convex and every equality's affine, each is above its
    linearisation at w, so for multipliers mu (>= 0 on the inequalities) and every feasible x
    in the domain D

        F_0(x) + R(x) >= F_0(x) + R(x) + sum_m mu_m (F_m(x) - U_m)
                      >= F_0(w) + R(x) + sum_m mu_m (F_m(w) - U_m) + q.(x - w),
        q = grad F_0(w) + sum_m mu_m grad F_m(w),

    and p* is at least the minimum of the right side over x in D (one convex problem of
    CVXPY, in the step v = x - w): the dual function of the Lagrangian's linearisation, the
    bound of eq. (prob:KKT)'s multipliers. The gap F_0(w) + R(w) - that minimum is then at
    least (F_0 + R)(w) - p*. It is finite when D is bounded or R strongly convex along q
    (else the minimum is -infinity and there is no bound); at a KKT point it tends to 0 with
    the residuals."""
    if not terms.convex:
        return float("nan"), "the problem is not declared convex"
    mu = np.asarray(mu, dtype=float)
    if not np.all(np.isfinite(mu)):
        return float("nan"), "no multipliers"
    det = terms.deterministic
    f0, cons, g0, G = _parts(w, ev, terms)
    q = g0 + G @ mu
    base = float(f0) + float(mu @ cons) if cons.size else float(f0)
    if det.empty:
        if np.any(q):
            return float("nan"), ("none: without a domain or a strongly convex deterministic "
                                  "term the linearised Lagrangian has no minimum")
        return float(f0) - base, "weak duality (the Lagrangian's gradient is zero)"
    v = cp.Variable(w.size)
    expr, dom = det.instantiate(w + v)
    objective = q @ v + (expr if expr is not None else 0.0)
    prob = cp.Problem(cp.Minimize(objective), dom)
    try:
        prob.solve(solver=solver, **({"tol_gap_abs": 1e-12, "tol_gap_rel": 1e-12,
                                      "tol_feas": 1e-12} if solver.upper() == "CLARABEL"
                                     else {}))
    except cp.error.SolverError as exc:
        return float("nan"), f"none: {solver} failed on the dual bound ({exc})"
    if prob.status in ("unbounded", "unbounded_inaccurate"):
        return float("nan"), ("none: the linearised Lagrangian is unbounded below on the "
                              "domain (a bounded domain or a strongly convex term gives one)")
    if prob.status not in ("optimal", "optimal_inaccurate") or prob.value is None:
        return float("nan"), f"none: {solver} ended {prob.status} on the dual bound"
    lower = base + float(prob.value)
    return float(f0) + det.value(w) - lower, "weak duality with these multipliers"


#: the near-active sets the multiplier fit also tries (:func:`_best_fit`): the inequalities
#: with |F_m - U_m| / max(1, |U_m|) at most each of these
ACTIVE_THRESHOLDS = (1e-10, 1e-8, 1e-6, 1e-4, 1e-2)
#: the largest force mu_m |grad F_m|, relative to the stationarity scale, of a plain
#: (unregularised) multiplier fit that :func:`_best_fit` accepts
FORCE_LIMIT = 1e3
#: and only when its largest relative residual is below PLAIN_GAIN times the regularised one's
PLAIN_GAIN = 0.1


def _best_fit(g, G, cons, eq, scale: float, bound_scale: np.ndarray) -> np.ndarray:
    """The multipliers of :func:`_fit_multipliers` over all constraints, or over a near-active
    set (the equalities and the inequalities within each of ``ACTIVE_THRESHOLDS`` of their
    bound), regularised or plain, whichever gives the smallest largest relative residual,
    max(|g + G mu| / scale, max_m min(mu_m |grad F_m| / scale, |F_m - U_m| / max(1, |U_m|))):
    the residuals :func:`kkt_report` then computes from the chosen mu, which is what it
    reports. A plain fit (no regularisation rows) counts only when its largest force
    mu_m |grad F_m| is at most FORCE_LIMIT times the scale and it does better than the
    regularised fits by the factor PLAIN_GAIN.

    The KKT conditions ask that *some* mu make every residual small. The fit over all
    constraints trades stationarity against complementarity through its regularisation rows:
    with many nearly active, nearly dependent linear constraints it gives slightly inactive
    ones small forces that fail complementarity, where the fit over the active ones balances
    g exactly. The regularisation itself leaves a residual of about eps^2 (force / scale)^2,
    which genuine large forces (a minimax problem whose active constraints' gradients nearly
    cancel) lift above the tolerance; the plain fit's forces are bounded instead, far below
    those with which two constraints a hair from parallel absorb an unbalanced gradient
    (tests/test_kkt.py)."""
    col = np.linalg.norm(G, axis=0)
    near = np.abs(cons) / bound_scale

    def worst(mu):
        stat = float(np.linalg.norm(g + G @ mu)) / scale
        comp = np.where(eq, 0.0, np.minimum(np.abs(mu) * col / scale, near))
        return max(stat, float(np.max(comp, initial=0.0)))

    # G'G and G'g once: every fit's normal equations are their rows and columns of them
    with one_blas_thread():
        GG, Gg = G.T @ G, G.T @ g
    gram = GramBlocks(GG)
    best = first = _fit_multipliers(g, G, cons, eq, gram=(gram, Gg))
    best_value = worst(best)
    tried, regularised_value = set(), None
    for eps in (MULTIPLIER_REGULARIZATION, 0.0):
        if eps == 0.0:
            regularised_value = best_value
        for theta in ACTIVE_THRESHOLDS + (np.inf,):
            keep = eq | (near <= theta)
            key = (eps, keep.tobytes())
            if key in tried or not keep.any() or (eps > 0 and keep.all()):
                continue
            tried.add(key)
            mu = np.zeros(cons.size)
            # the fit over all constraints guesses which multipliers are positive
            mu[keep] = _fit_multipliers(g, G[:, keep], cons[keep], eq[keep], eps,
                                        start=first[keep],
                                        gram=(gram.columns(np.flatnonzero(keep)),
                                              Gg[keep]))
            if eps == 0.0 and not (float(np.max(np.abs(mu) * col, initial=0.0))
                                   <= FORCE_LIMIT * scale):
                continue
            value = worst(mu)
            # a plain fit replaces the regularised ones only when it does much better (not by
            # the regularisation's own eps^2 on a fit that fails either way)
            if value < (best_value if eps > 0
                        else min(best_value, PLAIN_GAIN * regularised_value)):
                best, best_value = mu, value
    return best


#: iterations of SciPy's nnls per unknown (its default, 3, runs out on systems of many nearly
#: active constraints in few variables)
NNLS_ITERATIONS = 50


#: a guessed support is accepted when no column outside it has A_j'(b - A x) above this share
#: of |A_j| |b| (adding it could lower |A x - b|^2 by at most this squared times |b|^2)
SUPPORT_DUAL_TOL = 1e-10
#: and when the least-squares problem on it is well posed: the QR's diagonal spans at most
#: 1 / SUPPORT_RANK_TOL
SUPPORT_RANK_TOL = 1e-12
#: from this many columns on, the primal-dual active-set method runs before nnls (below,
#: nnls's few iterations cost less than the Gram matrix and the checks)
SUPPORT_MIN_COLUMNS = 32
#: supports the active-set method tries before nnls takes over (it stops early on a support
#: it has tried before: a cycle)
ACTIVE_SET_ITERATIONS = 12
#: the normal equations of a support are solved by Cholesky, with one refinement step from
#: the residual b - A x, while the factor's diagonal spans at most 1 / NORMAL_RANK_TOL
#: (cond(A_S) below about that) and the solution leaves |A_j'(b - A x)| within the dual
#: tolerance on the support too; by QR otherwise
NORMAL_RANK_TOL = 1e-4


class GramBlocks:
    """H = G'G + diag(extra) over some columns of a G'G formed once (a KKT report's fits
    share it, :func:`_best_fit`), read by the blocks a solve needs (:meth:`diagonal`,
    :meth:`block`) rather than copied whole for every fit: with hundreds of constraints in
    few variables most supports are solved in the rows' space (:func:`_by_rows`) and never
    read H. The blocks hold the numbers of the whole matrix's entries."""

    def __init__(self, GG: np.ndarray, cols: Optional[np.ndarray] = None,
                 extra: Optional[np.ndarray] = None):
        self.GG = GG
        self.cols = np.arange(GG.shape[0]) if cols is None else np.asarray(cols)
        self.extra = extra

    def columns(self, idx) -> "GramBlocks":
        """G'G over the columns ``idx`` of these (no diagonal added)."""
        return GramBlocks(self.GG, self.cols[idx])

    def plus_diagonal(self, extra: np.ndarray) -> "GramBlocks":
        """These columns' G'G + diag(``extra``)."""
        return GramBlocks(self.GG, self.cols, np.asarray(extra, dtype=float))

    def diagonal(self) -> np.ndarray:
        d = self.GG.diagonal()[self.cols]
        return d if self.extra is None else d + self.extra

    def block(self, idx) -> np.ndarray:
        """H[idx, idx], a new array."""
        c = self.cols[idx]
        B = self.GG[np.ix_(c, c)]
        if self.extra is not None:
            B[np.diag_indices(c.size)] += self.extra[idx]
        return B

    def dense(self) -> np.ndarray:
        """H whole, a new array."""
        return self.block(np.arange(self.cols.size))


class DiagonalRows:
    """A least-squares matrix [G; diag(D)] (D None: G alone), the form of a KKT fit's
    (:func:`_fit_multipliers`: the gradients above the diagonal block of the complementarity
    and regularisation rows), whose right-hand side is [b; 0]. The diagonal block is kept as
    its diagonal: the products of the active-set method cost n k, not (n + k) k, and the
    least-squares problem on columns S keeps only their rows of it (the others are 0 on S)."""

    def __init__(self, G: np.ndarray, D: Optional[np.ndarray] = None):
        self.G, self.D = G, D
        self.shape = (G.shape[0] + (0 if D is None else D.size), G.shape[1])

    def columns(self, idx) -> "DiagonalRows":
        """The columns ``idx`` with their rows of the diagonal block."""
        return DiagonalRows(self.G[:, idx], None if self.D is None else self.D[idx])

    def residual(self, b: np.ndarray, x: np.ndarray) -> tuple:
        """[b; 0] - A x, as its two blocks."""
        return b - self.G @ x, (None if self.D is None else -self.D * x)

    def transposed(self, res: tuple) -> np.ndarray:
        """A' [res_G; res_D]."""
        out = self.G.T @ res[0]
        return out if self.D is None else out + self.D * res[1]

    def dense(self, b: np.ndarray) -> tuple:
        """(A, [b; 0]) as arrays."""
        if self.D is None:
            return self.G, b
        return np.vstack([self.G, np.diag(self.D)]), np.concatenate([b, np.zeros(self.D.size)])


def nonnegative_least_squares(A, b, support: Optional[np.ndarray] = None,
                              normal: Optional[tuple] = None) -> np.ndarray:
    """argmin |A x - b| over x >= 0 (the KKT fit's multipliers: :func:`_fit_multipliers`).

    With SUPPORT_MIN_COLUMNS columns or more: a primal-dual active-set method
    (Hintermueller, Ito and Kunisch, SIAM J. Optim. 13 (2002)) on the support -- the columns
    with x_j > 0 -- starting from ``support`` (boolean, one per column: a guess, e.g. the
    solution of a nearby fit) or else from the columns with A_j'b > 0. Each iteration solves
    the least-squares problem on the support and keeps its positive part plus the columns
    outside it whose A_j'(b - A x) is positive; it returns the least-squares solution on a
    support where the conditions that make it the answer hold: every x_j > 0 on the support,
    A_j'(b - A x) <= SUPPORT_DUAL_TOL |A_j| |b| off it. That changes many columns an
    iteration where SciPy's nnls (Lawson and Hanson's active-set method) adds one at a time:
    hundreds on a fit over hundreds of constraints. Where it does not settle within
    ACTIVE_SET_ITERATIONS (a cycle, a rank-deficient support), and below
    SUPPORT_MIN_COLUMNS columns, SciPy's nnls runs, with NNLS_ITERATIONS per unknown, and
    bounded-variable least squares where it still runs out. ``normal``: (A'A as a
    :class:`GramBlocks`, A'b) when the caller has them (the KKT fits share one G'G), else
    formed here. ``A`` is an array or a
    :class:`DiagonalRows` (``b`` then the right-hand side of its G rows)."""
    if not isinstance(A, DiagonalRows):
        A = DiagonalRows(np.asarray(A, dtype=float))
    b = np.asarray(b, dtype=float)
    if A.shape[1] >= SUPPORT_MIN_COLUMNS:
        x = _active_set(A, b, None if support is None else np.asarray(support, dtype=bool),
                        normal)
        if x is not None:
            return x
    A, b = A.dense(b)
    try:
        return nnls(A, b, maxiter=NNLS_ITERATIONS * max(1, A.shape[1]))[0]
    except RuntimeError:
        return lsq_linear(A, b, bounds=(0.0, np.inf), method="bvls", tol=1e-12).x


def _active_set(A, b, support: Optional[np.ndarray],
                normal: Optional[tuple] = None) -> Optional[np.ndarray]:
    """:func:`nonnegative_least_squares`'s active-set iterations: its answer, or None. With
    one BLAS thread (:func:`ssca_solver._blas.one_blas_thread`): its products go to NumPy's
    BLAS and its factorisations to SciPy's, whose thread pools otherwise fight over the
    cores between the calls (n = m = 300 on 2 cores: its Cholesky factorisations, of up to
    300 unknowns, took 3.4 ms each on average with both pools at 2 threads, 0.1 ms at 1)."""
    with one_blas_thread():
        return _active_set_iterations(A, b, support, normal)


def _active_set_iterations(A: DiagonalRows, b, support: Optional[np.ndarray],
                           normal: Optional[tuple] = None) -> Optional[np.ndarray]:
    if normal is None:
        H = GramBlocks(A.G.T @ A.G)
        normal = (H if A.D is None else H.plus_diagonal(A.D * A.D), A.G.T @ b)
    H, q = normal
    bound = SUPPORT_DUAL_TOL * np.sqrt(np.maximum(H.diagonal(), 0.0)) * float(np.linalg.norm(b))
    S = q > bound if support is None or support.size != A.shape[1] else support.copy()
    tried = set()
    for _ in range(ACTIVE_SET_ITERATIONS):
        key = S.tobytes()
        if key in tried:
            return None
        tried.add(key)
        idx = np.flatnonzero(S)
        x = np.zeros(A.shape[1])
        if idx.size:
            z = _least_squares_on(A, b, H, q, idx, bound[idx])
            if z is None:
                return None
            x[idx] = z
        dual = A.transposed(A.residual(b, x))
        positive = x > 0.0
        if np.all(positive[S]) and not np.any(dual[~S] > bound[~S]):
            return x
        S = (S & positive) | (~S & (dual > bound))
    return None


#: a support of k columns whose G has n rows is solved in the rows' space (:func:`_by_rows`:
#: n x n systems) when k >= ROW_SPACE_RATIO n: a fit over hundreds of constraints in few
#: variables then costs n^2 k, not k^3
ROW_SPACE_RATIO = 2
#: in :func:`_by_rows`, a column whose diagonal entry D_j is below STIFF_SHARE |G_j| (an
#: active constraint's complementarity row, F_m - U_m near 0) is eliminated by its own small
#: system, not weighted by 1 / D_j^2 in the n x n one (whose condition number stays below
#: about 1 / STIFF_SHARE^2 times G's)
STIFF_SHARE = 1e-4


def _by_rows(A: DiagonalRows, b, idx) -> Optional[np.ndarray]:
    """argmin |G_S z - b|^2 + |D_S z|^2 over the columns ``idx`` of A = [G; diag(D)] in the
    space of G's n rows. With W = D_R^-2 on the regular columns R (D_j >= STIFF_SHARE |G_j|)
    and K = (I + G_R W G_R')^-1 (n x n, Cholesky), the stiff columns T (the others, few:
    those of active constraints) solve (G_T' K G_T + D_T^2) z_T = G_T' K b, and then
    z_R = W G_R' K (b - G_T z_T) (the push-through identity
    (G_R'G_R + D_R^2)^-1 G_R' = W G_R' K); one refinement step from the normal equations'
    residual. None where a factorisation fails."""
    G, D = A.G[:, idx], A.D[idx]
    n = G.shape[0]
    col = np.linalg.norm(G, axis=0)
    regular = D >= STIFF_SHARE * col
    if not np.any(regular & (D > 0.0)):
        return None
    R, T = np.flatnonzero(regular), np.flatnonzero(~regular)
    GR, W = G[:, R], 1.0 / (D[R] * D[R])
    try:
        L = cholesky(np.eye(n) + (GR * W) @ GR.T, lower=True, check_finite=False)
        GT = G[:, T]
        KGT = cho_solve((L, True), GT, check_finite=False) if T.size else None
        LT = (cholesky(GT.T @ KGT + np.diag(D[T] * D[T]), lower=True, check_finite=False)
              if T.size else None)
    except LinAlgError:
        return None

    def solve(c):
        # (G'G + D^2) z = c by blocks: the Schur complement of the regular block is
        # G_T' K G_T + D_T^2, and (G_R'G_R + D_R^2)^-1 = W - W G_R' K G_R W (Woodbury)
        z = np.empty(idx.size)
        y = c[R]
        if T.size:
            zT = cho_solve((LT, True), c[T] - KGT.T @ (GR @ (W * y)), check_finite=False)
            z[T] = zT
            y = y - GR.T @ (GT @ zT)
        z[R] = W * y - W * (GR.T @ cho_solve((L, True), GR @ (W * y), check_finite=False))
        return z

    # the least-squares solution itself: z_T from its Schur system, z_R = W G_R' K (b - G_T z_T)
    # (no difference of large terms), then one refinement step from the normal equations
    z = np.empty(idx.size)
    rhs = b
    if T.size:
        z[T] = cho_solve((LT, True), GT.T @ cho_solve((L, True), b, check_finite=False),
                         check_finite=False)
        rhs = b - GT @ z[T]
    z[R] = W * (GR.T @ cho_solve((L, True), rhs, check_finite=False))
    z = z + solve(G.T @ (b - G @ z) - D * D * z)
    return z if np.all(np.isfinite(z)) else None


def _least_squares_on(A: DiagonalRows, b, H, q, idx, bound) -> Optional[np.ndarray]:
    """argmin |A_S z - [b; 0]| over the columns ``idx`` (H = A'A as a :class:`GramBlocks`,
    q = A'[b; 0]): in the rows' space (:func:`_by_rows`) when the support has
    ROW_SPACE_RATIO times as many columns as G has rows, else Cholesky on H_SS with one
    refinement step, where that is accurate (NORMAL_RANK_TOL, and
    |A_S'([b; 0] - A_S z)| <= ``bound``), else QR of A_S; None where A_S is rank deficient
    (SUPPORT_RANK_TOL) or has more columns than rows."""
    if idx.size > A.shape[0]:
        return None
    if A.D is not None and idx.size >= ROW_SPACE_RATIO * A.G.shape[0]:
        z = _by_rows(A, b, idx)
        if z is not None:
            AS = A.columns(idx)
            if np.all(np.abs(AS.transposed(AS.residual(b, z))) <= bound):
                return z
    try:
        L = cholesky(H.block(idx), lower=True, check_finite=False)
    except LinAlgError:
        L = None
    if L is not None:
        diag = np.abs(np.diag(L))
        if diag.min(initial=np.inf) > NORMAL_RANK_TOL * diag.max(initial=0.0):
            z = cho_solve((L, True), q[idx], check_finite=False)
            AS = A.columns(idx)
            z += cho_solve((L, True), AS.transposed(AS.residual(b, z)), check_finite=False)
            if np.all(np.isfinite(z)) and np.all(np.abs(AS.transposed(AS.residual(b, z)))
                                                  <= bound):
                return z
    # the diagonal block's rows outside S are 0 on S: A_S is G_S over diag(D_S)
    AS, bS = A.columns(idx).dense(b)
    Q, R = np.linalg.qr(AS)
    diag = np.abs(np.diag(R))
    if not diag.min(initial=np.inf) > SUPPORT_RANK_TOL * diag.max(initial=0.0):
        return None
    z = solve_triangular(R, Q.T @ bS)
    return z if np.all(np.isfinite(z)) else None


def _fit_multipliers(g, G, cons, eq, eps: float = MULTIPLIER_REGULARIZATION,
                     start: Optional[np.ndarray] = None,
                     gram: Optional[tuple] = None) -> np.ndarray:
    """The regularised least-squares multipliers (see :func:`kkt_report`; ``eps`` the weight
    of the regularisation rows, 0 for the plain fit): mu_m >= 0 for an inequality, free sign
    for an equality (written as mu+ - mu-, both >= 0, with no complementarity row: the
    regularisation then keeps one of the two at 0). ``start``: the multipliers of a nearby fit
    (same constraints), whose signs guess the answer's support
    (:func:`nonnegative_least_squares`); ``gram``: (G'G, G'g) of these columns (G'G an array
    or a :class:`GramBlocks`), from which the fit's normal equations are formed (else from
    its rows)."""
    M = cons.size
    col = np.linalg.norm(G, axis=0)
    comp_rows = np.where(eq, 0.0, cons)
    # the complementarity rows mu_m (F_m - U_m) and the regularisation rows eps |grad F_m| mu_m
    # are both diagonal: one diagonal row block with their root sum of squares has the same
    # objective, with a third fewer rows for the active-set method to carry
    diag = np.hypot(comp_rows, eps * col)
    normal = None
    if gram is not None:
        GG, Gg = gram
        GG = GG if isinstance(GG, GramBlocks) else GramBlocks(np.asarray(GG, dtype=float))
        normal = (GG.plus_diagonal(diag * diag), -Gg)
    if not np.any(eq):
        return nonnegative_least_squares(DiagonalRows(G, diag), -g,
                                         None if start is None else start > 0.0, normal)
    E = np.flatnonzero(eq)
    # mu- = the columns -G_E, each with its own regularisation row eps |grad F_m|
    A2 = DiagonalRows(np.hstack([G, -G[:, E]]), np.concatenate([diag, eps * col[E]]))
    support = None if start is None else np.concatenate([start > 0.0, start[E] < 0.0])
    if normal is not None:
        # mu- = the columns -G_E with their own regularisation rows (this system whole)
        full = GG.dense()
        H2 = np.empty((M + E.size, M + E.size))
        H2[:M, :M] = normal[0].dense()
        H2[:M, M:] = -full[:, E]
        H2[M:, :M] = -full[E, :]
        H2[M:, M:] = full[np.ix_(E, E)]
        minus = np.arange(M, M + E.size)
        H2[minus, minus] += (eps * col[E]) ** 2
        normal = (GramBlocks(H2), np.concatenate([-Gg, Gg[E]]))
    x = nonnegative_least_squares(A2, -g, support, normal)
    mu = x[:M].copy()
    mu[E] -= x[M:]
    return mu


def force_multipliers(g, G, equality=None) -> np.ndarray:
    """The multipliers that balance the gradients alone: min |g + G mu| over mu_m >= 0 (free
    sign for an equality; the smallest such mu when every constraint is one), with none of
    :func:`kkt_report`'s complementarity rows. At a
    stationary point of the exact penalty F_0 + R + c sum_m (F_m - U_m)_+ (Problem 5) that
    violates constraint m, they are c for it, where the KKT fit, which also asks
    mu_m (F_m - U_m) = 0, is pulled toward 0: what the penalty continuation reads as "c is
    below the multipliers"."""
    g = np.asarray(g, dtype=float)
    G = np.asarray(G, dtype=float).reshape(g.size, -1)
    M = G.shape[1]
    eq = np.zeros(M, dtype=bool) if equality is None else np.asarray(equality, dtype=bool)
    if not np.any(eq):
        return nonnegative_least_squares(G, -g)
    if np.all(eq):
        # the smallest forces (dependent gradients leave the balance's mu non-unique)
        return np.linalg.lstsq(G, -g, rcond=None)[0]
    # an equality's multiplier has either sign: bounded least squares (the split
    # mu+ - mu- of the KKT fit is not unique without its regularisation rows, and SciPy's
    # nnls ran out of iterations on it)
    return lsq_linear(G, -g, bounds=(np.where(eq, -np.inf, 0.0), np.inf), method="bvls",
                      tol=1e-12).x


#: "infeasible" needs the returned point to be a stationary point of the violation to this
#: relative accuracy (:func:`violation_stationarity`)
PHASE1_TOL = 1e-3


def violation_stationarity(w: np.ndarray, ev: Evaluation, terms: ProblemTerms,
                           feas_tol: float, scale: float, solver: str = "CLARABEL") -> float:
    """How far ``w`` is from a stationary point of the violation sum_m (F_m(w) - U_m)_+ over
    the domain, relative to ``scale`` (the constraints' largest full-data gradient at the
    start): evidence of infeasibility needs this near 0, i.e. no direction decreases the
    violation to first order (for convex F_m this makes w a minimiser of the violation, so
    the constraints cannot be met; for nonconvex ones, a local one).

    The subgradient is g = sum over violated m (relative violation above ``feas_tol``) of
    grad F_m (sign(F_m - U_m) grad F_m for an equality) + sum over near-active m of
    lambda_m grad F_m, lambda in [0, 1] ([-1, 1] for an equality) chosen to make it smallest
    (bounded least squares). Without a domain the residual is |g|; with one, the
    length of the projected step |Proj_D(w - g) - w| (one CVXPY solve).
    """
    k = terms.first_constraint
    cons = np.asarray(ev.values[k:], dtype=float) - terms.bounds
    rel = terms.excess(cons) / np.maximum(1.0, np.abs(terms.bounds))
    G = np.asarray(ev.grads[k:], dtype=float).reshape(len(cons), w.size)
    # the violation's gradient: grad |F_m - U_m| = sign(F_m - U_m) grad F_m for an equality
    G = np.where((cons < 0)[:, None] & (terms.excess(cons) > cons)[:, None], -G, G)
    violated, near = rel > feas_tol, np.abs(rel) <= feas_tol
    g = G[violated].sum(axis=0)
    if np.any(near):
        eq = _equalities(terms, len(cons))
        lam = lsq_linear(G[near].T, -g, bounds=(np.where(eq[near], -1.0, 0.0), 1.0)).x
        g = g + lam @ G[near]
    if not terms.deterministic.has_domain:
        r = float(np.linalg.norm(g))
    else:
        u = cp.Variable(w.size)
        _, dom = terms.deterministic.instantiate(u)
        cp.Problem(cp.Minimize(cp.sum_squares(u - (w - g))), dom).solve(solver=solver)
        r = float(np.linalg.norm(u.value - w)) if u.value is not None else float("inf")
    if scale > 0:
        return r / scale
    return 0.0 if r == 0 else float("inf")     # no scale (zero gradients at the start)
