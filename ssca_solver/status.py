"""Statuses of a solve and the one place their shared messages are written.

``res.status`` is one of :data:`STATUSES`; ``res.success`` is True only for
:data:`CONVERGED`, which only a passed full-data KKT test gives (DESIGN.md: "status means what
it says"). The runner ends a run (or a stage of it) for one of :data:`REASONS`; a method turns
the reason, the state and the final KKT report into a status and a message
(:meth:`ssca_solver.engine.method.Method.status`), using the builders below for the parts every
method shares, so that every method says "stopped" and "the test did not pass" in the same
words. What "converged" promises, and the rules that give it, are in
:mod:`ssca_solver.diagnostics.certificate`.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

#: the full-data KKT test passed at the returned point (the only status with success=True)
CONVERGED = "converged"
#: no feasible point, with evidence (method "ssca": the violation is minimised and stalled at
#: the largest penalty); never a guess
INFEASIBLE = "infeasible"
#: the rounds allowed ran out (the message names the residual that failed)
MAX_ITER = "max_iter"
#: the user's callback stopped the run
STOPPED = "stopped"
#: the library's own numerical machinery failed (a subproblem no attempt could solve, or a
#: diagnostic that decides the status): the Result holds the last good point and its history,
#: and the message names what failed and where. User errors still raise
#: (docs/running.md, "Errors")
ERROR = "error"
#: the rounds a differential-privacy budget paid for ran (``privacy=``); nothing reads the
#: data without noise, so nothing is certified and the point is not evaluated
PRIVATE = "private"
#: every status a Result can have
STATUSES = (CONVERGED, INFEASIBLE, MAX_ITER, STOPPED, ERROR, PRIVATE)

#: a runner reason, not a status: the method's iterates stopped moving (``Method.settled``),
#: so the stage ends early; the method decides what that means
SETTLED = "settled"
#: why :meth:`ssca_solver.engine.runner.Runner.run` returned
REASONS = (CONVERGED, MAX_ITER, STOPPED, SETTLED)


def exceeds(name: str, value: float, tol: float) -> str:
    """"<name> = <value> > <tol> (relative)" for a residual that fails its test, or, for the
    NaN residual of a report that could not be computed, that it could not be computed (never
    "nan > tol", which reads as a measured value)."""
    if np.isnan(value):
        return f"{name} could not be computed"
    return f"{name} = {value:.3g} > {tol:g} (relative)"


def stopped(t: int, penalty: Optional[float] = None) -> tuple[str, str]:
    """(STOPPED, message) for a run the callback stopped after round ``t`` (``penalty``: the c
    in force, for methods with a penalty sequence)."""
    return STOPPED, (f"stopped by the callback after round {t}"
                     + (f" (c = {penalty:g})" if penalty is not None else ""))


def untested(t: int, residual: tuple, kkt=None) -> tuple[str, str]:
    """(MAX_ITER, message) for a run with no stopping test (``eval_every=None``); ``residual``:
    (name, value, tolerance) of the largest relative KKT residual at the end; ``kkt``: the
    report, whose absolute stationarity and scale the message quotes (no start-point scale is
    measured without evaluations, so at an unconstrained point the relative stationarity is
    |grad L| / |grad (F_0 + R)|, 1 there)."""
    name, value, tol = residual
    detail = ""
    if kkt is not None and np.isfinite(kkt.stationarity):
        detail = (f"; |grad L| = {kkt.stationarity:.3g} over the scale {kkt.scale:.3g} (without "
                  "evaluations no start-point scale is measured)")
    return MAX_ITER, (f"ran {t} rounds without a stopping test (eval_every=None): at the end "
                      f"{name} = {value:.3g} (tolerance {tol:g}){detail}")


def private(t: int, spent) -> tuple[str, str]:
    """(PRIVATE, message) for a run under differential privacy that ran ``t`` rounds and
    spent ``spent`` (:class:`ssca_solver.methods.ssca.privacy.PrivacySpent`)."""
    return PRIVATE, (f"ran {t} rounds under {spent.level}-level differential privacy: epsilon = "
                     f"{spent.epsilon:.4g} spent at delta = {spent.delta:g}"
                     + (f" (budget {spent.budget:g})" if spent.budget is not None else "")
                     + f", noise multiplier {spent.noise_multiplier:.4g}, clip "
                     f"{spent.clip:g}. Nothing read the data without noise, so the point is "
                     "neither evaluated nor certified: evaluate res.x on data of your own")


def not_passed(t: int, residual: tuple, advice: str) -> tuple[str, str]:
    """(MAX_ITER, message) for a run whose full-data KKT test did not pass in ``t`` rounds:
    names the residual that failed and what to try (``advice``)."""
    name, value, tol = residual
    return MAX_ITER, (f"the full-data KKT test did not pass in {t} rounds: "
                      f"{exceeds(name, value, tol)} at the returned point\ntry {advice}")


def error(what: str, t: int, exc: BaseException, checkpoint=None) -> tuple[str, str]:
    """(ERROR, message) for a run whose ``what`` (e.g. "round 12's subproblem") failed with
    ``exc`` after ``t`` completed rounds: the Result holds the point after round ``t``."""
    text = str(exc).split("\n", 1)[0]
    return ERROR, (f"{what} failed ({type(exc).__name__}: {text})\nreturning the last good "
                   f"point, after round {t}, with its history"
                   + (f" (checkpoint {checkpoint!r}: resume with solve(..., "
                      f"resume={checkpoint!r}))" if checkpoint else ""))
