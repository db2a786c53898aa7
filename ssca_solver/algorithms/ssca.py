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

from .. import driver
from ..federated.messages import Request, optional_int
from ..schedules import step_value
from ..surrogates import check_strongly_convex

TASK = "ssca.round"


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
        return client.reply(request, driver.pack_statistics(stats), batch_size=b)


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
                 rho, gamma, surrogate_init: str):
        self.problem = problem
        self.builders = tuple(builders)
        self.subproblem = subproblem
        self.batch_size = batch_size
        self.tau = float(tau)
        self.rho, self.gamma = rho, gamma
        self.surrogate_init = surrogate_init
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
        return Request(TASK, state.t + 1, state.w,
                       {"batch_size": self.batch_size, "tau": self.tau})

    def step(self, state, replies):
        t = state.t + 1
        r, g = step_value(self.rho, t, "rho"), step_value(self.gamma, t, "gamma")
        if t == 1:
            replies = self._checked_first(replies)
        return driver.step(state, replies, self.num_samples, r, g, self.subproblem)

    def _checked_first(self, replies):
        """Round 1: the first message's surrogates must be strongly convex (Assumption 2)."""
        p = self.problem
        for i, reply in enumerate(replies):
            if i == 0:
                for m, (fn, b) in enumerate(zip(p.functions, self.builders)):
                    st = {k: reply.arrays[driver.stat_key(m, k)]
                          for k in (s.name for s in b.statistic_specs(p.dim))}
                    check_strongly_convex(b, st, p.dim, fn.name)
            yield reply
            del reply

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
