"""A new method written against the method protocol: federated gradient descent.

    w_{t+1} = w_t - lr (sum_i N_i/(B N) g_i(w_t) + 2 lambda w_t)

where client i sends g_i, the sum of the objective's gradients over its mini-batch. It subclasses
``ss.Method`` and declares only what it has; the one front door and the one round loop give it
everything else: options parsed once (misspelled names rejected), stateless clients with seeded
batches, every transport, partial participation, dropouts, secure aggregation (it combines
replies only through their weighted sum, so it may declare it), communication counts,
evaluations every k rounds, callbacks that can stop the run, progress, checkpoint and resume,
and the same Result as the built-in methods. See docs/architecture.md, "Adding a method".

Run: python docs/examples/new_method.py
"""

from dataclasses import dataclass, replace
from typing import NamedTuple

import cvxpy as cp
import numpy as np

import ssca_solver as ss
from ssca_solver.engine import options as opt
from ssca_solver.federated import Request, aggregation_weight, array
from ssca_solver.model.functions import checked_value_and_grad

TASK = "gd.grad"


class GradientTask:
    """Client side: the sum over the round's mini-batch of the objective's gradients."""

    def __init__(self, objective):
        self.objective = objective

    def __call__(self, client, request):
        X, y, b = client.batch(request.round, request.config["batch_size"])
        where = f"client {client.index}, round {request.round}"
        _, g = checked_value_and_grad(self.objective, request.w, X, y, where)
        return client.reply(request, {"g": b * g}, batch_size=b)


class GDState(NamedTuple):
    t: int
    w: np.ndarray


@dataclass(frozen=True)
class GDOptions(opt.RunOptions):
    """Options of method "gd": the runner's, plus the batch size and the step."""

    batch_size: object = 10
    lr: float = 0.1


class GradientDescent(ss.Method):
    """Federated gradient descent: settings plus pure functions over an immutable state."""

    name = "gd"
    Options = GDOptions
    supports_secure_aggregation = True   # replies are read only through their weighted sum
    columns = {"step_norm": ()}          # one history column per round

    @classmethod
    def parse(cls, problem, options):
        o = super().parse(problem, options)          # the runner's options, checked
        if (problem.num_constraints or problem.objective is None
                or problem.deterministic.norm2_coefficient() is None):
            raise ss.ModelError("method 'gd' needs a stochastic objective, no constraints, "
                                "and at most a lambda |w|^2 term")
        return replace(o, batch_size=opt.batch_size(o.batch_size, problem.data),
                       lr=opt.real("lr", o.lr, low=0, low_open=True))

    @classmethod
    def build(cls, problem, o, given):
        return cls(problem, o.batch_size, o.lr, problem.deterministic.norm2_coefficient())

    def __init__(self, problem, batch_size, lr, ridge):
        self.objective, self.N = problem.objective, problem.data.num_samples
        self.batch_size, self.lr, self.ridge = batch_size, lr, ridge

    def fingerprint(self):                    # what a checkpoint must agree on to resume
        return {"batch_size": self.batch_size, "lr": self.lr}

    def tasks(self):
        return {TASK: GradientTask(self.objective)}

    def init(self, x0):
        return GDState(0, np.array(x0, dtype=float))

    def request(self, state):
        return Request(TASK, state.t + 1, state.w, {"batch_size": self.batch_size})

    def step(self, state, replies):
        g = 2.0 * self.ridge * state.w
        for r in replies:                                   # weights N_i / (B_i N)
            g += aggregation_weight(r, self.N) * array(r, "g")
        return GDState(state.t + 1, state.w - self.lr * g), self.lr * float(np.linalg.norm(g))

    def record(self, step_norm):
        return {"step_norm": step_norm}

    def describe(self, step_norm):
        return f"step {step_norm:.3g}"

    def status(self, outcome):
        if outcome.reason == ss.status.STOPPED:
            return ss.status.stopped(outcome.state.t)
        return ss.status.MAX_ITER, f"{outcome.state.t} rounds of gradient descent"

    def state_arrays(self, state):
        return {"t": np.asarray(state.t), "w": state.w}

    def state_from_arrays(self, arrays):
        return GDState(int(arrays["t"]), np.array(arrays["w"], dtype=float))


ss.register_method("gd", GradientDescent)


def main():
    from problems.logistic import logistic_loss
    from ssca_solver.datasets import breast_cancer

    X, y = breast_cancer()
    data = ss.FederatedData.split(X, y, num_clients=5, seed=0)
    prob = ss.Problem(logistic_loss(), dim=X.shape[1], data=data,
                      regularizer=lambda w: 1e-2 * cp.sum_squares(w))
    res = prob.solve(method="gd", batch_size="full", lr=0.5, max_iter=300, eval_every=50)
    print(res.report())
    print("history columns:", ", ".join(res.history.names))


if __name__ == "__main__":
    main()
