"""FedAvg / FedSGD with optional server momentum, as an algorithm of the one runner.

The comparisons of the paper's Section VI (McMahan et al. 2017). Each round the server sends
w_t; client i runs E local SGD steps of batch B on its own rows with learning rate
r_t = abar / t^alphabar,

    w <- w - r_t (grad F_0(w; batch) + 2 lambda w)        (lambda: an exact ridge term)

and sends its model back (as one sum: its reply's batch_size is 1); the server averages the
models with weights N_i / N, wbar_t = sum_i N_i/N w_i (times the reply's ``weight``: partial
participation and the renormalisation after dropouts, :mod:`ssca_solver.federated.gather`),
and with heavy-ball momentum beta

    v_t = beta v_{t-1} + (w_t - wbar_t),   w_{t+1} = w_t - v_t.

With E = 1 and beta = 0 this is FedSGD (mini-batch SGD with batch B per client). Local step k
of round t draws its batch from (seed, client, t, k), like every client task.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, NamedTuple, Optional

import numpy as np

from .. import status as st
from ..engine import options as opt
from ..engine.method import Method
from ..errors import ModelError
from ..federated.messages import Request, aggregation_weight, array, optional_int
from ..model.functions import checked_value_and_grad
from ..schedules import PowerStep, positive_value

TASK = "fedavg.local_sgd"


@dataclass(frozen=True)
class FedAvgOptions(opt.RunOptions):
    """Options of ``Problem.solve(method="fedavg")`` (and
    :class:`~ssca_solver.engine.options.RunOptions`).

    Attributes:
      batch_size: B rows per local step ("full" for all rows).
      local_steps: E local SGD steps per round (E = 1: FedSGD).
      lr: the learning rate r_t: a PowerStep(abar, alphabar), a callable t -> value > 0 or a
        number. Default PowerStep(0.5, 0.3).
      momentum: server-side heavy-ball coefficient beta in [0, 1) (0: plain FedAvg).
    """

    max_iter: int = 100
    batch_size: Any = 10
    local_steps: int = 1
    lr: Any = field(default_factory=lambda: PowerStep(0.5, 0.3))
    momentum: float = 0.0

    def checked(self, problem) -> "FedAvgOptions":
        """The options with FedAvg's own values checked and normalised (after
        :func:`ssca_solver.engine.options.parse` checked the shared ones)."""
        if problem.num_constraints:
            raise ModelError("method 'fedavg' cannot handle stochastic constraints; use 'ssca'")
        if problem.objective is None:
            raise ModelError("method 'fedavg' needs a stochastic objective (a SampleFunction)")
        if problem.deterministic.norm2_coefficient() is None:
            raise ModelError("method 'fedavg' supports deterministic terms only of the form "
                             "lambda |w|^2 (no domain)")
        return self.__class__(**{
            **vars(self), "batch_size": opt.batch_size(self.batch_size, problem.data),
            "lr": opt.learning_rate("lr", self.lr),
            "local_steps": opt.integer("local_steps", self.local_steps),
            "momentum": opt.real("momentum", self.momentum, low=0.0, high=1.0 - 1e-16)})


class LocalSGDTask:
    """Client side: ``config["steps"]`` local SGD steps on the objective from w_t with learning
    rate ``config["lr"]`` and batch ``config["batch_size"]``; ``config["ridge"]`` adds
    2 lambda w to the gradient. Replies with the local model ``w`` (d floats)."""

    def __init__(self, objective):
        self.objective = objective

    def __call__(self, client, request: Request):
        cfg = request.config
        B, lr, ridge = optional_int(cfg.get("batch_size")), float(cfg["lr"]), float(cfg["ridge"])
        w = np.array(request.w, dtype=float)
        for k in range(int(cfg["steps"])):
            X, y, _ = client.batch(request.round, B, draw=k)
            where = f"client {client.index}, round {request.round}, local step {k + 1}"
            _, g = checked_value_and_grad(self.objective, w, X, y, where)
            w -= lr * (g + 2.0 * ridge * w)
        # a model is one sum: the server weights it N_i / (1 N), the paper's N_i / N
        return client.reply(request, {"w": w}, batch_size=1)


class FedAvgState(NamedTuple):
    """t: rounds done; w: w_t; v: the momentum buffer."""

    t: int
    w: np.ndarray
    v: np.ndarray


class FedAvgInfo(NamedTuple):
    t: int
    lr: float
    step_norm: float


class FedAvg(Method):
    """FedAvg / FedSGD (McMahan et al.), the SGD baselines of Section VI: E local SGD steps
    on the clients, a weighted average of the models (plus server momentum beta) on the
    server. Unconstrained problems with an exact ridge term (or none).

    Status "max_iter" (the method has no stopping test, so ``success`` is False) or "stopped"
    (by the callback)."""

    name = "fedavg"
    Options = FedAvgOptions
    supports_secure_aggregation = True     # the server reads only weighted sums of replies
    columns = {"lr": (), "step_norm": ()}

    def __init__(self, problem, *, batch_size: Optional[int], local_steps: int, lr,
                 momentum: float, ridge: float, options: Optional[FedAvgOptions] = None):
        self.opts = options
        self.objective = problem.objective
        self.batch_size = batch_size
        self.local_steps = int(local_steps)
        self.lr = lr
        self.momentum = float(momentum)
        self.ridge = float(ridge)
        self.num_samples = problem.data.num_samples

    @classmethod
    def parse(cls, problem, options: dict) -> FedAvgOptions:
        return opt.parse(FedAvgOptions, options, cls.name).checked(problem)

    @classmethod
    def build(cls, problem, opts: FedAvgOptions, given: dict) -> "FedAvg":
        return cls(problem, batch_size=opts.batch_size, local_steps=opts.local_steps,
                   lr=opts.lr, momentum=opts.momentum,
                   ridge=problem.deterministic.norm2_coefficient(), options=opts)

    def fingerprint(self) -> dict:
        return {"batch_size": self.batch_size, "local_steps": self.local_steps,
                "momentum": self.momentum, "lr": opt.describe_schedule(self.lr)}

    def status(self, outcome) -> tuple[str, str]:
        if outcome.reason == st.STOPPED:
            return st.stopped(outcome.state.t)
        o = self.opts
        return st.MAX_ITER, (f"ran max_iter={o.max_iter} rounds of FedAvg "
                             f"(E = {o.local_steps}, B = {o.batch_size or 'full'}); "
                             "FedAvg has no stopping test: judge the point by its KKT report")

    def result_fields(self, outcome) -> dict:
        return {"slack": np.zeros(0),
                "extras": {"local_steps": self.local_steps, "momentum": self.momentum}}

    def tasks(self) -> Mapping:
        return {TASK: LocalSGDTask(self.objective)}

    def init(self, x0: np.ndarray) -> FedAvgState:
        x0 = np.array(x0, dtype=float)
        return FedAvgState(0, x0, np.zeros_like(x0))

    def request(self, state) -> Request:
        return Request(TASK, state.t + 1, state.w,
                       {"batch_size": self.batch_size, "steps": self.local_steps,
                        "lr": positive_value(self.lr, state.t + 1, "lr"), "ridge": self.ridge})

    def step(self, state, replies):
        t = state.t + 1
        avg = np.zeros_like(state.w)
        for reply in replies:              # summed as they come
            avg += aggregation_weight(reply, self.num_samples) * array(reply, "w")
        v = self.momentum * state.v + (state.w - avg)
        w = state.w - v
        return FedAvgState(t, w, v), FedAvgInfo(t, positive_value(self.lr, t, "lr"),
                                                float(np.linalg.norm(v)))

    def record(self, info: FedAvgInfo) -> dict:
        return {"lr": info.lr, "step_norm": info.step_norm}

    def describe(self, info: FedAvgInfo) -> str:
        return f"round {info.t:>5d}  lr={info.lr:.3g}"

    def state_arrays(self, state: FedAvgState) -> dict:
        return {"t": np.asarray(state.t), "w": state.w, "v": state.v}

    def state_from_arrays(self, arrays) -> FedAvgState:
        return FedAvgState(int(arrays["t"]), np.array(arrays["w"], dtype=float),
                           np.array(arrays["v"], dtype=float))
