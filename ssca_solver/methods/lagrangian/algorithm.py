"""Federated Lagrangian baselines for constrained problems, as algorithms of the one runner.

Two methods for Problem 3 (minimise F_0 + R over D subject to F_m <= U_m), the comparisons of
Algorithm 2 (docs/baselines.md has the equations with their references):

* **primal-dual** (federated stochastic gradient descent-ascent on the Lagrangian; Local SGDA,
  Deng & Mahdavi 2021): each round the server sends w_t and lambda_t; client i runs E local SGD
  steps of batch B on its rows,

      w <- w - r_t (grad F_0(w; batch) + sum_m lambda_m grad F_m(w; batch) [+ 2 c w]),

  and sends back its local model w_i and its estimate Fhat_{m,i} = F_m(w_t; batch) of each
  F_m at the point it received (on its first local step's batch: at a fixed point the dual
  step then asks F_m(w) <= U_m of the returned point itself, not of the local trajectory). The server averages with weights N_i/N,

      wbar = sum_i N_i/N w_i,   Fhat_m = sum_i N_i/N Fhat_{m,i},
      w_{t+1} = prox_{E r_t R + I_D}(wbar)         (wbar itself when R = c |w|^2 and no D),
      lambda_{t+1} = max(0, lambda_t + eta_t (Fhat - U))   (an equality: no max(0, .)).

  E = 1 is the FedSGD-style stochastic Arrow-Hurwicz iteration.

* **augmented Lagrangian** (federated stochastic augmented Lagrangian; Hestenes 1969, Powell
  1969, Rockafellar 1973 for inequalities): the local steps descend

      L_rho(w, lambda) = F_0 + R + sum_m [ (rho/2) max(0, F_m - U_m + lambda_m/rho)^2
                                           - lambda_m^2 / (2 rho) ],

      w <- w - r_t (grad F_0(w; batch) + sum_m mu_m grad F_m(w; batch)),
      mu_m = max(0, lambda_m + rho (Fhat_m^(t-1) - U_m)),

  where Fhat^(t-1) is the previous round's federated estimate of F_m (zero excess in round 1):
  F_m(w_t) on all clients is not known before they step, and a client-local
  max(0, lambda_m + rho (F_m(w; own batch) - U_m)) would descend the average of the clients'
  penalties, another function (by Jensen, larger), whose minimiser is biased even with full
  batches. Every K rounds (``dual_every``) the multipliers take the
  method-of-multipliers step lambda <- max(0, lambda + rho (Fhat - U)) with that round's
  averaged estimates (K = 1: the linearised augmented Lagrangian method, Xu 2021).

Deterministic terms: R = c |w|^2 without a domain is exact in every local step (2 c w, like
FedAvg's ridge). Any other R and every domain D go to the server, which applies after averaging
the proximal step prox_{s R + I_D}(wbar) = argmin_u |u - wbar|^2 / 2 + s R(u), u in D, with
s = E r_t (the length of the round's local steps), solved by CVXPY (Clarabel, compiled once with
Parameters). With E = 1 this is exactly proximal SGD; with E > 1 the local steps do not see R
or D (a server-side proximal step; Yuan, Zaheer and Reddi 2021, "Federated Composite
Optimization", discuss it and client-side alternatives), so the fixed point is exact only as
r_t -> 0 (like FedAvg's client drift).
"""

from __future__ import annotations

from typing import Mapping, NamedTuple, Optional

import cvxpy as cp
import numpy as np

from ...engine.method import Method
from ...engine.options import describe_schedule
from ...errors import SubproblemError
from ...federated.messages import Request, aggregation_weight, array, optional_int
from ...model.functions import checked_value_and_grad
from ...schedules import positive_value
from .options import AugmentedLagrangianOptions, LagrangianOptions, PrimalDualOptions

TASK = "lagrangian.local_sgd"
PRIMAL_DUAL, AUGMENTED = "primal_dual", "augmented_lagrangian"


class LagrangianSGDTask:
    """Client side: ``config["steps"]`` local SGD steps on F_0 + sum_m mu_m F_m (+ c |w|^2)
    from w_t, with fixed weights mu_m for the round (primal-dual: lambda_m; augmented
    Lagrangian: max(0, lambda_m + rho (Fhat_m - U_m)), computed by the server).

    Request config: ``batch_size`` (None: every row), ``steps`` (E), ``lr`` (r_t) and ``ridge``
    (c of an exact c |w|^2 term, added as 2 c w); request array ``weights``: mu (M floats,
    counted with the downlink). Replies
    with the local model ``w`` (d floats) and ``constraints``, the batch values F_m(w_t; batch)
    at the point received, on the first local step's batch (M floats).
    """

    def __init__(self, objective, functions):
        self.objective = objective
        self.functions = tuple(functions)

    def __call__(self, client, request: Request):
        cfg = request.config
        B, lr, ridge = optional_int(cfg.get("batch_size")), float(cfg["lr"]), float(cfg["ridge"])
        M = len(self.functions)
        mu = ([float(v) for v in np.asarray(request.arrays["weights"]).reshape(-1)] if M
              else [])
        if len(mu) != M:
            raise ValueError(f"client {client.index}: the request carries {len(mu)} weights "
                             f"for {M} stochastic constraints")
        w = np.array(request.w, dtype=float)
        steps = int(cfg["steps"])
        estimate = np.zeros(M)
        for k in range(steps):
            X, y, _ = client.batch(request.round, B, draw=k)
            where = f"client {client.index}, round {request.round}, local step {k + 1}"
            g = 2.0 * ridge * w
            if self.objective is not None:
                g = g + checked_value_and_grad(self.objective, w, X, y, where)[1]
            for m, fn in enumerate(self.functions):
                v, gm = checked_value_and_grad(fn, w, X, y, where)
                if k == 0:
                    estimate[m] = float(np.mean(v))
                if mu[m]:
                    g = g + mu[m] * gm
            w -= lr * g
        # a model and batch means are one value each, not sums over rows: weighted N_i / (1 N)
        return client.reply(request, {"w": w, "constraints": estimate}, batch_size=1)


class LagrangianState(NamedTuple):
    """t: rounds done; w: w_t; multipliers: lambda_t (M,); excess: the last round's federated
    estimate Fhat_m - U_m (M,; zeros before round 1)."""

    t: int
    w: np.ndarray
    multipliers: np.ndarray
    excess: np.ndarray


class LagrangianInfo(NamedTuple):
    t: int
    lr: float
    dual_step: float            # eta_t (primal-dual), rho at a multiplier update (AL), else 0
    step_norm: float
    estimate: np.ndarray        # Fhat_m - U_m (M,)
    multipliers: np.ndarray     # lambda_{t+1}
    weights: np.ndarray         # mu_m the clients used


class ServerProx:
    """prox_{s R + I_D}(z) = argmin_u |u - z|^2 / 2 + s R(u) subject to u in D, by CVXPY.

    Compiled once with Parameters z and s (s >= 0 multiplies a convex R: DPP), solved by
    ``solver`` at tight tolerances (Clarabel: 1e-10), since the KKT test reads the point at
    1e-4 relative.
    """

    def __init__(self, deterministic, dim: int, solver: str = "CLARABEL"):
        u = cp.Variable(dim)
        self.z = cp.Parameter(dim)
        self.s = cp.Parameter(nonneg=True)
        expr, cons = deterministic.instantiate(u)
        obj = 0.5 * cp.sum_squares(u - self.z) + (self.s * expr if expr is not None else 0)
        self.problem = cp.Problem(cp.Minimize(obj), cons)
        self.u = u
        self.solver = solver
        self.tight = ({"tol_gap_abs": 1e-10, "tol_gap_rel": 1e-10, "tol_feas": 1e-10}
                      if solver.upper() == "CLARABEL" else {})

    def __call__(self, z: np.ndarray, s: float) -> np.ndarray:
        self.z.value = np.asarray(z, dtype=float)
        self.s.value = float(s)
        try:
            self.problem.solve(solver=self.solver, warm_start=False, **self.tight)
        except cp.error.SolverError:
            # a fresh solve at the defaults (CVXPY's warm start would keep the tight settings)
            self.problem.solve(solver=self.solver, warm_start=False)
        if self.u.value is None or self.problem.status not in (cp.OPTIMAL,
                                                               cp.OPTIMAL_INACCURATE):
            raise SubproblemError(f"the server's proximal step on the deterministic terms and "
                                  f"domain failed ({self.problem.status}) with solver "
                                  f"{self.solver}")
        return np.array(self.u.value, dtype=float)


class Lagrangian(Method):
    """Federated stochastic primal-dual (``kind="primal_dual"``) or augmented Lagrangian
    (``kind="augmented_lagrangian"``) over the runner's protocol (see the module docstring).

    Args:
      problem: the :class:`~ssca_solver.Problem`.
      kind: "primal_dual" or "augmented_lagrangian".
      batch_size: B rows per local step (None: every row).
      local_steps: E.
      lr: r_t (PowerStep, callable t -> value > 0, or a number).
      dual_lr: eta_t of the dual ascent (primal-dual only).
      rho: the augmented Lagrangian's penalty (augmented_lagrangian only).
      dual_every: K, rounds between multiplier updates (augmented_lagrangian only).
      multipliers0: lambda_1 (M,), >= 0.
      solver: CVXPY solver of the server's proximal step (when one is needed).
    """

    columns: Mapping[str, tuple]
    Options = LagrangianOptions
    supports_secure_aggregation = True     # the server reads only weighted sums of replies
    certifies = True                       # the full-data KKT test at feas_tol, kkt_tol

    def __init__(self, problem, *, kind: str, batch_size: Optional[int], local_steps: int, lr,
                 dual_lr=None, rho: float = 0.0, dual_every: int = 1, multipliers0=None,
                 solver: str = "CLARABEL", options=None):
        if kind not in (PRIMAL_DUAL, AUGMENTED):
            raise ValueError(f"kind must be {PRIMAL_DUAL!r} or {AUGMENTED!r}, got {kind!r}")
        self.name = kind
        self.opts = options
        self.kkt_solver = solver
        self.problem = problem
        self.kind = kind
        self.batch_size = batch_size
        self.local_steps = int(local_steps)
        self.lr, self.dual_lr = lr, dual_lr
        self.rho, self.dual_every = float(rho), int(dual_every)
        self.M = problem.num_constraints
        self.bounds = problem.bounds
        self.equality = problem.equality
        self.multipliers0 = (np.zeros(self.M) if multipliers0 is None
                             else np.array(multipliers0, dtype=float))
        self.num_samples = problem.data.num_samples
        self.ridge = problem.deterministic.norm2_coefficient()
        # anything but c |w|^2 without a domain: the server's proximal step
        self.prox = (None if self.ridge is not None
                     else ServerProx(problem.deterministic, problem.dim, solver))
        self.columns = {"lr": (), "dual_step": (), "step_norm": (), "multipliers": (self.M,),
                        "weights": (self.M,), "constraint_estimate": (self.M,)}

    # -- protocol ----------------------------------------------------------------------------------
    def tasks(self) -> Mapping:
        return {TASK: LagrangianSGDTask(self.problem.objective,
                                        [c.function for c in self.problem.constraints])}

    def init(self, x0: np.ndarray) -> LagrangianState:
        return LagrangianState(0, np.array(x0, dtype=float), self.multipliers0.copy(),
                               np.zeros(self.M))

    def weights(self, state) -> np.ndarray:
        """mu_m of the round: lambda_m (primal-dual) or max(0, lambda_m + rho (Fhat_m - U_m))
        with the previous round's estimate (augmented Lagrangian)."""
        if self.kind == PRIMAL_DUAL:
            return state.multipliers
        return self._project(state.multipliers + self.rho * state.excess)

    def _project(self, lam: np.ndarray) -> np.ndarray:
        """max(0, lambda) for an inequality; an equality's multiplier keeps its sign (its
        augmented Lagrangian term lambda h + (rho/2) h^2 has weight lambda + rho h)."""
        return np.where(self.equality, lam, np.maximum(0.0, lam))

    def request(self, state) -> Request:
        t = state.t + 1
        config = {"batch_size": self.batch_size, "steps": self.local_steps,
                  "lr": positive_value(self.lr, t, "lr"),
                  "ridge": self.ridge if self.ridge is not None else 0.0}
        arrays = {"weights": np.array(self.weights(state), dtype=float)} if self.M else {}
        return Request(TASK, t, state.w, config, arrays)

    def step(self, state, replies):
        t = state.t + 1
        lr = positive_value(self.lr, t, "lr")
        avg = np.zeros_like(state.w)
        est = np.zeros(self.M)
        for reply in replies:               # summed as they come
            # weight_i N_i / (B_i N) with B_i = 1 (a model, not a sum over rows): N_i / N times
            # the server-side factor of partial participation and dropouts (1 by default);
            # under secure aggregation one reply holds the whole weighted sum
            share = aggregation_weight(reply, self.num_samples)
            avg += share * array(reply, "w")
            est += share * array(reply, "constraints")
        w = avg if self.prox is None else self.prox(avg, self.local_steps * lr)
        excess = est - self.bounds
        lam = state.multipliers
        if self.kind == PRIMAL_DUAL:
            dual = positive_value(self.dual_lr, t, "dual_lr")
            lam = self._project(lam + dual * excess)
        elif t % self.dual_every == 0:
            dual = self.rho
            lam = self._project(lam + dual * excess)
        else:
            dual = 0.0
        info = LagrangianInfo(t, lr, dual, float(np.linalg.norm(w - state.w)), excess, lam,
                              self.weights(state))
        return LagrangianState(t, w, lam, excess), info

    # -- the front door's hooks ----------------------------------------------------------------
    @classmethod
    def parse(cls, problem, options: dict) -> LagrangianOptions:
        return super().parse(problem, options).checked(problem, cls.name)

    @classmethod
    def build(cls, problem, opts: LagrangianOptions, given: dict) -> "Lagrangian":
        pd = cls.name == PRIMAL_DUAL
        return cls(problem, kind=cls.name, batch_size=opts.batch_size,
                   local_steps=opts.local_steps, lr=opts.lr,
                   dual_lr=opts.dual_lr if pd else None, rho=0.0 if pd else opts.rho,
                   dual_every=1 if pd else opts.dual_every, multipliers0=opts.multipliers0,
                   solver=opts.solver, options=opts)

    def _settings(self) -> dict:
        if self.kind == PRIMAL_DUAL:
            return {"dual_lr": describe_schedule(self.opts.dual_lr)}
        return {"rho": self.opts.rho, "dual_every": self.opts.dual_every}

    def fingerprint(self) -> dict:
        o = self.opts
        return {"batch_size": o.batch_size, "local_steps": o.local_steps,
                "lr": describe_schedule(o.lr), "multipliers0": o.multipliers0,
                "solver": o.solver, **self._settings()}

    def advice(self, outcome) -> str:
        pd = self.kind == PRIMAL_DUAL
        if self.opts.batch_size is not None:
            return ("with mini-batches and steps that do not vanish the iterates end at a "
                    "noise floor: a larger batch_size (or 'full'), smaller or decreasing lr"
                    + (" and dual_lr" if pd else "") + ", or more rounds")
        return "more rounds (max_iter), or other step sizes" + (" (lr, dual_lr)" if pd
                                                                 else " (lr, rho)")

    def result_fields(self, outcome) -> dict:
        o = self.opts
        return {"extras": {"multipliers": outcome.state.multipliers.copy(),
                           "local_steps": o.local_steps, "batch_size": o.batch_size,
                           "server_prox": self.prox is not None, **self._settings()}}

    # -- the runner's members --------------------------------------------------------------------
    def record(self, info: LagrangianInfo) -> dict:
        return {"lr": info.lr, "dual_step": info.dual_step, "step_norm": info.step_norm,
                "multipliers": info.multipliers, "weights": info.weights,
                "constraint_estimate": info.estimate}

    def describe(self, info: LagrangianInfo) -> str:
        text = f"round {info.t:>5d}  lr={info.lr:.3g}"
        if self.M:
            text += (f"  lambda={np.array2string(info.multipliers, precision=3)}"
                     f"  Fhat-U={np.array2string(info.estimate, precision=3)}")
        return text

    def state_arrays(self, state: LagrangianState) -> dict:
        return {"t": np.asarray(state.t), "w": state.w, "multipliers": state.multipliers,
                "excess": state.excess}

    def state_from_arrays(self, arrays) -> LagrangianState:
        lam = np.array(arrays["multipliers"], dtype=float).reshape(-1)
        if lam.size != self.M:
            raise ValueError(f"resume: the checkpoint holds {lam.size} multipliers, the problem "
                             f"has {self.M} stochastic constraints")
        return LagrangianState(int(arrays["t"]), np.array(arrays["w"], dtype=float), lam,
                               np.array(arrays["excess"], dtype=float).reshape(-1))


class PrimalDual(Lagrangian):
    """Federated stochastic gradient descent-ascent on the Lagrangian (Local SGDA; E = 1:
    stochastic Arrow-Hurwicz). Status "converged" only when the full-data KKT test (the same
    as method "ssca"'s) passed; else "stopped" (callback) or "max_iter" naming the residual
    that failed. The method's own multipliers lambda are in ``res.extras["multipliers"]`` and
    ``res.history.multipliers``; ``res.kkt.multipliers`` are those of the KKT conditions at
    ``res.x``, as for every method. Equations: docs/baselines.md."""

    name = PRIMAL_DUAL
    Options = PrimalDualOptions


class AugmentedLagrangian(Lagrangian):
    """Federated stochastic augmented Lagrangian (method of multipliers, Hestenes-Powell-
    Rockafellar, with E local SGD steps on L_rho per round and a multiplier step every
    ``dual_every`` rounds). Status as for :class:`PrimalDual`. Equations:
    docs/baselines.md."""

    name = AUGMENTED
    Options = AugmentedLagrangianOptions
