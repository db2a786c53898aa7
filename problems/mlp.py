"""The paper's 3-layer network (Section V) as SampleFunctions, with Numba client kernels.

K inputs, J hidden units with the swish activation S(z) = z / (1 + exp(-z)), L softmax outputs
and the cross-entropy of eqs. (Fcost)/(Ql):

    F(w) = -(1/N) sum_n sum_l y_{n,l} log Q_l(w, x_n),   w = (w1 in R^{J x K}, w2 in R^{L x J}).

w is stored flat, w1 row-major then w2 (then b1 in R^J and b2 in R^L with ``bias=True``; the
authors' public code has biases and a ReLU hidden layer, hence the options). The kernel computes
in one pass what a client sends: the per-sample losses (the value term of A-bar, with the sign
of PAPER_NOTES item 3: the surrogate's constant is f(w_t) - grad f(w_t).w_t + tau |w_t|^2 with
f = -sum_l y_l log Q_l >= 0) and the gradient blocks B-bar (w.r.t. w1) and C-bar (w.r.t. w2).
Matrix products go to BLAS (np.dot inside Numba); the elementwise work is fused in loops.

Problems: :func:`classification_uncon` (prob:class-uncon, F + lambda |w|^2) and
:func:`classification_con` (prob:class-con, min |w|^2 s.t. F <= U), both ordinary
``ssca_solver.Problem``s, so ``solve(method="ssca")`` picks the closed-form subproblem solver.
"""

from __future__ import annotations

from dataclasses import dataclass

import cvxpy as cp
import numpy as np
from numba import njit

import ssca_solver as ss

SWISH, RELU = 0, 1


@njit(cache=True)
def _forward_backward(w1, w2, b1, b2, X, y, act, want_grad):
    """Per-sample cross-entropy and the gradient sums (not means) of the batch.

    Returns (losses (n,), g1 (J, K), g2 (L, J), gb1 (J,), gb2 (L,), correct count).
    """
    n = X.shape[0]
    J, L = w1.shape[0], w2.shape[0]
    H = np.dot(X, w1.T)                     # (n, J), BLAS
    S = np.empty_like(H)
    Sp = np.empty_like(H)
    for i in range(n):                      # fused: activation and its derivative
        for j in range(J):
            h = H[i, j] + b1[j]
            if act == SWISH:
                sig = 1.0 / (1.0 + np.exp(-h))
                S[i, j] = h * sig
                Sp[i, j] = sig * (1.0 + h * (1.0 - sig))
            else:
                S[i, j] = h if h > 0.0 else 0.0
                Sp[i, j] = 1.0 if h > 0.0 else 0.0
    Z = np.dot(S, w2.T)                     # (n, L), BLAS
    losses = np.empty(n)
    D = np.empty_like(Z)
    correct = 0
    for i in range(n):                      # fused: stable softmax, loss, Q - Y, argmax
        zmax = -np.inf
        best = 0
        for l in range(L):
            z = Z[i, l] + b2[l]
            Z[i, l] = z
            if z > zmax:
                zmax = z
                best = l
        s = 0.0
        for l in range(L):
            e = np.exp(Z[i, l] - zmax)
            D[i, l] = e
            s += e
        losses[i] = np.log(s) + zmax - Z[i, y[i]]
        for l in range(L):
            D[i, l] /= s
        D[i, y[i]] -= 1.0
        if best == y[i]:
            correct += 1
    if not want_grad:
        return losses, np.empty((0, 0)), np.empty((0, 0)), np.empty(0), np.empty(0), correct
    g2 = np.dot(D.T, S)                     # (L, J) = C-bar (sums), BLAS
    dS = np.dot(D, w2)                      # (n, J), BLAS
    gb1 = np.zeros(J)
    gb2 = np.zeros(L)
    for i in range(n):
        for j in range(J):
            dS[i, j] *= Sp[i, j]
            gb1[j] += dS[i, j]
        for l in range(L):
            gb2[l] += D[i, l]
    g1 = np.dot(dS.T, X)                    # (J, K) = B-bar (sums), BLAS
    return losses, g1, g2, gb1, gb2, correct


@dataclass(frozen=True)
class MLP:
    """Shapes and flat-vector layout of the K-J-L network of Section V.

    Args:
      K, J, L: input, hidden and output sizes (paper: 784, 128, 10).
      activation: "swish" (the paper) or "relu" (the authors' public code).
      bias: add hidden and output biases (the public code has them; the paper does not).
    """

    K: int
    J: int
    L: int
    activation: str = "swish"
    bias: bool = False

    def __post_init__(self):
        if self.activation not in ("swish", "relu"):
            raise ValueError(f"activation must be 'swish' or 'relu', got {self.activation!r}")
        if min(self.K, self.J, self.L) < 1:
            raise ValueError("K, J and L must be positive")

    @property
    def dim(self) -> int:
        """d = J K + L J (+ J + L with biases); 784*128 + 128*10 = 101,632 in the paper."""
        return self.J * self.K + self.L * self.J + (self.J + self.L if self.bias else 0)

    def unflatten(self, w):
        """Views (w1 (J, K), w2 (L, J), b1 (J,), b2 (L,)) into the flat vector w."""
        w = np.ascontiguousarray(w, dtype=float)
        if w.shape != (self.dim,):
            raise ValueError(f"w must have shape ({self.dim},), got {w.shape}")
        J, K, L = self.J, self.K, self.L
        a, b = J * K, J * K + L * J
        w1, w2 = w[:a].reshape(J, K), w[a:b].reshape(L, J)
        if self.bias:
            return w1, w2, w[b:b + J], w[b + J:]
        return w1, w2, np.zeros(J), np.zeros(L)

    def flatten_grad(self, g1, g2, gb1, gb2) -> np.ndarray:
        parts = [g1.ravel(), g2.ravel()] + ([gb1, gb2] if self.bias else [])
        return np.concatenate(parts)

    def init(self, seed=0, scale: float = 1.0) -> np.ndarray:
        """A random start: weights N(0, scale^2 / fan_in), biases zero."""
        rng = np.random.default_rng(seed)
        w1 = rng.standard_normal((self.J, self.K)) * scale / np.sqrt(self.K)
        w2 = rng.standard_normal((self.L, self.J)) * scale / np.sqrt(self.J)
        parts = [w1.ravel(), w2.ravel()] + ([np.zeros(self.J + self.L)] if self.bias else [])
        return np.concatenate(parts)

    def _run(self, w, X, y, want_grad):
        """The kernel on rows X, labels y; both are checked first (a bad label would index
        out of bounds inside the kernel and crash the process)."""
        w1, w2, b1, b2 = self.unflatten(w)
        X = self._features(X, "batch")
        y = class_labels(y, X.shape[0], self.L, "batch")
        return _forward_backward(w1, w2, b1, b2, X, y, SWISH if self.activation == "swish"
                                 else RELU, want_grad)

    def _features(self, X, where: str) -> np.ndarray:
        """X as a C-contiguous float array of shape (n, K), or a ValueError."""
        X = np.ascontiguousarray(X, dtype=float)
        if X.ndim != 2 or X.shape[1] != self.K:
            raise ValueError(f"{where}: X must have shape (n, {self.K}) for a network with "
                             f"K = {self.K} inputs, got {X.shape}")
        return X

    def cross_entropy(self, name: str = "cross-entropy") -> ss.SampleFunction:
        """F of eq. (Fcost) as a SampleFunction (labels y in {0..L-1})."""

        def value(w, X, y):
            return self._run(w, X, y, False)[0]

        def value_and_grad(w, X, y):
            losses, g1, g2, gb1, gb2, _ = self._run(w, X, y, True)
            g = self.flatten_grad(g1, g2, gb1, gb2)
            g /= X.shape[0]
            return losses, g

        def grad(w, X, y):
            return value_and_grad(w, X, y)[1]

        return ss.SampleFunction(value, grad, name=name, value_and_grad=value_and_grad)

    def evaluate(self, w, X, y, chunk: int = 8192) -> tuple[float, float]:
        """Full-data cost F(w) and accuracy, in chunks of rows (no gradient)."""
        X = self._features(X, "evaluate")
        y = class_labels(y, X.shape[0], self.L, "evaluate")
        total, correct = 0.0, 0
        for s in range(0, len(y), chunk):
            losses, *_, c = self._run(w, X[s:s + chunk], y[s:s + chunk], False)
            total += float(losses.sum())
            correct += int(c)
        return total / len(y), correct / len(y)


def class_labels(y, n: int, L: int, where: str) -> np.ndarray:
    """Labels y as int64 class indices in 0..L-1, one per row; DataError naming the first bad one.

    Integer labels (any int dtype, or bool) and floats that are exact integers (3.0) are
    accepted; a label outside 0..L-1, a NaN or a fraction is refused. Cost: a min and a max
    for integer labels, so it runs on every batch before the Numba kernel, which does not check
    bounds.
    """
    y = np.asarray(y)
    if y.shape != (n,):
        raise ss.DataError(f"{where}: labels y must be a vector of {n} class indices, one per row "
                           f"of X, got shape {y.shape}; for one-hot rows pass y.argmax(axis=1)")
    if y.dtype == np.bool_ or n == 0:
        return np.ascontiguousarray(y, dtype=np.int64)
    if np.issubdtype(y.dtype, np.integer):
        ok = None if 0 <= y.min() and y.max() < L else (y >= 0) & (y < L)
    elif np.issubdtype(y.dtype, np.floating):
        with np.errstate(invalid="ignore"):
            ok = (y >= 0) & (y < L) & (y == np.floor(y))  # False for NaN and +-inf
    else:
        raise ss.DataError(f"{where}: labels y must be integers 0..{L - 1}, got dtype {y.dtype}")
    if ok is not None and not ok.all():
        row = int(np.flatnonzero(~ok)[0])
        raise ss.DataError(f"{where}, row {row}: label {y[row]} is not a class index: labels "
                           f"must be integers 0..{L - 1} for a network with L = {L} outputs; "
                           "fix the labels or build the MLP with a matching L")
    return np.ascontiguousarray(y, dtype=np.int64)


def _check_data(data: ss.FederatedData, net: MLP) -> None:
    """Every client's rows fit the network: K features and labels in 0..L-1 (DataError)."""
    for i, c in enumerate(data.clients):
        if c.X.shape[1:] != (net.K,):
            raise ss.DataError(f"client {i}: rows of X have shape {c.X.shape[1:]}, the network "
                               f"expects ({net.K},) (K = {net.K} inputs)")
        if c.y is None:
            raise ss.DataError("the network's cross-entropy needs labels: build FederatedData "
                               "with (X, y) pairs")
        class_labels(c.y, c.num_rows, net.L, f"client {i}")


def classification_uncon(data: ss.FederatedData, net: MLP, lam: float = 1e-5,
                         lam_mode: str = "exact") -> ss.Problem:
    """prob:class-uncon: minimise F(w) + lambda |w|^2.

    ``lam_mode="exact"`` (default) keeps lambda |w|^2 exact in the subproblem (PAPER_NOTES item
    5); ``"linearised"`` puts it inside f_0, so the proximal-linear surrogate linearises it as
    the paper does (the 2 lambda beta term of eq. (prob:class-uncon-ap)). A solve without
    ``x0`` starts from the network's own initialisation ``net.init(0)`` (at w = 0 its hidden
    units are dead).
    """
    if lam_mode not in ("exact", "linearised"):
        raise ValueError(f"lam_mode must be 'exact' or 'linearised', got {lam_mode!r}")
    _check_data(data, net)
    ce = net.cross_entropy()
    if lam_mode == "exact" or lam == 0:
        reg = (lambda w: lam * cp.sum_squares(w)) if lam else None
        return ss.Problem(ce, dim=net.dim, data=data, regularizer=reg, x0=net.init(0))

    def value(w, X, y):
        return ce.value(w, X, y) + lam * float(w @ w)

    def value_and_grad(w, X, y):
        v, g = ce.value_and_grad(w, X, y)
        return v + lam * float(w @ w), g + 2 * lam * w

    f0 = ss.SampleFunction(value, lambda w, X, y: value_and_grad(w, X, y)[1],
                           name="cross-entropy + lambda|w|^2", value_and_grad=value_and_grad)
    return ss.Problem(f0, dim=net.dim, data=data, x0=net.init(0))


def classification_con(data: ss.FederatedData, net: MLP, U: float = 0.13) -> ss.Problem:
    """prob:class-con: minimise |w|^2 subject to F(w) <= U (a solve without ``x0`` starts
    from ``net.init(0)``)."""
    _check_data(data, net)
    return ss.Problem(lambda w: cp.sum_squares(w), [net.cross_entropy() <= U], dim=net.dim,
                      data=data, x0=net.init(0))
