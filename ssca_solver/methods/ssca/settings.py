"""What a solve by SSCA fixes before round 1: the problem's sizes, the options, and the regime
they select (adaptive or fixed batch and tau, unit steps, the diagonal metric, the
quasi-Newton model). Built once (:meth:`Settings.build`), never changed; the round's functions
(:mod:`.probe`, :mod:`.acceptance`, :mod:`.continuation`) read it beside the state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from ...engine.options import ADAPTIVE_BATCHES
from ...schedules import at_epochs, step_value
from . import adaptive as ad
from . import quasi_newton as qn
from .newton import NewtonModel, SketchModel
from .options import sketch_rank
from .quasi_newton import LBFGSModel


def first_batch(batch_size, sizes, dim: int) -> int:
    """Round 1's rows per client under an adaptive ``batch_size``: "auto" reads every row
    (max_i N_i) when every client's full pass reads at most ``adaptive.FULL_PASS_WORK``
    row-parameters (N_i d), else it grows as "grow" does, from ``adaptive.START_BATCH``."""
    largest = max(int(n) for n in sizes)
    if batch_size == "auto" and largest * int(dim) <= ad.FULL_PASS_WORK:
        return largest
    return min(ad.START_BATCH, largest)


class ModelCache:
    """The model of the Lagrangian's Hessian the state holds, built once per state array (the
    solver, the rejection's tau and the fallback read it in the same round): the Newton model
    of ``state.hess`` when it holds one (its sketch, with ``state.hess_eig``), else the
    compact form of the quasi-Newton pairs. A
    cache of a value derived from the state, not memory: dropping it changes nothing but
    time."""

    def __init__(self):
        self._key, self._model = None, None

    def __call__(self, state):
        source = state.hess if state.hess.size else state.qn_s
        if self._model is None or self._key is not source:
            self.put(LBFGSModel(state.qn_s, state.qn_y) if not state.hess.size
                     else SketchModel(state.hess, state.hess_eig) if state.hess_eig.size
                     else NewtonModel(state.hess))
        return self._model

    def put(self, model) -> None:
        """Keep ``model``, built from ``model.S`` (the array the state will hold)."""
        self._key, self._model = model.S, model


class FormsCache:
    """Every function's surrogate a_m |w|^2 + b_m.w + c_m stacked over the functions
    (:func:`.merit.stacked_quadratics`) for the last few statistics tuples: a round reads the
    same (immutable) statistics in the merit, its rounding size, the quasi-Newton pair and
    the read-off evaluation. A cache of values derived from the statistics, not memory:
    dropping it changes nothing but time."""

    KEEP = 4

    def __init__(self):
        self._held: list = []
        self._stackable: Optional[bool] = None

    def stackable(self, test) -> bool:
        """Whether the settings' builders give stacked forms (``test()``, asked once: the
        builders are fixed for the settings' life)."""
        if self._stackable is None:
            self._stackable = bool(test())
        return self._stackable

    def get(self, stats, make):
        """The forms of ``stats`` (a tuple, compared by identity), made by ``make()`` once."""
        for held, forms in self._held:
            if held is stats:
                return forms
        forms = make()
        if isinstance(stats, tuple) or getattr(stats, "packed", None) is not None:
            # (not a list: the forms of an immutable sequence, a tuple or .step.Statistics)
            self._held = [(stats, forms)] + self._held[:self.KEEP - 1]
        return forms


def _read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


@dataclass(frozen=True)
class Settings:
    """The fixed settings of one solve by SSCA (see the module docstring).

    Attributes:
      problem, builders, subproblem, options: the problem, its surrogate builders, the
        subproblem solver and the parsed :class:`~ssca_solver.SSCAOptions`.
      penalties: c_1 < c_2 < ... of the continuation ((0,) for Algorithm 1).
      M: the number of stochastic constraints; ``first``: the index of the first
        constraint's statistics (1 when the objective is stochastic, else 0).
      equality: which constraints are equalities; ``bounds``: the U_m (read-only);
        ``bound_scale``: max(1, |U_m|).
      ridge: lambda when the deterministic part is lambda |w|^2 (else None).
      sizes, num_samples: the clients' rows N_i and N; ``size_array`` the N_i as a
        read-only array, ``largest`` max N_i (a round's bookkeeping stays O(1) in Python
        with thousands of clients).
      auto_batch, batch_size: batch_size "auto" or "grow", or the fixed B (None: full
        batches).
      first_batch: round 1's rows per client when ``auto_batch`` (:func:`first_batch`).
      auto_tau, tau: tau="auto", or the fixed tau (the fallback 0.1 under "auto").
      adapt_tau: tau="auto" and every builder's tau adaptable.
      sampled: the rounds' statistics are random (a fixed B, or K < I clients).
      sampled_clients: K < I clients per round, or proportional draws.
      private: differential privacy (``options.privacy``): every round's statistics are
        noised, so no round's statistics are the full data's (no guarded steps).
      unit_steps: rho = gamma = 1 on full batches (schedules not given).
      metric_ok, model_ok: the diagonal metric / a model of the Lagrangian's Hessian may
        apply; newton: that model is the clients' curvature (:mod:`.newton`), else the
        quasi-Newton one; sketch_rank: the directions of its sketch (0: whole Hessians).
      qn_memory: the quasi-Newton pairs kept.
      rho, gamma: the resolved schedules; ``participation``: K / I.
      own_curvature: the builders with a curvature of their own (scaled by kappa).
      models: the :class:`ModelCache`; forms: the :class:`FormsCache`.
    """

    problem: Any
    builders: tuple
    subproblem: Any
    options: Any
    penalties: tuple
    M: int
    first: int
    equality: np.ndarray
    bounds: np.ndarray
    bound_scale: np.ndarray
    ridge: Optional[float]
    sizes: tuple
    num_samples: int
    size_array: np.ndarray
    largest: int
    auto_batch: bool
    batch_size: Optional[int]
    first_batch: int
    auto_tau: bool
    tau: float
    adapt_tau: bool
    sampled: bool
    sampled_clients: bool
    private: bool
    unit_steps: bool
    metric_ok: bool
    model_ok: bool
    newton: bool
    sketch_rank: int
    qn_memory: int
    rho: Any
    gamma: Any
    participation: float
    own_curvature: tuple
    models: ModelCache
    forms: FormsCache

    @classmethod
    def build(cls, problem, *, builders, subproblem, options, rho, gamma,
              unit_steps: bool = True, participation: float = 1.0,
              sampled_clients: bool = False) -> "Settings":
        """The settings of a solve of ``problem`` with ``options`` (see :class:`Settings`)."""
        o = options
        builders = tuple(builders)
        bounds = _read_only(problem.bounds)
        auto_batch = o.batch_size in ADAPTIVE_BATCHES
        batch_size = None if auto_batch else o.batch_size
        auto_tau = o.tau == "auto"
        adapt_tau = auto_tau and ad.adaptable(builders)
        unit_steps = bool(unit_steps)
        full_phase = auto_batch or batch_size is None
        model_ok = (o.hessian in ("lbfgs", "newton", "sketch") and unit_steps and adapt_tau
                    and subproblem.supports_model and full_phase)
        newton = model_ok and o.hessian in ("newton", "sketch")
        return cls(
            problem=problem, builders=builders, subproblem=subproblem, options=o,
            penalties=tuple(float(c) for c in o.penalty), M=problem.num_constraints,
            first=problem.first_constraint, equality=problem.equality,
            bounds=bounds, bound_scale=np.maximum(1.0, np.abs(bounds)),
            ridge=problem.deterministic.norm2_coefficient(),
            sizes=tuple(problem.data.client_sizes), num_samples=problem.data.num_samples,
            size_array=_read_only(np.asarray(problem.data.client_sizes, dtype=np.int64)),
            largest=int(max(problem.data.client_sizes)),
            auto_batch=auto_batch, batch_size=batch_size,
            first_batch=first_batch(o.batch_size, problem.data.client_sizes, problem.dim),
            auto_tau=auto_tau,
            tau=0.1 if auto_tau else float(o.tau), adapt_tau=adapt_tau,
            # sampled rounds: a fixed B, or a random set of clients (K < I, proportional)
            sampled=(not auto_batch and batch_size is not None) or bool(sampled_clients),
            sampled_clients=bool(sampled_clients), unit_steps=unit_steps,
            private=o.privacy is not None,
            # a diagonal curvature where the data's scales differ, on full batches only
            # (where the backtracking guards every step): on mini-batches it made networks
            # diverge; the Newton model's curvature scales every direction itself
            metric_ok=(unit_steps and adapt_tau and subproblem.supports_metric and full_phase
                       and not newton),
            # a model of the Lagrangian's Hessian in the backtracking regime, which keeps
            # every accepted step monotone in the exact penalty
            model_ok=model_ok, newton=newton,
            sketch_rank=sketch_rank(problem.dim) if newton and o.hessian == "sketch" else 0,
            qn_memory=qn.memory_for(problem.dim), rho=rho, gamma=gamma,
            participation=float(participation),
            own_curvature=tuple(m for m, b in enumerate(builders) if ad.own_curvature(b)),
            models=ModelCache(), forms=FormsCache())

    # -- the regime of a round, from the state ---------------------------------------------------
    def batch(self, state) -> Optional[int]:
        """The rows per client of the next round (None: every row)."""
        return self.rows(state.batch)

    def rows(self, adaptive_batch: int) -> Optional[int]:
        """The rows per client of a round when an adaptive schedule is at ``adaptive_batch``
        (the fixed B otherwise; None: every row)."""
        if not self.auto_batch:
            return self.batch_size
        return None if adaptive_batch >= self.largest else int(adaptive_batch)

    def rows_read(self, batch) -> float:
        """sum_i min(B, N_i): the rows a round with ``batch`` rows per client reads from
        every client (None: N)."""
        if batch is None:
            return float(self.num_samples)
        return float(np.minimum(self.size_array, int(batch)).sum())

    def full(self, state) -> bool:
        """The next round reads every row of its clients."""
        return self.batch(state) is None

    def tau_of(self, state) -> float:
        """The tau clients use next round."""
        return float(state.tau) if state.tau > 0 else self.tau

    def backtracking(self, state) -> bool:
        """Full batches with the adaptive tau and unit steps: the backtracking regime."""
        return self.full(state) and self.adapt_tau and self.unit_steps

    def guarded(self, state) -> bool:
        """Full batches from every client outside the backtracking regime (a numeric tau, a
        builder with its own curvature such as DiagonalCurvature, or rho/gamma given): each
        round's statistics are the full data's at w_t, so the exact-penalty merit there is
        known and a step that raised it is taken back (:func:`.acceptance.guarded_step`)."""
        return (self.full(state) and not self.sampled_clients and not self.private
                and not (self.adapt_tau and self.unit_steps))

    def model_on(self, state) -> bool:
        """The model of the Lagrangian's Hessian is in the round's surrogate: it applies
        (``model_ok``), it holds a Hessian or a quasi-Newton pair, and no diagonal metric is
        in force (which takes precedence)."""
        return bool(self.model_ok and (state.hess.size or state.qn_s.size)
                    and not state.metric.size)

    def model(self, state):
        """The state's model of the Lagrangian's Hessian (:class:`ModelCache`)."""
        return self.models(state)

    def steps_at(self, batch, t: int) -> tuple:
        """rho_t, gamma_t of eqs. (rho)/(gamma) with ``batch`` rows per client (None: all): an
        :class:`~ssca_solver.EpochStep` counts passes over the data, R = N / ((K/I) sum_i
        min(B, N_i)) rounds per epoch at that batch."""
        rows = self.rows_read(batch)
        R = self.num_samples / max(rows * self.participation, 1e-300)
        return (step_value(at_epochs(self.rho, R), t, "rho"),
                step_value(at_epochs(self.gamma, R), t, "gamma"))

    @property
    def objective_stochastic(self) -> bool:
        """Whether the objective is a SampleFunction (its statistics come first)."""
        return self.first == 1
