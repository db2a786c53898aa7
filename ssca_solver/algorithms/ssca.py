"""Algorithms 1 and 2 (mini-batch SSCA) as an algorithm of the one runner.

The round itself is :func:`ssca_solver.driver.step` (eqs. (Fs0bar)/(Fsmbar), Problem 2/5,
eq. (updatew)); this module adds what the runner needs: the client task that computes the
statistics q_m on a mini-batch, the request, the history row, and the state's checkpoint form.
The penalty continuation of Theorem 2 is a loop over :meth:`SSCA.with_penalty` stages around the
runner (:func:`ssca_solver.solve.solve_ssca`).
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import numpy as np

from dataclasses import replace

from .. import driver
from ..errors import UserFunctionError
from ..federated.messages import Request, optional_int
from ..functions import checked_value_and_grad, checked_values
from ..schedules import step_value
from ..surrogates import check_strongly_convex

TASK = "ssca.round"
CHECK = "check:"          # prefix of the round-1 gradient-check arrays in a reply
CHECK_RTOL = 1e-2         # relative disagreement that fails the gradient check


def fd_step(w: np.ndarray) -> float:
    """The central-difference step of the gradient check at w."""
    return 1e-6 * max(1.0, float(np.max(np.abs(w), initial=0.0)))


def gradient_check(fn, w, X, y, where: str) -> np.ndarray:
    """[d/dh mean f(w + h u) by ``grad``, by a central difference of ``value``, mean f(w)],
    along u = grad / |grad| on the rows X, y: a directional check costing two value calls."""
    n = X.shape[0]
    v, g = checked_value_and_grad(fn, w, X, y, where)
    norm = float(np.linalg.norm(g))
    if norm == 0.0:
        return np.array([0.0, 0.0, float(v.mean())])
    u = g / norm
    h = fd_step(w)
    up = checked_values(fn, w + h * u, X, y, n, where).mean()
    down = checked_values(fn, w - h * u, X, y, n, where).mean()
    return np.array([norm, (up - down) / (2 * h), float(v.mean())])


class SSCARoundTask:
    """Client side of one round (Algorithms 1-2, steps 3-4): draw the mini-batch of
    (seed, client, round) and return q_m(w_t, batch) for every stochastic function m, as sums
    over the batch rows, each under the name ``"m:statistic"``.

    Request config: ``batch_size`` (None: every row) and ``tau`` (the solve's default proximal
    weight, used by builders without their own).
    """

    def __init__(self, functions: Sequence, builders: Sequence):
        self.functions = tuple(functions)
        self.builders = tuple(builders)

    def __call__(self, client, request: Request):
        X, y, b = client.batch(request.round, optional_int(request.config.get("batch_size")))
        tau = float(request.config["tau"])
        where = f"client {client.index}, round {request.round}"
        stats = [builder.statistics(fn, request.w, X, y,
                                    builder.tau if builder.tau is not None else tau, where)
                 for fn, builder in zip(self.functions, self.builders)]
        arrays = driver.pack_statistics(stats)
        if request.config.get("check_gradients"):
            for m, fn in enumerate(self.functions):
                arrays[f"{CHECK}{m}"] = gradient_check(fn, request.w, X, y, where)
        return client.reply(request, arrays, batch_size=b)


class SSCA:
    """Mini-batch SSCA over the runner's protocol.

    Args:
      problem: the :class:`~ssca_solver.Problem`.
      builders: the surrogate builders of its stochastic functions, read when the solve starts.
      subproblem: the subproblem solver (closed form or CVXPY).
      batch_size: B (None: full batch).
      tau, rho, gamma, surrogate_init: as in :class:`ssca_solver.options.SSCAOptions`.
    """

    name = "ssca"

    def __init__(self, problem, builders, subproblem, batch_size: Optional[int], tau: float,
                 rho, gamma, surrogate_init: str, check_gradients: bool = False):
        self.problem = problem
        self.builders = tuple(builders)
        self.subproblem = subproblem
        self.batch_size = batch_size
        self.tau = float(tau)
        self.rho, self.gamma = rho, gamma
        self.surrogate_init = surrogate_init
        self.check_gradients = bool(check_gradients)
        self.num_samples = problem.data.num_samples
        self.M = problem.num_constraints
        self.columns = {"rho": (), "gamma": (), "penalty": (), "slack": (self.M,),
                        "multipliers": (self.M,), "surrogate_value": (), "step_norm": (),
                        "retries": (), "inaccurate": ()}

    # -- protocol ----------------------------------------------------------------------------------
    def tasks(self) -> Mapping:
        return {TASK: SSCARoundTask(self.problem.functions, self.builders)}

    def init(self, x0: np.ndarray, penalty: float = 0.0) -> driver.SSCAState:
        return driver.init(x0, self.builders, self.tau, self.surrogate_init, self.M, penalty)

    @staticmethod
    def with_penalty(state: driver.SSCAState, penalty: float) -> driver.SSCAState:
        """The state with penalty c (a new stage of the continuation, warm-started)."""
        return state._replace(penalty=float(penalty))

    def request(self, state) -> Request:
        config = {"batch_size": self.batch_size, "tau": self.tau}
        if state.t == 0 and self.check_gradients:
            config["check_gradients"] = True
        return Request(TASK, state.t + 1, state.w, config)

    def step(self, state, replies):
        t = state.t + 1
        r, g = step_value(self.rho, t, "rho"), step_value(self.gamma, t, "gamma")
        if t == 1:
            replies = self._checked_first(replies, state.w)
        return driver.step(state, replies, self.num_samples, r, g, self.subproblem)

    def _checked_first(self, replies, w):
        """Round 1: every client's gradient check (when asked), and the first message's
        surrogates must be strongly convex (Assumption 2)."""
        p = self.problem
        for i, reply in enumerate(replies):
            if self.check_gradients:
                self._check_gradients(reply, w)
                reply = replace(reply, arrays={k: v for k, v in reply.arrays.items()
                                               if not k.startswith(CHECK)})
            if i == 0:
                for m, (fn, b) in enumerate(zip(p.functions, self.builders)):
                    st = {k: reply.arrays[driver.stat_key(m, k)]
                          for k in (s.name for s in b.statistic_specs(p.dim))}
                    check_strongly_convex(b, st, p.dim, fn.name)
            yield reply

    def _check_gradients(self, reply, w) -> None:
        """Raise UserFunctionError when a function's gradient disagrees with its values."""
        h = fd_step(w)
        for m, fn in enumerate(self.problem.functions):
            key = f"{CHECK}{m}"
            if key not in reply.arrays:
                raise ValueError(f"client {reply.client}: no gradient check for {fn.name}")
            an, fd, value = (float(v) for v in reply.arrays[key])
            err, size = abs(an - fd), max(abs(an), abs(fd))
            floor = 1e3 * np.finfo(float).eps * max(1.0, abs(value)) / h   # rounding in fd
            if err > CHECK_RTOL * size and err > floor:
                ratio = an / fd if fd != 0 else float("inf")
                hint = (" (a sign error?)" if abs(ratio + 1) < 0.1 else
                        f" (a sum instead of a mean over the {reply.batch_size} rows?)"
                        if abs(ratio - reply.batch_size) < 0.1 * reply.batch_size else "")
                raise UserFunctionError(
                    f"{fn.name}: its gradient does not match its values on client "
                    f"{reply.client}'s round-1 batch: along the gradient the derivative of the "
                    f"batch mean is {an:.6g} by grad and {fd:.6g} by a central difference of "
                    f"value (relative error {err / size:.2g}, grad/difference = {ratio:.3g})"
                    f"{hint}. grad must return the gradient of the MEAN of the per-sample "
                    "values; check it with ss.check_grad, or pass check_gradients=False to "
                    "skip this check")

    def record(self, info: driver.StepInfo) -> dict:
        sol = info.solution
        return {"rho": info.rho, "gamma": info.gamma, "penalty": info.penalty,
                "slack": sol.slack, "multipliers": sol.multipliers,
                "surrogate_value": sol.value, "step_norm": info.step_norm,
                "retries": sol.retries, "inaccurate": float(sol.inaccurate)}

    def describe(self, info: driver.StepInfo) -> str:
        text = f"round {info.t:>5d}"
        if self.M:
            text += (f"  c={info.penalty:<8.2g} |slack|="
                     f"{np.linalg.norm(info.solution.slack):.3g}")
        return text + f"  surrogate={info.solution.value:.5g}"

    # -- checkpoints -------------------------------------------------------------------------------
    def state_arrays(self, state: driver.SSCAState) -> dict:
        out = {"t": np.asarray(state.t), "w": state.w, "penalty": np.asarray(state.penalty),
               "nu": state.nu}
        for m, st in enumerate(state.stats):
            for k, v in st.items():
                out[f"stats/{m}/{k}"] = np.asarray(v)
        return out

    def state_from_arrays(self, arrays) -> driver.SSCAState:
        stats = []
        for m, b in enumerate(self.builders):
            st = {}
            for spec in b.statistic_specs(self.problem.dim):
                key = f"stats/{m}/{spec.name}"
                if key not in arrays:
                    raise ValueError(f"resume: the checkpoint has no statistic {key!r}: it was "
                                     "written for other surrogate builders")
                st[spec.name] = np.array(arrays[key], dtype=float).reshape(spec.shape)
            stats.append(st)
        return driver.SSCAState(int(arrays["t"]), np.array(arrays["w"], dtype=float),
                                tuple(stats), float(arrays["penalty"]),
                                np.array(arrays["nu"], dtype=float))
