"""Which mechanism of the default options earns its place (issue 10: "keep them only where the
suite shows they help"): the default options on every problem of :mod:`problems.suite`, seed
0, with ONE mechanism switched off at a time, against the full defaults in the same run.

Mechanisms and how each is switched off (module constants patched in this process only; the
library has no option for most of them because they are meant to be always on):

* ``adaptive_batch``: the norm test never grows the batch (it stays at START_BATCH = 32 rows
  per client with unit steps: the noise floor is never left);
* ``full_from_round_1``: ``batch_size="full"`` (deterministic SCA from the first round: what
  adaptive sampling saves in samples drawn);
* ``tau_probe``: the starting tau is 1.0 instead of the probe's curvature estimate (adaptation
  by backtracking stays on);
* ``backtracking``: full-batch steps are never rejected and tau never shrinks (MERIT_RTOL = inf,
  TAU_DOWN = 1): plain SCA with the probe's tau;
* ``diagonal_metric``: METRIC_SPREAD = inf (one scalar curvature always);
* ``clarabel_tolerances``: the CVXPY path at Clarabel's own tolerances (1e-8) instead of 1e-9.

Usage:  python benchmarks/ablation.py [--problems a,b] [--max-iter N]
Writes benchmarks/results/ablation.json and ablation.png (targets met and rounds per problem
and variant); progress on stderr. The digits softmax problem is left out (its reference takes
~40 s and it exercises no mechanism the others do not).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _common import RESULTS, log, machine, write_json  # noqa: E402
from defaults import START_BATCH, fmt, library_version, run  # noqa: E402
from problems import suite  # noqa: E402
from ssca_solver.methods.ssca import adaptive as ad  # noqa: E402
from ssca_solver.methods.ssca import probe  # noqa: E402

MAX_ITER = 2000


def _patch(obj, name, value, undo):
    undo.append((obj, name, getattr(obj, name)))
    setattr(obj, name, value)


def variant(name: str):
    """(extra solve options, patches to apply) of one ablation."""
    patches = {
        "defaults": [],
        "adaptive_batch": [(ad, "GROW_EVERY", 10 ** 9), (ad, "NOISE_RATIO", float("inf"))],
        "full_from_round_1": [],
        "tau_probe": [(probe, "run", lambda cfg, exchange, x0: probe.Probe(1.0, float("nan")))],
        "backtracking": [(ad, "MERIT_RTOL", {"closed_form": float("inf"),
                                             "cvxpy": float("inf")}),
                         (ad, "TAU_DOWN", 1.0)],
        "diagonal_metric": [(ad, "METRIC_SPREAD", float("inf"))],
        "clarabel_tolerances": [],
    }[name]
    extra = {"full_from_round_1": {"batch_size": "full"},
             "clarabel_tolerances": {"solver_options": {"tol_gap_abs": 1e-8,
                                                        "tol_gap_rel": 1e-8,
                                                        "tol_feas": 1e-8}}}.get(name, {})
    return extra, patches


VARIANTS = ["defaults", "adaptive_batch", "full_from_round_1", "tau_probe", "backtracking",
            "diagonal_metric", "clarabel_tolerances"]


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, axes = plt.subplots(2, 1, figsize=(13, 8), sharex=True)
    width = 0.8 / len(VARIANTS)
    x = np.arange(len(names))
    for k, v in enumerate(VARIANTS):
        err = [max(results[n][v]["error"], 1e-16) if results[n][v]["error"] is not None
               else np.nan for n in names]
        rounds = [results[n][v]["rounds"] for n in names]
        axes[0].bar(x + (k - len(VARIANTS) / 2) * width, err, width, label=v)
        axes[1].bar(x + (k - len(VARIANTS) / 2) * width, rounds, width, label=v)
    axes[0].set_yscale("log")
    axes[0].axhline(1e-3, color="k", ls="--", lw=0.8)
    axes[0].set_title("max(|gap|, violation, KKT/x error) at the end (seed 0); "
                      "dashed: the gap target 1e-3")
    axes[1].set_yscale("log")
    axes[1].set_title("rounds")
    axes[0].legend(fontsize=7, ncol=4)
    axes[1].set_xticks(x)
    axes[1].set_xticklabels(names, rotation=30, ha="right")
    fig.suptitle("Default options with one mechanism switched off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--problems", default=None)
    ap.add_argument("--max-iter", type=int, default=MAX_ITER)
    args = ap.parse_args(argv)
    names = (args.problems.split(",") if args.problems else
             [n for n in suite.PROBLEMS if n != "softmax_digits"])
    t_all = time.perf_counter()
    warm, _ = suite.build("qcqp3")
    warm.solve(seed=0, max_iter=50)
    results = {}
    for name in names:
        prob, ref = suite.build(name)
        results[name] = {}
        for v in VARIANTS:
            extra, patches = variant(v)
            undo = []
            try:
                for obj, attr, value in patches:
                    _patch(obj, attr, value, undo)
                m = run(prob, ref, dict(seed=0, max_iter=args.max_iter, **extra),
                        None if extra.get("batch_size") == "full" else START_BATCH)
            finally:
                for obj, attr, value in reversed(undo):
                    setattr(obj, attr, value)
            errs = [abs(m[k]) for k in ("gap", "violation") if m.get(k) is not None]
            if ref["kind"] == "nonconvex" and m.get("x_error") is not None:
                errs.append(m["x_error"])
            results[name][v] = {"status": m["status"], "rounds": m["rounds"],
                                "samples": m["samples"], "wall": m["wall"],
                                "gap": m["gap"], "violation": m["violation"],
                                "x_error": m["x_error"],
                                "error": max(errs) if errs else None,
                                "targets_met": not m["misses"], "misses": m["misses"]}
            log(f"[{name}] {v}: {m['status']} in {m['rounds']} rounds, {m['wall']:.1f} s, "
                f"gap {fmt(m['gap'])}, viol {fmt(m['violation'])}"
                + ("" if not m["misses"] else f"  MISSES {m['misses']}"))
    head = "| problem | " + " | ".join(VARIANTS) + " |"
    lines = [head, "|" + "---|" * (len(VARIANTS) + 1)]
    for n, r in results.items():
        cells = []
        for v in VARIANTS:
            e = r[v]
            cells.append(("met" if e["targets_met"] else "**missed**")
                         + f", {e['status']}, {e['rounds']} r, "
                         + (f"{e['samples']:.2g} rows" if e["samples"] else "-"))
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    text = "\n".join(lines)
    payload = {"description": __doc__, "command": "python benchmarks/ablation.py"
               + (f" --problems {args.problems}" if args.problems else ""),
               "machine": machine(), "library": library_version(), "max_iter": args.max_iter,
               "variants": VARIANTS, "total_time": time.perf_counter() - t_all,
               "table": text, "problems": results}
    path = write_json("ablation", payload)
    plot(results, RESULTS / "ablation.png")
    print(text)
    log(f"wrote {path} in {payload['total_time']:.0f} s")


if __name__ == "__main__":
    main()
