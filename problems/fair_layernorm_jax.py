"""A small network with layer normalisation under a demographic-parity constraint, in JAX.

A model that would be painful to differentiate by hand: one hidden layer with
layer normalisation (Ba, Kiros & Hinton 2016) and tanh, a scalar score, the logistic loss,
and a two-sided bound on the demographic-parity gap of the predicted probabilities:

    s(w, x)    = v . tanh(LN(W x + b)) + c,
    LN(h)      = gamma * (h - mean(h)) / sqrt(var(h) + 1e-5) + beta      (over the J units)
    minimise   (1/N) sum_n log(1 + exp(-(2 y_n - 1) s(w, x_n)))  +  lam |w|^2
    subject to DP(w) <= eps  and  -DP(w) <= eps,
    DP(w)      = mean_{g=1} sigma(s(w, x_n)) - mean_{g=0} sigma(s(w, x_n)).

Both sides of the bound are stochastic constraints F_m(w) <= U_m of Problem 3: DP(w) is the mean
over all N rows of (1{g_n = 1}/pi_1 - 1{g_n = 0}/pi_0) sigma(s(w, x_n)), pi_g the share of
group g, and it is nonconvex in w, as is the loss. The backward pass of the normalisation
(the mean and the variance over the units both depend on every weight of W and b) is what
a hand-written gradient would have to derive; here :func:`score` is the whole model and
``ss.SampleFunction.from_jax`` differentiates it.

Data: scikit-learn's bundled diabetes data (442 patients, no download), the label "disease
progression above the median", the protected attribute the recorded sex, kept as the LAST
column of X (the model reads the columns before it; docs/worked-examples.md, section 1).
w is one flat vector: W (J x K, row-major), b (J), gamma (J), beta (J), v (J), c (1).

:func:`pooled_reference` solves the same problem on the pooled rows by SciPy (SLSQP or
trust-constr) with the JAX gradients, and :func:`kkt_residuals` measures the first-order
conditions of any point on the pooled rows, so that a federated result can be checked
independently of the library's own KKT report. JAX is imported when a function is built or
called, not with this module.
"""

from __future__ import annotations

import functools

import cvxpy as cp
import numpy as np

import ssca_solver as ss

#: the normalisation's epsilon inside the square root (PyTorch's and Flax's default)
LN_EPS = 1e-5


def diabetes_groups():
    """(X (442, 10), y (442,)): the 9 standardised features other than sex, then the group
    g = 1{sex above its mean} as the last column; y = 1{progression above the median}
    (modelling support: the data)."""
    from sklearn.datasets import load_diabetes

    d = load_diabetes()
    col = list(d.feature_names).index("sex")
    group = (d.data[:, col] > d.data[:, col].mean()).astype(float)
    feats = np.delete(d.data, col, axis=1)
    feats = (feats - feats.mean(0)) / feats.std(0)
    y = (d.target > np.median(d.target)).astype(float)
    return np.column_stack([feats, group]), y


class LayerNormNet:
    """Shapes and the flat layout of w for K inputs and J hidden units (modelling support)."""

    def __init__(self, K: int = 9, J: int = 8):
        self.K, self.J = int(K), int(J)
        self.dim = self.J * self.K + 4 * self.J + 1

    def unpack(self, w):
        """(W, b, gamma, beta, v, c) as views of the flat w (NumPy or JAX)."""
        J, K = self.J, self.K
        i = J * K
        return (w[:i].reshape(J, K), w[i:i + J], w[i + J:i + 2 * J], w[i + 2 * J:i + 3 * J],
                w[i + 3 * J:i + 4 * J], w[i + 4 * J])

    def init(self, seed: int = 0) -> np.ndarray:
        """A start: W ~ N(0, 1/K), gamma = 1, beta = 0, v ~ N(0, 1/J), b = c = 0."""
        rng = np.random.default_rng(seed)
        J, K = self.J, self.K
        return np.concatenate([rng.normal(scale=K ** -0.5, size=J * K), np.zeros(J),
                               np.ones(J), np.zeros(J), rng.normal(scale=J ** -0.5, size=J),
                               [0.0]])

    def __repr__(self) -> str:
        return f"LayerNormNet(K={self.K}, J={self.J})"


def score(net: LayerNormNet, w, x):
    """The score s(w, x) of ONE row x (its first K columns; the group column is not read):
    the network inside both per-sample functions (modelling support)."""
    import jax.numpy as jnp

    W, b, gamma, beta, v, c = net.unpack(w)
    h = W @ x[:net.K] + b
    h = (h - jnp.mean(h)) / jnp.sqrt(jnp.var(h) + LN_EPS)
    return v @ jnp.tanh(gamma * h + beta) + c


def logistic_loss(net: LayerNormNet, w, x, y):
    """The logistic loss log(1 + exp(-(2y - 1) s(w, x))) of one row: the objective's f_0(w, x_n)
    of eq. (Fs0)."""
    import jax.numpy as jnp

    return jnp.logaddexp(0.0, -(2.0 * y - 1.0) * score(net, w, x))


def parity_term(net: LayerNormNet, pi1: float, w, x, y):
    """(1{g = 1}/pi_1 - 1{g = 0}/pi_0) sigma(s(w, x)) of one row: its mean over all rows is
    DP(w), the F_m of Problem 3 (this is its per-sample f_m); g is the row's last column."""
    import jax

    g = x[-1]
    return (g / pi1 - (1.0 - g) / (1.0 - pi1)) * jax.nn.sigmoid(score(net, w, x))


def functions(net: LayerNormNet, pi1: float, **options):
    """(loss, gap): the objective's and the constraint's SampleFunctions by
    ``ss.SampleFunction.from_jax`` (``options`` go to it). Picklable: partials of module-level
    functions."""
    loss = ss.SampleFunction.from_jax(functools.partial(logistic_loss, net), name="logistic",
                                      **options)
    gap = ss.SampleFunction.from_jax(functools.partial(parity_term, net, float(pi1)),
                                     name="DP gap", **options)
    return loss, gap


def group_share(data: ss.FederatedData) -> float:
    """pi_1, the share of rows with g = 1, from the clients' counts (one number each;
    modelling support)."""
    return sum(float(c.X[:, -1].sum()) for c in data.clients) / data.num_samples


def fair_layernorm(data: ss.FederatedData, eps: float = 0.1, lam: float = 1e-3, J: int = 8,
                   **options) -> ss.Problem:
    """The problem of the module docstring on ``data`` (X's last column the group): the
    logistic loss + lam |w|^2 (exact in the subproblem) subject to |DP(w)| <= eps."""
    K = data.clients[0].X.shape[1] - 1
    net = LayerNormNet(K, J)
    loss, gap = functions(net, group_share(data), **options)
    reg = (lambda w: lam * cp.sum_squares(w)) if lam else None
    return ss.Problem(loss, [gap <= eps, gap >= -eps], dim=net.dim, data=data, regularizer=reg,
                      x0=net.init(0))


def pooled_parts(X, y, eps: float, lam: float = 1e-3, J: int = 8):
    """On the pooled rows: (objective(w), its gradient, [c_1(w), c_2(w)] with c_i <= 0
    feasible, their Jacobian (2, d)), by JAX (jit-compiled, float64); modelling support for
    :func:`pooled_reference` and :func:`kkt_residuals`."""
    net = LayerNormNet(X.shape[1] - 1, J)
    pi1 = float(np.mean(X[:, -1]))
    functions(net, pi1)              # from_jax turns JAX's x64 on (or refuses, saying where)
    import jax
    import jax.numpy as jnp

    Xj, yj = jnp.asarray(X, dtype=jnp.float64), jnp.asarray(y, dtype=jnp.float64)

    def objective(w):
        per = jax.vmap(lambda x, t: logistic_loss(net, w, x, t))(Xj, yj)
        return jnp.mean(per) + lam * w @ w

    def constraints(w):
        gap = jnp.mean(jax.vmap(lambda x: parity_term(net, pi1, w, x, None))(Xj))
        return jnp.stack([gap - eps, -gap - eps])

    f, df = jax.jit(objective), jax.jit(jax.grad(objective))
    c, dc = jax.jit(constraints), jax.jit(jax.jacobian(constraints))
    as_np = lambda fn: lambda w: np.asarray(fn(jnp.asarray(w)), dtype=np.float64)  # noqa: E731
    return as_np(f), as_np(df), as_np(c), as_np(dc)


def pooled_reference(X, y, eps: float, x0, lam: float = 1e-3, J: int = 8,
                     method: str = "SLSQP", **minimize_options):
    """The pooled problem by ``scipy.optimize.minimize`` (``"SLSQP"`` or ``"trust-constr"``)
    from ``x0``, with the JAX gradients: an independent local solver for the KKT point the
    federated run should reach (the problem is nonconvex). Returns scipy's OptimizeResult."""
    from scipy.optimize import NonlinearConstraint, minimize

    f, df, c, dc = pooled_parts(X, y, eps, lam, J)
    if method == "SLSQP":
        cons = [{"type": "ineq", "fun": lambda w: -c(w), "jac": lambda w: -dc(w)}]
        opts = {"ftol": 1e-14, "maxiter": 2000, **minimize_options}
    elif method == "trust-constr":
        cons = [NonlinearConstraint(c, -np.inf, 0.0, jac=dc)]
        opts = {"gtol": 1e-10, "xtol": 1e-14, "maxiter": 5000, **minimize_options}
    else:
        raise ValueError(f"method must be 'SLSQP' or 'trust-constr', got {method!r}")
    return minimize(f, np.asarray(x0, dtype=float), jac=df, constraints=cons, method=method,
                    options=opts)


def kkt_residuals(w, X, y, eps: float, lam: float = 1e-3, J: int = 8) -> dict:
    """The first-order (KKT) conditions of the pooled problem at ``w``, measured independently
    of the library: multipliers mu >= 0 by nonnegative least squares on the stationarity
    equation grad f + J_c^T mu = 0, then the relative stationarity
    |grad f + J_c^T mu| / max(1, |grad f|), the violation max(c, 0), and the complementarity
    max |mu_i c_i|; also the objective and DP(w)."""
    from scipy.optimize import nnls

    f, df, c, dc = pooled_parts(X, y, eps, lam, J)
    g, cv, A = df(w), c(w), dc(w)
    mu, _ = nnls(A.T, -g)
    r = g + A.T @ mu
    return {"objective": float(f(w)), "gap": float(cv[0] + eps), "multipliers": mu,
            "stationarity": float(np.linalg.norm(r) / max(1.0, np.linalg.norm(g))),
            "violation": float(np.max(np.maximum(cv, 0.0))),
            "complementarity": float(np.max(np.abs(mu * cv)))}
