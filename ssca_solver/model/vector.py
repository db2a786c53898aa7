"""K stochastic functions from one call: ``VectorSampleFunction``.

Many constraints of Problem 3 often come out of one computation: the loss of every class or
group from one forward pass, every row of a system of equations c(w) from one evaluation. As K
separate :class:`SampleFunction` objects each would repeat it. A ``VectorSampleFunction`` takes
one callable returning all K per-sample values (and one returning the K x d Jacobian of their
means), evaluates it once per client, batch and point, and hands its K components to the rest
of the library as ordinary SampleFunctions (``F[k]``): F_m(w) = (1/N) sum_n f_m(w, x_n) of
eq. (Fs0) / Problem 3 for m = k, with the same statistics, surrogates and checks as K separate
functions (the same iterates, tested).
"""

from __future__ import annotations

import functools
import threading
from typing import Callable, Optional, Sequence

import numpy as np

from ..errors import UserFunctionError
from .functions import (SampleFunction, StochasticConstraint, _as_bound, _call, callable_name,
                        checked_convexity)


class VectorSampleFunction:
    """K functions f_k(w, x), k = 0..K-1, known through one call on a batch of rows: the
    averages F_k(w) = (1/N) sum_n f_k(w, x_n) (eq. (Fs0)) of K stochastic constraints
    F_k(w) <= U_k of Problem 3 (or of equalities), each with the proximal-linear surrogate
    of eq. (fsmbar).

    Args:
      value: ``value(w, X, y) -> ndarray (n, K)``: the per-sample values of every component
        on the n rows of ``X``.
      jac: ``jac(w, X, y) -> ndarray (K, d)``: row k is the gradient of the batch mean of
        component k (the Jacobian of the K means).
      size: K, the number of components.
      name: used in reports and errors; component k is called ``name[k]``.
      value_and_jac: optional ``value_and_jac(w, X, y) -> (values (n, K), jacobian (K, d))``
        in one pass; used instead of the two calls when given.
      hess: optional ``hess(w, X, y) -> ndarray (K, d, d)``: the Hessian of each component's
        batch mean (or a positive semidefinite approximation), as a SampleFunction's ``hess``.
      convexity: "convex", "concave", "affine" or None for every component, or a sequence of
        K of them (see :class:`SampleFunction`).

    ``F <= U`` with U a number or K numbers gives the K constraints F_k(w) <= U_k of Problem 3
    (a tuple; ``Problem(constraints=...)`` takes it as it is or inside a list), ``F >= L`` and
    ``F == b`` likewise; ``F[k]`` is component k, a :class:`SampleFunction` (usable as an
    objective, in ``check_grad``, or in a constraint of its own).

    One evaluation serves every component at the same point and rows: each client (thread or
    process) keeps the last one. The components' values and gradients are checked one by one,
    as separate functions' are, so an error names the component.
    """

    def __init__(self, value: Callable, jac: Callable, size: int, name: Optional[str] = None,
                 value_and_jac: Optional[Callable] = None, hess: Optional[Callable] = None,
                 convexity=None):
        if not callable(value) or not callable(jac):
            raise TypeError("VectorSampleFunction needs callables value(w, X, y) -> (n, K) and "
                            "jac(w, X, y) -> (K, d)")
        if value_and_jac is not None and not callable(value_and_jac):
            raise TypeError("value_and_jac must be callable(w, X, y) -> (values, jacobian)")
        if hess is not None and not callable(hess):
            raise TypeError("hess must be callable(w, X, y) -> (K, d, d) Hessians")
        if (not isinstance(size, (int, np.integer)) or isinstance(size, bool)
                or int(size) < 1):
            raise ValueError(f"size must be a positive integer (the number of components), "
                             f"got {size!r}")
        self.size = int(size)
        self.value, self.jac, self.value_and_jac, self.hess = value, jac, value_and_jac, hess
        self.name = name or callable_name(value, "F")
        if convexity is None or isinstance(convexity, str):
            kinds = [checked_convexity(convexity)] * self.size
        else:
            kinds = [checked_convexity(c) for c in convexity]
            if len(kinds) != self.size:
                raise ValueError(f"{self.name}: convexity must be one value or {self.size} "
                                 f"(one per component), got {len(kinds)}")
        self._cache: dict = {}
        self.components = tuple(self._component(k, kinds[k]) for k in range(self.size))

    def _component(self, k: int, convexity) -> SampleFunction:
        part = functools.partial
        fn = SampleFunction(part(self._values_of, k), part(self._grad_of, k),
                            name=f"{self.name}[{k}]",
                            value_and_grad=part(self._value_and_grad_of, k),
                            hess=None if self.hess is None else part(self._hess_of, k),
                            convexity=convexity)
        fn.component_of = (self, k)      # a client reads consecutive components at once
        return fn

    # -- one evaluation for every component -------------------------------------------------
    def _slot(self) -> dict:
        """This thread's cache (threads of one process answer different clients at once)."""
        return self._cache.setdefault(threading.get_ident(), {})

    @staticmethod
    def _hit(entry, w, X, y) -> bool:
        return (entry is not None and _same_rows(entry[0], X) and _same_rows(entry[1], y)
                and entry[2].shape == w.shape and np.array_equal(entry[2], w))

    def evaluate(self, w, X, y=None) -> tuple[np.ndarray, np.ndarray]:
        """(values (n, K), Jacobian (K, d)) at ``w`` on the rows ``X, y``: the per-sample
        f_k(w, x_n) and the gradients of their batch means, from which each component's
        statistics of eq. (fsmbar) are summed; shapes checked. The last result again when the
        point and the rows are the same (a client evaluates its K components in turn)."""
        return self._parts(w, X, y, True, True)

    def values(self, w, X, y=None) -> np.ndarray:
        """The per-sample values (n, K) at ``w`` alone, the f_k(w, x_n) whose batch sums are
        the value part of eq. (fsmbar) (:meth:`evaluate`'s first part; with separate
        ``value`` and ``jac``, ``jac`` is not called: a difference of values)."""
        return self._parts(w, X, y, True, False)[0]

    def jacobian(self, w, X, y=None) -> np.ndarray:
        """The Jacobian (K, d) of the batch means at ``w`` alone, the gradients of
        eq. (fsmbar)'s linear term (:meth:`evaluate`'s second part; with separate ``value``
        and ``jac``, ``value`` is not called: a difference of gradients)."""
        return self._parts(w, X, y, False, True)[1]

    def _parts(self, w, X, y, want_values: bool, want_jac: bool) -> tuple:
        """(values or None, Jacobian or None) with at least the parts asked for, from the
        cache of the last point and rows where it has them."""
        slot = self._slot()
        entry = slot.get("vj")
        if self._hit(entry, w, X, y):
            v, J = entry[3], entry[4]
            if (v is not None or not want_values) and (J is not None or not want_jac):
                return v, J
        else:
            v = J = None
        n, d, K = np.shape(X)[0], np.size(w), self.size
        if self.value_and_jac is not None:
            got = _call(self, "value_and_jac", w, X, y, "a call")
            try:
                v, J = got
            except (TypeError, ValueError):
                raise UserFunctionError(f"{self.name}.value_and_jac must return a pair "
                                        f"(values, jacobian); got {type(got).__name__}"
                                        ) from None
        else:
            if want_values and v is None:
                v = _call(self, "value", w, X, y, "a call")
            if want_jac and J is None:
                J = _call(self, "jac", w, X, y, "a call")
        if v is not None:
            v = np.asarray(v, dtype=float)
            if v.shape != (n, K):
                raise UserFunctionError(f"{self.name}.value must return per-sample values of "
                                        f"shape ({n}, {K}) for {n} rows and {K} components; "
                                        f"got shape {v.shape}")
        if J is not None:
            J = np.asarray(J, dtype=float)
            if J.shape != (K, d):
                raise UserFunctionError(f"{self.name}.jac must return the Jacobian of the batch "
                                        f"means, of shape ({K}, {d}); got shape {J.shape}")
        slot["vj"] = (X, y, np.array(w, dtype=float), v, J)
        return v, J

    def _hessians(self, w, X, y) -> np.ndarray:
        slot = self._slot()
        entry = slot.get("h")
        if self._hit(entry, w, X, y):
            return entry[3]
        H = np.asarray(_call(self, "hess", w, X, y, "a Hessian call"), dtype=float)
        d = np.size(w)
        if H.shape != (self.size, d, d):
            raise UserFunctionError(f"{self.name}.hess must return the Hessians of the batch "
                                    f"means, of shape ({self.size}, {d}, {d}); got shape "
                                    f"{H.shape}")
        slot["h"] = (X, y, np.array(w, dtype=float), H)
        return H

    def _values_of(self, k, w, X, y):
        return self.values(w, X, y)[:, k]

    def _grad_of(self, k, w, X, y):
        return self.jacobian(w, X, y)[k]

    def _value_and_grad_of(self, k, w, X, y):
        v, J = self.evaluate(w, X, y)
        return v[:, k], J[k]

    def _hess_of(self, k, w, X, y):
        return self._hessians(w, X, y)[k]

    # -- the components and the constraints ---------------------------------------------------
    def __len__(self) -> int:
        return self.size

    def __getitem__(self, k) -> SampleFunction:
        return self.components[k]

    def __iter__(self):
        return iter(self.components)

    def _bounds(self, bound, op: str) -> list:
        b = np.asarray(bound) if not np.isscalar(bound) else bound
        if isinstance(b, np.ndarray) and b.ndim == 1:
            if b.size != self.size:
                raise ValueError(f"{self.name} {op} ...: {b.size} bounds for {self.size} "
                                 "components (give one number, or one per component)")
            return [_as_bound(x, f"{self.name}[{k}]", op) for k, x in enumerate(b)]
        return [_as_bound(bound, self.name, op)] * self.size

    def __le__(self, bound) -> tuple:
        """``F <= U``: F_k(w) <= U_k for every k (Problem 3's stochastic constraints)."""
        return tuple(f <= u for f, u in zip(self.components, self._bounds(bound, "<=")))

    def __ge__(self, bound) -> tuple:
        """``F >= L``: -F_k(w) <= -L_k for every k."""
        return tuple(f >= lo for f, lo in zip(self.components, self._bounds(bound, ">=")))

    def __eq__(self, bound):
        """``F == b``: the equalities F_k(w) = b_k (affine surrogates, as ``f == b``)."""
        if isinstance(bound, (VectorSampleFunction, SampleFunction)):
            return NotImplemented
        return tuple(f == b for f, b in zip(self.components, self._bounds(bound, "==")))

    def __ne__(self, other):
        return NotImplemented

    __hash__ = object.__hash__

    def __getstate__(self):
        state = dict(self.__dict__)
        state["_cache"] = {}          # evaluations stay where they were made
        return state

    def __repr__(self) -> str:
        return f"VectorSampleFunction(name={self.name!r}, size={self.size})"


def _same_rows(a, b) -> bool:
    """``a`` and ``b`` are the same rows: the same object, or views of the same memory with
    the same layout (a client slices its rows anew for every function it evaluates). The
    cache holds ``a``, so its memory cannot have been freed and reused in between."""
    if a is b:
        return True
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
        return False
    return (a.__array_interface__["data"][0] == b.__array_interface__["data"][0]
            and a.shape == b.shape and a.strides == b.strides and a.dtype == b.dtype)


def flatten_constraints(items: Sequence) -> list:
    """The constraints F_m(w) <= U_m of Problem 3 as ``Problem(constraints=...)`` lists them,
    with the tuples that ``VectorSampleFunction`` comparisons give spliced in (one level)."""
    out = []
    for c in items:
        if isinstance(c, tuple) and c and all(isinstance(x, StochasticConstraint) for x in c):
            out.extend(c)
        else:
            out.append(c)
    return out

