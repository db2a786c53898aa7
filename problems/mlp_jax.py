"""The paper's 3-layer network (Section V) written as a JAX loss: no hand-written gradient.

The same K-J-L network, swish (or ReLU) hidden layer, softmax outputs and cross-entropy as
:mod:`problems.mlp` (eqs. (Fcost)/(Ql)), with the same flat layout of w (w1 row-major, then w2,
then b1 and b2 with ``bias=True``):

    f(w, x, y) = log sum_l exp(z_l) - z_y,   z = w2 S(w1 x + b1) + b2.

:func:`cross_entropy` is the loss of one sample handed to ``ss.SampleFunction.from_jax``, which
vmaps it over a batch and differentiates the batch mean; :func:`classification_uncon` and
:func:`classification_con` are the problems of :mod:`problems.mlp` with it in place of the Numba
kernels, so ``solve(method="ssca")`` still picks the closed-form subproblem (it needs only the
surrogate statistics). JAX is imported when a function is built, not with this module.
"""

from __future__ import annotations

import functools

import cvxpy as cp

import ssca_solver as ss
from problems.mlp import MLP, _check_data


def network_loss(net: MLP, w, x, y):
    """The cross-entropy -log Q_y(w, x) of ONE sample x (K,) with class label y (eq. (Ql))."""
    import jax
    import jax.numpy as jnp

    J, K, L = net.J, net.K, net.L
    a, b = J * K, J * K + L * J
    w1, w2 = w[:a].reshape(J, K), w[a:b].reshape(L, J)
    h = w1 @ x
    if net.bias:
        h = h + w[b:b + J]
    s = h * jax.nn.sigmoid(h) if net.activation == "swish" else jax.nn.relu(h)
    z = w2 @ s
    if net.bias:
        z = z + w[b + J:]
    return jax.nn.logsumexp(z) - z[jnp.asarray(y).astype(jnp.int32)]


def cross_entropy(net: MLP, name: str = "cross-entropy", **options) -> ss.SampleFunction:
    """F of eq. (Fcost) as a SampleFunction by automatic differentiation (labels y in
    {0..L-1}); ``options`` go to ``from_jax`` (``buckets``, ``dtype``). Picklable: the loss
    is a partial of a module-level function and the network's shapes."""
    return ss.SampleFunction.from_jax(functools.partial(network_loss, net), name=name,
                                      **options)


def classification_uncon(data: ss.FederatedData, net: MLP, lam: float = 1e-5,
                         **options) -> ss.Problem:
    """prob:class-uncon with the JAX loss: minimise F(w) + lambda |w|^2 (lambda |w|^2 exact in
    the subproblem, as ``problems.mlp.classification_uncon(lam_mode="exact")``)."""
    _check_data(data, net)
    reg = (lambda w: lam * cp.sum_squares(w)) if lam else None
    return ss.Problem(cross_entropy(net, **options), dim=net.dim, data=data, regularizer=reg,
                      x0=net.init(0))


def classification_con(data: ss.FederatedData, net: MLP, U: float = 0.13,
                       **options) -> ss.Problem:
    """prob:class-con with the JAX loss: minimise |w|^2 subject to F(w) <= U."""
    _check_data(data, net)
    return ss.Problem(lambda w: cp.sum_squares(w), [cross_entropy(net, **options) <= U],
                      dim=net.dim, data=data, x0=net.init(0))
