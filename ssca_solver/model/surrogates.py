"""Surrogate builders: the client statistics q_m and the convex model p_m(q_m, w).

Paper, Sections III-IV: for a mini-batch, sum_n fbar_m(w, w_t, x_n) = p_m(q_m(w_t, batch), w).
A builder fixes both halves:

* ``statistics`` runs on the client: from w_t and the client's rows it returns q_m, a dict of
  arrays that are **sums over the batch rows** (the paper's q_m).
* ``expression`` runs on the server: a convex CVXPY expression of the decision variable that is
  **affine in the statistics**. It also receives ``w_sq``, an affine stand-in for |w|^2 (the
  subproblem's epigraph variable r with |w|^2 <= r); a builder may use ``coef * w_sq`` with a
  nonnegative coefficient instead of ``coef * cp.sum_squares(w)``. That is exact (every surrogate
  is nondecreasing in r, so r = |w|^2 wherever it matters) and conditions the interior-point
  solve better: all surrogates then share one second-order cone. Because of that linearity, the recursive average of surrogates
  in eqs. (Fs0bar)/(Fsmbar) is the surrogate of the recursively averaged statistics, so the
  server only keeps one set of statistics per function.

Custom builders subclass :class:`SurrogateBuilder` (see docs/modelling.md, "Custom builders").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Optional

import cvxpy as cp
import numpy as np

from .._kernels import axpy
from .functions import SampleFunction, checked_value_and_grad


@dataclass(frozen=True)
class Statistic:
    """One statistic a client sends: its name, shape, and whether it is always >= 0 (or PSD).

    ``nonneg`` statistics become nonnegative CVXPY Parameters, which is what lets a product
    ``parameter * convex(w)`` stay DCP and DPP. ``psd`` matrices become PSD Parameters, usable in
    ``cp.quad_form(w, P)`` (DCP, but not DPP: CVXPY then recompiles the subproblem each round).
    """

    name: str
    shape: tuple
    nonneg: bool = False
    psd: bool = False


class SurrogateBuilder:
    """Protocol of a surrogate builder (paper: the pair q_m, p_m).

    Subclasses implement :meth:`statistic_specs`, :meth:`statistics` and :meth:`expression`;
    :meth:`initial_statistics` and :meth:`quadratic_form` have defaults.
    """

    #: the builder's own tau; None means "use the solve's tau option"
    tau: Optional[float] = None
    #: its surrogates are strongly convex (Assumption 2, checked at round 1); False only for
    #: the affine surrogate of an equality constraint
    strongly_convex: bool = True

    @property
    def scalar_curvature(self) -> bool:
        """True when p(q, w) = a |w|^2 + b.w + c given by :meth:`quadratic_form` (the closed-form
        subproblem solver then applies)."""
        return False

    def statistic_specs(self, dim: int) -> tuple[Statistic, ...]:
        """The statistics a client sends for one function, for a decision variable of size dim."""
        raise NotImplementedError

    def statistics(self, fn: SampleFunction, w: np.ndarray, X, y, tau: float,
                   where: str) -> dict[str, np.ndarray]:
        """Client side: q_m(w_t, batch) as sums over the batch rows. ``where`` is for errors."""
        raise NotImplementedError

    def expression(self, stats: Mapping[str, cp.Expression], w: cp.Variable,
                   w_sq: cp.Expression) -> cp.Expression:
        """Server side: p_m(q, w), convex in ``w`` and affine in the entries of ``stats``.

        ``w_sq`` stands for |w|^2 and may only appear with a nonnegative coefficient.
        """
        raise NotImplementedError

    def initial_statistics(self, dim: int, tau: float, init: str) -> dict[str, np.ndarray]:
        """Fbar^(0): all zeros for ``init="zero"`` (eq. (Fs0bar) as written).

        For ``init="tau"`` (the convention behind the closed forms of Section V, PAPER_NOTES
        item 4) a builder whose curvature statistic is called ``quad`` starts it at tau, i.e.
        Fbar^(0)(w) = tau |w|^2.
        """
        out = {s.name: np.zeros(s.shape) for s in self.statistic_specs(dim)}
        if init == "tau" and "quad" in out:
            out["quad"] = np.full(out["quad"].shape, float(tau))
        return out

    def quadratic_form(self, stats: Mapping[str, np.ndarray]):
        """``(a, b, c)`` with p(q, w) = a |w|^2 + b.w + c when the curvature is a scalar a.

        None when the surrogate does not have that form (then only the CVXPY path applies).
        """
        return None

    def recentre(self, stats: Mapping[str, np.ndarray],
                 center: np.ndarray) -> Optional[dict[str, np.ndarray]]:
        """Statistics q' with p(q', v) = p(q, center + v) for every v, or None when the
        builder cannot give them (the default).

        The CVXPY subproblem is then solved in the step v = w - center about the round's
        point: its data are the surrogate's value, gradient and curvature there instead of
        the expanded constants (tau |w_t|^2 and more), which cancel and, far from the origin,
        leave the interior-point solver's answers "inaccurate".
        """
        return None

    def evaluate(self, stats: Mapping[str, np.ndarray], w) -> float:
        """p(q, w) at a numeric w (for reports and tests)."""
        w = np.asarray(w, dtype=float)
        consts = {k: cp.Constant(np.asarray(v, dtype=float)) for k, v in stats.items()}
        return float(self.expression(consts, cp.Constant(w), cp.Constant(w @ w)).value)


def recentre_quadratic(stats: Mapping[str, np.ndarray], center: np.ndarray) -> dict:
    """p(q, w) = sum(quad * w^2) + lin.w + const (quad a scalar or a vector) about ``center``:
    the statistics of v -> p(q, center + v), i.e. lin + 2 quad center and p(q, center)."""
    c = np.asarray(center, dtype=float)
    quad = np.asarray(stats["quad"], dtype=float)
    lin = np.asarray(stats["lin"], dtype=float)
    const = float(stats["const"]) + float(lin @ c) + float(np.sum(quad * (c * c)))
    return {"const": np.asarray(const), "lin": lin + 2.0 * quad * c, "quad": quad}


def proximal_linear_statistics(value_sums, grads, n: int, w: np.ndarray, nt, ww=None):
    """(const, lin, quad) of :class:`ProximalLinear` over a batch of n rows (eq. (fsmbar)):
    quad = n tau, lin = g - 2 n tau w_t, const = v - g.w_t + n tau |w_t|^2 with v the sum of
    the values and g = n grad the sum of the gradients. One function (``grads`` (d,), scalars
    ``value_sums`` and ``nt``) or K of them at once (``grads`` (K, d), ``value_sums`` and
    ``nt`` (K,): a vector function's components or a run of functions,
    :mod:`ssca_solver.methods.ssca.client`), each row the same floats as on its own.
    ``ww``: |w_t|^2 when the caller has it."""
    lin = np.multiply(grads, n)                # g = n grad, the batch's gradient sums
    ww = w @ w if ww is None else ww
    if lin.ndim == 1:
        const = value_sums - lin @ w + nt * ww
        axpy(-2.0 * nt, w, lin)                # lin = g - 2 n tau w, in place
    else:
        # one dot product per row, as one function's (a matrix-vector product may round
        # differently)
        const = value_sums - np.array([row @ w for row in lin]) + nt * ww
        lin -= np.multiply.outer(2.0 * nt, w)
    return const, lin, nt


class ProximalLinear(SurrogateBuilder):
    """The proximal-linear surrogate of eqs. (fs0bar) and (fsmbar).

    fbar(w, w_t, x) = f(w_t, x) + grad f(w_t, x)^T (w - w_t) + tau |w - w_t|^2.

    Expanded so that it is affine in the statistics (the form of eqs. (B), (C), (A)): over a
    batch of n rows with sums v = sum f, g = sum grad f,

        p(q, w) = quad |w|^2 + lin.w + const,
        quad = n tau,  lin = g - 2 n tau w_t,  const = v - g.w_t + n tau |w_t|^2.

    The paper's eq. (fs0bar) for the objective omits the value term f(w_t, x); it changes no
    minimiser, and keeping it makes the surrogate's value comparable with F_0 in reports.
    Messages carry d + 2 floats per function.
    """

    def __init__(self, tau: Optional[float] = None):
        if tau is not None and not (np.isfinite(tau) and tau > 0):
            raise ValueError(f"ProximalLinear: tau must be > 0, got {tau!r}")
        self.tau = tau

    def statistic_specs(self, dim):
        return (Statistic("const", ()), Statistic("lin", (dim,)), Statistic("quad", (), True))

    def statistics(self, fn, w, X, y, tau, where):
        n = X.shape[0]
        values, grad = checked_value_and_grad(fn, w, X, y, where)
        const, lin, quad = proximal_linear_statistics(values.sum(), grad, n, w, n * tau)
        return {"const": np.asarray(const), "lin": lin, "quad": np.asarray(quad)}

    def expression(self, stats, w, w_sq):
        return stats["quad"] * w_sq + stats["lin"] @ w + stats["const"]

    @property
    def scalar_curvature(self) -> bool:
        # a subclass that rewrites the expression no longer promises the quadratic form
        return type(self).expression is ProximalLinear.expression

    def quadratic_form(self, stats):
        return float(stats["quad"]), np.asarray(stats["lin"]), float(stats["const"])

    def recentre(self, stats, center):
        # a subclass that rewrites the expression keeps the default (None)
        return recentre_quadratic(stats, center) if self.scalar_curvature else None

    def evaluate(self, stats, w):
        w = np.asarray(w, dtype=float)
        a, b, c = self.quadratic_form(stats)
        return a * float(w @ w) + float(b @ w) + c

    def __repr__(self):
        return f"{type(self).__name__}(tau={self.tau})"


class Linearization(ProximalLinear):
    """The affine surrogate of an equality constraint ``f == b``: the linearisation

        fbar(w, w_t, x) = f(w_t, x) + grad f(w_t, x)^T (w - w_t),

    the proximal-linear surrogate with tau = 0 (statistics quad = 0, lin = g, const =
    v - g.w_t: the same d + 2 floats per function). An equality's surrogate must be affine: the
    set {w : p(w) = b} of a strongly convex p is a sphere, not a convex set. Algorithm 2 keeps
    the subproblem well posed through the objective's curvature and the two-sided slack
    |p(w) - b| <= s; the recursive average of affine surrogates stays affine. Assumption 2's
    strong convexity concerns the objective and the inequalities' surrogates only.
    """

    strongly_convex = False

    def __init__(self):
        self.tau = 0.0                       # its own tau: the solve's tau never applies

    def initial_statistics(self, dim, tau, init):
        """Fbar^(0) = 0 whatever ``init`` (an affine surrogate has no tau |w|^2 start)."""
        return {s.name: np.zeros(s.shape) for s in self.statistic_specs(dim)}

    def __repr__(self):
        return "Linearization()"


class DiagonalCurvature(SurrogateBuilder):
    """A proximal-linear surrogate with a diagonal curvature estimate added.

    fbar(w, w_t, x) = f(w_t, x) + grad f(w_t, x)^T (w - w_t)
                      + sum_k (max(h_k, 0) / 2 + tau) (w_k - w_{t,k})^2,

    where h = ``hess_diag(w_t, X, y)`` is the diagonal of the Hessian of the batch mean of f
    (or any nonnegative curvature estimate, e.g. Gauss-Newton). It satisfies Assumption 2 of the
    paper (same gradient at w_t; strongly convex with modulus 2 tau) and, when h is accurate,
    follows the local shape of f far better than a scalar tau, which lets the solver take
    longer steps along flat coordinates. Statistics: const (1), lin (d), quad (d, >= 0).

    Args:
      hess_diag: ``hess_diag(w, X, y) -> ndarray (d,)``; negative entries are clipped to 0 so
        the surrogate stays convex.
      tau: proximal weight; None uses the solve's tau.
    """

    def __init__(self, hess_diag: Callable, tau: Optional[float] = None):
        if not callable(hess_diag):
            raise TypeError("DiagonalCurvature needs a callable hess_diag(w, X, y) -> (d,)")
        if tau is not None and not (np.isfinite(tau) and tau > 0):
            raise ValueError(f"DiagonalCurvature: tau must be > 0, got {tau!r}")
        self.hess_diag = hess_diag
        self.tau = tau

    def statistic_specs(self, dim):
        return (Statistic("const", ()), Statistic("lin", (dim,)), Statistic("quad", (dim,), True))

    def statistics(self, fn, w, X, y, tau, where):
        from ..errors import UserFunctionError

        n = X.shape[0]
        values, grad = checked_value_and_grad(fn, w, X, y, where)
        v, g = values.sum(), n * grad
        try:
            h = np.asarray(self.hess_diag(w, X, y), dtype=float)
        except Exception as exc:
            raise UserFunctionError(f"{fn.name}: hess_diag raised on {where}: {exc!r}") from exc
        if h.shape != w.shape or not np.all(np.isfinite(h)):
            raise UserFunctionError(f"{fn.name}: hess_diag must return finite values of shape "
                                    f"{w.shape}; got shape {h.shape} on {where}")
        q = n * (np.maximum(h, 0.0) / 2.0 + tau)
        return {"const": np.asarray(v - g @ w + q @ (w * w)), "lin": g - 2.0 * q * w, "quad": q}

    def expression(self, stats, w, w_sq):
        return cp.sum(cp.multiply(stats["quad"], cp.square(w))) + stats["lin"] @ w + stats["const"]

    def recentre(self, stats, center):
        if type(self).expression is not DiagonalCurvature.expression:
            return None
        return recentre_quadratic(stats, center)

    def evaluate(self, stats, w):
        w = np.asarray(w, dtype=float)
        return float(stats["quad"] @ (w * w) + stats["lin"] @ w + stats["const"])

    def __repr__(self):
        return f"DiagonalCurvature(tau={self.tau})"


def check_strongly_convex(builder: SurrogateBuilder, stats: Mapping[str, np.ndarray], dim: int,
                          name: str, seed: int = 0) -> None:
    """Raise ModelError unless p(q, .) curves upwards along random directions (Assumption 2.2).

    A custom builder without curvature makes Problem 2 unbounded; interior-point solvers then
    return huge points flagged only as "inaccurate". Checked once, on the first message.
    """
    from ..errors import ModelError

    form = builder.quadratic_form(stats) if builder.scalar_curvature else None
    if form is not None:
        # a |w|^2 + b.w + c: strongly convex iff a > 0, read exactly (a second difference
        # through the expression loses a to rounding once const ~ a |w_t|^2 is large, and
        # would refuse the default surrogates far from the origin)
        if not form[0] > 0:
            raise ModelError(f"the surrogate of {name} ({builder!r}) is not strongly convex: its "
                             f"curvature is {form[0]:.3g}. Assumption 2 needs strong convexity "
                             "(e.g. a tau |w - w_t|^2 term), or the subproblem is unbounded.")
        return

    def p(v):  # through the CVXPY expression: exactly what the subproblem will minimise
        return SurrogateBuilder.evaluate(builder, stats, v)

    rng = np.random.default_rng(seed)
    w = rng.standard_normal(dim)
    p0 = p(w)
    for u in rng.standard_normal((3, dim)):
        u /= np.linalg.norm(u)
        second = p(w + u) + p(w - u) - 2 * p0
        if not second > 1e-12 * max(1.0, abs(p0)):
            raise ModelError(f"the surrogate of {name} ({builder!r}) is not strongly convex: its "
                             f"second difference along a direction is {second:.3g}. Assumption 2 "
                             "needs strong convexity (e.g. a tau |w - w_t|^2 term), or the "
                             "subproblem is unbounded.")


def check_all_strongly_convex(builders, stats, dim: int, names) -> None:
    """:func:`check_strongly_convex` (Assumption 2) of every function whose surrogate must be
    strongly convex (not an equality's affine one): the proximal-linear builders' curvature
    ``quad`` read for all of them at once where ``stats`` carry it stacked (a ``stacked``
    method, :class:`ssca_solver.methods.ssca.step.Statistics`: one number per function),
    the others (and any whose quad is not positive, for its error) one by one."""
    quad = stats.stacked("quad") if hasattr(stats, "stacked") else None
    fine = np.zeros(len(builders), dtype=bool)
    if quad is not None and quad.shape == (len(builders),):
        fine = np.fromiter((type(b) is ProximalLinear for b in builders), bool,
                           len(builders)) & (quad > 0)
    for m, (b, name) in enumerate(zip(builders, names)):
        if b.strongly_convex and not fine[m]:
            check_strongly_convex(b, stats[m], dim, name)


def builder_of(fn: SampleFunction, equality: bool = False) -> SurrogateBuilder:
    """The builder a function uses: its own, or the proximal-linear default; for an equality
    constraint the :class:`Linearization` (a surrogate of its own is refused there, since it
    would not be affine)."""
    from ..errors import ModelError

    b = fn.surrogate if fn.surrogate is not None else ProximalLinear()
    if not isinstance(b, SurrogateBuilder):
        raise TypeError(f"{fn.name}: surrogate must be a SurrogateBuilder, got {type(b).__name__}")
    if equality:
        if fn.surrogate is not None and not isinstance(fn.surrogate, Linearization):
            raise ModelError(f"{fn.name} == ...: an equality constraint takes the affine "
                             f"surrogate ss.Linearization(), not {fn.surrogate!r} (a surrogate "
                             "with curvature would make {w : p(w) = b} a non-convex set); "
                             "remove its surrogate= or write two inequalities")
        return Linearization()
    return b
