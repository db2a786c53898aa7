"""Per-sample functions by automatic differentiation in PyTorch: :func:`from_torch` turns the
loss of one sample into a :class:`TorchSampleFunction`, with the contract of
:func:`~ssca_solver.model.autodiff_jax.from_jax` (:mod:`ssca_solver.model.autodiff`,
docs/autodiff.md): values by ``torch.func.vmap``, the gradient of the batch mean by reverse-mode
autograd through them, and for the Newton and sketch models the Hessian of the batch mean
(``torch.func.hessian``) and its products with a block of vectors (``torch.func.jvp`` of
``torch.func.grad``). PyTorch runs eagerly, so nothing is compiled and batches are not padded
to buckets. A process forked after torch was imported runs torch on one thread (its OpenMP
team does not survive a fork).

PyTorch is never a dependency of the library: it is imported when a function is built, not
with this module.
"""

from __future__ import annotations

import os
import sys
from typing import Callable, Optional

import numpy as np

from ..errors import ModelError, UserFunctionError
from .autodiff_common import (DTYPES, AutodiffSampleFunction, checked_inputs, first_line,
                              not_floating, wrong_shape)

TORCH_INSTALL_HINT = ("install PyTorch (CPU build: pip install torch --index-url "
                      "https://download.pytorch.org/whl/cpu); it is not a dependency of "
                      "ssca-solver")
#: the computing precisions of :func:`from_torch` (names of torch dtypes)
TORCH_DTYPES = tuple(DTYPES)

#: True in a process forked from one that had imported torch: torch's CPU builds run their
#: parallel regions on GNU OpenMP (libgomp), whose thread team does not survive a fork, so a
#: parallel kernel in the child (an MKL matrix-vector product of a few thousand entries) waits
#: forever for threads that are not there. Set by :func:`_after_fork_in_child_torch`
_FORKED_AFTER_TORCH = False


def _after_fork_in_child_torch() -> None:
    """At fork, in the child: remember whether the parent had imported torch."""
    global _FORKED_AFTER_TORCH
    if "torch" in sys.modules:
        _FORKED_AFTER_TORCH = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child_torch)


def _single_thread_after_fork(torch) -> None:
    """In a process forked after torch was imported, run torch on one thread (once): a team
    of one never waits for the parent's OpenMP threads, which do not exist here (with more
    than one, a large matrix product can hang in the child). The clients of
    ``transport="process"`` are such processes; their ``client_threads`` is 1 per client on
    a machine with fewer cores than clients anyway."""
    global _FORKED_AFTER_TORCH
    if _FORKED_AFTER_TORCH:
        torch.set_num_threads(1)
        _FORKED_AFTER_TORCH = False


def import_torch():
    """``torch`` with ``torch.func`` (PyTorch >= 2.0), or a ModelError saying how to get it."""
    try:
        import torch
    except ImportError as exc:
        raise ModelError(f"SampleFunction.from_torch needs PyTorch, which is not installed: "
                         f"{TORCH_INSTALL_HINT}") from exc
    try:
        import torch.func  # noqa: F401
    except ImportError as exc:
        raise ModelError(f"SampleFunction.from_torch needs torch.func (PyTorch >= 2.0); this "
                         f"is torch {getattr(torch, '__version__', '?')}") from exc
    return torch


def _torch_not_traceable(name: str, exc: Exception) -> UserFunctionError:
    return UserFunctionError(
        f"{name}: the loss failed under torch.func ({type(exc).__name__}: {first_line(exc)}). "
        "from_torch maps it over the rows with torch.func.vmap and differentiates the mean by "
        "autograd, so it must compute with torch operations on its "
        "arguments: no .item(), float(), int(), .numpy() or NumPy (np.*) functions on w, x or "
        "y (use torch.*), no Python if/while on their values (use torch.where), no in-place "
        "operations on w, x, y or tensors kept from one call to the next, and every tensor it "
        "creates or closes over in the computing dtype (e.g. torch.zeros(3, dtype=w.dtype))")


class TorchSampleFunction(AutodiffSampleFunction):
    """A :class:`SampleFunction` whose values and gradient come from a PyTorch loss of one
    sample (built by :func:`from_torch`; the arguments are described there).

    ``value``, ``grad`` and ``value_and_grad`` are the per-sample values by
    ``torch.func.vmap``, the gradient of the batch mean by reverse mode through them
    (``torch.autograd.grad``) and both at once (NumPy arrays in, NumPy float64 arrays out).
    PyTorch runs eagerly: nothing is compiled, so changing batch sizes cost nothing extra.
    Picklable: the state is the plain Python loss and the options.
    """

    builder, returns = "from_torch", "scalar tensor"
    _transient = AutodiffSampleFunction._transient + ("hess", "hessp")

    def __init__(self, loss: Callable, name: Optional[str] = None, *, batched: bool = False,
                 dtype: str = "float64", surrogate=None):
        super().__init__(loss, name, batched=batched, dtype=dtype, surrogate=surrogate)
        self.hess, self.hessp = self._hess, self._hessp
        import_torch()

    def __setstate__(self, state):
        super().__setstate__(state)
        self.hess, self.hessp = self._hess, self._hessp

    def _hess(self, w, X, y):
        """The Hessian of the mean of the per-sample values over the rows of X: (d, d), by
        ``torch.func.hessian`` (forward over reverse mode). What the Newton model
        (``hessian="newton"``) asks the clients for: the curvature term of the surrogate
        that replaces eq. (fsmbar)'s tau |w - w_t|^2."""
        return self._run(2, w, X, y)

    def _hessp(self, w, X, y, V):
        """The Hessian of the batch mean times the columns of V (d, k): (d, k), forward-mode
        derivatives of the gradient (``torch.func.jvp`` of ``torch.func.grad``, vmapped over
        the columns), O(k) gradient passes instead of the d of the whole Hessian: what
        ``hessian="sketch"`` asks the clients for."""
        V = np.asarray(V, dtype=DTYPES[self.dtype])
        if V.ndim != 2 or V.shape[0] != np.size(w):
            raise UserFunctionError(f"{self.name}.hessp: V must have shape (d, k) with d = "
                                    f"{np.size(w)}, got {V.shape}")
        return self._run(3, w, X, y, V)

    def __repr__(self) -> str:
        return f"TorchSampleFunction(name={self.name!r}, dtype={self.dtype!r})"

    def _per_sample(self, torch, w, X, y):
        """The per-sample values (n,) of the loss: vmapped over the rows, or the batched
        loss; shapes and dtypes checked (inside vmap a tensor shows its per-sample shape)."""
        name, batched, dt = self.name, self.batched, getattr(torch, self.dtype)

        def checked(out, what, shape):
            if not isinstance(out, torch.Tensor):
                raise UserFunctionError(f"{name}: the loss must return a torch tensor, got "
                                        f"{type(out).__name__}")
            if tuple(out.shape) != shape:
                raise wrong_shape(name, tuple(out.shape), what, batched, ".sum()")
            if not out.is_floating_point():
                raise not_floating(name, out.dtype, what, "torch.sigmoid")
            if out.dtype != dt:
                raise UserFunctionError(
                    f"{name}: the loss returned dtype {out.dtype} for {what} although its "
                    f"inputs are {dt}: a tensor it creates or closes over is in another "
                    f"precision. Create tensors with dtype=w.dtype (or convert what it closes "
                    f"over with .to(torch.{self.dtype})); from_torch computes in "
                    f"{self.dtype} (dtype= to change it)")
            return out

        if batched:
            return checked(self.loss(w, X, y), f"a batch X of shape {tuple(X.shape)}",
                           (X.shape[0],))

        def one(x, t):
            return checked(self.loss(w, x, t), f"one row x of shape {tuple(x.shape)}", ())

        return torch.func.vmap(one, in_dims=(0, None if y is None else 0))(X, y)

    def _inputs(self, torch, w, X, y):
        """w, X, y as torch tensors (:func:`checked_inputs`; integer y as int64: labels may
        index)."""
        w, X, y, n = checked_inputs(self.name, w, X, y, DTYPES[self.dtype])
        if y is not None and y.dtype.kind != "f":
            y = y.astype(np.int64, copy=False)

        def tensor(a):
            # torch.from_numpy shares the memory; it warns on read-only arrays (the library's
            # w and client data are), so those are copied: the loss never writes into them
            a = np.ascontiguousarray(a)
            return torch.from_numpy(a if a.flags.writeable else a.copy())

        return tensor(w), tensor(X), None if y is None else tensor(y), n

    def _run(self, which: int, w, X, y, V=None):
        torch = import_torch()
        _single_thread_after_fork(torch)
        w, X, y, n = self._inputs(torch, w, X, y)
        if n == 0:
            return self._empty(which, w.numel()) if which < 3 else np.full(V.shape, np.nan)
        try:
            if which >= 2:
                return self._curvature(torch, which, w, X, y, V)
            if which == 0:
                with torch.no_grad():
                    v = self._per_sample(torch, w, X, y)
            else:
                # reverse mode through the vmapped values: the numbers of
                # torch.func.grad_and_value, at a lower cost per call
                w = w.requires_grad_(True)
                v = self._per_sample(torch, w, X, y)
                g = (torch.autograd.grad(v.mean(), w, allow_unused=True)[0]
                     if v.requires_grad else None)
                g = torch.zeros_like(w) if g is None else g
        except UserFunctionError:
            raise
        except (RuntimeError, TypeError, ValueError) as exc:
            raise _torch_not_traceable(self.name, exc) from exc
        v = v.detach().numpy().astype(np.float64)
        return v if which == 0 else (v, g.detach().numpy().astype(np.float64))

    def _curvature(self, torch, which: int, w, X, y, V):
        """The batch mean's Hessian (``which`` 2) or its products with V's columns (3)."""

        def mean(u):
            return self._per_sample(torch, u, X, y).mean()

        if which == 2:
            H = torch.func.hessian(mean)(w)
        else:
            grad = torch.func.grad(mean)
            V = torch.from_numpy(np.ascontiguousarray(V))
            H = torch.func.vmap(lambda v: torch.func.jvp(grad, (w,), (v,))[1],
                                in_dims=1, out_dims=1)(V)
        return H.detach().numpy().astype(np.float64)


def from_torch(loss: Callable, name: Optional[str] = None, *, batched: bool = False,
               dtype: str = "float64", surrogate=None) -> TorchSampleFunction:
    """A SampleFunction from the PyTorch loss of one sample (automatic differentiation).

    Implements f(w, x_n) (eq. (Fs0) and the F_m of Problem 3) from ``loss``: values per sample
    by ``torch.func.vmap``, the gradient of the batch mean by reverse mode through them
    (``torch.autograd.grad``: one forward and one backward pass; the numbers of
    ``torch.func.grad``), and the curvature of the surrogates that replace eq. (fsmbar)'s
    tau |w - w_t|^2 in the second-order phase: ``hess`` (``torch.func.hessian`` of the batch
    mean, the Newton model) and ``hessp`` (its products with V's columns, the sketch model);
    the same contract as :func:`from_jax`. Also
    reachable as ``ss.SampleFunction.from_torch``. PyTorch is never a dependency of the
    library: it is imported when a function is built.

    Args:
      loss: ``loss(w, x, y) -> scalar tensor`` written with torch operations: w the flat
        decision vector (d,) as a tensor, x one row of X, y its target (one entry of y; None
        when the data have none). A ``torch.nn.Module`` can be used through
        ``torch.func.functional_call`` with its parameters sliced from w.
      name: used in reports and error messages (default: the loss's ``__name__``).
      batched: the loss takes the whole batch, ``loss(w, X, y) -> (n,)`` per-sample values (no
        vmap); each value must depend on its own row only.
      dtype: ``"float64"`` (default: w and X are passed as float64 tensors, whatever torch's
        default dtype; a loss whose result comes out in another precision is refused) or
        ``"float32"``.
      surrogate: the surrogate builder, as for :class:`SampleFunction`.

    Returns:
      a :class:`TorchSampleFunction` (a SampleFunction): ``f <= U`` makes a constraint as
      usual.

    Raises:
      ModelError: PyTorch (with torch.func) is not installed.
      UserFunctionError (on a call): the loss returns another shape than a scalar per sample,
        a non-floating or other-precision dtype, or fails under vmap/grad (.item(), NumPy,
        data-dependent Python control flow, ...).
    """
    return TorchSampleFunction(loss, name, batched=batched, dtype=dtype, surrogate=surrogate)
