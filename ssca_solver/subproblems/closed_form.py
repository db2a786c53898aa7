"""Problem 5 in closed form when every surrogate has scalar curvature (Numba).

With surrogates p_m(w) = a_m |w|^2 + b_m.w + c_m (m = 0 the objective, plus lambda |w|^2 of an
exact ridge term folded into a_0) the subproblem

    minimise   p_0(w) + c sum_m s_m   s.t.  p_m(w) - U_m <= s_m,  s_m >= 0
                                             |p_m(w) - U_m| <= s_m  (an equality constraint)

has the Lagrangian minimiser w(nu) = -(b_0 + sum_m nu_m b_m) / (2 (a_0 + sum_m nu_m a_m)) and the
concave dual (PAPER_NOTES item 6)

    g(nu) = -|B(nu)|^2 / (4 A(nu)) + c_0 + sum_m nu_m (c_m - U_m),   nu_m in [0, c]
                                                                    (equality: nu_m in [-c, c]),

which needs only the (M+1) x (M+1) Gram matrix G of (b_0, ..., b_M): |B(nu)|^2 = nt' G nt with
nt = (1, nu). Its gradient is p_m(w(nu)) - U_m and its Hessian -J J' / (2 A) with
J_m = b_m + 2 a_m w(nu), also functions of G. M = 0 is eqs. (omega1-uncon)/(omega2-uncon);
M = 1 is Lemma 1 (a root of a quadratic, nu = c when even the surrogate's minimum violates the
constraint); M >= 2 is a projected Newton method on the box (Bertsekas 1982) run to a
projected-gradient residual of 1e-13 (relative).

An equality F_m = U_m has an affine surrogate (a_m = 0, :class:`ssca_solver.Linearization`), so
its two-sided slack |p_m - U_m| <= s_m has one free-sign multiplier nu_m = nu_m^+ - nu_m^- with
|nu_m| <= c, and A(nu) does not depend on it: the same dual on the box [-c, c] in that
coordinate (M = 1: the root of the linear g'(nu), clipped).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .._blas import one_blas_thread
from .._kernels import combination
from .base import BoundSolver, SubproblemSolution, SubproblemSolver
from ..model.surrogates import ProximalLinear


@njit(cache=True)
def _dual(G, a0, a, d, nu):
    """g(nu) and its gradient from the Gram matrix (O(M^2)), and the size of the terms g is
    made of (its rounding error is about 1e-16 times that)."""
    nt = np.empty(nu.size + 1)
    nt[0] = 1.0
    nt[1:] = nu
    A = a0 + np.dot(nu, a)
    Gn = G @ nt
    BB = np.dot(nt, Gn)
    g = -BB / (4.0 * A) + np.dot(nu, d)
    bw = -Gn / (2.0 * A)          # b_j . w(nu), j = 0..M
    ww = BB / (4.0 * A * A)       # |w(nu)|^2
    grad = a * ww + bw[1:] + d
    scale = BB / (4.0 * A) + np.sum(np.abs(nu * d))
    return g, grad, scale


@njit(cache=True)
def _dual_curvature(G, a0, a, nu, free):
    """Minus the Hessian of g (see :func:`_dual`) on the coordinates ``free``:
    (b_m.b_k + 2 a_k b_m.w + 2 a_m b_k.w + 4 a_m a_k |w|^2) / (2 A), O(|free|^2)."""
    nt = np.empty(nu.size + 1)
    nt[0] = 1.0
    nt[1:] = nu
    A = a0 + np.dot(nu, a)
    Gn = G @ nt
    bw = -Gn / (2.0 * A)
    ww = np.dot(nt, Gn) / (4.0 * A * A)
    F = free.size
    H = np.empty((F, F))
    for i in range(F):
        m = free[i]
        for j in range(F):
            k = free[j]
            H[i, j] = (G[m + 1, k + 1] + 2.0 * a[k] * bw[m + 1] + 2.0 * a[m] * bw[k + 1]
                       + 4.0 * a[m] * a[k] * ww) / (2.0 * A)
    return H


@njit(cache=True)
def _summary(G, coef, a0, a, d, c0, c, lower):
    """A(nu), |w|^2, b_j.w, the slacks and the value of Problem 5 at w(nu), from G alone
    (``lower``: the dual box's lower bounds, -c marking an equality)."""
    A = a0 + np.dot(coef[1:], a)
    Gc = G @ coef
    ww = np.dot(coef, Gc) / (4.0 * A * A)       # |w|^2
    bw = -Gc / (2.0 * A)                         # b_j . w, j = 0..M
    excess = a * ww + bw[1:] + d
    slack = np.maximum(excess, 0.0)              # [p_m(w) - U_m]_+
    for m in range(slack.size):
        if lower[m] < 0.0:
            slack[m] = abs(excess[m])            # |p_m(w) - U_m| for an equality
    return A, ww, bw, slack, a0 * ww + bw[0] + c0 + c * np.sum(slack)


@njit(cache=True)
def _equality1(G, a0, d1, c):
    """M = 1, an equality (a_1 = 0): g'(nu) = d_1 - (G_01 + nu G_11) / (2 a_0) is linear; its
    root clipped to [-c, c]."""
    if G[1, 1] <= 0.0:
        return 0.0                 # b_1 = 0: the surrogate constraint does not depend on w
    nu = (2.0 * a0 * d1 - G[0, 1]) / G[1, 1]
    return min(max(nu, -c), c)


@njit(cache=True)
def _lemma1(G, a0, a1, d1, c):
    """M = 1: nu in [0, c] with g'(nu) = 0, from the quadratic 4 A(nu)^2 g'(nu) = 0."""
    def p(nu):
        return (-a1 * G[1, 1] + 4.0 * d1 * a1 * a1) * nu * nu \
            + (-2.0 * a0 * G[1, 1] + 8.0 * d1 * a0 * a1) * nu \
            + (a1 * G[0, 0] - 2.0 * a0 * G[0, 1] + 4.0 * d1 * a0 * a0)
    if p(0.0) <= 0.0:
        return 0.0
    if p(c) >= 0.0:
        return c               # even the surrogate's minimiser violates the constraint
    q2 = -a1 * G[1, 1] + 4.0 * d1 * a1 * a1
    q1 = -2.0 * a0 * G[1, 1] + 8.0 * d1 * a0 * a1
    q0 = a1 * G[0, 0] - 2.0 * a0 * G[0, 1] + 4.0 * d1 * a0 * a0
    if abs(q2) <= 1e-300:
        nu = -q0 / q1
    else:
        disc = max(q1 * q1 - 4.0 * q2 * q0, 0.0)
        s = math.sqrt(disc)
        t = -0.5 * (q1 + math.copysign(s, q1))      # stable roots t/q2 and q0/t
        r1 = t / q2
        r2 = q0 / t if t != 0.0 else r1
        nu = r1 if (0.0 < r1 < c) else r2
    lo, hi = 0.0, c                             # safeguarded Newton polish on [0, c]
    if not (lo < nu < hi):
        nu = 0.5 * c
    for _ in range(100):
        v = p(nu)
        if v == 0.0:
            break
        if v > 0.0:
            lo = nu
        else:
            hi = nu
        dp = 2.0 * q2 * nu + q1
        step = nu - v / dp if dp < 0.0 else 0.5 * (lo + hi)
        if not (lo <= step <= hi):
            step = 0.5 * (lo + hi)
        if abs(step - nu) <= 1e-16 * max(1.0, nu):
            nu = step
            break
        nu = step
    return nu


@njit(cache=True)
def _diag_terms(a0v, b0v, Ac, Bc, nu):
    """A(nu) = a_0 + sum_m nu_m a_m and B(nu) = b_0 + sum_m nu_m b_m (d-vectors) for diagonal
    curvature (see :func:`solve_closed_form_diag`), skipping the multipliers that are 0."""
    A = a0v.copy()
    B = b0v.copy()
    for m in range(nu.size):
        if nu[m] != 0.0:
            A += nu[m] * Ac[m]
            B += nu[m] * Bc[m]
    return A, B


@njit(cache=True)
def _dual_diag(a0v, b0v, Ac, Bc, d, nu):
    """g(nu), its gradient and term size for diagonal curvature (see
    :func:`solve_closed_form_diag`): Ac, Bc (M, d) the constraints' curvature vectors and
    linear terms, a0v, b0v the objective's. O(M d), two matrix-vector products."""
    A, B = _diag_terms(a0v, b0v, Ac, Bc, nu)
    w = -B / (2.0 * A)
    term = np.sum(B * B / (4.0 * A))
    g = np.dot(nu, d) - term
    scale = np.sum(np.abs(nu * d)) + term
    grad = d + np.dot(Ac, w * w) + np.dot(Bc, w)
    return g, grad, scale


@njit(cache=True)
def _dual_diag_curvature(a0v, b0v, Ac, Bc, nu, free):
    """Minus the Hessian of g (see :func:`_dual_diag`) on the coordinates ``free``:
    sum_k J_mk J_lk / (2 A_k), J_mk = b_mk + 2 a_mk w_k, one matrix product, O(|free|^2 d)."""
    A, B = _diag_terms(a0v, b0v, Ac, Bc, nu)
    w = -B / (2.0 * A)
    r = 1.0 / np.sqrt(2.0 * A)
    J = np.empty((free.size, A.size))
    for i in range(free.size):
        m = free[i]
        J[i] = (Bc[m] + 2.0 * Ac[m] * w) * r
    return np.dot(J, J.T)


#: how the dual's terms are held (``mode`` of the kernels below): the Gram matrix of scalar
#: curvatures; per-coordinate curvature vectors; or both added up, the split of a
#: quasi-Newton model's subproblem into its directions and their complement
#: (:func:`solve_closed_form_model`)
GRAM, DIAG, SPLIT = 0, 1, 2


@njit(cache=True)
def _evaluate(mode, G, a0, a, a0v, b0v, Ac, Bc, d, nu):
    if mode == DIAG:
        return _dual_diag(a0v, b0v, Ac, Bc, d, nu)
    if mode == GRAM:
        return _dual(G, a0, a, d, nu)
    # SPLIT: g is the sum of the two parts' -|B|^2 / 4A terms plus nu.d, counted once
    g1, grad1, scale1 = _dual(G, a0, a, d, nu)
    g2, grad2, scale2 = _dual_diag(a0v, b0v, Ac, Bc, d, nu)
    nd = np.dot(nu, d)
    return g1 + g2 - nd, grad1 + grad2 - d, scale1 + scale2 - np.sum(np.abs(nu * d))


@njit(cache=True)
def _curvature(mode, G, a0, a, a0v, b0v, Ac, Bc, nu, free):
    if mode == DIAG:
        return _dual_diag_curvature(a0v, b0v, Ac, Bc, nu, free)
    if mode == GRAM:
        return _dual_curvature(G, a0, a, nu, free)
    return (_dual_curvature(G, a0, a, nu, free)
            + _dual_diag_curvature(a0v, b0v, Ac, Bc, nu, free))


@njit(cache=True)
def _projected_newton(G, a0, a, d, c, nu0, tol, max_iter, mode, a0v, b0v, Ac, Bc, lower):
    """Maximise the concave g on the box [lower, c] (lower_m = 0, or -c for an equality) by
    projected Newton with an Armijo arc search (g from the Gram matrix, from the curvature
    vectors, or from both: ``mode``)."""
    M = d.size
    nu = np.minimum(np.maximum(nu0, lower), c)
    res = np.inf
    for _ in range(max_iter):
        g, grad, gscale = _evaluate(mode, G, a0, a, a0v, b0v, Ac, Bc, d, nu)
        pg = nu - np.minimum(np.maximum(nu + grad, lower), c)
        res = np.max(np.abs(pg))
        if res <= tol:
            break
        eps = min(1e-3 * (1.0 + c), res)
        binding = np.zeros(M, dtype=np.bool_)
        for i in range(M):
            binding[i] = ((nu[i] <= lower[i] + eps and grad[i] < 0.0)
                          or (nu[i] >= c - eps and grad[i] > 0.0))
        free = np.where(~binding)[0]
        direction = grad.copy()  # binding coordinates: gradient step, stopped by the projection
        if free.size > 0:
            Hf = _curvature(mode, G, a0, a, a0v, b0v, Ac, Bc, nu, free)
            reg = 1e-14 * (1.0 + np.trace(Hf))
            for i in range(free.size):
                Hf[i, i] += reg
            df = np.linalg.solve(Hf, grad[free])
            for i in range(free.size):
                direction[free[i]] = df[i]
        alpha = 1.0
        accepted = False
        for _ in range(60):
            trial = np.minimum(np.maximum(nu + alpha * direction, lower), c)
            gt, gradt, _ = _evaluate(mode, G, a0, a, a0v, b0v, Ac, Bc, d, trial)
            if gt - g >= 1e-4 * np.dot(grad, trial - nu) and gt >= g:
                nu = trial
                accepted = True
                break
            # near the optimum the Armijo gain falls below rounding in g (g is a difference of
            # terms of size gscale): accept a step that keeps g within that rounding and
            # shrinks the projected-gradient residual
            rest = np.max(np.abs(trial - np.minimum(np.maximum(trial + gradt, lower), c)))
            if gt >= g - 1e-13 * (1.0 + gscale) and rest < res:
                nu = trial
                accepted = True
                break
            alpha *= 0.5
        if not accepted:
            break
    return nu, res


#: above this many constraints the dual is maximised over a working set (:func:`_maximise_dual`)
WORKING_SET_MIN = 32


def _maximise_dual(G, a0, a, d, c, start, tol, max_iter, mode, a0v, b0v, Ac, Bc, lower):
    """The projected Newton method (:func:`_projected_newton`, one BLAS thread) on the whole
    box, or, above WORKING_SET_MIN constraints, on a working set that grows until the whole
    box's projected-gradient residual is within ``tol``.

    With many constraints of which few bind, the Newton systems on the free coordinates are
    large and rank-deficient while the active set is being found (300 free multipliers, one
    positive at the optimum, 38 iterations: 26 ms a solve). The working set starts as the
    multipliers that are nonzero (and every equality's), with the most violated others up to
    WORKING_SET_MIN; the dual is maximised with the rest held at 0, which is the same dual
    restricted to a face of the box; then every constraint outside whose projected gradient
    exceeds ``tol`` (its surrogate violated at w(nu)) is a candidate, the most violated up to
    the set's size are added, and so on. The set only grows, so this ends; the answer
    satisfies the same test on all M coordinates as the plain method's."""
    M = d.size
    nu = np.minimum(np.maximum(start, lower), c)
    with one_blas_thread():
        if M <= WORKING_SET_MIN:
            return _projected_newton(G, a0, a, d, c, nu, tol, max_iter, mode, a0v, b0v, Ac,
                                     Bc, lower)
        inside = (nu != 0.0) | (lower < 0.0)
        residual = np.inf
        for _ in range(M):
            _, grad, _ = _evaluate(mode, G, a0, a, a0v, b0v, Ac, Bc, d, nu)
            pg = np.abs(nu - np.minimum(np.maximum(nu + grad, lower), c))
            residual = float(np.max(pg))
            out = np.flatnonzero(~inside & (pg > tol))
            if out.size == 0 and residual <= tol:
                break
            if out.size:
                room = max(WORKING_SET_MIN - int(inside.sum()), int(inside.sum()), 1)
                inside[out[np.argsort(-pg[out], kind="stable")[:room]]] = True
            W = np.flatnonzero(inside)
            # the dual restricted to W: its rows of whatever holds the terms
            Gw, aw, Acw, Bcw = G, a, Ac, Bc
            if mode != DIAG:
                rows = np.concatenate(([0], W + 1))
                Gw, aw = np.ascontiguousarray(G[np.ix_(rows, rows)]), a[W]
            if mode != GRAM:
                Acw, Bcw = np.ascontiguousarray(Ac[W]), np.ascontiguousarray(Bc[W])
            sub, sub_res = _projected_newton(Gw, a0, aw, d[W], c, nu[W], tol, max_iter, mode,
                                             a0v, b0v, Acw, Bcw, lower[W])
            nu = np.zeros(M)
            nu[W] = sub
            if not sub_res <= tol:       # the restricted solve stopped short: say so as it is
                _, grad, _ = _evaluate(mode, G, a0, a, a0v, b0v, Ac, Bc, d, nu)
                pg = np.abs(nu - np.minimum(np.maximum(nu + grad, lower), c))
                return nu, float(np.max(pg))
        return nu, residual


_NONE = np.zeros((0, 0))
#: up to this many constraints the Gram matrix is formed by dot products (no copy of the
#: vectors); above it by one matrix product
GRAM_LOOP = 8
_EMPTY = np.zeros(0)


def solve_closed_form(a0: float, b0: np.ndarray | None, c0: float, a: np.ndarray, bs,
                      cs: np.ndarray, U: np.ndarray, penalty: float,
                      out: np.ndarray | None = None,
                      nu0: np.ndarray | None = None, max_iter: int = 200,
                      equality=None) -> SubproblemSolution:
    """Solve Problem 5 with scalar curvatures a_0 > 0, a_m >= 0 (see module docstring).

    M = 0 is eqs. (omega1-uncon)/(omega2-uncon), M = 1 Lemma 1, M >= 2 the projected Newton
    method on the dual box.

    Args:
      a0, b0, c0: the objective's surrogate a_0 |w|^2 + b_0.w + c_0 (with any lambda |w|^2);
        ``b0=None`` means b_0 = 0 (a deterministic objective such as |w|^2 in
        prob:class-con), which saves its passes over d floats.
      a, bs, cs: the constraints' surrogates (arrays of M curvatures, M vectors, M constants).
      U: the bounds U_m; penalty: c.
      out: optional buffer of shape (d,) to form w-bar in; without it the solution carries
        w-bar as its terms (the server forms eq. (updatew) from them in one pass, and
        ``sol.w`` is formed only when read).
      nu0: warm start for the multipliers (M >= 2).
      max_iter: iteration limit of the projected Newton method (M >= 2).
      equality: M booleans (None: none): constraint m is the equality p_m(w) = U_m, with the
        two-sided slack |p_m(w) - U_m| <= s_m and a free-sign multiplier in [-c, c]; its
        surrogate must be affine (a_m = 0).

    Cost: the Gram matrix's dot products (one per pair of nonzero vectors), and one pass to form
    w-bar if it is asked for; |w-bar|^2 and b_m.w-bar, hence the slacks and the value, come from
    G.
    """
    M = len(bs)
    if not a0 > 0:
        raise ValueError(f"the closed form needs objective curvature a_0 > 0, got {a0}")
    if b0 is None and M == 0:
        raise ValueError("the closed form needs b0 or at least one constraint to know d")
    if M == 0:                                   # eqs. (omega1-uncon)/(omega2-uncon)
        value = -float(b0 @ b0) / (4.0 * a0) + c0
        return _solution([(-0.5 / a0, b0)], np.zeros(0), np.zeros(0), value, 0.0, b0, out)
    vecs = (b0,) + tuple(bs)
    G = np.zeros((M + 1, M + 1))                 # row and column 0 stay 0 when b_0 = 0
    first = 0 if b0 is not None else 1
    if M <= GRAM_LOOP:
        for j in range(first, M + 1):
            for k in range(j, M + 1):
                G[j, k] = G[k, j] = float(vecs[j] @ vecs[k])
    else:
        # many constraints: one matrix product instead of (M + 1)^2 / 2 Python-level dot
        # products (the copy into V is one more pass, which few vectors would notice)
        V = np.vstack(vecs[first:])
        P = V @ V.T
        G[first:, first:] = 0.5 * (P + P.T)
    a = np.asarray(a, dtype=float)
    d = np.asarray(cs, dtype=float) - np.asarray(U, dtype=float)
    c = float(penalty)
    lower = _lower_bounds(equality, M, c, a)
    residual = 0.0
    if M == 1 and lower[0] < 0.0:
        nu = np.array([_equality1(G, float(a0), float(d[0]), c)])
    elif M == 1:
        nu = np.array([_lemma1(G, float(a0), float(a[0]), float(d[0]), c)])
    else:
        start = np.zeros(M) if nu0 is None else np.asarray(nu0, dtype=float)
        nu, residual = _maximise_dual(G, float(a0), a, d, c, start, 1e-13 * (1.0 + c),
                                      int(max_iter), GRAM, _EMPTY, _EMPTY, _NONE, _NONE,
                                      lower)
    coef = np.concatenate(([0.0 if b0 is None else 1.0], nu))
    A, ww, bw, slack, value = _summary(G, coef, float(a0), a, d, float(c0), c, lower)
    # w = -(b_0 + sum nu_m b_m) / (2 A), left to the server as its terms unless out is given
    terms = [(-0.5 * cf / A, v) for cf, v in zip(coef, vecs) if cf != 0.0]
    return _solution(terms, slack, nu, value, float(residual), bs[0], out)


def _lower_bounds(equality, M: int, c: float, a) -> np.ndarray:
    """The dual box's lower bounds: 0, or -c for an equality (whose curvature must be 0)."""
    if equality is None:
        return np.zeros(M)
    eq = np.asarray(equality, dtype=bool).reshape(M)
    if np.any(np.asarray(a, dtype=float).reshape(M, -1)[eq] != 0.0):
        raise ValueError("an equality constraint needs an affine surrogate (curvature 0)")
    return np.where(eq, -c, 0.0)


def solve_closed_form_diag(a0: np.ndarray, b0: np.ndarray | None, c0: float,
                           a: np.ndarray, bs, cs: np.ndarray, U: np.ndarray, penalty: float,
                           nu0: np.ndarray | None = None,
                           max_iter: int = 200, equality=None) -> SubproblemSolution:
    """Solve Problem 5 with DIAGONAL curvatures: p_m(w) = sum_k a_{m,k} w_k^2 + b_m.w + c_m.

    The same dual as :func:`solve_closed_form` with the scalars made elementwise: the
    Lagrangian minimiser is w_k(nu) = -B_k(nu) / (2 A_k(nu)) with A = a_0 + sum_m nu_m a_m and
    B = b_0 + sum_m nu_m b_m, and the concave dual, still of dimension M,

        g(nu) = -sum_k B_k(nu)^2 / (4 A_k(nu)) + c_0 + sum_m nu_m (c_m - U_m),  nu in [0, c]^M,

    has gradient p_m(w(nu)) - U_m and Hessian -sum_k J_mk J_lk / (2 A_k), J_mk = b_mk +
    2 a_mk w_k. It is maximised by the projected Newton method of the scalar case (M = 1
    included); each evaluation costs O(M^2 d) instead of O(M^2).

    Args:
      a0: the objective's curvature vector (d,), every entry > 0 (with any lambda added).
      b0, c0: its linear term (None: 0) and constant.
      a: the constraints' curvature vectors, shape (M, d), entries >= 0.
      bs, cs: the constraints' linear terms (M vectors) and constants; U: bounds; penalty: c.
      nu0: warm start of the multipliers. max_iter: projected Newton iterations.
      equality: as in :func:`solve_closed_form` (free-sign multipliers in [-c, c]).
    """
    a0 = np.asarray(a0, dtype=float)
    dim = a0.size
    M = len(bs)
    if a0.ndim != 1 or not np.all(a0 > 0):
        raise ValueError("the diagonal closed form needs objective curvatures a_0 > 0")
    a = np.asarray(a, dtype=float).reshape(M, dim)
    Acur = np.vstack([a0[None, :], a])
    Bv = np.zeros((M + 1, dim))
    if b0 is not None:
        Bv[0] = b0
    if M:
        Bv[1:] = np.asarray(bs, dtype=float).reshape(M, dim)
    d = np.asarray(cs, dtype=float) - np.asarray(U, dtype=float)
    c = float(penalty)
    lower = _lower_bounds(equality, M, c, a)
    residual = 0.0
    if M == 0:
        nu = np.zeros(0)
    else:
        start = np.zeros(M) if nu0 is None else np.asarray(nu0, dtype=float)
        nu, residual = _maximise_dual(_NONE, 0.0, np.zeros(M), d, c, start,
                                      1e-13 * (1.0 + c), int(max_iter), DIAG, Acur[0], Bv[0],
                                      np.ascontiguousarray(Acur[1:]),
                                      np.ascontiguousarray(Bv[1:]), lower)
    A = Acur[0] + nu @ Acur[1:]
    w = -(Bv[0] + nu @ Bv[1:]) / (2.0 * A)
    excess = np.einsum("mk,k->m", Acur[1:], w * w) + Bv[1:] @ w + d
    slack = np.where(lower < 0.0, np.abs(excess), np.maximum(excess, 0.0))
    value = float(a0 @ (w * w) + Bv[0] @ w + c0 + c * np.sum(slack))
    return SubproblemSolution(w, slack, nu, value, float(residual))


def solve_closed_form_model(a0: float, b0: np.ndarray | None, c0: float, a: np.ndarray, bs,
                            cs: np.ndarray, U: np.ndarray, penalty: float, model,
                            center: np.ndarray, nu0: np.ndarray | None = None,
                            max_iter: int = 200, equality=None) -> SubproblemSolution:
    """Problem 5 with a quasi-Newton model added to the objective's surrogate:

        p_0(w) = a_0 |w|^2 + b_0.w + c_0 + (w - x)' B (w - x) / 2,   x = ``center``,

    the constraints' surrogates a_m |w|^2 + b_m.w + c_m as in :func:`solve_closed_form`, and
    B positive definite, B = delta I on the complement of the span of ``model.directions()``
    (:class:`ssca_solver.methods.ssca.quasi_newton.LBFGSModel`, the Newton and sketch models
    of :mod:`ssca_solver.methods.ssca.newton`; ``model.delta`` is delta).

    Where the directions span less than R^d, R^d splits into their span P (an orthonormal
    basis from one QR of d x dim P, rotated to diagonalise P' B P / 2 + a_0 I: curvatures h_k)
    and its complement, where the Lagrangian's curvature is the scalar
    delta / 2 + a_0 + sum_m nu_m a_m. The dual g(nu) is then the sum of the diagonal closed
    form's terms in the dim P coordinates (:func:`solve_closed_form_diag`) and the scalar
    closed form's in the complement (:func:`solve_closed_form`, from the Gram matrix of the
    linear terms b_0 - B x, b_1, ..., b_M projected onto it): the same M-dimensional dual,
    exactly, at the cost of dim P coordinates plus an (M + 1) x (M + 1) Gram matrix, whatever
    M is. Where the directions span R^d (the Newton model) the basis is the eigenvectors of
    B / 2 + a_0 I from the model's ``eigen()`` (else from B itself), and the problem is the
    diagonal closed form in d coordinates.
    """
    x = np.asarray(center, dtype=float)
    dim = x.size
    M = len(bs)
    Bx = model.matvec(x)
    lin0 = (np.zeros_like(x) if b0 is None else np.asarray(b0, dtype=float)) - Bx
    const0 = float(c0) + 0.5 * float(x @ Bx)
    Bm = np.asarray(bs, dtype=float).reshape(M, dim)        # the constraints' b_m as rows
    a = np.asarray(a, dtype=float).reshape(M)
    D = model.directions()
    if D.shape[0] < dim:
        return _solve_split(float(a0), lin0, const0, a, Bm, cs, U, penalty, model, D, nu0,
                            max_iter, equality)
    eigen = getattr(model, "eigen", None)
    if eigen is not None:
        lam, V = eigen()
        h = 0.5 * lam + float(a0)
    else:
        H = 0.5 * model.matmat(np.eye(dim))
        H = 0.5 * (H + H.T) + float(a0) * np.eye(dim)
        h, V = np.linalg.eigh(H)
    h = _floored(h, float(a0))
    sol = solve_closed_form_diag(h, V.T @ lin0, const0, np.repeat(a[:, None], h.size, axis=1),
                                 Bm @ V, cs, U, penalty, nu0=nu0, max_iter=max_iter,
                                 equality=equality)
    return SubproblemSolution(V @ sol.w, sol.slack, sol.multipliers, sol.value, sol.residual)


def _floored(h: np.ndarray, a0: float) -> np.ndarray:
    """The model's curvatures h with none below a_0 (or, when a_0 is negligible, below 1e-12
    of the largest). B is positive definite in exact arithmetic (every pair has s'y > 0);
    nearly dependent pairs can leave rounding below a_0 in Z' B Z / 2 + a_0 I."""
    return np.maximum(h, max(a0, 1e-12 * float(np.max(np.abs(h), initial=0.0))))


def _solve_split(a0: float, lin0: np.ndarray, const0: float, a: np.ndarray, Bm: np.ndarray,
                 cs, U, penalty: float, model, D: np.ndarray, nu0, max_iter: int,
                 equality) -> SubproblemSolution:
    """:func:`solve_closed_form_model` where the model's directions ``D`` (rows) span less
    than R^d: the dual over the span's rotated basis V (diagonal curvatures h) plus the
    complement (scalar curvature delta / 2 + a_0, the projected terms' Gram matrix)."""
    dim = lin0.size
    M = a.size
    if D.shape[0]:
        Q, _ = np.linalg.qr(np.asarray(D, dtype=float).T)   # (d, r): contains span(D)
        H = 0.5 * (Q.T @ model.matmat(Q))
        h, E = np.linalg.eigh(0.5 * (H + H.T) + a0 * np.eye(Q.shape[1]))
        V = Q @ E
    else:
        h, V = np.zeros(0), np.zeros((dim, 0))
    h = _floored(np.append(h, 0.5 * float(model.delta) + a0), a0)
    h, hp = h[:-1], float(h[-1])
    # the linear terms b_0 - B x, b_1, ..., b_M (rows of L) in V's coordinates (C) and the
    # Gram matrix of their parts in the complement, projected twice (not L L' - C C', which
    # loses the digits of a part that is small beside its term)
    L = np.vstack([lin0[None, :], Bm])
    C = L @ V
    L -= C @ V.T
    L -= (L @ V) @ V.T
    G = L @ L.T
    G = 0.5 * (G + G.T)
    d = np.asarray(cs, dtype=float) - np.asarray(U, dtype=float)
    c = float(penalty)
    lower = _lower_bounds(equality, M, c, a)
    nu, residual = np.zeros(M), 0.0
    if M:
        start = np.zeros(M) if nu0 is None else np.asarray(nu0, dtype=float)
        if V.shape[1]:
            nu, residual = _maximise_dual(G, hp, a, d, c, start, 1e-13 * (1.0 + c),
                                          int(max_iter), SPLIT, h, np.ascontiguousarray(C[0]),
                                          np.ascontiguousarray(np.repeat(a[:, None], h.size,
                                                                         axis=1)),
                                          np.ascontiguousarray(C[1:]), lower)
        else:
            nu, residual = _maximise_dual(G, hp, a, d, c, start, 1e-13 * (1.0 + c),
                                          int(max_iter), GRAM, _EMPTY, _EMPTY, _NONE, _NONE,
                                          lower)
    curv = float(nu @ a)
    u = -(C[0] + nu @ C[1:]) / (2.0 * (h + curv))            # w's coordinates in V
    Bnu = lin0 + nu @ Bm
    wp = -(Bnu - V @ (V.T @ Bnu)) / (2.0 * (hp + curv))      # w's part in the complement
    w = V @ u + wp
    excess = a * float(w @ w) + Bm @ w + d
    slack = np.where(lower < 0.0, np.abs(excess), np.maximum(excess, 0.0))
    value = (float(h @ (u * u)) + hp * float(wp @ wp) + float(lin0 @ w) + const0
             + c * float(np.sum(slack)))
    return SubproblemSolution(w, slack, nu, value, float(residual))


def _solution(terms, slack, nu, value, residual, like, out) -> SubproblemSolution:
    """w-bar as its terms, or formed in ``out`` (one pass) when a buffer is given or it is 0."""
    if out is None and terms:
        return SubproblemSolution(None, slack, nu, value, residual, terms=terms)
    w = np.empty(np.shape(like)) if out is None else out
    if terms:
        combination(terms, w)
    else:
        w[:] = 0.0
    return SubproblemSolution(w, slack, nu, value, residual)


class ClosedFormSubproblem(SubproblemSolver):
    """The closed-form backend behind the common subproblem contract.

    Args:
      builders: the stochastic functions' builders (all with scalar curvature).
      stochastic_objective: whether builders[0] is the objective's.
      bounds: U_m.
      ridge: lambda of the deterministic terms, which must add up to lambda |w|^2.
      newton_max_iter: iteration limit of the projected Newton method (M >= 2).
      equality: M booleans (None: none), the equality constraints (two-sided slack, free-sign
        multiplier; affine surrogates).

    Holds no state between rounds: the multipliers' warm start comes in as ``nu0``.
    """

    name = "closed_form"
    supports_metric = True
    supports_model = True
    #: a dual residual above this (times 1 + c) flags the round's solve as inaccurate
    INACCURATE = 1e-9

    def __init__(self, dim: int, builders, stochastic_objective: bool, bounds, ridge: float,
                 newton_max_iter: int = 200, equality=None):
        self.dim = dim
        self.equality = (None if equality is None or not np.any(equality)
                         else np.asarray(equality, dtype=bool))
        self.builders = tuple(builders)
        self.k = 1 if stochastic_objective else 0
        self.bounds = np.asarray(bounds, dtype=float)
        self.ridge = float(ridge)
        self.newton_max_iter = int(newton_max_iter)
        # every surrogate's (a, b, c) can be read from stacked statistics (:meth:`_all_forms`)
        self._proximal = all(type(b).quadratic_form is ProximalLinear.quadratic_form
                             for b in self.builders)

    def solve(self, stats, penalty: float, round: int, nu0=None,
              center=None) -> SubproblemSolution:
        """Problem 5 (Problem 2 when M = 0) at the averaged statistics, in closed form."""
        a0, b0, c0, a, bs, c = self._all_forms(stats, (0.0, None, 0.0))
        sol = solve_closed_form(a0, b0, c0, a, bs, c, self.bounds, penalty, nu0=nu0,
                                max_iter=self.newton_max_iter, equality=self.equality)
        return self._flagged(sol, penalty)

    def _quadratic_forms(self, stats) -> list:
        """Each surrogate's (a_m, b_m, c_m) at the averaged statistics."""
        return [b.quadratic_form(s) for b, s in zip(self.builders, stats)]

    def _all_forms(self, stats, no_objective: tuple) -> tuple:
        """:meth:`_forms` of every surrogate's (a_m, b_m, c_m): read as arrays from statistics
        that carry them stacked (hundreds of constraints; :meth:`.step.Statistics.stacked`,
        the same numbers) where every builder's form is the proximal-linear one, else
        function by function."""
        stacked = getattr(stats, "stacked", None)
        if stacked is not None and self._proximal:
            quad, lin, const = (stacked(name) for name in ("quad", "lin", "const"))
            if not (quad is None or lin is None or const is None) and quad.ndim == 1 \
                    and const.ndim == 1 and lin.shape == (quad.size, self.dim):
                k = self.k
                a0, b0, c0 = (quad[0], lin[0], const[0]) if k else no_objective
                return a0 + self.ridge, b0, c0, quad[k:], lin[k:], const[k:]
        return self._forms(self._quadratic_forms(stats), no_objective)

    def _forms(self, forms: list, no_objective: tuple) -> tuple:
        """(a_0 + lambda, b_0, c_0) of the objective's form (``no_objective`` in its place
        without a stochastic objective), then the constraints' (a_m), [b_m] and (c_m)."""
        a0, b0, c0 = forms[0] if self.k else no_objective
        cons = forms[self.k:]
        return (a0 + self.ridge, b0, c0, np.array([f[0] for f in cons]), [f[1] for f in cons],
                np.array([f[2] for f in cons]))

    def _flagged(self, sol: SubproblemSolution, penalty: float) -> SubproblemSolution:
        # the dual residual is p_m(w) - U_m in the constraints' units: a stop far above
        # rounding (iteration limit, stalled line search) is reported as an inaccurate solve
        sol.inaccurate = sol.residual > self.INACCURATE * (1.0 + penalty)
        return sol

    def with_model(self, model, center: np.ndarray) -> BoundSolver:
        """This solver with the quasi-Newton ``model`` added to the objective's surrogate about
        ``center``, the point the round's statistics were taken at (:meth:`solve_model`)."""
        return BoundSolver(self, center, lambda stats, penalty, round, nu0:
                           self.solve_model(stats, penalty, model, center, nu0))

    def solve_model(self, stats, penalty: float, model, center: np.ndarray,
                    nu0=None) -> SubproblemSolution:
        """Problem 5 at the averaged statistics with (w - x)' B (w - x) / 2 added to the
        objective's surrogate, x = ``center`` (:func:`solve_closed_form_model`)."""
        a0, b0, c0, a, bs, c = self._all_forms(stats, (0.0, None, 0.0))
        with one_blas_thread():
            sol = solve_closed_form_model(a0, b0, c0, a, bs, c, self.bounds, penalty, model,
                                          center, nu0=nu0, max_iter=self.newton_max_iter,
                                          equality=self.equality)
        return self._flagged(sol, penalty)

    def with_metric(self, metric: np.ndarray, center: np.ndarray) -> BoundSolver:
        """This solver for statistics whose proximal term tau |w - x|^2 is to be replaced by
        tau (w - x)' diag(metric_m) (w - x), x = ``center`` (:meth:`solve_metric`)."""
        return BoundSolver(self, center, lambda stats, penalty, round, nu0:
                           self.solve_metric(stats, penalty, metric, center, nu0))

    def solve_metric(self, stats, penalty: float, metric: np.ndarray, center: np.ndarray,
                     nu0=None) -> SubproblemSolution:
        """Problem 5 with each surrogate's scalar curvature a_m made the vector a_m D_m.

        The statistics are proximal-linear ones taken at x = ``center`` (a |w|^2 + b.w + c with
        a the curvature, b = g - 2 a x, c = f - g.x + a |x|^2); swapping the proximal term for
        a (w - x)' diag(D_m) (w - x) keeps the value and gradient at x and gives
        a D_m, b + 2 a (1 - D_m) x, c + a x'((D_m - 1) x): solved by
        :func:`solve_closed_form_diag`."""
        forms = []
        for (a, lin, const), D in zip(self._quadratic_forms(stats), metric):
            Dx = D * center
            forms.append((a * D, lin + 2.0 * a * (center - Dx),
                          const + a * float(center @ Dx - center @ center)))
        a0, b0, c0, a, bs, c = self._forms(forms, (np.zeros(self.dim), None, 0.0))
        sol = solve_closed_form_diag(a0, b0, c0, a.reshape(len(bs), self.dim), bs, c,
                                     self.bounds, penalty, nu0=nu0,
                                     max_iter=self.newton_max_iter, equality=self.equality)
        return self._flagged(sol, penalty)
