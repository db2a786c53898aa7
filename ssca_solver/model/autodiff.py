"""Per-sample functions by automatic differentiation: a JAX (:func:`from_jax`) or PyTorch
(:func:`from_torch`) loss of one sample becomes a
:class:`~ssca_solver.model.functions.SampleFunction`.

The user writes ``loss(w, x, y) -> scalar``, the loss f(w, x_n) of ONE row x (and its target
y) in ``jax.numpy`` or torch. :func:`from_jax` and :func:`from_torch` turn it into the two
callables the library asks for (docs/modelling.md, "Per-sample functions"; docs/autodiff.md):

* ``value(w, X, y)``: the per-sample values f(w, x_n), n = 1..B, by ``jax.vmap`` (or
  ``torch.func.vmap``) of the loss over the rows;
* ``grad(w, X, y)``: the gradient of their mean (1/B) sum_n f(w, x_n), by ``jax.grad`` of the
  mean (reverse-mode autograd in torch); ``value_and_grad`` gives both in one forward and one
  backward pass (what the clients call for the surrogate statistics of eqs.
  (fs0bar)/(fsmbar) and for the KKT test).

The code is in three modules: :mod:`.autodiff_common` (the base class, the checks of inputs
and of what a loss returns, the bucketing of batch sizes), :mod:`.autodiff_jax` (compiling
per bucket, x64, forks after JAX started) and :mod:`.autodiff_torch` (eager, one thread after
a fork). This module gathers their public names; neither JAX nor torch is imported with it.
"""

from .autodiff_common import BUCKETS, DTYPES, AutodiffSampleFunction, bucket_size
from .autodiff_jax import INSTALL_HINT, JaxSampleFunction, ensure_x64, from_jax, import_jax
from .autodiff_jax import _jax_started  # noqa: F401  (tests read it; not public)
from .autodiff_torch import (TORCH_DTYPES, TORCH_INSTALL_HINT, TorchSampleFunction,
                             from_torch, import_torch)

__all__ = ["from_jax", "JaxSampleFunction", "from_torch", "TorchSampleFunction",
           "AutodiffSampleFunction", "bucket_size", "BUCKETS", "DTYPES", "TORCH_DTYPES",
           "INSTALL_HINT", "TORCH_INSTALL_HINT", "ensure_x64", "import_jax", "import_torch"]
