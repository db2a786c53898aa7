"""A new method written against the algorithm protocol: federated gradient descent.

    w_{t+1} = w_t - lr (sum_i N_i/(B N) g_i(w_t) + 2 lambda w_t)

where client i sends g_i, the sum of the objective's gradients over its mini-batch. It reuses
everything the runner gives every method: stateless clients with seeded batches, transports,
communication counts, evaluations every k rounds, callbacks that can stop the run, progress,
checkpoint and resume. See docs/architecture.md, section "Adding a method".

Run: python docs/examples/new_method.py
"""

from dataclasses import dataclass
from typing import NamedTuple

import cvxpy as cp
import numpy as np

import ssca_solver as ss
from ssca_solver import options as opt
from ssca_solver.federated import Request, array
from ssca_solver.functions import checked_value_and_grad
from ssca_solver.result import Result
from ssca_solver.session import Session, fingerprint

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


class GradientDescent:
    """The algorithm: settings plus pure functions over an immutable state."""

    name = "gd"
    columns = {"step_norm": ()}          # one history column per round

    def __init__(self, problem, batch_size, lr, ridge):
        self.objective, self.N = problem.objective, problem.data.num_samples
        self.batch_size, self.lr, self.ridge = batch_size, lr, ridge

    def tasks(self):
        return {TASK: GradientTask(self.objective)}

    def init(self, x0):
        return GDState(0, np.array(x0, dtype=float))

    def request(self, state):
        return Request(TASK, state.t + 1, state.w, {"batch_size": self.batch_size})

    def step(self, state, replies):
        g = 2.0 * self.ridge * state.w
        for r in replies:                                   # weights N_i / (B_i N)
            g += r.weight * r.num_rows / (r.batch_size * self.N) * array(r, "g")
        return GDState(state.t + 1, state.w - self.lr * g), self.lr * float(np.linalg.norm(g))

    def record(self, step_norm):
        return {"step_norm": step_norm}

    def describe(self, step_norm):
        return f"step {step_norm:.3g}"

    def state_arrays(self, state):
        return {"t": np.asarray(state.t), "w": state.w}

    def state_from_arrays(self, arrays):
        return GDState(int(arrays["t"]), np.array(arrays["w"], dtype=float))


@dataclass(frozen=True)
class GDOptions(opt.RunOptions):
    """Options of method "gd": the runner's, plus the batch size and the step."""

    batch_size: object = 10
    lr: float = 0.1


def solve_gd(problem, **options) -> Result:
    """The front door: parse options once, run, report on the full data."""
    o = opt.parse(GDOptions, options, "gd")
    ridge = problem.deterministic.norm2_coefficient()
    if problem.num_constraints or problem.objective is None or ridge is None:
        raise ss.ModelError("method 'gd' needs a stochastic objective, no constraints, and "
                            "at most a lambda |w|^2 term")
    B = opt.batch_size(o.batch_size, problem.data)
    algorithm = GradientDescent(problem, B, opt.real("lr", o.lr, low=0, low_open=True), ridge)
    fp = fingerprint(problem, "gd", batch_size=B, lr=o.lr)
    with Session(problem, algorithm, o, fp, algorithm.init) as session:
        state, reason = session.runner.run(session.state, o.max_iter - session.state.t)
        fun, cons, kkt, comm, history = session.final_report(state)
    return Result(x=state.w.copy(), status="stopped" if reason == "stopped" else "max_iter",
                  message=f"{state.t} rounds of gradient descent", fun=fun, constraints=cons,
                  slack=np.zeros(0), penalty=None, kkt=kkt, history=history,
                  communication=comm, stages=(), nit=state.t, method="gd", subproblem=None,
                  time=session.runner.elapsed)


ss.register_method("gd", solve_gd)


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
