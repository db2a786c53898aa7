"""A damped limited-memory BFGS model of the Lagrangian for the full-batch phase.

On full batches every round's statistics hold the exact gradient of every F_m at the round's
point (grad p_m(q, w_t) = 2 quad w_t + lin), so pairs

    s_k = w_{k+1} - w_k,   y_k = grad L(w_{k+1}, nu) - grad L(w_k, nu),
    L(w, nu) = F_0(w) + sum_m nu_m F_m(w)        (nu: the multipliers of the step's subproblem)

cost no communication: both gradients were sent anyway (the rounds at w_k and w_{k+1}). The
deterministic terms R (lambda |w|^2) are modelled exactly by the subproblem and left out of L.
The model B of the Hessian of L is the limited-memory BFGS matrix of the last ``memory`` pairs
in the compact form of Byrd, Nocedal and Schnabel (Math. Programming 63, 1994, eq. (2.17)):

    B = delta I - Psi N^{-1} Psi',   Psi = [delta S', Y'],   N = [[delta S S', L], [L', -D]],

L the strictly lower triangle of S Y' and D its diagonal, delta = y'y / s'y of the newest pair.
The Lagrangian of a constrained problem need not be convex, so a pair is damped as in Powell's
SQP (Nocedal & Wright, Numerical Optimization, Procedure 18.2): when s'y < 0.2 s'Bs, y is
replaced by theta y + (1 - theta) B s with theta = 0.8 s'Bs / (s'Bs - s'y), which keeps
s'y = 0.2 s'Bs > 0 and so B positive definite.

The model enters the objective's surrogate as (w - w_t)' B (w - w_t) / 2 on top of the
proximal term tau |w - w_t|^2 (tau is the backtracking's regularisation, a Levenberg-Marquardt
weight; it falls fast while steps are accepted): the subproblem is the SQP step with an l1
exact penalty (Fletcher's Sl1QP) and the constraints linearised with tau's proximal term. The
closed form keeps its M-dimensional dual: B is a multiple of I plus a rank <= 2 memory term, so
the dual is the diagonal closed form's in an orthonormal basis of the 2 memory directions plus
the scalar closed form's on their complement
(:func:`ssca_solver.subproblems.closed_form.solve_closed_form_model`).

B models the whole Lagrangian, the constraints' curvature included (weighted by nu). It is
not split by constraint: a secant curvature per inequality fails where the multipliers are
large and not unique (an equality written as two inequalities), since each constraint's share
of y then swings from round to round.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

#: pairs kept (the model's rank is at most twice this) above SMALL_DIM variables
MEMORY = 8
#: pairs kept at most SMALL_DIM variables, where a model of rank up to 2 SMALL_MEMORY costs
#: little and a longer memory resolves more of the curvature (the benchmarks page has the
#: rounds with either memory)
SMALL_DIM = 512
SMALL_MEMORY = 64
#: Powell's damping threshold: s'y >= DAMPING s'Bs after damping
DAMPING = 0.2
#: a pair whose step is this small relative to |w| carries rounding, not curvature
MIN_STEP = 1e-10
#: the model's smallest eigenvalue must exceed this fraction of its largest, and its middle
#: matrix's inverse must satisfy |N N^-1 - I|_max <= INVERSE_TOL (LBFGSModel); else the
#: oldest pairs are dropped
PD_TOL = 1e-10
INVERSE_TOL = 1e-8


def memory_for(dim: int) -> int:
    """The pairs the model keeps for a problem with ``dim`` variables."""
    return SMALL_MEMORY if int(dim) <= SMALL_DIM else MEMORY


class LBFGSModel:
    """The compact limited-memory BFGS matrix B of the pairs (S, Y) (rows: s_k, y_k, oldest
    first; the y_k already damped), with B = delta I - Psi N^{-1} Psi' (module docstring)."""

    def __init__(self, S: np.ndarray, Y: np.ndarray):
        S = np.asarray(S, dtype=float)
        Y = np.asarray(Y, dtype=float)
        # every pair has s'y > 0, so B is positive definite in exact arithmetic; in floating
        # point the compact form loses it when the steps are nearly dependent (more pairs than
        # variables, or iterates converging along a line): N is then nearly singular and its
        # inverse garbage. The oldest pairs are dropped until B is positive definite on the
        # span of Psi (on its complement B = delta I): an indefinite B gives steps that raise
        # the objective at every tau, and the run settles away from the optimum
        while True:
            self._build(S, Y)
            if self.Psi is None or (self.Ninv is not None and self._positive_definite()):
                return
            if S.shape[0] <= 1:
                # one pair with s'y > 0 whose N cannot be inverted: no model
                self._build(S[:0], Y[:0])
                return
            S, Y = S[1:], Y[1:]

    def _positive_definite(self) -> bool:
        """Whether B's smallest eigenvalue on the span of Psi is above PD_TOL of its largest
        (and of delta), from matrices of order min(2k, d) only: with the Gram matrix
        Psi Psi' = V L V' (its range: eigenvalues above 1e-12 of the largest),
        Q = Psi' V L^(-1/2) is an orthonormal basis of that span and
        Q' B Q = delta I - L^(1/2) V' N^-1 V L^(1/2)
        (one product of 2k x d by d x 2k; a QR of the d x 2k matrix took 30 times longer at
        d = 101,632)."""
        if self.Psi is None:
            return True
        if self.Psi.shape[0] <= self.Psi.shape[1]:
            lam, V = np.linalg.eigh(self.Psi @ self.Psi.T)
            keep = lam > 1e-12 * max(float(lam[-1]), 1e-300)
            R = V[:, keep] * np.sqrt(lam[keep])
        else:
            # more rows than variables (2k > d: up to 64 pairs kept at d <= SMALL_DIM): the
            # same span from the d x d Gram matrix Psi' Psi = W L W', Q = W (its range), and
            # R = Psi Q, so that R' N^-1 R = Q' (B - delta I) Q in a basis of the same span (the
            # 128 x 128 eigendecompositions took 15 % of a d = 7 problem's wall time)
            lam, W = np.linalg.eigh(self.Psi.T @ self.Psi)
            keep = lam > 1e-12 * max(float(lam[-1]), 1e-300)
            R = self.Psi @ W[:, keep]
        H = self.delta * np.eye(R.shape[1]) - R.T @ (self.Ninv @ R)
        h = np.linalg.eigvalsh(0.5 * (H + H.T))
        if not np.all(np.isfinite(h)):
            return False
        return bool(h[0] > PD_TOL * max(float(h[-1]), self.delta))

    def _build(self, S: np.ndarray, Y: np.ndarray) -> None:
        self.S, self.Y = S, Y
        k = self.S.shape[0]
        if k == 0:
            self.delta, self.Psi, self.Ninv = 0.0, None, None
            return
        s, y = self.S[-1], self.Y[-1]
        self.delta = float(y @ y) / float(s @ y)
        SY = self.S @ self.Y.T
        Lo = np.tril(SY, -1)
        D = np.diag(np.diag(SY))
        N = np.block([[self.delta * (self.S @ self.S.T), Lo], [Lo.T, -D]])
        self.Psi = np.vstack([self.delta * self.S, self.Y])            # (2k, d): rows
        try:
            Ninv = np.linalg.inv(N)
        except np.linalg.LinAlgError:
            Ninv = None
        # the inverse must be one: with nearly dependent steps (more pairs than variables,
        # or iterates converging along a line) N is singular to rounding and inv(N) garbage
        # (an asymmetric B, B x off by 1e1 from B @ x, on a d = 3 problem with 8 pairs)
        if (Ninv is None or not np.all(np.isfinite(Ninv))
                or not np.max(np.abs(N @ Ninv - np.eye(2 * k))) <= INVERSE_TOL):
            self.Ninv = None
            return
        self.Ninv = 0.5 * (Ninv + Ninv.T)

    def __len__(self) -> int:
        return self.S.shape[0]

    def matvec(self, v: np.ndarray) -> np.ndarray:
        """B v (0 when there is no pair)."""
        if self.Psi is None:
            return np.zeros_like(v)
        return self.delta * v - self.Psi.T @ (self.Ninv @ (self.Psi @ v))

    def matmat(self, V: np.ndarray) -> np.ndarray:
        """B V for V of shape (d, k)."""
        if self.Psi is None:
            return np.zeros_like(V)
        return self.delta * V - self.Psi.T @ (self.Ninv @ (self.Psi @ V))

    def eigen(self) -> tuple:
        """(eigenvalues, eigenvectors as columns) of B, from one QR of the d x 2k matrix Psi'
        (complete: its last d - 2k columns span the complement, where B = delta I) and the
        2k x 2k matrix of B on the span, delta I - R N^-1 R' (Psi' = Q R): O(d^2 k) instead
        of an eigendecomposition of order d. With 2k >= d, that of B itself."""
        d = self.S.shape[1]
        if self.Psi is None:
            return np.zeros(d), np.eye(d)
        r = self.Psi.shape[0]
        if r >= d:
            B = self.matmat(np.eye(d))
            return np.linalg.eigh(0.5 * (B + B.T))
        Q, R = np.linalg.qr(self.Psi.T, mode="complete")
        top = R[:r]                                    # Psi' = Q[:, :r] top
        small = self.delta * np.eye(r) - top @ (self.Ninv @ top.T)
        mu, E = np.linalg.eigh(0.5 * (small + small.T))
        lam = np.concatenate([mu, np.full(d - r, self.delta)])
        return lam, np.hstack([Q[:, :r] @ E, Q[:, r:]])

    def directions(self) -> np.ndarray:
        """The rows of Psi, (2k, d): B - delta I maps everything into their span."""
        return np.zeros((0, self.S.shape[1] if self.S.ndim == 2 else 0)) if self.Psi is None \
            else self.Psi


def add_pair(S: np.ndarray, Y: np.ndarray, s: np.ndarray, y: np.ndarray,
             memory: Optional[int] = None) -> Optional[tuple]:
    """The pairs with (s, y) added (Powell-damped against the current model, the oldest pair
    dropped beyond ``memory``), or None when the pair carries no curvature information (a step
    lost in rounding, a non-finite gradient difference, s'Bs = 0 and s'y <= 0)."""
    kept = extend(LBFGSModel(S, Y), s, y, memory)
    return None if kept is None else (kept.S, kept.Y)


def extend(model: LBFGSModel, s: np.ndarray, y: np.ndarray,
           memory: Optional[int] = None) -> Optional[LBFGSModel]:
    """:func:`add_pair` on the model of the current pairs, returning the new model itself
    (its ``S``, ``Y`` are the pairs kept), so that neither is built twice in a round (three
    compact forms per round took 18 % of a 5-variable problem's run)."""
    memory = MEMORY if memory is None else int(memory)
    s = np.asarray(s, dtype=float)
    y = np.asarray(y, dtype=float)
    ss = float(s @ s)
    if not (np.all(np.isfinite(s)) and np.all(np.isfinite(y))) or ss == 0.0:
        return None
    S, Y = model.S, model.Y
    if len(model):
        Bs = model.matvec(s)
    else:
        # no pair yet: B_0 = (|y| / |s|) I, the secant scale of this pair (Nocedal & Wright
        # eq. (6.20) needs s'y > 0; the ratio of norms also serves a negative-curvature pair)
        Bs = (np.linalg.norm(y) / np.sqrt(ss)) * s
    sBs, sy = float(s @ Bs), float(s @ y)
    if not sBs > 0.0:
        return None
    if sy < DAMPING * sBs:
        theta = (1.0 - DAMPING) * sBs / (sBs - sy)
        y = theta * y + (1.0 - theta) * Bs
    S2 = np.vstack([S.reshape(-1, s.size), s[None, :]])[-memory:]
    Y2 = np.vstack([Y.reshape(-1, s.size), y[None, :]])[-memory:]
    # the pairs the model can use (LBFGSModel drops the oldest while its compact form is not
    # positive definite to rounding): the state keeps only those
    kept = LBFGSModel(S2, Y2)
    if not len(kept):
        return None
    return kept
