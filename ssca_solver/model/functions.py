"""Per-sample functions f_m(w, x_n) and the stochastic constraints built from them.

F_m(w) = (1/N) sum_n f_m(w, x_n) (eq. (Fs0) and the F_m of Problem 3). The user supplies the
per-sample values and the gradient of their mean over a set of rows; only differential privacy
needs per-sample gradients (``per_sample_grad``, or ``grad`` on each row alone).
"""

from __future__ import annotations

import functools
import math
import numbers
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from ..errors import UserFunctionError


class SampleFunction:
    """A function f(w, x) known through its values on rows and the gradient of their mean.

    Args:
      value: ``value(w, X, y) -> ndarray (n,)``, the per-sample values f(w, x_n) for the n rows
        of ``X`` (and targets ``y``, None when the data have none).
      grad: ``grad(w, X, y) -> ndarray (d,)``, the gradient of ``mean(value(w, X, y))`` w.r.t. w.
      name: used in reports and error messages.
      surrogate: the surrogate builder (:mod:`ssca_solver.model.surrogates`); default: proximal-linear,
        eqs. (fs0bar)/(fsmbar), with the solve's ``tau``.
      value_and_grad: optional ``value_and_grad(w, X, y) -> (values (n,), grad (d,))`` computing
        both in one pass (e.g. one forward and one backward pass of a network); clients use it
        instead of two separate calls when it is given.
      hess: optional ``hess(w, X, y) -> ndarray (d, d)``, the Hessian of ``mean(value(w, X,
        y))`` w.r.t. w, or a positive semidefinite approximation of it (a Gauss-Newton form).
        When every stochastic function has one and d is small enough, full-batch rounds carry
        it and the server's step is Newton's SQP step (``hessian="auto"``, see
        :class:`~ssca_solver.SSCAOptions`) instead of a quasi-Newton one.
      hessp: optional ``hessp(w, X, y, V) -> ndarray (d, k)``, the same Hessian (or
        approximation) times the k columns of ``V`` (d, k), without forming it: e.g.
        ``X.T @ (s[:, None] * (X @ V)) / n`` for a generalised linear model. Above the size
        where whole Hessians are sent, full-batch rounds carry the Hessian's products with k
        server-chosen directions, the statistics of a randomized Nystrom sketch of the
        Lagrangian's Hessian (``hessian="sketch"``); a function with only ``hess`` is
        multiplied by V on the client, and one with only ``hessp`` gives its whole Hessian
        as ``hessp(w, X, y, I)`` where that is sent.
      convexity: optional declaration of how f(w, x) depends on w for every row x, in CVXPY's
        words: "convex", "concave" or "affine" (None: unknown, the default). When the
        objective is convex, every inequality's function convex and every equality's affine
        (the deterministic terms and the domain are convex by construction), the problem is
        convex and the result bounds the objective's suboptimality by weak duality
        (:func:`ssca_solver.diagnostics.kkt.objective_gap`). The library does not check the
        declaration; a wrong one makes that bound wrong.
      per_sample_grad: optional ``per_sample_grad(w, X, y) -> ndarray (n, d)``, the gradient
        of f(w, x_n) for each row (not divided by n). Only differential privacy needs it
        (``solve(..., privacy=ss.Privacy(...))`` clips each row's contribution); without it
        the clients call ``grad`` on each row alone.

    ``f <= U`` (or ``f >= L``) makes a stochastic constraint F(w) <= U of Problem 3, and
    ``f == b`` the equality F(w) = b.
    The ``w`` the callables receive is read-only (shared by the clients of a round).
    """

    convexity: Optional[str] = None
    hessp: Optional[Callable] = None
    per_sample_grad: Optional[Callable] = None

    def __init__(self, value: Callable, grad: Callable, name: Optional[str] = None,
                 surrogate=None, value_and_grad: Optional[Callable] = None,
                 hess: Optional[Callable] = None, convexity: Optional[str] = None,
                 hessp: Optional[Callable] = None,
                 per_sample_grad: Optional[Callable] = None):
        if not callable(value) or not callable(grad):
            raise TypeError("SampleFunction needs callables value(w, X, y) and grad(w, X, y)")
        self.value = value
        self.grad = grad
        self.name = name or callable_name(value)
        self.surrogate = surrogate
        if value_and_grad is not None and not callable(value_and_grad):
            raise TypeError("value_and_grad must be callable(w, X, y) -> (values, grad)")
        self.value_and_grad = value_and_grad
        if hess is not None and not callable(hess):
            raise TypeError("hess must be callable(w, X, y) -> (d, d) Hessian of the batch mean")
        self.hess = hess
        if hessp is not None and not callable(hessp):
            raise TypeError("hessp must be callable(w, X, y, V) -> (d, k) Hessian times V")
        self.hessp = hessp
        if per_sample_grad is not None and not callable(per_sample_grad):
            raise TypeError("per_sample_grad must be callable(w, X, y) -> (n, d) gradients "
                            "of the rows")
        self.per_sample_grad = per_sample_grad
        self.convexity = checked_convexity(convexity)

    @classmethod
    def from_jax(cls, loss: Callable, name: Optional[str] = None, **options):
        """A SampleFunction from the JAX loss ``loss(w, x, y) -> scalar`` of one sample, by
        automatic differentiation: :func:`ssca_solver.model.autodiff.from_jax` (options
        ``batched``, ``buckets``, ``dtype``, ``surrogate``; docs/autodiff.md)."""
        from .autodiff_jax import from_jax

        return from_jax(loss, name, **options)

    @classmethod
    def from_torch(cls, loss: Callable, name: Optional[str] = None, **options):
        """A SampleFunction from the PyTorch loss ``loss(w, x, y) -> scalar`` of one sample, by
        automatic differentiation: :func:`ssca_solver.model.autodiff.from_torch` (options
        ``batched``, ``dtype``, ``surrogate``; docs/autodiff.md)."""
        from .autodiff_torch import from_torch

        return from_torch(loss, name, **options)

    def __le__(self, bound) -> "StochasticConstraint":
        return StochasticConstraint(self, _as_bound(bound, self.name, "<="))

    def __ge__(self, bound) -> "StochasticConstraint":
        """``f >= L`` is modelled as ``-f <= -L`` (a constraint of Problem 3)."""
        return StochasticConstraint(-self, -_as_bound(bound, self.name, ">="))

    def __eq__(self, bound):
        """``f == b``: the equality constraint F(w) = b (a number); its surrogate is affine
        (:class:`~ssca_solver.model.surrogates.Linearization`) and Algorithm 2 gives it a
        two-sided slack |F - b| <= s with a free-sign multiplier. Compared with anything but a
        number, a SampleFunction is equal only to itself."""
        if isinstance(bound, SampleFunction) or not _is_number(bound):
            return NotImplemented
        return StochasticConstraint(self, _as_bound(bound, self.name, "=="), equality=True)

    def __ne__(self, other):
        return NotImplemented        # identity, as for any object (f != 0.5 is no constraint)

    def __neg__(self) -> "SampleFunction":
        """-f, with the default surrogate (a custom builder may depend on f's curvature)."""
        from ..errors import ModelError
        from .surrogates import ProximalLinear

        if self.surrogate is not None and not isinstance(self.surrogate, ProximalLinear):
            raise ModelError(f"cannot negate {self.name}: it has a custom surrogate "
                             f"({self.surrogate!r}) whose curvature would change sign; write "
                             "the constraint as g <= U with g and its surrogate defined directly")
        value, grad, vg, hess = self.value, self.grad, self.value_and_grad, self.hess
        hessp, rows = self.hessp, self.per_sample_grad

        def neg_vg(w, X, y):
            v, g = vg(w, X, y)
            return -np.asarray(v, dtype=float), -np.asarray(g, dtype=float)

        return SampleFunction(lambda w, X, y: -np.asarray(value(w, X, y), dtype=float),
                              lambda w, X, y: -np.asarray(grad(w, X, y), dtype=float),
                              name=f"-{self.name}", surrogate=self.surrogate,
                              value_and_grad=None if vg is None else neg_vg,
                              hess=None if hess is None else
                              (lambda w, X, y: -np.asarray(hess(w, X, y), dtype=float)),
                              convexity=NEGATED[self.convexity],
                              hessp=None if hessp is None else
                              (lambda w, X, y, V: -np.asarray(hessp(w, X, y, V), dtype=float)),
                              per_sample_grad=None if rows is None else
                              (lambda w, X, y: -np.asarray(rows(w, X, y), dtype=float)))

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return f"SampleFunction(name={self.name!r})"


#: the convexity of -f from that of f
NEGATED = {None: None, "affine": "affine", "convex": "concave", "concave": "convex"}


def checked_convexity(value) -> Optional[str]:
    """``convexity`` of a SampleFunction: None, "convex", "concave" or "affine"."""
    if value is None or (isinstance(value, str) and value in ("convex", "concave", "affine")):
        return value
    raise ValueError(f"convexity must be 'convex', 'concave', 'affine' or None, got {value!r}")


def _is_number(value) -> bool:
    """A real number or a 0-d array of one (what a constraint's bound may be), not a bool."""
    if isinstance(value, np.ndarray):
        return value.ndim == 0 and value.dtype.kind in "iuf"
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def callable_name(fn, default: str = "f") -> str:
    """The name a user's callable goes by in reports and errors: its ``__name__`` (a lambda's:
    ``default``), that of the function a ``functools.partial`` wraps, or a callable object's
    class name (a ``torch.nn.Module``, say)."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    name = getattr(fn, "__name__", None)
    if name is None and callable(fn):
        name = type(fn).__name__
    return default if not name or name == "<lambda>" else str(name)


def _as_bound(bound, name: str = "f", op: str = "<=") -> float:
    """The bound U of ``f <= U`` (or L of ``f >= L``, b of ``f == b``) as a finite Python
    float; errors name the constraint (``name``, ``op``: the function's name and relation).

    Accepts a real number: int, float, a NumPy integer or floating scalar, or a 0-d array of
    one. Refuses strings, bools, None, complex numbers and sequences (TypeError) instead of
    letting ``float()`` turn ``"0.5"`` or ``True`` into a bound; NaN and inf are a ValueError.
    """
    if isinstance(bound, np.ndarray) and bound.ndim == 0:
        bound = bound[()]  # a 0-d array counts as the scalar it holds
    if isinstance(bound, (bool, np.bool_)) or not isinstance(bound, numbers.Real):
        got = (f"an array of shape {bound.shape}" if isinstance(bound, np.ndarray)
               else f"{type(bound).__name__} {bound!r}")
        raise TypeError(f"{name} {op} ...: a stochastic constraint bound must be a real "
                        f"number (int, float or a "
                        f"NumPy scalar), got {got}; write e.g. f <= 0.5, one constraint per "
                        "bound")
    b = float(bound)
    if not np.isfinite(b):
        raise ValueError(f"{name} {op} {bound!r}: a stochastic constraint bound must be "
                         f"finite, got {bound!r}; drop "
                         "the constraint if it should not bind")
    return b


@dataclass(frozen=True, eq=False)
class StochasticConstraint:
    """The constraint F(w) <= bound (``f <= U``), or F(w) = bound with ``equality`` (``f == b``):
    F_m of Problem 3 is F - bound."""

    function: SampleFunction
    bound: float
    equality: bool = False

    @property
    def name(self) -> str:
        return f"{self.function.name} {'==' if self.equality else '<='} {self.bound:g}"


# -- checks on what user functions return ---------------------------------------------------------

def _call(fn: SampleFunction, method: str, w, X, y, where: str):
    try:
        return getattr(fn, method)(w, X, y)
    except Exception as exc:
        hint = ""
        if isinstance(exc, ValueError) and "read-only" in str(exc):
            hint = (" (the w handed to user functions is shared by the clients and read-only: "
                    "copy it, e.g. w = w.copy(), before changing it in place)")
        raise UserFunctionError(f"{fn.name}.{method} raised on {where}: {exc!r}{hint}") from exc


def _valid_values(name: str, v, n: int, where: str) -> np.ndarray:
    v = np.asarray(v, dtype=float)
    if v.shape != (n,):
        raise UserFunctionError(f"{name}.value must return per-sample values of shape ({n},) "
                                f"for {n} rows; got shape {v.shape} on {where}")
    if not math.isfinite(float(np.add.reduce(v))) and not np.all(np.isfinite(v)):
        # (the sum is finite whenever every value is: one reduction in the usual case)
        bad = int(np.flatnonzero(~np.isfinite(v))[0])
        raise UserFunctionError(f"{name}.value returned a non-finite value ({v[bad]}) at row "
                                f"{bad} of the batch on {where}")
    return v


def _valid_grad(name: str, g, d: int, where: str) -> np.ndarray:
    g = np.asarray(g, dtype=float)
    if g.shape != (d,):
        raise UserFunctionError(f"{name}.grad must return the gradient of the batch mean, of "
                                f"shape ({d},) (the problem's dim); got shape {g.shape} on {where}")
    if not math.isfinite(float(np.add.reduce(g))) and not np.all(np.isfinite(g)):
        raise UserFunctionError(f"{name}.grad returned a non-finite entry on {where}")
    return g


def checked_values(fn: SampleFunction, w, X, y, n: int, where: str) -> np.ndarray:
    """Call ``fn.value`` and check shape (n,) and finiteness; ``where`` names client and round."""
    return _valid_values(fn.name, _call(fn, "value", w, X, y, where), n, where)


def checked_grad(fn: SampleFunction, w, X, y, d: int, where: str) -> np.ndarray:
    """Call ``fn.grad`` and check shape (d,) and finiteness; ``where`` names client and round."""
    return _valid_grad(fn.name, _call(fn, "grad", w, X, y, where), d, where)


def checked_row_grads(fn: SampleFunction, w, X, y, where: str) -> np.ndarray:
    """(n, d): the gradient of f(w, x_n) for each row of X: ``fn.per_sample_grad`` when the
    function has one (shape and finiteness checked), else ``fn.grad`` on each row alone."""
    n, d = X.shape[0], w.size
    if getattr(fn, "per_sample_grad", None) is None:
        return np.array([checked_grad(fn, w, X[i:i + 1], None if y is None else y[i:i + 1], d,
                                      f"{where}, row {i} alone") for i in range(n)]
                        ).reshape(n, d)
    G = np.asarray(_call(fn, "per_sample_grad", w, X, y, where), dtype=float)
    if G.shape != (n, d):
        raise UserFunctionError(f"{fn.name}.per_sample_grad must return one gradient per row, "
                                f"of shape ({n}, {d}); got shape {G.shape} on {where}")
    if not np.all(np.isfinite(G)):
        raise UserFunctionError(f"{fn.name}.per_sample_grad returned a non-finite entry on "
                                f"{where}")
    return G


def checked_hess(fn: SampleFunction, w, X, y, d: int, where: str) -> np.ndarray:
    """Call ``fn.hess`` and check shape (d, d) and finiteness; the symmetric part."""
    H = np.asarray(_call(fn, "hess", w, X, y, where), dtype=float)
    if H.shape != (d, d):
        raise UserFunctionError(f"{fn.name}.hess must return the Hessian of the batch mean, of "
                                f"shape ({d}, {d}); got shape {H.shape} on {where}")
    if not np.all(np.isfinite(H)):
        raise UserFunctionError(f"{fn.name}.hess returned a non-finite entry on {where}")
    return 0.5 * (H + H.T)


def has_curvature(fn) -> bool:
    """Whether ``fn`` gives its Hessian: a ``hess`` or a ``hessp``."""
    return fn.hess is not None or getattr(fn, "hessp", None) is not None


def checked_hessp(fn: SampleFunction, w, X, y, V: np.ndarray, where: str) -> np.ndarray:
    """The batch mean's Hessian times the columns of ``V`` (d, k): ``fn.hessp`` when it has
    one (shape (d, k) and finiteness checked), else ``fn.hess`` (checked) times V."""
    hessp = getattr(fn, "hessp", None)
    if hessp is None:
        return checked_hess(fn, w, X, y, V.shape[0], where) @ V
    try:
        P = np.asarray(hessp(w, X, y, V), dtype=float)
    except Exception as exc:
        raise UserFunctionError(f"{fn.name}.hessp raised on {where}: {exc!r}") from exc
    if P.shape != V.shape:
        raise UserFunctionError(f"{fn.name}.hessp(w, X, y, V) must return the Hessian of the "
                                f"batch mean times V, of V's shape {V.shape}; got shape "
                                f"{P.shape} on {where}")
    if not np.all(np.isfinite(P)):
        raise UserFunctionError(f"{fn.name}.hessp returned a non-finite entry on {where}")
    return P


def whole_hessian(fn: SampleFunction, w, X, y, d: int, where: str) -> np.ndarray:
    """The batch mean's (d, d) Hessian, symmetric: ``fn.hess``, or ``fn.hessp`` of the
    identity."""
    if fn.hess is not None:
        return checked_hess(fn, w, X, y, d, where)
    H = checked_hessp(fn, w, X, y, np.eye(d), where)
    return 0.5 * (H + H.T)


#: the relative step of the central differences of a gradient that stand in for the Hessian
#: of a function that gives none (:func:`difference_hessians`): eps^(1/3), which balances the
#: differences' truncation error (h^2 times the third derivative) against the rounding of the
#: gradients (eps |grad| / h)
HESSIAN_STEP = float(np.cbrt(np.finfo(float).eps))


def vector_groups(fns) -> list:
    """[(vector, i, k)]: the positions i in ``fns`` (an integer array) of the components k (an
    integer array) of each VectorSampleFunction with at least two of its components there."""
    by = {}
    for i, fn in enumerate(fns):
        of = getattr(fn, "component_of", None)
        if of is not None:
            group = by.get(id(of[0]))
            if group is None:
                group = by[id(of[0])] = (of[0], [], [])
            group[1].append(i)
            group[2].append(of[1])
    return [(vec, np.array(idx, dtype=np.intp), np.array(ks, dtype=np.intp))
            for vec, idx, ks in by.values() if len(idx) >= 2]


def _gradients_or_none(fns, groups, w, X, y, d: int) -> tuple:
    """(G, ok): row i of G (len(fns), d) is function i's gradient at the difference point
    ``w`` where ``ok[i]``; not ok where the function fails there (its call raises, e.g. a
    fractional power of a negative number; a wrong shape; a non-finite entry). The
    components of a vector function (``groups``, :func:`vector_groups`) are read from one
    evaluation of its Jacobian, each row not ok where it is not finite. A failure at the
    round's own point still raises, from the statistics computed there."""
    G = np.zeros((len(fns), d))
    ok = np.zeros(len(fns), dtype=bool)
    done = np.zeros(len(fns), dtype=bool)
    for vec, idx, ks in groups:
        done[idx] = True
        try:
            J = vec.jacobian(w, X, y)
        except UserFunctionError:
            continue                         # every component fails at w
        G[idx] = J[ks]
        ok[idx] = np.all(np.isfinite(G[idx]), axis=1)
    rest = np.flatnonzero(~done)
    for i in rest.tolist():
        # checked inline (hundreds of constraints, 2 d points each): a failure of the
        # user's call or a wrong shape is not ok; a non-finite entry below, for all at once
        try:
            g = np.asarray(fns[i].grad(w, X, y), dtype=float)
        except Exception:
            continue
        if g.shape == (d,):
            G[i], ok[i] = g, True
    if rest.size:
        ok[rest] &= np.isfinite(G[rest]).all(axis=1)
    G[~ok] = 0.0
    return G, ok


def _difference(fns, w, X, y, steps, where: str) -> np.ndarray:
    """(len(fns), d, k): for each function of ``fns``, the (d, k) matrix whose column j is the
    central difference (grad(w + v_j) - grad(w - v_j)) / 2 of its gradient along the step v_j
    (the columns of ``steps``, (d, k)), the one-sided difference where the function fails
    at one of the two points, 0 where it fails at both. The points are the outer loop: a
    function that caches its evaluation per point (the components of a VectorSampleFunction
    share one) computes each point once."""
    d, k = steps.shape
    out = np.empty((len(fns), d, k))
    at_w = {}                      # a function's gradient at w, once, where a side fails
    groups = vector_groups(fns)
    for j in range(k):
        v = steps[:, j]
        plus, okp = _gradients_or_none(fns, groups, w + v, X, y, d)
        minus, okm = _gradients_or_none(fns, groups, w - v, X, y, d)
        # (both failing: 0, no curvature along v_j: tau and the merit hold the step)
        out[:, :, j] = np.where((okp & okm)[:, None], 0.5 * (plus - minus), 0.0)
        for i in np.flatnonzero(okp != okm):
            if i not in at_w:
                at_w[i] = checked_grad(fns[i], w, X, y, d, where)
            g0 = at_w[i]
            out[i, :, j] = (plus[i] - g0) if okp[i] else (g0 - minus[i])
    return out


def difference_hessians(fns, w, X, y, where: str) -> list:
    """The batch means' (d, d) Hessians of the functions ``fns`` (which give no ``hess`` or
    ``hessp``) from central differences of their gradients: column k is
    (grad(w + h_k e_k) - grad(w - h_k e_k)) / (2 h_k), h_k = HESSIAN_STEP max(1, |w_k|),
    and the matrix returned its symmetric part; 2 d gradient calls per function, on the
    client (the Newton model's statistics, :mod:`ssca_solver.methods.ssca.newton`: the
    curvature it adds to the surrogates of eqs. (fs0bar) and (fsmbar)). A one-sided
    difference where one of the two points is outside a function's domain (it fails there);
    a zero column where both are (the model then has none of that function's curvature along
    e_k: the proximal weight tau and the exact-penalty acceptance still hold the step)."""
    w = np.asarray(w, dtype=float)
    h = HESSIAN_STEP * np.maximum(1.0, np.abs(w))
    C = _difference(fns, w, X, y, np.diag(h), where) / h
    return list(0.5 * (C + C.transpose(0, 2, 1)))


def difference_products(fns, w, X, y, V: np.ndarray, where: str) -> list:
    """The batch means' Hessians of ``fns`` times the columns of ``V`` (d, k), from central
    differences of their gradients along each column v: (grad(w + h v) - grad(w - h v)) /
    (2 h), h = HESSIAN_STEP max(1, |w|) / |v| (the sketch's products,
    :func:`ssca_solver.methods.ssca.newton.sketch_model`, for functions without ``hess`` or
    ``hessp``; its model is added to the surrogates of eqs. (fs0bar) and (fsmbar)); 2 k
    gradient calls per function."""
    w = np.asarray(w, dtype=float)
    V = np.asarray(V, dtype=float)
    norms = np.linalg.norm(V, axis=0)
    h = HESSIAN_STEP * max(1.0, float(np.linalg.norm(w))) / np.where(norms > 0, norms, 1.0)
    return list(_difference(fns, w, X, y, V * h, where) / h)


def mean_value_or_nan(fn: SampleFunction, w, X, y, n: int, where: str) -> float:
    """The batch mean of ``fn.value`` at ``w``, NaN when a value is not finite (``w`` outside
    the function's domain: a difference step may leave it); a wrong shape or an exception
    still raises UserFunctionError."""
    v = np.asarray(_call(fn, "value", w, X, y, where), dtype=float)
    if v.shape != (n,):
        _valid_values(fn.name, v, n, where)
    m = float(v.mean()) if np.all(np.isfinite(v)) else float("nan")
    return m if np.isfinite(m) else float("nan")


def raw_value_and_grad(fn: SampleFunction, w, X, y):
    """(per-sample values, mean gradient) as ``fn`` returns them, unchecked (one call when
    ``fn.value_and_grad`` exists): for callers that check many functions' answers at once and
    fall back to :func:`checked_value_and_grad`, whose errors name the function."""
    if fn.value_and_grad is None:
        return fn.value(w, X, y), fn.grad(w, X, y)
    return fn.value_and_grad(w, X, y)


def checked_value_and_grad(fn: SampleFunction, w, X, y, where: str):
    """(per-sample values, mean gradient), checked; one call when ``fn.value_and_grad`` exists."""
    n, d = X.shape[0], w.size
    if fn.value_and_grad is None:
        return checked_values(fn, w, X, y, n, where), checked_grad(fn, w, X, y, d, where)
    v, g = _call(fn, "value_and_grad", w, X, y, where)
    return _valid_values(fn.name, v, n, where), _valid_grad(fn.name, g, d, where)


#: The relative steps of a careful central difference, largest first: eps^(1/3) (the step that
#: balances truncation, ~ h^2 |f'''|, against rounding, ~ eps |f| / h, for a function of unit
#: scale) times 10, 1, 0.1, ..., 1e-8. A step is one of these times :func:`step_scale`.
DIFFERENCE_STEPS = np.cbrt(np.finfo(float).eps) * 10.0 ** np.arange(1, -9, -1)
CHECK_GRAD_GOOD = 1e-8   # check_grad stops trying steps along a direction that agrees this well


def step_scale(w, u) -> float:
    """max(1, largest |w_i| over the coordinates that direction ``u`` moves): the size of w a
    step along u is relative to."""
    w, u = np.asarray(w, dtype=float), np.asarray(u, dtype=float)
    return max(1.0, float(np.max(np.abs(w[u != 0]), initial=0.0)))


def central_difference(F, g, w, delta):
    """One central difference along ``delta``, over the displacement actually taken: with
    D = (w + delta) - (w - delta) (w +- delta rounded to floats), returns
    ``(g . D / |D|, (F(w + delta) - F(w - delta)) / |D|, |D| / 2)``: the derivative along D by
    the gradient g and by the difference of the values ``F``, and the step h. Comparing both
    along the same D removes the error of rounding w + h u (relative eps |w| / h: 1 % at
    |w| = 5e7 and h = 1e-6). None when D = 0 (the step is lost in w's rounding)."""
    up, down = w + delta, w - delta
    D = up - down
    length = float(np.linalg.norm(D))
    if length == 0.0:
        return None
    return float(g @ D) / length, (F(up) - F(down)) / length, length / 2


def check_grad(fn: SampleFunction, w, X, y=None, eps: Optional[float] = None, seed=0,
               directions: Optional[int] = None) -> float:
    """Relative error between ``fn.grad`` and central finite differences of ``mean(fn.value)``.

    Like :func:`scipy.optimize.check_grad`, for a :class:`SampleFunction` on rows ``X, y``.
    With ``directions=None`` every coordinate is differenced; with an integer k, k random unit
    directions are used instead (cheap for large d).

    Steps (``eps=None``): along direction u, h = c :func:`step_scale` (w, u) (max(1, the largest
    |w_i| u moves)) with c = eps^(1/3) first, each difference taken over the displacement
    actually stored (:func:`central_difference`). When it agrees with the gradient within
    ``CHECK_GRAD_GOOD`` (1e-8) that is the direction's answer (2 evaluations, as one step);
    otherwise every c of :data:`DIFFERENCE_STEPS` (eps^(1/3) times 10, 1, ..., 1e-8) is tried
    and the direction takes the difference at the plateau: the shorter of the two consecutive
    steps whose differences are closest (longer steps carry truncation, shorter ones rounding;
    where both are small the differences stop changing; a difference of exactly 0, a step
    lost in the function's own rounding, is left out). A number ``eps`` is one absolute step
    h = eps along every direction, as in scipy (no scaling, no retry).

    Returns:
      ``|g - g_fd| / max(|g_fd|, 1e-8)`` (Euclidean norms; for directions, of the directional
      derivatives). Values around 1e-6 or below mean the gradient is right.
    """
    w = np.asarray(w, dtype=float)
    d = w.size
    n = np.asarray(X).shape[0]
    where = "check_grad"
    g = checked_grad(fn, w, X, y, d, where)

    def F(v):
        return float(np.mean(checked_values(fn, v, X, y, n, where)))

    if directions is None:
        basis = np.eye(d)
    else:
        rng = np.random.default_rng(seed)
        basis = rng.standard_normal((int(directions), d))
        basis /= np.linalg.norm(basis, axis=1, keepdims=True)
    an = basis @ g
    fd = an.copy()
    for k, u in enumerate(basis):
        if eps is not None:
            got = central_difference(F, g, w, float(eps) * u)
            if got is not None:
                an[k], fd[k] = got[0], got[1]
            continue
        s = step_scale(w, u)
        first = central_difference(F, g, w, DIFFERENCE_STEPS[1] * s * u)
        if first is not None and abs(first[0] - first[1]) <= CHECK_GRAD_GOOD * abs(first[0]):
            an[k], fd[k] = first[0], first[1]
            continue
        tried = [first if i == 1 else central_difference(F, g, w, c * s * u)
                 for i, c in enumerate(DIFFERENCE_STEPS)]
        # steps whose difference is exactly 0 lost w + h u in the function's own rounding
        # (e.g. float32 inside), unless every step sees no change
        tried = [got for got in tried if got is not None]
        moved = [got for got in tried if got[1] != 0.0]
        tried = moved if len(moved) >= 2 else tried
        if len(tried) >= 2:  # the plateau: the shorter of the two consecutive closest steps
            j = min(range(len(tried) - 1), key=lambda i: abs(tried[i][1] - tried[i + 1][1]))
            an[k], fd[k] = tried[j + 1][0], tried[j + 1][1]
        elif first is not None:
            an[k], fd[k] = first[0], first[1]
    return float(np.linalg.norm(an - fd) / max(np.linalg.norm(fd), 1e-8))
