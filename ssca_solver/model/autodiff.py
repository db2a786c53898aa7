"""Per-sample functions by automatic differentiation: a JAX (:func:`from_jax`) or PyTorch
(:func:`from_torch`) loss of one sample becomes a
:class:`~ssca_solver.model.functions.SampleFunction`.

PyTorch (the second half of this module) follows the same contract with ``torch.func.vmap``
and reverse-mode autograd; it runs eagerly, so nothing below about compiling and
buckets applies to it, and a process forked after torch was imported runs torch on one
thread (its OpenMP team does not survive a fork). Neither JAX nor torch is imported with
this module.

The user writes ``loss(w, x, y) -> scalar``, the loss f(w, x_n) of ONE row x (and its target
y) in ``jax.numpy``. :func:`from_jax` turns it into the two callables the library asks for
(docs/modelling.md, "Per-sample functions"; docs/autodiff.md):

* ``value(w, X, y)``: the per-sample values f(w, x_n), n = 1..B, by ``jax.vmap`` of the loss
  over the rows;
* ``grad(w, X, y)``: the gradient of their mean (1/B) sum_n f(w, x_n), by ``jax.grad`` of the
  mean; ``value_and_grad`` gives both in one forward and one backward pass (what the clients
  call for the surrogate statistics of eqs. (fs0bar)/(fsmbar) and for the KKT test).

Compiling. Each of the two programs (values; values and gradient) is compiled by ``jax.jit``
once per *bucket*: a batch of B rows is padded to the next power of two (repeating its last
row) and the padded rows are masked out of the mean, so the mean and its gradient are those of
the B real rows, and batch sizes that change from round to round (``batch_size="auto"``)
compile at most once per power of two (``buckets="exact"``: once per distinct B instead).
A new shape of the features, another dtype or ``y`` present/absent compile again, as does a
new process (the compiled programs are never pickled or inherited: each process builds its
own on first use).

Precision. Computations run in float64 (``dtype="float64"``, the default), which needs JAX's
``jax_enable_x64``. :func:`from_jax` turns it on when JAX has not created any array yet in this
process (the flag must be set before that), and refuses with :class:`ModelError` otherwise,
saying where to set it; ``dtype="float32"`` computes in single precision instead.

Processes. ``transport="process"`` forks the clients from the server process. XLA's threads do
not survive a fork, so JAX works in a forked client only when the server process itself had not
started JAX (created an array or run a JAX function) before the fork; otherwise the client
raises :class:`UserFunctionError` saying so, instead of deadlocking. Pickling (Flower ships the
functions to its nodes) keeps only the plain Python loss and the options.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Callable, Optional

import numpy as np

from ..errors import ModelError, UserFunctionError
from .functions import SampleFunction

#: the bucket policies of :func:`from_jax`: "pow2" pads a batch of B rows to the next power of
#: two (one compilation per power of two), "exact" compiles once per distinct B
BUCKETS = ("pow2", "exact")
#: the computing precisions of :func:`from_jax`
DTYPES = {"float64": np.float64, "float32": np.float32}

INSTALL_HINT = "install it with pip install 'ssca-solver[jax]' (or pip install jax)"

#: True in a process forked from one in which JAX had started its runtime (XLA's threads do
#: not exist in the child: JAX would deadlock there); set by :func:`_after_fork_in_child`
_FORKED_AFTER_JAX = False


def _jax_started() -> bool:
    """Whether JAX has started its runtime (a backend) in this process: after the first array
    or computation. Reads the backend table without its lock (safe in a fresh fork)."""
    xb = sys.modules.get("jax._src.xla_bridge")
    return bool(getattr(xb, "_backends", None)) if xb is not None else False


def _after_fork_in_child() -> None:
    """At fork, in the child: remember whether the parent had started JAX."""
    global _FORKED_AFTER_JAX
    if _jax_started():
        _FORKED_AFTER_JAX = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def import_jax():
    """``jax``, or a ModelError saying how to install it."""
    try:
        import jax
    except ImportError as exc:
        raise ModelError(f"SampleFunction.from_jax needs JAX, which is not installed: "
                         f"{INSTALL_HINT}") from exc
    return jax


def ensure_x64(name: str, error=ModelError) -> None:
    """Turn on ``jax_enable_x64`` if JAX has created no array yet in this process; if it has
    (with x64 off), raise ``error`` saying where to turn it on.

    JAX reads the flag when it creates arrays: set after that, arrays made before stay float32,
    so the flag belongs at the top of the script (``jax.config.update("jax_enable_x64", True)``
    or the environment variable ``JAX_ENABLE_X64=1``), before anything else uses JAX.
    """
    jax = import_jax()
    if jax.config.jax_enable_x64:
        return
    if not _jax_started():
        jax.config.update("jax_enable_x64", True)
        return
    raise error(f"{name}: JAX's 64-bit mode (jax_enable_x64) is off and JAX has already "
                "created arrays in this process, so it can no longer be turned on safely; "
                "from_jax computes in float64 by default. Fix: put "
                "jax.config.update('jax_enable_x64', True) at the top of your script, before "
                "any other use of JAX (or set the environment variable JAX_ENABLE_X64=1), or "
                "pass dtype='float32' to from_jax to compute in single precision")


def bucket_size(n: int, buckets: str = "pow2") -> int:
    """The padded batch size of a batch of ``n`` rows: the next power of two >= n for
    ``"pow2"``, n itself for ``"exact"`` (0 stays 0)."""
    if buckets == "exact" or n <= 1:
        return n
    return 1 << (n - 1).bit_length()


def _pad_rows(a: np.ndarray, b: int) -> np.ndarray:
    """``a`` with rows appended up to ``b`` rows, copies of its last row (finite wherever the
    real rows are, so a masked-out padded value or gradient is an exact 0)."""
    n = a.shape[0]
    if b == n:
        return a
    return np.concatenate([a, np.broadcast_to(a[-1:], (b - n,) + a.shape[1:])])


def _not_traceable(name: str, exc: Exception) -> UserFunctionError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return UserFunctionError(
        f"{name}: JAX cannot trace the loss ({type(exc).__name__}: {first}). from_jax compiles "
        "it with jax.jit, jax.vmap and jax.grad, so it must compute with jax.numpy on its "
        "arguments: no float(), int(), bool() or NumPy (np.*) functions on w, x or y (use "
        "jnp.*), no Python if/while on their values (use jnp.where or jax.lax.cond), no "
        "in-place assignment (use a.at[i].set(v)), and no arrays kept from one call to the next")


class JaxSampleFunction(SampleFunction):
    """A :class:`SampleFunction` whose values and gradient come from a JAX loss of one sample
    (built by :func:`from_jax`; the arguments are described there).

    ``value``, ``grad`` and ``value_and_grad`` are the vmapped values, the gradient of the
    batch mean and both at once (NumPy float64 arrays in, NumPy float64 arrays out).
    ``traces`` counts the compilations of this process (one per bucket and program).
    Picklable: the state is the plain Python loss and the options; the compiled programs are
    rebuilt in each process on first use.
    """

    def __init__(self, loss: Callable, name: Optional[str] = None, *, batched: bool = False,
                 buckets: str = "pow2", dtype: str = "float64", surrogate=None):
        if not callable(loss):
            raise TypeError(f"from_jax needs a callable loss(w, x, y) -> scalar, got "
                            f"{type(loss).__name__}")
        if buckets not in BUCKETS:
            raise ValueError(f"buckets must be one of {BUCKETS}, got {buckets!r}")
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {tuple(DTYPES)}, got {dtype!r}")
        self.loss = loss
        self.batched = bool(batched)
        self.buckets = buckets
        self.dtype = dtype
        name = name or getattr(loss, "__name__", None) or "f"
        super().__init__(self._values, self._grad, name=("f" if name == "<lambda>" else name),
                         surrogate=surrogate, value_and_grad=self._value_and_grad)
        self._reset()
        import_jax()
        if dtype == "float64":
            ensure_x64(self.name)

    def _reset(self) -> None:
        self._programs = None
        self._pid = None
        self._lock = threading.Lock()
        self.traces = 0

    # -- pickling: the plain loss and the options, never a compiled program ------------------

    def __getstate__(self):
        state = {k: v for k, v in self.__dict__.items()
                 if k not in ("value", "grad", "value_and_grad", "_programs", "_pid", "_lock",
                              "traces")}
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.value, self.grad = self._values, self._grad
        self.value_and_grad = self._value_and_grad
        self._reset()

    def __repr__(self) -> str:
        return f"JaxSampleFunction(name={self.name!r}, buckets={self.buckets!r}, " \
               f"dtype={self.dtype!r})"

    # -- the compiled programs, one pair per process ------------------------------------------

    def _compiled(self):
        """(values program, value-and-grad program), built on first use in this process."""
        pid = os.getpid()
        if self._programs is not None and self._pid == pid:
            if self.dtype == "float64" and not sys.modules["jax"].config.jax_enable_x64:
                raise UserFunctionError(
                    f"{self.name}: JAX's 64-bit mode (jax_enable_x64) was turned off after "
                    "this function was built; it computes in float64. Leave "
                    "jax_enable_x64 on (or build the function with dtype='float32')")
            return self._programs
        with self._lock:
            if _FORKED_AFTER_JAX:
                raise UserFunctionError(
                    f"{self.name}: this process was forked (transport='process') from a "
                    "process that had already started JAX, and XLA's threads do not survive a "
                    "fork: JAX would deadlock here. Fix: use transport='inprocess' (JAX "
                    "already runs each batch on every core), or keep the server process free "
                    "of JAX until solve() has started its clients (no JAX arrays, no call of "
                    "the function and no ss.check_grad on it before solve), or use "
                    "transport='flower' (fresh processes)")
            import_jax()
            if self.dtype == "float64":
                ensure_x64(self.name, UserFunctionError)
            self._programs = self._build()
            self._pid = pid
        return self._programs

    def _build(self):
        import jax
        import jax.numpy as jnp

        loss, name, batched = self.loss, self.name, self.batched

        def checked(out, what, shape):
            try:
                out = jnp.asarray(out)
            except TypeError as exc:
                raise UserFunctionError(f"{name}: the loss must return a JAX array, got "
                                        f"{type(out).__name__} ({exc})") from exc
            if out.shape != shape:
                fix = ("return one value per row, shape (n,)" if batched else
                       "return one scalar per sample, shape (): e.g. jnp.sum(...) or out[0]; "
                       "a loss of the whole batch takes batched=True")
                raise UserFunctionError(f"{name}: the loss returned shape {out.shape} for "
                                        f"{what}; it must {fix}")
            if not jnp.issubdtype(out.dtype, jnp.floating):
                raise UserFunctionError(
                    f"{name}: the loss returned dtype {out.dtype} for {what}; it must return "
                    "a real floating-point value (an integer or boolean result has no "
                    "gradient: compute it from w with floating-point operations, e.g. "
                    "jax.nn.sigmoid instead of a 0/1 step)")
            return out

        def per_sample(w, X, y):
            self.traces += 1          # runs once per trace (compilation), never per call
            if batched:
                return checked(loss(w, X, y), f"a batch X of shape {X.shape}", (X.shape[0],))

            def one(x, t):
                return checked(loss(w, x, t), f"one row x of shape {x.shape}", ())

            return jax.vmap(one, in_axes=(0, None if y is None else 0))(X, y)

        def mean_and_values(w, X, y, n):
            v = per_sample(w, X, y)
            keep = jnp.arange(v.shape[0]) < n
            return jnp.sum(jnp.where(keep, v, 0.0)) / n, v

        def value_and_grad(w, X, y, n):
            (_, v), g = jax.value_and_grad(mean_and_values, has_aux=True)(w, X, y, n)
            return v, g

        return jax.jit(per_sample), jax.jit(value_and_grad)

    # -- what the library calls --------------------------------------------------------------

    def _inputs(self, w, X, y):
        """w, X, y as NumPy arrays for the programs (w and X in the computing dtype: integer
        features are converted as FederatedData does; integer y kept: labels may index),
        padded to the bucket; and the number n of real rows."""
        dt = DTYPES[self.dtype]
        w, X = np.asarray(w), np.asarray(X)
        for what, a in (("w", w), ("X", X)):
            if a.dtype.kind not in "biuf":
                raise TypeError(f"{self.name}: {what} must be a real array (float or int), "
                                f"got dtype {a.dtype}")
        if w.ndim != 1:
            raise TypeError(f"{self.name}: w must be a flat vector of shape (d,), got shape "
                            f"{w.shape}")
        if X.ndim < 1:
            raise TypeError(f"{self.name}: X must hold one row per sample, got a scalar")
        w, X = w.astype(dt, copy=False), X.astype(dt, copy=False)
        n = X.shape[0]
        if y is not None:
            y = np.asarray(y)
            if y.dtype.kind not in "biuf":
                raise TypeError(f"{self.name}: y must be a real array, got dtype {y.dtype}")
            if y.ndim < 1 or y.shape[0] != n:
                raise TypeError(f"{self.name}: y must have one entry per row of X ({n}), got "
                                f"shape {y.shape}")
            if y.dtype.kind == "f":
                y = y.astype(dt, copy=False)
        b = bucket_size(n, self.buckets)
        X = _pad_rows(X, b)
        y = None if y is None else _pad_rows(y, b)
        return w, X, y, n

    def _run(self, which: int, w, X, y):
        programs = self._compiled()
        w, X, y, n = self._inputs(w, X, y)
        if n == 0:
            return (np.zeros(0), np.full(w.size, np.nan)) if which else np.zeros(0)
        import jax

        try:
            if which == 0:
                v = programs[0](w, X, y)
            else:
                v, g = programs[1](w, X, y, np.int32(n))
        except (jax.errors.JAXTypeError, jax.errors.JAXIndexError) as exc:
            raise _not_traceable(self.name, exc) from exc
        # slice on the host: a slice of a JAX array is one more dispatched computation
        v = np.array(np.asarray(v)[:n], dtype=np.float64)
        return v if which == 0 else (v, np.array(g, dtype=np.float64))

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


def from_jax(loss: Callable, name: Optional[str] = None, *, batched: bool = False,
             buckets: str = "pow2", dtype: str = "float64", surrogate=None
             ) -> JaxSampleFunction:
    """A SampleFunction from the JAX loss of one sample (automatic differentiation).

    Implements f(w, x_n) (eq. (Fs0) and the F_m of Problem 3) from ``loss``: values per sample
    by ``jax.vmap``, the gradient of the batch mean by ``jax.value_and_grad``, jit-compiled once
    per bucket of batch sizes. Also reachable as ``ss.SampleFunction.from_jax``.

    Args:
      loss: ``loss(w, x, y) -> scalar`` written in ``jax.numpy``: w the flat decision vector
        (d,), x one row of X, y its target (one entry of y, None when the data have none).
      name: used in reports and error messages (default: the loss's ``__name__``).
      batched: the loss takes the whole batch, ``loss(w, X, y) -> (n,)`` per-sample values (no
        vmap); each value must depend on its own row only (padded rows are computed and
        dropped).
      buckets: ``"pow2"`` (default) pads a batch to the next power of two, so changing batch
        sizes compile once per power of two; ``"exact"`` compiles once per distinct size.
      dtype: ``"float64"`` (default; turns on ``jax_enable_x64`` if JAX has created no array
        yet, else refuses with a ModelError saying where to set it) or ``"float32"``.
      surrogate: the surrogate builder, as for :class:`SampleFunction`.

    Returns:
      a :class:`JaxSampleFunction` (a SampleFunction): ``f <= U`` makes a constraint as usual.

    Raises:
      ModelError: JAX is not installed, or x64 is off and can no longer be turned on.
      UserFunctionError (on a call): the loss returns another shape than a scalar per sample or
        a non-floating dtype, or JAX cannot trace it (float() or NumPy on traced values, ...).
    """
    return JaxSampleFunction(loss, name, batched=batched, buckets=buckets, dtype=dtype,
                             surrogate=surrogate)


# -- PyTorch -------------------------------------------------------------------------------------

TORCH_INSTALL_HINT = ("install PyTorch (CPU build: pip install torch --index-url "
                      "https://download.pytorch.org/whl/cpu); it is not a dependency of "
                      "ssca-solver")
#: the computing precisions of :func:`from_torch` (names of torch dtypes)
TORCH_DTYPES = ("float64", "float32")

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
    of one never waits for the parent's OpenMP threads, which do not exist here (measured:
    a 4000 x 400 product hangs in the child without it, and runs with it). The clients of
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
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return UserFunctionError(
        f"{name}: the loss failed under torch.func ({type(exc).__name__}: {first}). "
        "from_torch maps it over the rows with torch.func.vmap and differentiates the mean by "
        "autograd, so it must compute with torch operations on its "
        "arguments: no .item(), float(), int(), .numpy() or NumPy (np.*) functions on w, x or "
        "y (use torch.*), no Python if/while on their values (use torch.where), no in-place "
        "operations on w, x, y or tensors kept from one call to the next, and every tensor it "
        "creates or closes over in the computing dtype (e.g. torch.zeros(3, dtype=w.dtype))")


class TorchSampleFunction(SampleFunction):
    """A :class:`SampleFunction` whose values and gradient come from a PyTorch loss of one
    sample (built by :func:`from_torch`; the arguments are described there).

    ``value``, ``grad`` and ``value_and_grad`` are the per-sample values by
    ``torch.func.vmap``, the gradient of the batch mean by reverse mode through them
    (``torch.autograd.grad``) and both at once (NumPy arrays in, NumPy float64 arrays out). PyTorch runs eagerly: nothing is
    compiled, so changing batch sizes cost nothing extra. Picklable: the state is the plain
    Python loss and the options.
    """

    def __init__(self, loss: Callable, name: Optional[str] = None, *, batched: bool = False,
                 dtype: str = "float64", surrogate=None):
        if not callable(loss):
            raise TypeError(f"from_torch needs a callable loss(w, x, y) -> scalar tensor, got "
                            f"{type(loss).__name__}")
        if dtype not in TORCH_DTYPES:
            raise ValueError(f"dtype must be one of {TORCH_DTYPES}, got {dtype!r}")
        self.loss = loss
        self.batched = bool(batched)
        self.dtype = dtype
        name = name or getattr(loss, "__name__", None) or "f"
        super().__init__(self._values, self._grad, name=("f" if name == "<lambda>" else name),
                         surrogate=surrogate, value_and_grad=self._value_and_grad)
        import_torch()

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items()
                if k not in ("value", "grad", "value_and_grad")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.value, self.grad = self._values, self._grad
        self.value_and_grad = self._value_and_grad

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
                fix = ("return one value per row, shape (n,)" if batched else
                       "return one scalar per sample, shape (): e.g. .sum() or out[0]; a "
                       "loss of the whole batch takes batched=True")
                raise UserFunctionError(f"{name}: the loss returned shape {tuple(out.shape)} "
                                        f"for {what}; it must {fix}")
            if not out.is_floating_point():
                raise UserFunctionError(
                    f"{name}: the loss returned dtype {out.dtype} for {what}; it must return "
                    "a real floating-point value (an integer or boolean result has no "
                    "gradient: compute it from w with floating-point operations, e.g. "
                    "torch.sigmoid instead of a 0/1 step)")
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
        """w, X, y as torch tensors (w and X in the computing dtype: integer features are
        converted as FederatedData does; integer y kept, as int64: labels may index)."""
        dt = np.float64 if self.dtype == "float64" else np.float32
        w, X = np.asarray(w), np.asarray(X)
        for what, a in (("w", w), ("X", X)):
            if a.dtype.kind not in "biuf":
                raise TypeError(f"{self.name}: {what} must be a real array (float or int), "
                                f"got dtype {a.dtype}")
        if w.ndim != 1:
            raise TypeError(f"{self.name}: w must be a flat vector of shape (d,), got shape "
                            f"{w.shape}")
        if X.ndim < 1:
            raise TypeError(f"{self.name}: X must hold one row per sample, got a scalar")
        n = X.shape[0]
        if y is not None:
            y = np.asarray(y)
            if y.dtype.kind not in "biuf":
                raise TypeError(f"{self.name}: y must be a real array, got dtype {y.dtype}")
            if y.ndim < 1 or y.shape[0] != n:
                raise TypeError(f"{self.name}: y must have one entry per row of X ({n}), got "
                                f"shape {y.shape}")
            y = y.astype(dt if y.dtype.kind == "f" else np.int64, copy=False)

        def tensor(a, dtype):
            # torch.from_numpy shares the memory; it warns on read-only arrays (the library's
            # w and client data are), so those are copied: the loss never writes into them
            a = np.ascontiguousarray(a, dtype=dtype)
            return torch.from_numpy(a if a.flags.writeable else a.copy())

        return (tensor(w, dt), tensor(X, dt), None if y is None else tensor(y, y.dtype), n)

    def _run(self, which: int, w, X, y):
        torch = import_torch()
        _single_thread_after_fork(torch)
        w, X, y, n = self._inputs(torch, w, X, y)
        if n == 0:
            return (np.zeros(0), np.full(w.numel(), np.nan)) if which else np.zeros(0)
        try:
            if which == 0:
                with torch.no_grad():
                    v = self._per_sample(torch, w, X, y)
            else:
                # reverse mode through the vmapped values: the numbers of
                # torch.func.grad_and_value (equal to the bit on the paper's network), at
                # half its per-call cost there (1.9 against 4.0 ms, 128 rows, one thread)
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


def from_torch(loss: Callable, name: Optional[str] = None, *, batched: bool = False,
               dtype: str = "float64", surrogate=None) -> TorchSampleFunction:
    """A SampleFunction from the PyTorch loss of one sample (automatic differentiation).

    Implements f(w, x_n) (eq. (Fs0) and the F_m of Problem 3) from ``loss``: values per sample
    by ``torch.func.vmap``, the gradient of the batch mean by reverse mode through them
    (``torch.autograd.grad``: one forward and one backward pass; the numbers of
    ``torch.func.grad``), the same contract as :func:`from_jax`. Also
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


def _from_torch_classmethod(cls, loss: Callable, name: Optional[str] = None, **options):
    """A SampleFunction from the PyTorch loss ``loss(w, x, y) -> scalar`` of one sample, by
    automatic differentiation: :func:`ssca_solver.model.autodiff.from_torch` (options
    ``batched``, ``dtype``, ``surrogate``; docs/autodiff.md)."""
    return from_torch(loss, name, **options)


# ss.SampleFunction.from_torch, beside from_jax (which model/functions.py defines). Attached
# here so that functions.py need not change; it belongs there as a classmethod like from_jax.
if not hasattr(SampleFunction, "from_torch"):
    SampleFunction.from_torch = classmethod(_from_torch_classmethod)
