"""Full-data evaluations: F_m(w) and their gradients on all N rows, for the history, the KKT
test and the final report of every method.

The evaluation is itself a federated exchange: each client returns sums of f_m and of grad f_m
over all its rows; the server divides by N. The server never reads rows.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import numpy as np

from ..federated import Request, array
from ..model.functions import checked_value_and_grad, checked_values, vector_groups


#: The task name of full-data evaluations (registered with every algorithm's tasks).
EVALUATE = "evaluate"


class Evaluation(NamedTuple):
    """F_m(w) (values, one per stochastic function) and their gradients, on all N rows.

    ``complete`` is False when some client did not answer (``on_client_failure="drop"``):
    the values then average the rows of the clients who answered."""

    values: np.ndarray
    grads: Optional[np.ndarray]
    floats_up: int
    floats_down: int
    complete: bool = True


class EvaluateTask:
    """Client side of a full-data evaluation: sums over all N_i rows of f_m(w, x_n) for every
    stochastic function m (``values``) and, with ``config["with_grad"]``, of their gradients
    (``grads``, shape (number of functions, d))."""

    def __init__(self, functions):
        self.functions = tuple(functions)
        # the components of each VectorSampleFunction: read from one evaluation of it
        self.groups = vector_groups(self.functions)

    def pooling(self, request):
        """Every row (:mod:`ssca_solver.federated.shards` pools the rows of a shard's clients
        into one evaluation: the values and gradients are sums over rows)."""
        from ..federated.shards import Pooling

        return Pooling(None)

    def row_sums(self, request, X, y, where: str) -> dict:
        """The arrays of the reply of one client holding the rows (X, y)."""
        return self._arrays(request, X, y, where)

    def __call__(self, client, request):
        return client.reply(request, self._arrays(
            request, client.X, client.y, f"client {client.index}, full-data evaluation"))

    def _arrays(self, request, X, y, where: str) -> dict:
        n, w = X.shape[0], request.w
        with_grad = bool(request.config.get("with_grad"))
        vals = np.zeros(len(self.functions))
        grads = np.zeros((len(self.functions), w.size)) if with_grad else None
        done = np.zeros(len(self.functions), dtype=bool)
        for vec, idx, ks in self.groups:
            # a vector function's components at once (the sums of their columns, the rows
            # of the Jacobian: the same floats as one by one); where it raises or is not
            # finite they go one by one, whose errors name the component
            try:
                v, J = vec.evaluate(w, X, y) if with_grad else (vec.values(w, X, y), None)
            except Exception:
                continue
            V = v[:, ks]
            if not (np.all(np.isfinite(V)) and (not with_grad or np.all(np.isfinite(J[ks])))):
                continue
            vals[idx] = V.sum(axis=0)
            if with_grad:
                grads[idx] = n * J[ks]
            done[idx] = True
        for m in np.flatnonzero(~done):
            f = self.functions[m]
            if with_grad:
                v, g = checked_value_and_grad(f, w, X, y, where)
                vals[m], grads[m] = v.sum(), n * g
            else:
                vals[m] = checked_values(f, w, X, y, n, where).sum()
        return {"values": vals, "grads": grads} if with_grad else {"values": vals}


class ProblemTerms(NamedTuple):
    """What the diagnostics need to know about the problem's structure."""

    stochastic_objective: bool
    bounds: np.ndarray          # U_m
    deterministic: object       # DeterministicPart
    equality: Optional[np.ndarray] = None   # which constraints are equalities (None: none)
    convex: bool = False        # Problem 3 is convex by its functions' declarations

    @property
    def first_constraint(self) -> int:
        """The index of the first constraint's value among the per-function values (1 when
        the objective is stochastic, else 0)."""
        return 1 if self.stochastic_objective else 0

    def excess(self, cons: np.ndarray) -> np.ndarray:
        """:func:`excess` with this problem's equalities."""
        return excess(cons, self.equality)


def excess(cons, equality=None) -> np.ndarray:
    """F_m - U_m for an inequality, |F_m - U_m| for an equality (``equality``: M booleans, or
    None), rows of a history too: the violation is its positive part."""
    cons = np.asarray(cons, dtype=float)
    if equality is None or not np.any(equality):
        return cons
    return np.where(np.asarray(equality, dtype=bool), np.abs(cons), cons)


def split_values(values: np.ndarray, terms: ProblemTerms) -> tuple[float, np.ndarray]:
    """(F_0 stochastic part or 0, F_m - U_m) from the per-function values."""
    k = terms.first_constraint
    f0 = float(values[0]) if k else 0.0
    return f0, np.asarray(values[k:], dtype=float) - terms.bounds


class Evaluator:
    """Full-data evaluations through the federated layer (the server never reads rows).

    ``tasks`` is what the clients must be able to run; :meth:`evaluate` asks every client for
    sums at w and divides by N (eq. (Fs0) and the F_m of Problem 3).
    """

    def __init__(self, problem):
        self.terms = ProblemTerms(problem.objective is not None, problem.bounds,
                                  problem.deterministic, problem.equality, problem.convex)
        self.num_samples = problem.data.num_samples
        self.tasks = {EVALUATE: EvaluateTask(problem.functions)}

    def evaluate(self, source, w: np.ndarray, with_grad: bool, round: int = 0) -> Evaluation:
        """F_m(w) and (``with_grad``) their gradients on the full data, from every client's
        sums. ``source``: a transport, or ``source(request) -> replies`` (the runner's
        gatherer: replies carry the factor ``weight``, e.g. the renormalisation over the
        clients who answered, or one secure sum). ``round``: the rounds done (for messages)."""
        request = Request(EVALUATE, int(round), np.asarray(w, dtype=float),
                          {"with_grad": bool(with_grad)})
        replies = source(request) if callable(source) else source.stream(request)
        up = count = 0
        values = grads = None
        complete = True
        for m in replies:      # summed as they come: O(1) replies held
            v = array(m, "values")
            if m.weight != 1.0:
                v, complete = m.weight * v, False
            values = v.copy() if values is None else values + v
            if with_grad:
                g = array(m, "grads")
                if m.weight != 1.0:
                    g = m.weight * g
                grads = g.copy() if grads is None else grads + g
            up += m.num_floats()
            count += 1
        N = self.num_samples
        return Evaluation(values / N, grads / N if with_grad else None, up,
                          count * request.num_floats(), complete)

    def objective_gradient(self, ev: Evaluation, w: np.ndarray) -> np.ndarray:
        """grad F_0(w) + grad R(w) (R's gradient only when R is smooth), with the coordinates
        the domain's simple bounds fix set to 0 (:meth:`DeterministicPart.bound_fixed`): the
        objective's side of the stationarity balance, for the KKT test's scale and floor."""
        det = self.terms.deterministic
        g = ev.grads[0] if self.terms.stochastic_objective else np.zeros(w.size)
        if det.smooth:
            g = g + det.grad(w)
        return det.free(np.asarray(g, dtype=float))

    def objective_gradient_norm(self, ev: Evaluation, w: np.ndarray) -> float:
        """|grad F_0(w) + grad R(w)| (R's gradient only when R is smooth)."""
        return float(np.linalg.norm(self.objective_gradient(ev, w)))

    def split(self, values: np.ndarray, w: np.ndarray) -> tuple[float, np.ndarray]:
        """(full objective F_0(w) + deterministic terms, F_m(w) - U_m)."""
        f0, cons = split_values(values, self.terms)
        return f0 + self.terms.deterministic.value(w), cons
