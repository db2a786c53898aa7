"""Step-size schedules rho_t and gamma_t of eqs. (rho) and (gamma).

A schedule is any callable ``t -> float`` for t = 1, 2, ...; :class:`PowerStep` is the paper's
``a / t**alpha`` family (Section VI uses rho_t = a1 / t^alpha, gamma_t = a2 / t^(alpha + 0.05)).
:class:`EpochStep` (method "ssca"'s default on rounds with sampled statistics, see
:func:`resolve`) is the same family on a clock of passes over the data instead of rounds, so
that a round that reads 10 rows per client decays the steps as much as a tenth of a round
that reads 100.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable

from .errors import ScheduleError

class ScheduleWarning(UserWarning):
    """A schedule violates a convergence condition of eq. (rho) or eq. (gamma)."""


@dataclass(frozen=True)
class PowerStep:
    """The diminishing step ``a / t**alpha`` (paper Section VI).

    Args:
      a: scale, > 0. Values of the schedule must lie in (0, 1]; ``a <= 1`` guarantees it.
      alpha: exponent, >= 0.

    Example:
      >>> PowerStep(0.6, 0.3)(1), round(PowerStep(0.6, 0.3)(8), 4)
      (0.6, 0.3215)
    """

    a: float
    alpha: float

    def __post_init__(self):
        if not (isinstance(self.a, (int, float)) and math.isfinite(self.a) and self.a > 0):
            raise ScheduleError(f"PowerStep: a must be a finite number > 0, got {self.a!r}")
        if not (isinstance(self.alpha, (int, float)) and math.isfinite(self.alpha)
                and self.alpha >= 0):
            raise ScheduleError(f"PowerStep: alpha must be a finite number >= 0, got {self.alpha!r}")

    def __call__(self, t: int) -> float:
        return self.a / float(t) ** self.alpha


@dataclass(frozen=True)
class EpochStep:
    """The diminishing step ``a / (1 + e_t)**alpha`` of eqs. (rho)/(gamma) on a clock of
    epochs (method "ssca"'s default on rounds with sampled statistics, :func:`resolve`).

    e_t = (t - 1) / R is the number of passes over the data made before round t, R the rounds
    per epoch: N over the rows the clients read per round (in expectation when K < I clients
    take part), which the solver fills in (:meth:`per_epoch`). So rho_1 = gamma_1 = a whatever
    the batch, and the steps decay with the data seen, not with the rounds: at B = 1 a round
    reads 1/100 of what it reads at B = 100 and the steps decay 100 times more slowly per round.
    For large t, EpochStep(a, alpha) ~ (a R^alpha) / t^alpha, a :class:`PowerStep` with the same
    exponent, so the conditions of eqs. (rho)/(gamma) are those of PowerStep
    (:func:`check_schedules`). Called directly (no epoch length known), R = 1: ``a / t**alpha``.

    Args:
      a: scale, in (0, 1] (the first value).
      alpha: exponent, >= 0.

    Example:
      >>> s = EpochStep(0.3, 0.55)
      >>> s(1), round(s.per_epoch(60.0)(61), 4)      # 60 rounds per epoch: round 61 = 1 epoch
      (0.3, 0.2049)
    """

    a: float
    alpha: float

    def __post_init__(self):
        PowerStep(self.a, self.alpha)       # the same checks
        if self.a > 1:
            raise ScheduleError(f"EpochStep: a is the first value and must be <= 1, got {self.a!r}")

    def __call__(self, t: int) -> float:
        return self.a / float(t) ** self.alpha

    def per_epoch(self, rounds: float) -> Callable[[int], float]:
        """The schedule t -> a / (1 + (t - 1) / rounds)^alpha for ``rounds`` rounds per epoch."""
        if not (math.isfinite(rounds) and rounds > 0):
            raise ScheduleError(f"EpochStep: rounds per epoch must be > 0, got {rounds!r}")
        return _EpochClock(self.a, self.alpha, float(rounds))


@dataclass(frozen=True)
class _EpochClock:
    a: float
    alpha: float
    rounds: float

    def __call__(self, t: int) -> float:
        return self.a / (1.0 + (t - 1) / self.rounds) ** self.alpha


def at_epochs(schedule, rounds: float):
    """``schedule`` on the clock of ``rounds`` rounds per epoch when it is an EpochStep;
    any other schedule counts rounds and is returned as it is."""
    return schedule.per_epoch(rounds) if isinstance(schedule, EpochStep) else schedule


@dataclass(frozen=True)
class _Constant:
    value: float

    def __call__(self, t: int) -> float:
        return self.value


#: rho and gamma when the options leave them "auto" (the default of method "ssca"): rounds with
#: exact statistics (every row of every client, deterministic SCA with a fixed tau) take the
#: round-counted schedules below; rounds on sampled data (a fixed B, or K < I clients) take the
#: epoch-counted ones, whose smaller first values average more rounds of noise
DEFAULT_EXACT = {"rho": PowerStep(0.9, 0.4), "gamma": PowerStep(0.9, 0.55)}
DEFAULT_SAMPLED = {"rho": EpochStep(0.15, 0.4), "gamma": EpochStep(0.3, 0.55)}


def resolve(schedule, name: str, exact: bool):
    """``schedule``, or for "auto" the default for rounds with exact (``exact``) or sampled
    statistics (:data:`DEFAULT_EXACT`, :data:`DEFAULT_SAMPLED`)."""
    if isinstance(schedule, str):
        return (DEFAULT_EXACT if exact else DEFAULT_SAMPLED)[name]
    return schedule


def as_schedule(value, name: str) -> Callable[[int], float]:
    """Turn ``value`` (an EpochStep, a PowerStep, a callable, or a constant in (0, 1]) into a
    schedule."""
    if isinstance(value, str) and value == "auto":
        return value
    if isinstance(value, (PowerStep, EpochStep)) or callable(value):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if not 0 < value <= 1:
            raise ScheduleError(f"{name}: a constant step must lie in (0, 1], got {value!r}")
        return _Constant(float(value))
    raise ScheduleError(f"{name}: expected a PowerStep, a callable t -> value or a number, "
                        f"got {type(value).__name__}")


def step_value(schedule, t: int, name: str) -> float:
    """Evaluate ``schedule(t)`` and check that it lies in (0, 1].

    rho_t must lie in (0, 1] because eq. (Fs0bar) is a convex combination (a weight 1 - rho_t < 0
    can make the surrogate non-convex); gamma_t must lie in (0, 1] because eq. (updatew) is one.
    """
    try:
        v = float(schedule(t))
    except Exception as exc:  # a user's callable failed: say which schedule and when
        raise ScheduleError(f"{name}: the schedule raised at t={t}: {exc!r}") from exc
    if not (math.isfinite(v) and 0 < v <= 1):
        raise ScheduleError(f"{name}_t must lie in (0, 1] (eqs. (rho)/(gamma)); "
                            f"{name}({t}) = {v!r}")
    return v


def positive_value(schedule, t: int, name: str) -> float:
    """``schedule(t)`` for a learning rate (a PowerStep, a callable or a number): unlike rho_t
    and gamma_t (:func:`step_value`) it need not be <= 1, but must be finite and > 0."""
    try:
        v = float(schedule(t)) if callable(schedule) else float(schedule)
    except Exception as exc:  # a user's callable failed: say which schedule and when
        raise ScheduleError(f"{name}: the schedule raised at t={t}: {exc!r}") from exc
    if not (math.isfinite(v) and v > 0):
        raise ScheduleError(f"{name}_t must be a finite number > 0; {name}({t}) = {v!r}")
    return v


def check_schedules(rho, gamma, stochastic: bool = True) -> list[str]:
    """Check the conditions of eqs. (rho) and (gamma) that can be checked, and warn.

    For PowerStep and EpochStep schedules (rho ~ a1/t^p, gamma ~ a2/t^q) the conditions are
    exactly:
    rho_t -> 0 and sum rho = inf: 0 < p <= 1; gamma_t -> 0, sum gamma = inf, sum gamma^2 < inf:
    1/2 < q <= 1; gamma/rho -> 0: q > p. For other callables only the values are checked, at
    run time (see :func:`step_value`); a constant step (a number) violates rho_t -> 0 and
    gamma_t -> 0, which matters only with mini-batches (``stochastic``): with full batches the
    iteration is deterministic SCA, for which constant steps are standard. Returns the list of
    warnings issued.
    """
    issued = []
    for name, s in (("rho", rho), ("gamma", gamma)):
        if stochastic and isinstance(s, _Constant):
            issued.append(f"{name} = {s.value} (constant): eqs. (rho)/(gamma) need {name}_t -> 0 "
                          "with mini-batches")
    power = (PowerStep, EpochStep)
    if isinstance(rho, power):
        if not 0 < rho.alpha <= 1:
            issued.append(f"rho = {rho}: eq. (rho) needs 0 < alpha <= 1 "
                          "(rho_t -> 0 and sum rho_t = inf)")
    if isinstance(gamma, power):
        if not 0.5 < gamma.alpha <= 1:
            issued.append(f"gamma = {gamma}: eq. (gamma) needs 1/2 < alpha <= 1 "
                          "(sum gamma_t = inf and sum gamma_t^2 < inf)")
    if isinstance(rho, power) and isinstance(gamma, power):
        if not gamma.alpha > rho.alpha:
            issued.append(f"gamma/rho -> 0 (eq. (gamma)) needs gamma's exponent {gamma.alpha} "
                          f"> rho's exponent {rho.alpha}")
    for msg in issued:
        warnings.warn(msg + "; the convergence theorems do not cover this choice.",
                      ScheduleWarning, stacklevel=3)
    return issued
