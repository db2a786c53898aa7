"""The Newton model of the full-batch phase: the clients' curvature of every function at the
round's point, assembled into the Hessian of the Lagrangian.

On full batches every client sends, beside its statistics, the sum over its rows of each
function's Hessian at w_t (``SampleFunction.hess``; :mod:`.client`, ``"curv"``: packed
upper triangles, one row per function asked for). Weighted like the statistics
(h_i N_i / (B_i N)), they add up to the full-data Hessians H_m = grad^2 F_m(w_t): a sum of
replies, so secure aggregation and partial participation apply as to every statistic. The
server's model of the Lagrangian's Hessian is

    B = H_0 + sum_m nu_m H_m        (nu: the multipliers of the subproblem that gave w_t),

made positive definite: each eigenvalue replaced by its absolute value, and raised to at least
EIGEN_FLOOR of the largest (the Lagrangian of a nonconvex problem need not be convex: a
negative curvature kept by its size, not floored near zero, keeps the step from running far
along it; the modified Newton methods of Nocedal & Wright, sec. 3.4). It enters the
objective's surrogate exactly where the quasi-Newton model does (:mod:`.quasi_newton`: same
interface), so every round is an SQP step (Nocedal & Wright, ch. 18) with the linearised
constraints of Problem 5 and the same exact-penalty backtracking (:mod:`.acceptance`). With
the exact Hessian the steps converge quadratically near a KKT point whatever the conditioning
of the problem, where first-order and quasi-Newton rounds slow down with it.

Above the size where whole Hessians are worth their floats (``hessian="sketch"``), the
request carries k orthonormal directions Omega (k x d, :func:`sketch_directions`: the last
model's leading eigenvectors, the last step and fresh Gaussian ones) and each client sends
each function's Hessian times them, k d floats (``"curv"``, rows H_m omega_j). Their sum
Y = L Omega' with the same weights nu gives the randomized Nystrom approximation
Y (Omega Y')^+ Y' of the Lagrangian's Hessian L (Tropp, Yurtsever, Udell & Cevher 2017,
stabilised by a shift; Rayleigh-Ritz, eigenvalues by their absolute values, where Omega L
Omega' is indefinite), and the model is that approximation on its range with the smallest
of its k eigenvalues on the complement (the Nystrom preconditioner of Frangella, Tropp &
Udell 2023): :class:`SketchModel`, B = rho I + U' diag(lambda - rho) U. The directions carry
the leading eigenvectors forward, so successive rounds refine them as a subspace iteration
would.
"""

from __future__ import annotations

import numpy as np

from .client import CURVATURE, unpack_symmetric

#: the model's smallest eigenvalue is at least this fraction of its largest
EIGEN_FLOOR = 1e-12
#: the sketch's fresh Gaussian directions each round (the rest: the last model's leading
#: eigenvectors and the last step)
SKETCH_FRESH = 2
#: the random stream of the sketch's Gaussian directions (with the round: reproducible,
#: and the same after a checkpoint's resume)
SKETCH_SEED = 0x5C7


class NewtonModel:
    """A positive definite model B of the Lagrangian's Hessian from its full-data Hessian
    ``H`` (symmetric, d x d; eigenvalues by their absolute values, floored), with the interface of
    :class:`~ssca_solver.methods.ssca.quasi_newton.LBFGSModel` that the subproblem solvers
    read: ``delta`` (the model's scale: the mean of its eigenvalues), ``directions()`` (its
    eigenvectors, rows), ``matvec``, ``matmat``."""

    def __init__(self, H: np.ndarray):
        H = np.asarray(H, dtype=float)
        h, V = np.linalg.eigh(0.5 * (H + H.T))
        h = np.abs(h)                     # a negative curvature counts by its size
        top = float(np.max(h, initial=0.0))
        h = np.maximum(h, EIGEN_FLOOR * top if top > 0.0 else 1e-300)
        self.S = H                       # the state's array this model was built from
        self.eigenvalues, self.V = h, V
        self.B = (V * h) @ V.T
        self.delta = float(np.mean(h))

    def __len__(self) -> int:
        return self.B.shape[0]

    def matvec(self, v: np.ndarray) -> np.ndarray:
        return self.B @ v

    def eigen(self) -> tuple:
        """(eigenvalues, eigenvectors as columns) of B: the closed-form subproblem's basis."""
        return self.eigenvalues, self.V

    def matmat(self, V: np.ndarray) -> np.ndarray:
        return self.B @ V

    def directions(self) -> np.ndarray:
        return self.V.T


class SketchModel:
    """The positive definite model B = rho I + U' diag(lambda - rho) U of a sketch of the
    Lagrangian's Hessian (module docstring): ``U`` (k, d) orthonormal rows, ``eig`` the k
    eigenvalues lambda (descending, each >= rho) followed by rho. The interface of
    :class:`NewtonModel`; ``delta`` = rho, the eigenvalue on the complement of U's rows."""

    def __init__(self, U: np.ndarray, eig: np.ndarray):
        self.S = U                       # the state's array this model was built from
        self.U = np.asarray(U, dtype=float)
        eig = np.asarray(eig, dtype=float)
        self.eigenvalues, self.delta = eig[:-1], float(eig[-1])
        self._excess = self.eigenvalues - self.delta

    def __len__(self) -> int:
        return self.U.shape[0]

    def matvec(self, v: np.ndarray) -> np.ndarray:
        return self.delta * v + self.U.T @ (self._excess * (self.U @ v))

    def matmat(self, V: np.ndarray) -> np.ndarray:
        return self.delta * V + self.U.T @ (self._excess[:, None] * (self.U @ V))

    def eigen(self) -> tuple:
        """(eigenvalues, eigenvectors as columns) of B: U's rows, and a basis of their
        complement (a complete QR) with eigenvalue rho."""
        k, d = self.U.shape
        Q, _ = np.linalg.qr(self.U.T, mode="complete")
        return (np.concatenate([self.eigenvalues, np.full(d - k, self.delta)]),
                np.hstack([self.U.T, Q[:, k:]]))

    def directions(self) -> np.ndarray:
        return self.U


def sketch_directions(k: int, t: int, w: np.ndarray, prev_w: np.ndarray,
                      model_rows: np.ndarray) -> np.ndarray:
    """Omega (k, d), orthonormal rows: the directions whose Hessian products round ``t``
    asks for at w: the leading rows of the last model (``model_rows``, eigenvectors by
    descending eigenvalue; empty: none yet), the step w - prev_w, and Gaussian ones (at
    least SKETCH_FRESH, from the round's own stream). A pure function of its arguments: the
    request and the step that reads the replies build the same."""
    d = w.size
    rng = np.random.default_rng([SKETCH_SEED, int(t)])
    cols = []
    kept = min(len(model_rows), max(0, k - 1 - SKETCH_FRESH))
    if kept:
        cols.append(np.asarray(model_rows[:kept], dtype=float).T)
    if len(prev_w) == d:
        s = w - prev_w
        if float(np.linalg.norm(s)) > 0.0:
            cols.append(s[:, None])
    fresh = k - sum(c.shape[1] for c in cols)
    cols.append(rng.standard_normal((d, fresh)))
    Q, _ = np.linalg.qr(np.hstack(cols))
    return np.ascontiguousarray(Q.T)


def sketch_model(omega: np.ndarray, Y: np.ndarray) -> tuple:
    """(U (k, d), eig (k + 1,)) of :class:`SketchModel` from the directions ``omega`` (k, d,
    orthonormal rows) and the Lagrangian's Hessian's products with them ``Y`` (k, d; rows
    L omega_j): the stabilised Nystrom approximation when Omega L Omega' is positive
    semidefinite, else Rayleigh-Ritz on Omega's rows with the eigenvalues' absolute values;
    the complement's eigenvalue rho the smallest of the k, and every eigenvalue at least
    EIGEN_FLOOR of the largest."""
    k, d = omega.shape
    T = omega @ Y.T
    T = 0.5 * (T + T.T)
    theta, Z = np.linalg.eigh(T)
    top = float(np.max(np.abs(theta), initial=0.0))
    U, lam = None, None
    if theta[0] >= -1e-10 * top and top > 0.0:
        shift = np.sqrt(d) * np.finfo(float).eps * float(np.linalg.norm(Y))
        Ys = Y + shift * omega
        core = omega @ Ys.T
        try:
            C = np.linalg.cholesky(0.5 * (core + core.T))
        except np.linalg.LinAlgError:
            C = None
        if C is not None:
            F = np.linalg.solve(C, Ys)                  # (k, d): B_nys = F' F
            _, sv, Vt = np.linalg.svd(F, full_matrices=False)
            U, lam = Vt, np.maximum(sv ** 2 - shift, 0.0)
    if U is None:                                       # indefinite: Rayleigh-Ritz
        order = np.argsort(-np.abs(theta))
        U, lam = (omega.T @ Z[:, order]).T, np.abs(theta[order])
    top = float(np.max(lam, initial=0.0))
    floor = EIGEN_FLOOR * top if top > 0.0 else 1e-300
    lam = np.maximum(lam, floor)
    return np.ascontiguousarray(U), np.append(lam, lam[-1])


def lagrangian_hessian(curvature: dict, nu: np.ndarray, first: int, d: int) -> np.ndarray:
    """H_0 + sum_m nu_m H_m from the round's full-data Hessians ``curvature`` (function index
    -> H), ``first`` the index of the first constraint (1 when the objective is stochastic)."""
    weights = np.concatenate(([1.0] * first, np.asarray(nu, dtype=float)))
    total = np.zeros_like(next(iter(curvature.values()))) if curvature else np.zeros((d, d))
    for m, H in curvature.items():
        if weights[m] != 0.0:
            total += weights[m] * H
    return total


class CurvatureSum:
    """A round's curvature replies added up (:func:`take_curvature`): the rows of the reply
    array ``"curv"`` are the functions ``rows`` (the round's request asked for their
    curvature, in index order), each a packed Hessian (:func:`.client.pack_symmetric`) or a
    sketch's (k, d) products; weighted like the statistics and summed as they came."""

    def __init__(self, rows, d: int):
        self.rows = [int(m) for m in rows]
        self.d = int(d)
        self.total = None

    def add(self, reply, weight: float) -> None:
        """Add ``weight`` times ``reply``'s curvature array (one row per function asked
        for: another count is the client's fault, a ReplyError naming it)."""
        value = np.asarray(reply.arrays[CURVATURE], dtype=float)
        if value.ndim not in (2, 3) or value.shape[0] != len(self.rows):
            from ...errors import ReplyError

            raise ReplyError(reply.client, reply.round, f"its reply to task {reply.task!r} "
                             f"has array {CURVATURE!r} of shape {value.shape}, but the round "
                             f"asked for the curvature of {len(self.rows)} functions (one "
                             "row each)", kind="shape", array=CURVATURE)
        S = weight * value
        self.total = S if self.total is None else self.total + S

    def by_function(self) -> dict:
        """Function index -> its full-data Hessian (d, d) (a sketch's (k, d) products), views
        of one array; empty when no reply carried curvature."""
        if self.total is None:
            return {}
        H = self.total if self.total.ndim == 3 else unpack_symmetric(self.total, self.d)
        return {m: H[i] for i, m in enumerate(self.rows)}


def take_curvature(reply, weight: float, total: CurvatureSum) -> dict:
    """The reply's arrays without its curvature array, which (times ``weight``, the reply's
    aggregation weight) is added into ``total``."""
    if CURVATURE not in reply.arrays:
        return reply.arrays
    total.add(reply, weight)
    return {k: v for k, v in reply.arrays.items() if k != CURVATURE}
