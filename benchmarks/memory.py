"""Memory of the server loop: one closed-form round at d = 10^6, and the history's growth.

1. Peak traced memory (tracemalloc; NumPy reports its allocations to it) of ONE round of the
   runner -- request -> ``InProcessTransport.stream`` -> ``driver.step`` with the closed-form
   subproblem, exactly ``Runner.run(state, 1)`` as ``Problem.solve`` drives it -- above the
   memory held before the round, in copies of d floats (8 d bytes), at d = 10^6, I = 10
   clients, B = 100, for M = 0 (Algorithm 1) and M = 1 (Algorithm 2). The sample function is
   f(w, x_n) = 0.5 |w - s_n c|^2 with one shared d-vector c and a scalar s_n per row: the
   clients' rows are 200 floats each, while w, the gradient and the statistics have 10^6
   entries (the constraint of M = 1 is the same kind of function with another vector c').
   A second, instrumented run of the same round snapshots the traced allocations each time the
   traced size reaches a new high, and reports what is alive at the peak (grouped by the line
   that allocated it).
2. History growth: resident set size (/proc/self/statm) and tracemalloc's current size after
   2,000, 10,000 and 20,000 rounds of logistic regression on breast cancer (d = 31, 5 clients,
   B = 10, eval_every=None), in bytes per round, and Python objects per round (gc-tracked
   objects, and pymalloc blocks from ``sys.getallocatedblocks``).

Usage:  python benchmarks/memory.py [--quick] [--d D]
Writes benchmarks/results/memory.json and memory.png; progress on stderr.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import ssca_solver as ss  # noqa: E402
from _common import RESULTS, log, machine, machine_title, write_json  # noqa: E402
from ssca_solver.methods import SSCA  # noqa: E402
from ssca_solver.engine.session import Session  # noqa: E402

LIMIT_COPIES = 6.0          # the requirement: a closed-form round at d = 10^6 within 6 copies
ROWS, CLIENTS, BATCH = 200, 10, 100
PAGE = os.sysconf("SC_PAGE_SIZE")


# -- part 1: one round at d = 10^6 -------------------------------------------------------------

def shifted_square(c: np.ndarray, name: str) -> ss.SampleFunction:
    """f(w, x_n) = 0.5 |w - s_n c|^2, s_n = X[n, 0]: per-row values from three dot products,
    and the gradient of the batch mean, w - mean(s) c, with one d-sized allocation (the least a
    gradient can cost)."""
    cc = float(c @ c)

    def value_and_grad(w, X, y):
        s = X[:, 0]
        ww, wc = float(w @ w), float(w @ c)
        v = 0.5 * (ww - 2.0 * s * wc + s * s * cc)
        g = np.multiply(c, -float(s.mean()))
        g += w
        return v, g

    return ss.SampleFunction(lambda w, X, y: value_and_grad(w, X, y)[0],
                             lambda w, X, y: value_and_grad(w, X, y)[1],
                             name=name, value_and_grad=value_and_grad)


def big_problem(d: int, M: int, seed: int = 0) -> ss.Problem:
    rng = np.random.default_rng(seed)
    c0 = rng.standard_normal(d) / np.sqrt(d)
    X = 1.0 + 0.1 * rng.standard_normal((CLIENTS * ROWS, 1))      # s_n around 1
    data = ss.FederatedData.split(X, None, num_clients=CLIENTS, seed=seed)
    f0 = shifted_square(c0, "f0")
    if M == 0:
        return ss.Problem(f0, dim=d, data=data)
    c1 = rng.standard_normal(d) / np.sqrt(d)
    # F_1(w) = 0.5 E|w - s c1|^2 <= 0.3: active at the objective's minimiser w = E[s] c0
    return ss.Problem(f0, [shifted_square(c1, "f1") <= 0.3], dim=d, data=data)


def runner_for(prob, **options):
    """The runner, algorithm and starting state exactly as ``solve_ssca`` builds them."""
    o = SSCA.parse(prob, options)
    alg = SSCA.build(prob, o, options)
    session = Session(prob, alg, o)
    return session, alg


class PeakSnapshots:
    """A profile hook that snapshots the traced allocations whenever the traced size reaches a
    new high (checked at every function return, Python or C): the last snapshot is what was
    alive at the round's peak, up to allocations made and freed inside one C call."""

    def __init__(self, margin: int):
        self.margin, self.high, self.snap, self.where = margin, 0, None, None

    def __call__(self, frame, event, arg):
        if event in ("return", "c_return"):
            cur = tracemalloc.get_traced_memory()[0]
            if cur > self.high + self.margin:
                self.high = cur
                self.snap = tracemalloc.take_snapshot()
                self.where = f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} " \
                             f"({frame.f_code.co_name}{', after ' + getattr(arg, '__name__', '') if event == 'c_return' else ''})"


def _label(frames) -> str:
    """The allocating line inside ssca_solver (or this file), innermost first."""
    inner = list(frames)[::-1]          # tracemalloc lists the oldest frame first
    keep = [f for f in inner if "ssca_solver" in f.filename or f.filename.endswith("memory.py")]
    f = (keep or inner)[0]
    parts = Path(f.filename).parts
    short = "/".join(parts[parts.index("ssca_solver"):]) if "ssca_solver" in parts else parts[-1]
    return f"{short}:{f.lineno}"


WHAT = {  # what the allocating line makes, for the report
    "federated/messages.py": "read-only broadcast copy of w_t (Request.read_only)",
    "memory.py": "a client's gradient (the user function)",
    "surrogates.py": "a client's statistic 'lin' (its reply)",
    "functions.py": "isfinite mask of a gradient (_valid_grad), bool",
    "driver.py": "the new averaged statistics (average_with_messages' out)",
    "_kernels.py": "w_{t+1} (convex_step)",
}


def _what(label: str) -> str:
    return next((v for k, v in WHAT.items() if label.split(":")[0].endswith(k)), "")


def one_round(d: int, M: int) -> dict:
    unit = 8.0 * d
    prob = big_problem(d, M)
    extra = {"penalty": [1e2]} if M else {}
    session, alg = runner_for(prob, max_iter=3, eval_every=None, batch_size=BATCH,
                              subproblem="closed_form", seed=0, **extra)
    with session:
        runner, state = session.runner, session.state
        state, _ = runner.run(state, 1)              # warm-up: Numba, round 1's checks
        state_bytes = state.w.nbytes + sum(np.asarray(v).nbytes for st in state.stats
                                           for v in st.values())
        gc.collect()
        tracemalloc.start(30)
        before = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        t0 = time.perf_counter()
        state2, _ = runner.run(state, 1)             # the measured round
        seconds = time.perf_counter() - t0
        current, peak = tracemalloc.get_traced_memory()
        del state2
        gc.collect()
        # the same round again, instrumented: what is alive at the high-water mark
        base_snap = tracemalloc.take_snapshot()
        hook = PeakSnapshots(margin=int(unit // 64))
        before2 = hook.high = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        sys.setprofile(hook)
        try:
            runner.run(state, 1)
        finally:
            sys.setprofile(None)
        peak2 = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    alive = []
    if hook.snap is not None:
        for st in hook.snap.compare_to(base_snap, "traceback"):
            if st.size_diff > unit / 100:
                label = _label(st.traceback)
                alive.append({"allocated_at": label, "what": _what(label),
                              "copies_of_d": st.size_diff / unit, "count": st.count_diff})
        alive.sort(key=lambda r: -r["copies_of_d"])
    row = {"M": M, "d": d, "clients": CLIENTS, "batch_size": BATCH,
           "message_floats": (d + 2) * (1 + M),
           "server_state_before_round_copies_of_d": state_bytes / unit,
           "peak_above_before_bytes": peak - before,
           "peak_above_before_copies_of_d": (peak - before) / unit,
           "after_round_above_before_copies_of_d": (current - before) / unit,
           "instrumented_peak_above_before_copies_of_d": (peak2 - before2) / unit,
           "peak_snapshot_taken_at": hook.where,
           "alive_at_peak": alive,
           "alive_at_peak_total_copies_of_d": sum(r["copies_of_d"] for r in alive),
           "round_seconds": seconds,
           # judged on two decimals: a few kB of Python objects come with the d-sized arrays
           "within_limit": round((peak - before) / unit, 2) <= LIMIT_COPIES}
    log(f"[1] d={d:,} M={M}: one closed-form round peaks {row['peak_above_before_copies_of_d']:.2f}"
        f" copies of d floats ({peak - before:,} bytes) above what was held before it (the "
        f"server's state: {state_bytes / unit:.2f} copies; limit "
        f"{LIMIT_COPIES:g}: {'met' if row['within_limit'] else 'EXCEEDED'}); round "
        f"{seconds:.2f} s")
    for r in alive:
        log(f"      {r['copies_of_d']:5.2f} x d  {r['count']:+d} block(s)  {r['allocated_at']:<36s}"
            f" {r['what']}")
    log(f"      (snapshot at {hook.where}; instrumented peak "
        f"{row['instrumented_peak_above_before_copies_of_d']:.2f})")
    return row


# -- part 2: history growth -------------------------------------------------------------------

def rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * PAGE


def history_growth(marks: list[int], trace: bool) -> dict:
    from problems.logistic import logistic_loss

    from ssca_solver.datasets import breast_cancer

    X, y = breast_cancer()
    data = ss.FederatedData.split(X, y, num_clients=5, seed=0)
    prob = ss.Problem(logistic_loss(), dim=X.shape[1], data=data)
    rows, todo, start = [], sorted(marks), time.perf_counter()

    def cb(it):
        if todo and it.t == todo[0]:
            todo.pop(0)
            gc.collect()
            rows.append({"rounds": it.t, "rss_bytes": rss_bytes(),
                         "traced_bytes": tracemalloc.get_traced_memory()[0] if trace else None,
                         "gc_objects": len(gc.get_objects()),
                         "allocated_blocks": sys.getallocatedblocks(),
                         "seconds": time.perf_counter() - start})
            r = rows[-1]
            log(f"[2] {'traced' if trace else 'untraced'} run: {it.t:>6,d} rounds, RSS "
                f"{r['rss_bytes'] / 2**10:,.0f} KiB"
                + (f", traced {r['traced_bytes'] / 2**20:.2f} MiB" if trace else "")
                + f", {r['gc_objects']:,} gc objects, {r['allocated_blocks']:,} blocks "
                f"({r['seconds']:.0f} s)")

    if trace:
        tracemalloc.start()
    res = prob.solve(max_iter=max(marks), batch_size=10, eval_every=None, seed=0,
                     subproblem="closed_form", callback=cb)
    if trace:
        tracemalloc.stop()
    first, out = rows[0], {"rows": rows, "rounds_run": int(res.nit), "traced": trace}
    for r in rows[1:]:
        n = r["rounds"] - first["rounds"]
        r["per_round_since_first_mark"] = {
            "rss_bytes": (r["rss_bytes"] - first["rss_bytes"]) / n,
            "traced_bytes": ((r["traced_bytes"] - first["traced_bytes"]) / n) if trace else None,
            "gc_objects": (r["gc_objects"] - first["gc_objects"]) / n,
            "allocated_blocks": (r["allocated_blocks"] - first["allocated_blocks"]) / n}
    for r in rows[1:]:
        g = r["per_round_since_first_mark"]
        log(f"[2] {'traced' if trace else 'untraced'} run, rounds {first['rounds']:,}-"
            f"{r['rounds']:,}: RSS {g['rss_bytes']:+.1f} B/round"
            + (f", traced {g['traced_bytes']:+.1f} B/round" if trace else "")
            + f", gc objects {g['gc_objects']:+.4f}/round, blocks {g['allocated_blocks']:+.4f}/round")
    hist = res.history.as_dict()
    out["history_columns"] = {k: [list(v.shape), str(v.dtype)] for k, v in hist.items()}
    out["history_bytes_per_round_of_arrays"] = sum(
        v.itemsize * int(np.prod(v.shape[1:], dtype=int)) for k, v in hist.items()
        if k not in ("eval_t", "objective", "constraints"))
    return out


def history_growth_fresh(marks: list[int], trace: bool) -> dict:
    """``history_growth`` in a fresh interpreter: part 1 leaves hundreds of MB of freed but
    resident heap behind, which later allocations reuse without raising the RSS."""
    import json
    import subprocess

    cmd = [sys.executable, str(Path(__file__).resolve()), "--history-run",
           "traced" if trace else "untraced", "--marks", ",".join(map(str, marks))]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, check=True, text=True)
    return json.loads(done.stdout)


def plot(res, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(13, 5))
    for run in res["history_growth"]:
        rows = run["rows"]
        t = [r["rounds"] for r in rows]
        tag = "traced run" if run["traced"] else "untraced run"
        ax[0].plot(t, [(r["rss_bytes"] - rows[0]["rss_bytes"]) / 2**20 for r in rows], "o-",
                   label=f"RSS ({tag})")
        if run["traced"]:
            ax[0].plot(t, [(r["traced_bytes"] - rows[0]["traced_bytes"]) / 2**20 for r in rows],
                       "s--", label="tracemalloc current (traced run)")
    t0 = res["history_growth"][0]["rows"][0]["rounds"]
    t = np.array([t0, max(r["rounds"] for run in res["history_growth"] for r in run["rows"])])
    ax[0].plot(t, 550 * (t - t0) / 2**20, ":",
               color="grey", label="before the refactor: ~550 B/round")
    ax[0].set(xlabel="rounds", ylabel="MiB above the first mark",
              title="history growth, logistic regression d=31, 5 clients, B=10")
    ax[0].legend(fontsize=8)
    rr = res["round_peak"]
    labels = [f"M={r['M']}\n({'Alg. 1' if r['M'] == 0 else 'Alg. 2'})" for r in rr]
    bottom = np.zeros(len(rr))
    names = sorted({a["what"] or a["allocated_at"] for r in rr for a in r["alive_at_peak"]})
    for k, name in enumerate(names):
        h = np.array([sum(a["copies_of_d"] for a in r["alive_at_peak"]
                          if (a["what"] or a["allocated_at"]) == name) for r in rr])
        ax[1].bar(labels, h, bottom=bottom, label=name, color=f"C{k}")
        bottom += h
    for i, r in enumerate(rr):
        ax[1].text(i, r["peak_above_before_copies_of_d"] + 0.1,
                   f"peak {r['peak_above_before_copies_of_d']:.2f}", ha="center", fontsize=9)
    ax[1].axhline(LIMIT_COPIES, color="k", ls="--", lw=1, label=f"limit {LIMIT_COPIES:g} copies")
    ax[1].set(ylabel="copies of d floats above what the round started with",
              title=f"one closed-form round, d={rr[0]['d']:,}, I={CLIENTS}, B={BATCH}",
              ylim=(0, max(LIMIT_COPIES, max(r['peak_above_before_copies_of_d'] for r in rr)) + 4))
    ax[1].legend(fontsize=7, loc="upper left")
    fig.suptitle(machine_title(res["machine"]), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="200/1,000/2,000 rounds of part 2")
    ap.add_argument("--d", type=int, default=None, help="dimension of part 1 (default 10^6)")
    ap.add_argument("--history-run", choices=("traced", "untraced"), help=argparse.SUPPRESS)
    ap.add_argument("--marks", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.history_run:                 # the child of history_growth_fresh: JSON on stdout
        import json
        marks = [int(m) for m in args.marks.split(",")]
        print(json.dumps(history_growth(marks, trace=args.history_run == "traced"),
                         default=float))
        return
    d = args.d or 1_000_000
    marks = [200, 1000, 2000] if args.quick else [2000, 10000, 20000]
    start = time.perf_counter()
    res = {"command": " ".join(["python", "benchmarks/memory.py"] + (argv or sys.argv[1:])),
           "machine": machine(), "loadavg_at_start": os.getloadavg(),
           "unit": f"copies of d floats = 8 d bytes = {8 * d:,} bytes",
           "limit_copies_of_d": LIMIT_COPIES}
    res["round_peak"] = [one_round(d, M) for M in (0, 1)]
    res["history_growth"] = [history_growth_fresh(marks, trace=False),
                             history_growth_fresh(marks, trace=True)]
    res["wall_time_s"] = time.perf_counter() - start
    path = write_json("memory", res)
    plot(res, RESULTS / "memory.png")
    log(f"wrote {path} and {RESULTS / 'memory.png'} in {res['wall_time_s']:.0f} s")


if __name__ == "__main__":
    main()
