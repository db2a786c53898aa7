"""Per-sample functions by automatic differentiation in JAX: :func:`from_jax` turns the loss
of one sample into a :class:`JaxSampleFunction` (the contract: :mod:`ssca_solver.model.autodiff`
and docs/autodiff.md).

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

JAX is not imported with this module.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Callable, Optional

import numpy as np

from ..errors import ModelError, UserFunctionError
from .autodiff_common import (BUCKETS, DTYPES, AutodiffSampleFunction, bucket_size,
                              checked_inputs, first_line, not_floating, pad_rows,
                              require_callable, wrong_shape)

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


def _not_traceable(name: str, exc: Exception) -> UserFunctionError:
    return UserFunctionError(
        f"{name}: JAX cannot trace the loss ({type(exc).__name__}: {first_line(exc)}). "
        "from_jax compiles it with jax.jit, jax.vmap and jax.grad, so it must compute with "
        "jax.numpy on its arguments: no float(), int(), bool() or NumPy (np.*) functions on "
        "w, x or y (use jnp.*), no Python if/while on their values (use jnp.where or "
        "jax.lax.cond), no in-place assignment (use a.at[i].set(v)), and no arrays kept from "
        "one call to the next")


class JaxSampleFunction(AutodiffSampleFunction):
    """A :class:`SampleFunction` whose values and gradient come from a JAX loss of one sample
    (built by :func:`from_jax`; the arguments are described there).

    ``value``, ``grad`` and ``value_and_grad`` are the vmapped values, the gradient of the
    batch mean and both at once (NumPy float64 arrays in, NumPy float64 arrays out).
    ``traces`` counts the compilations of this process (one per bucket and program).
    Picklable: the state is the plain Python loss and the options; the compiled programs are
    rebuilt in each process on first use.
    """

    builder, returns = "from_jax", "scalar"
    _transient = AutodiffSampleFunction._transient + ("_programs", "_pid", "_lock", "traces",
                                                      "hess", "hessp")

    def __init__(self, loss: Callable, name: Optional[str] = None, *, batched: bool = False,
                 buckets: str = "pow2", dtype: str = "float64", surrogate=None):
        require_callable(loss, self.builder, self.returns)
        if buckets not in BUCKETS:
            raise ValueError(f"buckets must be one of {BUCKETS}, got {buckets!r}")
        self.buckets = buckets
        super().__init__(loss, name, batched=batched, dtype=dtype, surrogate=surrogate)
        self.hess, self.hessp = self._hess, self._hessp
        import_jax()
        if dtype == "float64":
            ensure_x64(self.name)

    def __setstate__(self, state):
        super().__setstate__(state)
        self.hess, self.hessp = self._hess, self._hessp

    def _hess(self, w, X, y):
        """The Hessian of the mean of the per-sample values over the rows of X: (d, d), by
        ``jax.hessian`` (forward over reverse), compiled once per bucket of batch sizes."""
        return self._run(2, w, X, y)

    def _hessp(self, w, X, y, V):
        """The Hessian of the batch mean times the columns of V (d, k): (d, k), forward-mode
        derivatives of the gradient (``jax.jvp`` of ``jax.grad``, vmapped over the columns),
        O(k) gradient passes instead of the d of the whole Hessian; compiled once per bucket
        and k: what ``hessian="sketch"`` asks the clients for."""
        V = np.asarray(V, dtype=DTYPES[self.dtype])
        if V.ndim != 2 or V.shape[0] != np.size(w):
            raise UserFunctionError(f"{self.name}.hessp: V must have shape (d, k) with d = "
                                    f"{np.size(w)}, got {V.shape}")
        return self._run(3, w, X, y, V)

    def _reset(self) -> None:
        self._programs = None
        self._pid = None
        self._lock = threading.Lock()
        self.traces = 0

    def __repr__(self) -> str:
        return f"JaxSampleFunction(name={self.name!r}, buckets={self.buckets!r}, " \
               f"dtype={self.dtype!r})"

    # -- the compiled programs, one pair per process ------------------------------------------

    def _compiled(self):
        """(values, value-and-grad, Hessian, Hessian-times-V programs), built on first use in
        this process."""
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
                raise wrong_shape(name, out.shape, what, batched, "jnp.sum(...)")
            if not jnp.issubdtype(out.dtype, jnp.floating):
                raise not_floating(name, out.dtype, what, "jax.nn.sigmoid")
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

        def hessian(w, X, y, n):
            return jax.hessian(lambda u: mean_and_values(u, X, y, n)[0])(w)

        def hessian_times(w, X, y, n, V):
            grad = jax.grad(lambda u: mean_and_values(u, X, y, n)[0])
            return jax.vmap(lambda v: jax.jvp(grad, (w,), (v,))[1], in_axes=1, out_axes=1)(V)

        return (jax.jit(per_sample), jax.jit(value_and_grad), jax.jit(hessian),
                jax.jit(hessian_times))

    # -- what the library calls --------------------------------------------------------------

    def _inputs(self, w, X, y):
        """w, X, y as NumPy arrays for the programs (:func:`checked_inputs`), padded to the
        bucket; and the number n of real rows."""
        w, X, y, n = checked_inputs(self.name, w, X, y, DTYPES[self.dtype])
        b = bucket_size(n, self.buckets)
        X = pad_rows(X, b)
        y = None if y is None else pad_rows(y, b)
        return w, X, y, n

    def _run(self, which: int, w, X, y, V=None):
        programs = self._compiled()
        w, X, y, n = self._inputs(w, X, y)
        if n == 0:
            return self._empty(which, w.size) if which < 3 else np.full(V.shape, np.nan)
        import jax

        try:
            if which == 2:
                return np.array(programs[2](w, X, y, np.int32(n)), dtype=np.float64)
            if which == 3:
                return np.array(programs[3](w, X, y, np.int32(n), V), dtype=np.float64)
            if which == 0:
                v = programs[0](w, X, y)
            else:
                v, g = programs[1](w, X, y, np.int32(n))
        except (jax.errors.JAXTypeError, jax.errors.JAXIndexError) as exc:
            raise _not_traceable(self.name, exc) from exc
        # slice on the host: a slice of a JAX array is one more dispatched computation
        v = np.array(np.asarray(v)[:n], dtype=np.float64)
        return v if which == 0 else (v, np.array(g, dtype=np.float64))


def from_jax(loss: Callable, name: Optional[str] = None, *, batched: bool = False,
             buckets: str = "pow2", dtype: str = "float64", surrogate=None
             ) -> JaxSampleFunction:
    """A SampleFunction from the JAX loss of one sample (automatic differentiation).

    Implements f(w, x_n) (eq. (Fs0) and the F_m of Problem 3) from ``loss``: values per sample
    by ``jax.vmap``, the gradient of the batch mean by ``jax.value_and_grad``, jit-compiled once
    per bucket of batch sizes; its Hessian (``hess``, by ``jax.hessian``) and Hessian times a
    block of vectors (``hessp``, forward over reverse) for the Newton and sketch models
    (``hessian="newton"`` / ``"sketch"``). Also reachable as ``ss.SampleFunction.from_jax``.

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
