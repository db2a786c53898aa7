"""``res.plot()``: a run's history in one matplotlib figure (matplotlib is an optional extra:
``pip install 'ssca-solver[plot]'``; it is imported only when a plot is drawn).

One panel per quantity the run recorded, against the rounds, with the floats sent on the top
axis:

- **objective**: the full-data F_0 + deterministic terms at each evaluation (``eval_every``)
  and at the returned point;
- **largest violation** (with constraints): max over m of max(F_m - U_m, 0) (|F_m - U_m| for
  an equality, a constraint named ``"f == b"``) at the same points;
- **stationarity**: the relative stationarity of the full-data KKT test at the returned point
  (and at each evaluation when the history records a column ``stationarity_rel``), with the
  method's step length ``step_norm`` of every round;
- **penalty c** (method "ssca" with constraints), on a log axis;
- **batch size** per client (when the history records ``batch_size``; full batches shaded).

Dotted vertical lines mark where a penalty stage starts. The floats sent are the run's
algorithm messages up and down, all clients (``res.communication.up_total + down_total``,
evaluations not counted), spread evenly over its rounds: every round's messages have the same
size, so the top axis is exact apart from the replies of dropped clients.
"""

from __future__ import annotations

import numpy as np

from .result import Result

INSTALL = "pip install 'ssca-solver[plot]'"


def _pyplot():
    try:
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ImportError(f"Result.plot needs matplotlib, an optional extra of ssca-solver: "
                          f"{INSTALL}  ({exc})") from exc
    return plt


def _equalities(result: Result) -> np.ndarray:
    """Which constraints are equalities (their names read ``"f == b"``)."""
    return np.array([" == " in name for name in result.constraint_names], dtype=bool)


def violation(constraints: np.ndarray, equality: np.ndarray) -> np.ndarray:
    """The largest violation of each row of ``constraints`` (F_m - U_m, shape (k, M)):
    max over m of max(F_m - U_m, 0), |F_m - U_m| for an equality; 0 without constraints."""
    c = np.atleast_2d(np.asarray(constraints, dtype=float))
    if not c.shape[1]:
        return np.zeros(len(c))
    excess = np.where(equality, np.abs(c), np.maximum(c, 0.0))
    return excess.max(axis=1)


def floats_per_round(result: Result) -> float:
    """The floats the run's algorithm messages carried per round, up and down, all clients
    (evaluations not counted); 0 when the run has no rounds or no counts."""
    c = result.communication
    return (c.up_total + c.down_total) / c.rounds if c.rounds else 0.0


def plot_result(result: Result, figsize=None, title=None):
    """Draw ``result``'s run (see the module docstring) and return the matplotlib Figure
    (made with ``pyplot.subplots``: ``fig.savefig(...)`` writes it, ``plt.show()`` shows it,
    ``plt.close(fig)`` frees it). ``figsize``: (width, height) in inches, by default 8 wide and
    2 per panel; ``title``: the figure's title, by default the method, status and rounds."""
    plt = _pyplot()
    from matplotlib.ticker import MaxNLocator

    h = result.history.as_dict()
    names = set(h)
    t = np.asarray(h.get("t", np.zeros(0, dtype=int)))
    eval_t = np.asarray(h.get("eval_t", np.zeros(0, dtype=int)))
    M = np.asarray(result.constraints).size
    panels = ["objective"] + (["violation"] if M else []) + ["stationarity"]
    if M and "penalty" in names and result.stages:
        panels.append("penalty")
    if "batch_size" in names:
        panels.append("batch")
    fig, axes = plt.subplots(len(panels), 1, sharex=True, squeeze=False,
                             figsize=figsize or (8.0, 2.0 * len(panels) + 0.8))
    axes = dict(zip(panels, axes[:, 0]))

    # the evaluations, and the returned point at round nit when no evaluation was there
    at = eval_t.astype(float)
    objective = np.asarray(h.get("objective", np.zeros(0)), dtype=float)
    cons = np.asarray(h.get("constraints", np.zeros((0, M))), dtype=float).reshape(len(at), M)
    if result.nit not in set(eval_t.tolist()):
        at = np.r_[at, result.nit]
        objective = np.r_[objective, result.fun]
        cons = np.vstack([cons, np.asarray(result.constraints, dtype=float).reshape(1, M)])

    ax = axes["objective"]
    ax.plot(at, objective, "o-", ms=3, label="full-data objective")
    ax.set_ylabel("objective")

    if M:
        ax = axes["violation"]
        v = violation(cons, _equalities(result))
        ax.plot(at, v, "o-", ms=3, color="C3", label="largest violation")
        if np.any(v > 0):
            # zeros shown at the bottom; a log axis over at most six decades below the largest
            ax.set_yscale("symlog", linthresh=max(float(np.min(v[v > 0])),
                                                  1e-6 * float(np.max(v)), 1e-300))
        ax.set_ylabel("largest\nviolation")

    ax = axes["stationarity"]
    if "step_norm" in names and len(t):
        steps = np.asarray(h["step_norm"], dtype=float)
        ax.plot(t, np.where(steps > 0, steps, np.nan), color="0.6", lw=1,
                label="step length (step_norm)")
    if "stationarity_rel" in names:
        s = np.asarray(h["stationarity_rel"], dtype=float)
        xs = eval_t if len(s) == len(eval_t) else t
        ax.plot(xs, s, "o-", ms=3, color="C2", label="relative stationarity")
    final = float(result.kkt.stationarity_rel)
    if np.isfinite(final) and final > 0:
        ax.plot([result.nit], [final], "D", color="C2",
                label="relative stationarity (KKT test at the end)")
    if ax.lines:
        ax.set_yscale("log")
        ax.legend(loc="best", fontsize="small")
    ax.set_ylabel("stationarity")

    if "penalty" in axes:
        ax = axes["penalty"]
        ax.step(t, np.asarray(h["penalty"], dtype=float), where="mid", color="C4")
        ax.set_yscale("log")
        ax.set_ylabel("penalty c")

    if "batch" in axes:
        ax = axes["batch"]
        b = np.asarray(h["batch_size"], dtype=float)
        ax.step(t, b, where="mid", color="C1", label="rows per client")
        full = np.isnan(b)
        for i, (start, end) in enumerate(_runs(full)):
            ax.axvspan(t[start] - 0.5, t[end] + 0.5, color="C1", alpha=0.15, lw=0,
                       label="full batch" if i == 0 else None)
        if np.any(full) or np.any(np.isfinite(b)):
            ax.legend(loc="best", fontsize="small")
        ax.set_ylabel("batch size")

    # where each penalty stage starts (after the first)
    if "stage" in names and len(t):
        stage = np.asarray(h["stage"])
        starts = t[1:][stage[1:] != stage[:-1]]
        for ax in axes.values():
            for s in starts:
                ax.axvline(s - 0.5, color="0.4", ls=":", lw=1)

    bottom = axes[panels[-1]]
    bottom.set_xlabel("round")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    rate = floats_per_round(result)
    top = axes[panels[0]]
    if rate > 0:
        sec = top.secondary_xaxis("top", functions=(lambda r: r * rate, lambda f: f / rate))
        sec.set_xlabel("floats sent (up + down, all clients; evaluations not counted)")
    for ax in axes.values():
        ax.grid(True, alpha=0.3)
    fig.suptitle(title if title is not None
                 else f"{result.method}: {result.status} after {result.nit} rounds")
    fig.tight_layout()
    return fig


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """(first, last) index of each run of True in ``mask``."""
    out, start = [], None
    for i, m in enumerate(mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            out.append((start, i - 1))
            start = None
    if start is not None:
        out.append((start, len(mask) - 1))
    return out
