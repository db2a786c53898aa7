"""The certificate: what status "converged" promises, and every rule behind it, in one place.

The promise: at the returned point, on the full data (every client's every row), each relative
KKT residual of Problem 3 is within its tolerance: stationarity and complementarity within
``kkt_tol``, each constraint's violation within ``feas_tol`` max(1, |U_m|), the domain's within
``feas_tol`` (:class:`KKTReport`, computed by :func:`ssca_solver.diagnostics.kkt.kkt_report`).

The rules, all here:

* the test: :meth:`KKTReport.passed` (every relative residual within its tolerance; never a
  report that could not be computed);
* when it runs: at every full-data evaluation of a method that declares ``certifies``
  (:class:`Certificate`, the runner's stop test), never on an evaluation some client missed;
  its multiplier fit is skipped where the report would not feed the method's evidence and
  the test cannot pass whatever the multipliers: a constraint's violation alone exceeds
  ``feas_tol`` (:func:`ssca_solver.diagnostics.kkt.feasibility_exceeds`), or a lower bound
  on the stationarity of any multipliers that pass complementarity exceeds ``kkt_tol``
  (:func:`ssca_solver.diagnostics.kkt.stationarity_exceeds`);
* the end of a run: a run that used its rounds (or settled) between two tests is promoted to
  "converged" when the test passes at the returned point (:meth:`Certificate.promote`);
* the final word: "converged" is never claimed against the report the Result carries
  (:meth:`Certificate.converged`); an incomplete final evaluation certifies nothing
  (:meth:`Certificate.incomplete`); the status every certifying method shares
  (:meth:`Certificate.decide`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Optional

import numpy as np

from .. import status as st


@dataclass(frozen=True)
class KKTReport:
    """KKT diagnostics of Problem 3 at the returned point, on the full data.

    Attributes:
      multipliers: mu_m >= 0 of the stochastic constraints, from the KKT conditions at the point
        (:func:`ssca_solver.diagnostics.kkt.kkt_report`), never a penalty c.
      multiplier_source: "nnls" (least-squares fit of stationarity and complementarity) or
        "linearized" (the linearised KKT step, used with a domain or a nonsmooth term), or
        "failed: <why>" when the report could not be computed (:meth:`failed_at`): then the
        multipliers, stationarity and complementarity are NaN (feasibility too when the point
        could not even be evaluated), ``passed`` is False and ``failed`` is True.
      stationarity: |grad F_0 + grad R + sum mu_m grad F_m| ("gradient"), or the length of the
        linearised KKT step ("linearized step").
      stationarity_kind: which of the two.
      feasibility: max(F_m(w) - U_m, 0) per constraint (plus ``domain_violation``).
      complementarity: |mu_m (F_m(w) - U_m)| per constraint.
      domain_violation: largest violation of the domain constraints (0 inside).
      domain_multipliers: one array of multipliers per domain constraint (empty without one).
      scale: the gradient scale of the relative stationarity (see ``kkt_report``).
      stationarity_rel, feasibility_rel, complementarity_rel: the relative residuals the
        stopping test compares with ``kkt_tol`` and ``feas_tol``.
      objective_gap: on a convex problem, an upper bound on (F_0 + R)(w) - p*, the returned
        point's objective above the optimum p* (weak duality with these multipliers:
        :func:`ssca_solver.diagnostics.kkt.objective_gap`); NaN: no bound.
      objective_gap_note: how the bound was obtained, or why there is none.
    """

    multipliers: np.ndarray
    multiplier_source: str
    stationarity: float
    stationarity_kind: str
    feasibility: np.ndarray
    complementarity: np.ndarray
    domain_violation: float = 0.0
    domain_multipliers: tuple = ()
    scale: float = 1.0
    stationarity_rel: float = float("nan")
    feasibility_rel: np.ndarray = field(default_factory=lambda: np.zeros(0))
    complementarity_rel: np.ndarray = field(default_factory=lambda: np.zeros(0))
    objective_gap: float = float("nan")
    objective_gap_note: str = ""

    @classmethod
    def failed_at(cls, why: str, num_constraints: int, constraints=None, bounds=None,
                  domain_violation: float = float("nan")) -> "KKTReport":
        """A report that says it could not be computed (``why``): NaN multipliers,
        stationarity and complementarity; feasibility from ``constraints`` (F_m - U_m at the
        point, relative to max(1, |U_m|) with ``bounds``) when they were evaluated, else NaN."""
        nan = np.full(num_constraints, np.nan)
        if constraints is None:
            feas, feas_rel = nan, nan.copy()
        else:
            cons = np.asarray(constraints, dtype=float)
            feas = np.maximum(cons, 0.0)
            scale = np.maximum(1.0, np.abs(np.asarray(bounds if bounds is not None
                                                      else np.zeros(cons.size), dtype=float)))
            feas_rel = feas / scale
        return cls(multipliers=nan.copy(), multiplier_source=f"failed: {why}",
                   stationarity=float("nan"), stationarity_kind="not computed",
                   feasibility=feas, complementarity=nan.copy(),
                   domain_violation=float(domain_violation), scale=float("nan"),
                   stationarity_rel=float("nan"), feasibility_rel=feas_rel,
                   complementarity_rel=nan.copy())

    @property
    def failed(self) -> bool:
        """True when the report could not be computed (``multiplier_source`` says why)."""
        return self.multiplier_source.startswith("failed")

    @property
    def max_residual(self) -> float:
        """The largest absolute residual (NaN when one of them is NaN: a failed report)."""
        values = np.array([self.stationarity, self.domain_violation,
                           *np.atleast_1d(self.feasibility),
                           *np.atleast_1d(self.complementarity)], dtype=float)
        return float("nan") if np.any(np.isnan(values)) else float(np.max(values))

    def residuals(self, feas_tol: float, kkt_tol: float) -> list[tuple[str, float, float]]:
        """(name, relative residual, tolerance) of every test, largest ratio first (a NaN
        residual, of a failed report, counts as the largest)."""
        rows = [("stationarity", float(self.stationarity_rel), kkt_tol),
                ("domain feasibility", float(self.domain_violation), feas_tol)]
        for m, (f, c) in enumerate(zip(np.atleast_1d(self.feasibility_rel),
                                       np.atleast_1d(self.complementarity_rel))):
            rows.append((f"feasibility of constraint {m + 1}", float(f), feas_tol))
            rows.append((f"complementarity of constraint {m + 1}", float(c), kkt_tol))
        def ratio(row):
            _, value, tol = row
            if np.isnan(value):
                return np.inf
            return value / tol if tol > 0 else (np.inf if value > 0 else 0.0)

        return sorted(rows, key=lambda r: -ratio(r))

    def largest(self, feas_tol: float, kkt_tol: float) -> tuple[str, float, float]:
        """The first row of :meth:`residuals` (the largest ratio of a residual to its
        tolerance; the first of equal ones), found without building and sorting every row."""
        feas = np.atleast_1d(np.asarray(self.feasibility_rel, dtype=float))
        comp = np.atleast_1d(np.asarray(self.complementarity_rel, dtype=float))
        values = np.concatenate([[float(self.stationarity_rel), float(self.domain_violation)],
                                 np.column_stack([feas, comp]).ravel()])
        tols = np.concatenate([[kkt_tol, feas_tol], np.tile([feas_tol, kkt_tol], feas.size)])
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(tols > 0, values / np.where(tols > 0, tols, 1.0),
                             np.where(values > 0, np.inf, 0.0))
        ratio[np.isnan(values)] = np.inf
        i = int(np.argmax(ratio))
        if i < 2:
            name = ("stationarity", "domain feasibility")[i]
        else:
            m, kind = divmod(i - 2, 2)
            name = f"{('feasibility', 'complementarity')[kind]} of constraint {m + 1}"
        return name, float(values[i]), float(tols[i])

    def passed_message(self, t: int, feas_tol: float, kkt_tol: float) -> str:
        """The message of status "converged": the round and the largest residual."""
        name, value, tol = self.largest(feas_tol, kkt_tol)
        return (f"the full-data KKT test passed at round {t}: every relative residual within "
                f"tolerance (largest: {name} {value:.2g} <= {tol:g})")

    def passed(self, feas_tol: float, kkt_tol: float) -> bool:
        """The KKT test: every relative residual within its tolerance (never for a failed
        report: NaN is within no tolerance)."""
        # the rows of :meth:`residuals`, compared as arrays (one round's test with hundreds of
        # constraints built and sorted 2 M rows in Python)
        feas = np.asarray(self.feasibility_rel, dtype=float)
        comp = np.asarray(self.complementarity_rel, dtype=float)
        return bool(float(self.stationarity_rel) <= kkt_tol
                    and float(self.domain_violation) <= feas_tol
                    and np.all(feas <= feas_tol) and np.all(comp <= kkt_tol))



class Certificate(NamedTuple):
    """The certificate's rules at the tolerances of one solve (``feas_tol``, ``kkt_tol`` of a
    method's options)."""

    feas_tol: float
    kkt_tol: float

    @classmethod
    def of(cls, options) -> "Certificate":
        """The certificate at ``options.feas_tol`` and ``options.kkt_tol``."""
        return cls(float(options.feas_tol), float(options.kkt_tol))

    def passes(self, report: KKTReport) -> bool:
        """The KKT test on ``report`` (:meth:`KKTReport.passed`)."""
        return report.passed(self.feas_tol, self.kkt_tol)

    def promote(self, reason: str, report: KKTReport, complete: bool, tested: bool) -> str:
        """The runner's reason at the end of a run: a run that ended between two tests
        ("max_iter" or "settled") is "converged" when the test passes at the returned point
        (``report``), from an evaluation every client answered (``complete``) and with the
        test on (``tested``: ``eval_every`` set); otherwise ``reason`` unchanged."""
        if (reason in (st.MAX_ITER, st.SETTLED) and complete and tested and not report.failed
                and self.passes(report)):
            return st.CONVERGED
        return reason

    def converged(self, report: Optional[KKTReport], t: int) -> tuple[str, str]:
        """(CONVERGED, message) for a run whose test passed at round ``t``, provided
        ``report``, the full-data report at the returned point, passes too. When it does not
        (the test passed on an evaluation the returned point's own report contradicts: a
        defect of the library), (ERROR, a message naming the residual that fails):
        "converged" is never claimed against the report the Result carries."""
        if report is not None and not self.passes(report):
            name, value, tol = report.largest(self.feas_tol, self.kkt_tol)
            return st.ERROR, (f"the KKT test passed at round {t}, but the full-data report at "
                              f"the returned point does not: {st.exceeds(name, value, tol)}; "
                              "the run's stop test and its final report disagree, a defect of "
                              "the library: please report it")
        return st.CONVERGED, report.passed_message(t, self.feas_tol, self.kkt_tol)

    def incomplete(self, message: str, report: KKTReport, missing) -> str:
        """The message of a run whose final full-data evaluation missed ``missing`` clients
        (``on_client_failure="drop"``): its KKT report covers only the clients that answered,
        so it certifies nothing, whichever way it came out; never "did not pass" with a
        residual within its tolerance."""
        who = ", ".join(str(c) for c in missing) or "some client"
        if self.passes(report):
            name, value, tol = report.largest(self.feas_tol, self.kkt_tol)
            return (f"no certificate: client(s) {who} did not answer the final full-data "
                    "evaluation (on_client_failure='drop'), so the KKT report at the returned "
                    "point covers only the clients that answered\non those every relative "
                    f"residual is within tolerance (largest: {name} {value:.2g} <= {tol:g})\n"
                    "check the failing clients, or run on: the status can say 'converged' "
                    "only from an evaluation every client answered")
        return (message + f"\nnote: the final evaluation missed client(s) {who}: these "
                "residuals cover only the clients that answered")

    def decide(self, reason: str, t: int, report: KKTReport, tested: bool, advice: str,
               penalty: Optional[float] = None) -> tuple[str, str]:
        """The status every certifying method shares: CONVERGED only when the runner's test
        passed, STOPPED by the callback, else MAX_ITER naming the largest residual
        (``tested``: whether the test ran at all, i.e. ``eval_every`` was set; ``advice``:
        what to try)."""
        if reason == st.CONVERGED:
            return self.converged(report, t)
        if reason == st.STOPPED:
            return st.stopped(t, penalty)
        residual = report.largest(self.feas_tol, self.kkt_tol)
        if not tested:
            return st.untested(t, residual, report)
        return st.not_passed(t, residual, advice)


def kkt_failed(message: str, report: KKTReport) -> str:
    """``message`` with a note that the KKT report at the returned point could not be computed
    (``report.multiplier_source`` names the failure)."""
    return (f"{message}\nnote: the full-data KKT report at the returned point could not be "
            f"computed ({report.multiplier_source}), so its stationarity and multipliers are "
            "NaN")
