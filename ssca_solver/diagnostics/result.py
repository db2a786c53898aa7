"""The result of a solve: point, status, slacks, KKT diagnostics, history, communication.

The KKT report and what it certifies are in :mod:`.certificate`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from .. import status as st
from .certificate import KKTReport
from .history import History


@dataclass(frozen=True)
class Communication:
    """Floats sent between server and clients, counted from the messages themselves.

    ``up_per_client_round``/``down_per_client_round``: one client, one round of the algorithm.
    ``up_total``/``down_total``: all clients, all rounds of the algorithm.
    ``eval_up_total``/``eval_down_total``: the full-data evaluations for the history and the
    KKT report (diagnostics, not part of Algorithms 1-2; zero when ``eval_every=None`` apart
    from the final evaluation).
    ``clients_per_round``: K with partial participation (only they are counted), else None.
    Under secure aggregation the counts include the protocol's keys, shares and masked words
    (8-byte words; byte arrays count bytes / 8).
    """

    rounds: int
    num_clients: int
    up_per_client_round: int
    down_per_client_round: int
    up_total: int
    down_total: int
    eval_up_total: int
    eval_down_total: int
    clients_per_round: Optional[int] = None


@dataclass(frozen=True)
class Stage:
    """One run of Algorithm 2 at a fixed penalty c_j; ``slack_norm`` estimates |s_j*|
    (mean of |s^(t)| over the stage's last tenth of rounds)."""

    penalty: float
    rounds: int
    slack_norm: float


@dataclass(frozen=True)
class Result:
    """What ``Problem.solve`` returns, for every method.

    Attributes:
      x: the point w returned, shape (d,).
      status: "converged" | "infeasible" | "max_iter" | "stopped" (by the callback) |
        "error": the library's own numerical machinery failed, after its retries: a round's
        subproblem that no solver attempt could solve (or another library-internal solver
        failure, ``cvxpy.error.SolverError``), or the status decision's diagnostics. Then
        ``x`` is the last good point (after the last completed round; the start point when
        round 1 failed), ``nit`` the rounds completed, ``history`` their rows, ``fun``,
        ``constraints`` and ``kkt`` are evaluated at ``x`` when possible (else NaN), and
        ``message`` names what failed, where (the round) and with which solver and status;
        ``extras["error"]`` holds the exception. A KKT report that cannot be computed does
        not make a run "error": its status is the one the run earned, ``kkt.failed`` is True
        and the message says so. User errors still raise at once instead of returning:
        bad options (``ValueError``, ``TypeError``; an uninstalled ``solver``), a bad
        function (``UserFunctionError``), bad data or model (``DataError``, ``ModelError``,
        e.g. an empty domain), ``ClientError`` with ``on_client_failure="raise"``,
        ``DivergenceError`` and Ctrl-C (``KeyboardInterrupt``), each with ``exc.state``.
      message: a sentence saying why.
      fun: full-data objective F_0(x) + deterministic terms.
      constraints: full-data F_m(x) - U_m, shape (M,) (<= 0 when feasible).
      slack: the last round's slacks s (M,) (zeros for methods without slacks, such as
        "primal_dual"); ``penalty``: the c at which the solver stopped.
      kkt: :class:`KKTReport` on the full data (``kkt.failed`` when it could not be computed).
      history: :class:`History`.
      communication: :class:`Communication`.
      stages: one :class:`Stage` per penalty value run.
      nit: rounds run in all.
      method: the method that ran ("ssca", "fedavg", ...).
      subproblem: which subproblem solver ran: "closed_form" or "cvxpy" (method "ssca"); None
        for methods without one.
      time: wall-clock seconds of the solve (summed over resumed parts).
      solver_info: method "ssca": ``solver`` ("closed_form" or the CVXPY solver's name),
        ``retries`` (total fallback attempts of the CVXPY path over all rounds; each attempt
        re-solves one round's subproblem with other Clarabel settings, recentred, or with
        another installed solver: :mod:`ssca_solver.subproblems.cvxpy_backend`),
        ``inaccurate_rounds``
        (rounds whose subproblem solve was flagged inaccurate: CVXPY's "optimal_inaccurate",
        an answer of another solver than the chosen one when that is a first-order method
        (SCS, OSQP), or the closed form's dual iteration stopping above rounding) and
        ``parametrized``
        (CVXPY path: compiled once with Parameters, or rebuilt each round for d > 4096; None
        for the closed form) and ``direct_solves`` (CVXPY path: the rounds whose subproblem, a
        QP over a box, Clarabel solved directly without CVXPY's model, see
        :mod:`ssca_solver.subproblems.box_qp`, counted in this call of ``solve``: a resumed
        run counts the rounds since its checkpoint; None for the closed form).
      extras: method-specific settings worth keeping with the result (e.g. FedAvg's E; the
        Lagrangian baselines' own multipliers lambda under ``"multipliers"``; SSCA's
        ``"diagonal_metric"``: the spread of the curvature estimates when the default options
        used the diagonal metric, see :mod:`ssca_solver.methods.ssca.adaptive`).
      dropouts: with ``on_client_failure="drop"``, every client that failed in a round or an
        evaluation, in order: :class:`ssca_solver.federated.Dropout` (client, task, round,
        error); ``round`` is the round the request belonged to (for task "evaluate", the
        rounds done when it ran). Empty when no client failed.
      tolerances: the certificate's tolerances ``{"feas_tol": ..., "kkt_tol": ...}`` (empty
        for a method that does not certify): the relative residuals of ``kkt`` are tested
        against them.

    ``success`` is True only when the method's own stopping test passed (status "converged").
    """

    x: np.ndarray
    status: str
    message: str
    fun: float
    constraints: np.ndarray
    slack: np.ndarray
    penalty: Optional[float]
    kkt: KKTReport
    history: History
    communication: Communication
    stages: tuple
    nit: int
    method: str
    subproblem: Optional[str]
    time: float
    constraint_names: tuple = field(default=())
    solver_info: dict = field(default_factory=dict)
    extras: dict = field(default_factory=dict)
    dropouts: tuple = ()
    tolerances: dict = field(default_factory=dict)

    @property
    def success(self) -> bool:
        """True only when the method's own stopping test passed (never for a run that used
        up ``max_iter`` or was stopped by its callback)."""
        return self.status == st.CONVERGED

    @property
    def privacy(self) -> Optional[dict]:
        """Under differential privacy (``privacy=``), what the run spent: ``epsilon`` and
        ``delta`` over the rounds that ran, ``budget``, ``noise_multiplier``, ``clip``,
        ``rounds``, ``planned``, ``batch_size``, ``mechanism``, ``level``
        (:class:`ssca_solver.methods.ssca.privacy.PrivacySpent`); None otherwise. The
        history's column ``epsilon`` holds it after each round."""
        return self.extras.get("privacy")

    def report(self) -> str:
        """A readable account of the solve (what the demo prints)."""
        k = self.kkt
        lines = [_block("status", f"{self.status}: {self.message}"),
                 f"rounds        {self.nit}   method: {self.method}"
                 + (f"   subproblem solver: {self.subproblem}" if self.subproblem else "")
                 + f"   time: {self.time:.2f} s",
                 (f"objective     {self.fun:.6g}   (full data, with deterministic terms)"
                  if not self.privacy else
                  "objective     not evaluated (differential privacy: nothing reads the data "
                  "without noise)")]
        sampling = _sampling(self.history)
        if self.extras.get("diagonal_metric"):
            sampling = (sampling + "; " if sampling else "") + (
                "diagonal metric on full batches (the curvature estimates span "
                f"{self.extras['diagonal_metric']:.2g})")
        if sampling:
            lines.append(f"sampling      {sampling}")
        if self.privacy:
            p = self.privacy
            lines.append(f"privacy       {p['level']}-level ({p['epsilon']:.4g}, {p['delta']:g})-DP "
                         f"over {p['rounds']} rounds ({p['mechanism']} Gaussian noise, "
                         f"multiplier {p['noise_multiplier']:.4g}, clip {p['clip']:g})")
        if self.stages and self.slack.size:
            lines.append("penalty steps")
            for j, s in enumerate(self.stages):
                kept = j > 0 and s.penalty == self.stages[j - 1].penalty
                lines.append(f"  c = {s.penalty:<10.3g} rounds = {s.rounds:<6d} "
                             f"|slack| = {s.slack_norm:.3g}"
                             + ("   (c kept: no evidence that it was too small)" if kept
                                else ""))
        if self.constraints.size and self.privacy:
            lines.append(f"constraints   {self.constraints.size}, not evaluated")
        elif self.constraints.size:
            lines.append("constraints   (full data; F_m - U_m <= 0 is feasible, = 0 for ==)")
            names = self.constraint_names or tuple(f"#{m + 1}" for m in range(self.slack.size))
            for m, name in enumerate(names):
                own = self.extras.get("multipliers")     # a Lagrangian method's lambda
                lines.append(f"  {m + 1:>2d} {name:<28s} F-U = {self.constraints[m]: .4g}   "
                             + (f"slack = {self.slack[m]:.3g}   " if self.stages else "")
                             + f"mu = {k.multipliers[m]:.4g}"
                             + (f"   method's lambda = {own[m]:.4g}" if own is not None
                                else ""))
        si = self.solver_info
        if si.get("retries") or si.get("inaccurate_rounds"):
            lines.append(f"subproblem    {si.get('retries', 0)} retries (fallback settings, "
                         "recentred, other solvers), "
                         f"{len(si.get('inaccurate_rounds', ()))} rounds flagged inaccurate")
        lines.extend(_kkt_lines(k, self.tolerances))
        if k.objective_gap_note:
            lines.append(_gap_line(k, self.fun))
        if self.dropouts:
            d = self.dropouts
            lines.append(f"dropouts      {len(d)} (client, round): "
                         + ", ".join(f"({x.client}, {x.round})" for x in d[:8])
                         + (" ..." if len(d) > 8 else "") + f"; first error: {d[0].error}")
        c = self.communication
        lines.append(f"communication per client per round: {c.up_per_client_round} floats up, "
                     f"{c.down_per_client_round} down; total over "
                     + (f"{c.clients_per_round} of {c.num_clients} clients per round"
                        if c.clients_per_round else f"{c.num_clients} clients")
                     + " x "
                     f"{c.rounds} rounds: {c.up_total:,} up, {c.down_total:,} down "
                     f"(+ {c.eval_up_total:,} up / {c.eval_down_total:,} down for evaluations)")
        return "\n".join(lines)

    # -- keeping and looking at a result (ssca_solver/diagnostics/result_io.py, plot.py) -------
    def save(self, path) -> str:
        """Write the result to ``path``, one ``.npz`` archive of arrays and JSON metadata (no
        pickles; the versions of the software that wrote it included), and return the path;
        ``ss.load_result(path)`` reads it back, every field as it was (an exception in
        ``extras`` comes back as its text). See :mod:`ssca_solver.diagnostics.result_io`."""
        from .result_io import save
        return save(self, path)

    def to_dict(self) -> dict:
        """The result as plain data: dicts, lists, Python scalars and NumPy arrays (copies),
        one key per field plus ``success``; ``history`` is a dict of its arrays (per round and
        per evaluation: see :meth:`history_columns` for one table). JSON: :meth:`to_json`."""
        from .result_io import to_dict
        return to_dict(self)

    def to_json(self, **kwargs) -> str:
        """:meth:`to_dict` as standard JSON text (arrays as lists; NaN and infinities as
        ``null``); ``kwargs`` go to ``json.dumps``, e.g. ``indent=2``."""
        from .result_io import to_json
        return to_json(self, **kwargs)

    def history_columns(self) -> dict:
        """The history as one row per round: a dict of equal-length 1-D arrays, e.g.
        ``pandas.DataFrame(res.history_columns())`` (pandas is not needed otherwise). 2-D
        columns are split (``slack[0]``, ...); the evaluations' ``objective`` and
        ``constraints[m]`` are NaN in rounds without one (``evaluated`` says which)."""
        from .result_io import history_columns
        return history_columns(self)

    def plot(self, **kwargs):
        """A matplotlib Figure of the run against the rounds (and the floats sent, on the top
        axis): objective, largest violation, stationarity, penalty stages and batch size, as
        far as the run recorded them. Needs matplotlib (``pip install
        'ssca-solver[plot]'``); never calls ``plt.show()``. Options:
        :func:`ssca_solver.diagnostics.plot.plot_result`."""
        from .plot import plot_result
        return plot_result(self, **kwargs)

    def __repr__(self) -> str:
        return (f"Result(method={self.method!r}, status={self.status!r}, fun={self.fun:.6g}, nit={self.nit}, "
                f"max_constraint={np.max(self.constraints, initial=-np.inf):.3g}, "
                f"slack_norm={np.linalg.norm(self.slack):.3g}, "
                f"stationarity={self.kkt.stationarity:.3g})")


def _block(head: str, text: str) -> str:
    """``text`` under a 14-character heading, its further lines indented to match."""
    first, *rest = str(text).split("\n")
    return "\n".join([f"{head:<14s}{first}"] + [" " * 14 + line for line in rest])


def _gap_line(k: KKTReport, fun: float) -> str:
    """The report's line on the objective's suboptimality (a convex problem)."""
    gap = float(k.objective_gap)
    if not np.isfinite(gap):
        return f"optimality    no bound on the objective's gap: {k.objective_gap_note}"
    if gap <= 0.0:
        return (f"optimality    objective not above the optimum (bound {gap:.2g}: the "
                f"constraints' violation lets it below; convex: {k.objective_gap_note})")
    return (f"optimality    objective at most {gap:.3g} above the optimum "
            f"({gap / max(1.0, abs(fun)):.2g} relative; convex: {k.objective_gap_note})")


def _kkt_lines(k: KKTReport, tolerances: dict) -> list[str]:
    """The KKT report as the certificate reads it: each relative residual beside its
    tolerance (``tolerances``: the solve's ``feas_tol`` and ``kkt_tol``; none for a method
    that does not certify), then the absolute residuals."""
    if k.failed:
        return [f"KKT           not computed ({k.multiplier_source})"
                + (f"   max feasibility = {np.max(k.feasibility):.3g}"
                   if np.size(k.feasibility) else "")]
    feas_tol, kkt_tol = tolerances.get("feas_tol"), tolerances.get("kkt_tol")

    def judged(name, value, tol):
        if tol is None:
            return f"{name} {value:.2g}"
        return f"{name} {value:.2g} {'<=' if value <= tol else '>'} {tol:g}"

    rel = [judged("stationarity", float(k.stationarity_rel), kkt_tol)]
    if np.size(k.feasibility_rel):
        rel.append(judged("feasibility", float(np.max(k.feasibility_rel)), feas_tol))
        rel.append(judged("complementarity", float(np.max(k.complementarity_rel)), kkt_tol))
    if k.domain_violation > 0:
        rel.append(judged("domain feasibility", float(k.domain_violation), feas_tol))
    lines = ["KKT           relative residuals" + (" (the certificate's test)" if feas_tol
                                                   is not None else "") + ": "
             + ", ".join(rel)]
    absolute = (f"absolute: stationarity {k.stationarity:.3g} ({k.stationarity_kind}, scale "
                f"{k.scale:.3g})")
    if np.size(k.feasibility):
        absolute += (f", max feasibility {np.max(k.feasibility):.3g}, max complementarity "
                     f"{np.max(k.complementarity):.3g}; multipliers from "
                     f"{k.multiplier_source}")
    if k.domain_violation > 0:
        absolute += f", domain violation {k.domain_violation:.3g}"
    return lines + [" " * 14 + absolute]


def _sampling(history) -> str:
    """'B = 32 (rounds 1-50), 64 (51-100), full (101-160); tau 13.6 -> 0.0245' from the history
    of an adaptive run ('' when the batch and tau never changed)."""
    names = history.names
    if "batch_size" not in names or not len(history.t):
        return ""
    batch, t = history.batch_size, history.t
    change = np.flatnonzero(np.r_[True, ~((batch[1:] == batch[:-1])
                                          | (np.isnan(batch[1:]) & np.isnan(batch[:-1])))])
    if len(change) == 1 and history.tau[0] == history.tau[-1]:
        return ""
    parts = []
    for i, start in enumerate(change):
        end = (change[i + 1] if i + 1 < len(change) else len(t)) - 1
        b = "full" if np.isnan(batch[start]) else f"{int(batch[start])}"
        parts.append(f"{b} (rounds {t[start]}-{t[end]})")
    text = "B = " + ", ".join(parts)
    if history.tau[0] != history.tau[-1]:
        text += f"; tau {history.tau[0]:.3g} -> {history.tau[-1]:.3g}"
    if "rejected" in names and history.rejected.sum():
        text += f" ({int(history.rejected.sum())} steps retried with a larger tau)"
    return text


#: The name of :class:`Result` before it served every method.
SSCAResult = Result
