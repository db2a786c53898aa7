"""What :func:`~ssca_solver.model.autodiff_jax.from_jax` and
:func:`~ssca_solver.model.autodiff_torch.from_torch` share: the base class (options, pickling,
the three callables the library asks for), the checks of the inputs w, X, y, the messages on
what a loss returns, and the bucketing of batch sizes (JAX compiles per shape; torch runs
eagerly and does not pad).

Imports neither JAX nor torch.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ..errors import UserFunctionError
from .functions import SampleFunction, callable_name

#: the bucket policies of :func:`from_jax`: "pow2" pads a batch of B rows to the next power of
#: two (one compilation per power of two), "exact" compiles once per distinct B
BUCKETS = ("pow2", "exact")
#: the computing precisions, by name, and their NumPy dtypes
DTYPES = {"float64": np.float64, "float32": np.float32}


def bucket_size(n: int, buckets: str = "pow2") -> int:
    """The padded batch size of a batch of ``n`` rows: the next power of two >= n for
    ``"pow2"``, n itself for ``"exact"`` (0 stays 0)."""
    if buckets == "exact" or n <= 1:
        return n
    return 1 << (n - 1).bit_length()


def pad_rows(a: np.ndarray, b: int) -> np.ndarray:
    """``a`` with rows appended up to ``b`` rows, copies of its last row (finite wherever the
    real rows are, so a masked-out padded value or gradient is an exact 0)."""
    n = a.shape[0]
    if b == n:
        return a
    return np.concatenate([a, np.broadcast_to(a[-1:], (b - n,) + a.shape[1:])])


def first_line(exc: Exception) -> str:
    """The first line of an exception's message ("" when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else ""


def checked_inputs(name: str, w, X, y, dtype):
    """(w, X, y, n): w and X as NumPy arrays in the computing ``dtype`` (integer features are
    converted as FederatedData does), y as an array with floating y in ``dtype`` and integer
    y kept (labels may index), n the number of rows; TypeError naming ``name`` for anything
    else (a complex or object w or X, w not flat, X a scalar, y of another length)."""
    w, X = np.asarray(w), np.asarray(X)
    for what, a in (("w", w), ("X", X)):
        if a.dtype.kind not in "biuf":
            raise TypeError(f"{name}: {what} must be a real array (float or int), "
                            f"got dtype {a.dtype}")
    if w.ndim != 1:
        raise TypeError(f"{name}: w must be a flat vector of shape (d,), got shape "
                        f"{w.shape}")
    if X.ndim < 1:
        raise TypeError(f"{name}: X must hold one row per sample, got a scalar")
    w, X = w.astype(dtype, copy=False), X.astype(dtype, copy=False)
    n = X.shape[0]
    if y is not None:
        y = np.asarray(y)
        if y.dtype.kind not in "biuf":
            raise TypeError(f"{name}: y must be a real array, got dtype {y.dtype}")
        if y.ndim < 1 or y.shape[0] != n:
            raise TypeError(f"{name}: y must have one entry per row of X ({n}), got "
                            f"shape {y.shape}")
        if y.dtype.kind == "f":
            y = y.astype(dtype, copy=False)
    return w, X, y, n


def wrong_shape(name: str, shape: tuple, what: str, batched: bool,
                scalar_hint: str) -> UserFunctionError:
    """The error for a loss that returned ``shape`` for ``what`` (a row, or a batch)."""
    fix = ("return one value per row, shape (n,)" if batched else
           f"return one scalar per sample, shape (): e.g. {scalar_hint} or out[0]; a loss of "
           "the whole batch takes batched=True")
    return UserFunctionError(f"{name}: the loss returned shape {shape} for {what}; it must "
                             f"{fix}")


def not_floating(name: str, dtype, what: str, sigmoid: str) -> UserFunctionError:
    """The error for a loss whose result has a non-floating ``dtype`` (no gradient)."""
    return UserFunctionError(
        f"{name}: the loss returned dtype {dtype} for {what}; it must return a real "
        "floating-point value (an integer or boolean result has no gradient: compute it from "
        f"w with floating-point operations, e.g. {sigmoid} instead of a 0/1 step)")


def require_callable(loss, builder: str, returns: str) -> None:
    if not callable(loss):
        raise TypeError(f"{builder} needs a callable loss(w, x, y) -> {returns}, got "
                        f"{type(loss).__name__}")


class AutodiffSampleFunction(SampleFunction):
    """A :class:`SampleFunction` whose values and gradient come from the loss of one sample by
    automatic differentiation; subclasses compute :meth:`_run` with their framework.

    ``value``, ``grad`` and ``value_and_grad`` are the per-sample values, the gradient of the
    batch mean and both at once (NumPy arrays in, NumPy float64 arrays out). Picklable: the
    state is the plain Python loss and the options (attributes in ``_transient`` are rebuilt
    by :meth:`_reset` in each process).
    """

    #: the builder's name and what its loss returns (the message on a non-callable loss)
    builder, returns = "from_jax", "scalar"
    #: attributes never pickled
    _transient: tuple = ("value", "grad", "value_and_grad")

    def __init__(self, loss: Callable, name: Optional[str], *, batched: bool, dtype: str,
                 surrogate):
        require_callable(loss, self.builder, self.returns)
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {dtype!r}")
        self.loss = loss
        self.batched = bool(batched)
        self.dtype = dtype
        super().__init__(self._values, self._grad, name=name or callable_name(loss),
                         surrogate=surrogate, value_and_grad=self._value_and_grad)
        self._reset()

    def _reset(self) -> None:
        """Rebuild what is never pickled (nothing here; JAX's compiled programs)."""

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k not in self._transient}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.value, self.grad = self._values, self._grad
        self.value_and_grad = self._value_and_grad
        self._reset()

    def _run(self, which: int, w, X, y):
        """The per-sample values (``which`` 0), or (values, gradient of their mean)."""
        raise NotImplementedError

    @staticmethod
    def _empty(which: int, d: int):
        """What a batch of no rows gives: no values, and a NaN gradient (and Hessian, ``which``
        2: the mean of nothing)."""
        if which == 2:
            return np.full((d, d), np.nan)
        return (np.zeros(0), np.full(d, np.nan)) if which else np.zeros(0)

    def _values(self, w, X, y):
        """The per-sample values f(w, x_n) of the rows of X: shape (n,)."""
        return self._run(0, w, X, y)

    def _value_and_grad(self, w, X, y):
        """(per-sample values (n,), gradient of their mean (d,)), one forward and one backward
        pass."""
        return self._run(1, w, X, y)

    def _grad(self, w, X, y):
        """The gradient of the mean of the per-sample values over the rows of X: shape (d,)."""
        return self._run(1, w, X, y)[1]
