"""The run's history: per-round rows and every-k-round full-data evaluations, in growing arrays.

Rows are written into preallocated NumPy arrays that double when full, so a run of T rounds
costs O(log T) allocations and O(1) Python objects per round, whatever T.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np


class Column:
    """A growable array of rows of one shape and dtype."""

    def __init__(self, shape: tuple = (), dtype=float, capacity: int = 256):
        self.shape = tuple(shape)
        self._data = np.empty((capacity, *self.shape), dtype=dtype)
        self.size = 0

    def append(self, row) -> None:
        if self.size == self._data.shape[0]:
            grown = np.empty((2 * self.size, *self.shape), dtype=self._data.dtype)
            grown[:self.size] = self._data[:self.size]
            self._data = grown
        self._data[self.size] = row
        self.size += 1

    def array(self) -> np.ndarray:
        """A copy of the rows written so far."""
        return self._data[:self.size].copy()

    def view(self) -> np.ndarray:
        """The rows written so far (a view: valid until the next append)."""
        return self._data[:self.size]

    def load(self, rows: np.ndarray) -> None:
        rows = np.asarray(rows, dtype=self._data.dtype)
        rows = rows.reshape((rows.shape[0] if rows.ndim else 0,) + self.shape)
        self._data = np.empty((max(256, 2 * len(rows)), *self.shape), dtype=self._data.dtype)
        self._data[:len(rows)] = rows
        self.size = len(rows)


class History:
    """Per-round arrays (length = rounds run) and every-k-round full-data evaluations.

    Every method records ``t`` (the round) and ``stage`` (the penalty stage j, 0 without one);
    method "ssca" adds ``rho``, ``gamma``, ``penalty`` (c in force), ``slack`` (rounds x M),
    ``multipliers`` (subproblem duals, rounds x M), ``surrogate_value`` (optimal value of
    Problem 2/5), ``step_norm`` (|wbar_t - w_t|), ``retries`` (subproblem fallback attempts)
    and ``inaccurate`` (1.0 when the round's subproblem solve was flagged inaccurate); method
    "fedavg" adds ``lr`` and ``step_norm`` (|w_{t+1} - w_t|); "primal_dual" and
    "augmented_lagrangian" add ``lr``, ``dual_step``, ``step_norm``, ``multipliers`` (their own
    lambda_{t+1}, rounds x M), ``weights`` (the mu_t the clients used) and
    ``constraint_estimate`` (Fhat - U, rounds x M).
    Every ``eval_every`` rounds: ``eval_t``, ``objective`` (full-data F_0 + deterministic
    terms at w_t) and ``constraints`` (full-data F_m(w_t) - U_m, len(eval_t) x M).
    Read them as attributes (``res.history.slack``); ``names`` lists them.
    """

    def __init__(self, columns: Mapping[str, np.ndarray]):
        self._columns = dict(columns)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._columns)

    def __getattr__(self, name):
        try:
            return self.__dict__["_columns"][name]
        except KeyError:
            raise AttributeError(f"History has no column {name!r}; it has "
                                 f"{', '.join(self.__dict__['_columns'])}") from None

    def as_dict(self) -> dict[str, np.ndarray]:
        return dict(self._columns)

    def __repr__(self):
        return f"History(rounds={len(self._columns['t'])}, columns={list(self._columns)})"


class Recorder:
    """Collects the rounds' rows (columns declared by the algorithm) and the evaluations."""

    def __init__(self, round_columns: Mapping[str, tuple], num_constraints: int):
        self.M = num_constraints
        self.columns = {"t": Column((), int), "stage": Column((), int)}
        self.columns.update({k: Column(shape) for k, shape in round_columns.items()})
        self.evals = {"eval_t": Column((), int), "objective": Column(()),
                      "constraints": Column((num_constraints,))}

    @property
    def rounds(self) -> int:
        return self.columns["t"].size

    def round(self, t: int, stage: int, row: Mapping) -> None:
        self.columns["t"].append(t)
        self.columns["stage"].append(stage)
        for k, v in row.items():
            self.columns[k].append(v)

    def evaluation(self, t: int, objective: float, constraints) -> None:
        self.evals["eval_t"].append(t)
        self.evals["objective"].append(objective)
        self.evals["constraints"].append(constraints)

    def last_evaluation(self):
        """(t, objective, constraints) of the latest evaluation, or None."""
        e = self.evals
        if not e["eval_t"].size:
            return None
        i = e["eval_t"].size - 1
        return int(e["eval_t"].view()[i]), float(e["objective"].view()[i]), \
            e["constraints"].view()[i].copy()

    def stage_rows(self, name: str, stage: int) -> np.ndarray:
        """The rows of column ``name`` recorded during ``stage``."""
        return self.columns[name].view()[self.columns["stage"].view() == stage]

    def history(self) -> History:
        return History({**{k: c.array() for k, c in self.columns.items()},
                        **{k: c.array() for k, c in self.evals.items()}})

    # -- checkpoints ---------------------------------------------------------------------------
    def arrays(self) -> dict[str, np.ndarray]:
        return {**{f"history/{k}": c.view() for k, c in self.columns.items()},
                **{f"history/{k}": c.view() for k, c in self.evals.items()}}

    def load(self, arrays: Mapping[str, np.ndarray]) -> None:
        for k, c in {**self.columns, **self.evals}.items():
            key = f"history/{k}"
            if key not in arrays:
                raise ValueError(f"the checkpoint has no history column {k!r}")
            c.load(arrays[key])
