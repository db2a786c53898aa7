"""What a full-batch round costs against a growing schedule's, by the work of a full local pass,
on the transports, in one run: the measurement behind ``batch_size="auto"``'s rule.

``batch_size="auto"`` reads every row from round 1 when every client's full pass reads at most
``FULL_PASS_WORK`` = 2^24 row-parameters (its rows N_i times d), and grows the batch from 32
rows per client (``batch_size="grow"``) above it. This program solves one problem family at
work levels N_i d from 2^14 to 2^25 with ``batch_size="full"`` and ``batch_size="grow"`` (the
other options at their defaults), on the in-process and the process transports, and records
for each run the status, the rounds, the wall time and the median time of a round; and, per
transport, the fixed part of a round (the median round time at the smallest work level, where
the local pass is negligible) and the time of a full local pass per row-parameter.

The family: :func:`problems.least_squares.ill_conditioned` (least squares, condition number
1e2, an equality and a norm ball, every function with its Hessian) with d = 64 over 4 clients.

Writes ``batch_cost.json`` and ``batch_cost.png`` (the wall time of "full" over "grow", and
each one's rounds, against N_i d, the rule's threshold marked). ``--quick``: 2^14 .. 2^20,
in-process only.

    python benchmarks/batch_cost.py [--quick] [--publish]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _common import RESULTS, log, machine, write_json  # noqa: E402
from problems import least_squares  # noqa: E402

D, CLIENTS, COND = 64, 4, 1e2
LEVELS = tuple(range(14, 26))           # log2 of N_i d
QUICK_LEVELS = tuple(range(14, 21, 2))


def run(prob, batch_size: str, transport: str) -> dict:
    """One solve with the default options but ``batch_size`` and ``transport``."""
    stamps = []
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = prob.solve(method="ssca", batch_size=batch_size, transport=transport, seed=0,
                         progress=False, callback=lambda it: stamps.append(time.perf_counter()))
    wall = time.perf_counter() - t0
    per_round = np.diff(stamps)
    return {"status": res.status, "rounds": int(res.nit), "wall": wall,
            "median_round": float(np.median(per_round)) if len(per_round) else None,
            "objective": float(res.fun)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    args = p.parse_args()
    from ssca_solver.methods.ssca.adaptive import FULL_PASS_WORK

    levels = QUICK_LEVELS if args.quick else LEVELS
    transports = ("inprocess",) if args.quick else ("inprocess", "process")
    rows = []
    warm = least_squares.ill_conditioned(COND, d=D, n=64 * CLIENTS, clients=CLIENTS)[0]
    for transport in transports:            # compilation and start-up outside the figures
        run(warm, "full", transport)
    for level in levels:
        n_i = max(2 ** level // D, 64)
        prob = least_squares.ill_conditioned(COND, d=D, n=n_i * CLIENTS, clients=CLIENTS)[0]
        work = max(prob.data.client_sizes) * D
        for transport in transports:
            row = {"log2_work": level, "work": int(work), "rows_per_client": int(n_i),
                   "transport": transport}
            for batch in ("full", "grow", "auto"):
                row[batch] = run(prob, batch, transport)
            row["full_over_grow"] = row["full"]["wall"] / row["grow"]["wall"]
            rows.append(row)
            log(f"N_i d = 2^{level} ({transport}): full {row['full']['rounds']} rounds "
                f"{row['full']['wall']:.2f} s, grow {row['grow']['rounds']} rounds "
                f"{row['grow']['wall']:.2f} s (full / grow = {row['full_over_grow']:.2f}), "
                f"auto {row['auto']['rounds']} rounds")
    fixed = {}
    for transport in transports:
        mine = [r for r in rows if r["transport"] == transport]
        small, large = mine[0], mine[-1]
        per_work = ((large["full"]["median_round"] - small["full"]["median_round"])
                    / (large["work"] - small["work"]))
        fixed[transport] = {
            "round_fixed_s": small["full"]["median_round"],
            "full_pass_s_per_row_parameter": per_work,
            "work_at_which_the_pass_equals_the_fixed_part":
                small["full"]["median_round"] / per_work if per_work > 0 else None}
    out = {"machine": machine(), "d": D, "clients": CLIENTS, "cond": COND,
           "full_pass_work": FULL_PASS_WORK, "rows": rows, "per_transport": fixed,
           "command": "python benchmarks/batch_cost.py" + (" --quick" if args.quick else "")}
    write_json("batch_cost", out)
    plot(out, RESULTS / "batch_cost.png")
    log(f"wrote {RESULTS / 'batch_cost.json'} and batch_cost.png")


def plot(out: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for k, transport in enumerate(sorted({r["transport"] for r in out["rows"]})):
        mine = [r for r in out["rows"] if r["transport"] == transport]
        w = [r["work"] for r in mine]
        a.plot(w, [r["full_over_grow"] for r in mine], "o-", color=f"C{k}", label=transport)
        b.plot(w, [r["full"]["rounds"] for r in mine], "o-", color=f"C{k}",
               label=f"full ({transport})")
        b.plot(w, [r["grow"]["rounds"] for r in mine], "s--", color=f"C{k}",
               label=f"grow ({transport})")
    for ax in (a, b):
        ax.set_xscale("log", base=2)
        ax.axvline(out["full_pass_work"], color="gray", ls=":", label="auto's threshold")
        ax.set_xlabel("a client's full pass: rows x d")
    a.axhline(1.0, color="k", lw=0.5)
    a.set_ylabel('wall time, "full" / "grow"')
    a.set_yscale("log")
    b.set_ylabel("rounds")
    a.legend(fontsize=8)
    b.legend(fontsize=8)
    fig.suptitle(f"least squares, d = {out['d']}, {out['clients']} clients, default options")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
