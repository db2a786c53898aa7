"""A round's cost against the number of clients: the library's round beside a batched NumPy
round that computes the same per-client numbers in one pass over the rows.

Problem: Neyman-Pearson logistic regression (problems/neyman_pearson.py, alpha = 0.3,
lambda = 1e-3) on N = 100,000 synthetic rows with d = 30 (29 standard normal features and a
column of ones; labels from a random linear model plus unit noise, seed 0), split uniformly
over I clients (``FederatedData.split``, seed 0), built with ``one_pass=True`` (the two class
losses as the components of one VectorSampleFunction: one product X w and one X' C per batch
for both, as the NumPy round computes them). The library runs ROUNDS full-batch rounds
of Algorithm 2 in process (``batch_size="full"``, ``eval_every=None``, ``hessian="lbfgs"``
so that the clients send values and gradients only, no gradient check); a round's time is the
median over the rounds of the time between two calls of the round callback (the start's probe
and the final evaluation excluded).

The NumPy round does the clients' and the server's arithmetic of that round for all clients at
once: the margins X w of every row, each function's per-row loss and derivative, their sums
per client (sparse I x N products over the clients' contiguous rows, for the values and,
with each row's coefficient in the matrix, for the gradients X' r: one pass over X, no
N x d temporary, flat in I), the proximal-linear
statistics of every client and their weighted average. Its time is the median over ROUNDS
repetitions. The ratio of the two is what issue "thousands of
clients" asks to bring to <= 1.5 at I = 1,000 and <= 2 at I = 10,000.

Each I is run twice: every client answering for itself (the default), and with the clients
in SHARDS shards (``shards=SHARDS``, :mod:`ssca_solver.federated.shards`: one summed reply
per shard, the rows of equally weighted clients pooled into one call of each function);
at I = 1,000 and 10,000 also with 4 and 16 shards. Both runs' final points are compared (the
same iterates up to rounding).

Without ``--quick``, the same round on other engines at I = ENGINE_CLIENTS = 10,000: 2 shards
in forked processes (``transport="process", shards=2``) and 2 Ray actors
(``transport="ray", shards=2``, a local cluster), against the in-process shards' round (the
issue's target: within 2x); and Flower's simulation engine, which keeps one client per
SuperNode, at I = 100 and 1,000 (FLOWER_ROUNDS rounds each).

Without ``--quick`` also the paper's network (Section V, Fashion-MNIST) with I = 1,000 clients
and K = 100 a round, with and without shards (:func:`network`).

Then, without ``--quick``, 100,000 clients of 10 rows each (N = 1,000,000, d = 30, in a
child process whose peak resident memory is read from ``getrusage``) run 50 rounds of
Algorithm 2 with shards on mini-batches of 5 rows (``batch_size=5``, the default rho and
gamma schedules): the target "without running out of memory" is recorded as the child's
peak memory beside the rows' own size.

Usage: ``python benchmarks/many_clients.py [--quick | --big-only | --engines-only] [--publish |
--results-dir DIR]`` (``--quick``: I in {10, 100, 1000}; ``--big-only``: the 100,000 clients
again, into the existing results file, with its own command and machine; ``--engines-only``:
the other engines again, beside the in-process shards' round at the same I, likewise).
Writes many_clients.json and many_clients.png.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, log, machine, machine_title, write_json  # noqa: E402

N, D, ALPHA, LAM, ROUNDS, TAU = 100_000, 30, 0.3, 1e-3, 16, 1.0
SHARDS = 1                      # in process: one worker (pools in pieces of POOL_FLOATS)
SWEEP = {1000: (4, 16), 10000: (4, 16)}
BIG_CLIENTS, BIG_ROWS, BIG_ROUNDS, BIG_BATCH = 100_000, 10, 50, 5
ENGINE_CLIENTS = 10_000        # process and Ray shards, 2 workers
FLOWER_CLIENTS, FLOWER_ROUNDS, FLOWER_START = (100, 1000), 4, 1200.0
NET_CLIENTS, NET_K, NET_BATCH, NET_ROUNDS = 1000, 100, 10, 300
CLIENTS = (10, 100, 1000, 3000, 10000)
QUICK = (10, 100, 1000)


def rows(seed: int = 0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((N, D))
    X[:, -1] = 1.0
    y = (X @ rng.standard_normal(D) + rng.standard_normal(N) > 0).astype(float)
    return X, y


def library_round(data, I: int, shards=None, rounds=None, **transport) -> dict:
    """The median time of a full-batch round of the library on ``data`` (I clients; with
    ``shards``: in that many shards; ``transport``: its options, default in process)."""
    import ssca_solver as ss  # noqa: F401  (the problem module needs it imported)
    from problems.neyman_pearson import neyman_pearson

    prob = neyman_pearson(data, alpha=ALPHA, lam=LAM, one_pass=True)
    opts = dict(seed=0, batch_size="full", eval_every=None, hessian="lbfgs",
                check_gradients=False, shards=shards, **transport)
    rounds = ROUNDS if rounds is None else rounds
    if not transport:
        prob.solve(max_iter=1, **opts)               # Numba's cache loaded outside the clock
    stamps = []

    def callback(it):
        stamps.append(time.perf_counter())

    t0 = time.perf_counter()
    res = prob.solve(max_iter=rounds + 1, callback=callback, **opts)
    wall = time.perf_counter() - t0
    steps = np.diff(stamps)
    return {"round_s": float(statistics.median(steps)), "rounds": int(res.nit),
            "wall": wall, "status": res.status, "x": res.x.tolist()}


def client_sums(starts, n: int):
    """The I x N sparse matrix whose row i sums client i's contiguous rows (built once, like
    the clients' split; products with it are the per-client sums of the batched round)."""
    import scipy.sparse as sp

    counts = np.diff(np.append(starts, n))
    owner = np.repeat(np.arange(len(starts)), counts)
    return sp.csr_matrix((np.ones(n), (owner, np.arange(n))), shape=(len(starts), n))


def numpy_round(X, y, S, n_i, w, pi) -> tuple:
    """The clients' statistics of one full-batch round and their weighted average, batched
    (S: :func:`client_sums`): the objective's and the constraint's averaged (const, lin,
    quad)."""
    import scipy.sparse as sp

    s = 2.0 * y - 1.0
    m = s * (X @ w)
    loss = np.logaddexp(0.0, -m)
    deriv = -s / (1.0 + np.exp(m))                    # d loss / d (x.w)
    out = []
    for label, frac in ((1, pi[1]), (0, pi[0])):
        wt = (y == label) / frac
        v = S @ (wt * loss)                            # (I,) sums of values
        # (I, d) sums of gradients: S with row n's entry scaled by its coefficient, times X
        # (one pass over X, no N x d temporary)
        g = sp.csr_matrix(((wt * deriv)[S.indices], S.indices, S.indptr), shape=S.shape) @ X
        nt = n_i * TAU
        const = v - g @ w + nt * (w @ w)
        lin = g - 2.0 * nt[:, None] * w
        # the server's weights N_i / (B_i N) with B_i = N_i: 1 / N each
        out.append((const.sum() / N, lin.sum(axis=0) / N, nt.sum() / N))
    return tuple(out)


def numpy_time(X, y, starts, pi) -> float:
    S = client_sums(starts, X.shape[0])
    n_i = np.diff(np.append(starts, X.shape[0])).astype(float)
    w = np.zeros(D)
    numpy_round(X, y, S, n_i, w, pi)
    times = []
    for k in range(ROUNDS):
        w = np.full(D, 0.01 * (k + 1))
        t = time.perf_counter()
        numpy_round(X, y, S, n_i, w, pi)
        times.append(time.perf_counter() - t)
    return float(statistics.median(times))


def engines(X, y, inproc: dict) -> list:
    """Other engines against the in-process shards (module docstring): 2 shards in forked
    processes and as Ray actors at I = 10,000; Flower's simulation (one client per
    SuperNode) at I = 100 and 1,000, FLOWER_ROUNDS rounds. Each is skipped (and said so)
    where its package is missing."""
    import importlib.util

    import ssca_solver as ss

    out = []
    runs = [(ENGINE_CLIENTS, "process, 2 shards", dict(shards=2, transport="process"), ROUNDS)]
    if importlib.util.find_spec("ray") is not None:
        runs.append((ENGINE_CLIENTS, "ray, 2 shards", dict(shards=2, transport="ray"), ROUNDS))
    else:
        log("engines: Ray is not installed (pip install 'ssca-solver[ray]'): skipped")
    if importlib.util.find_spec("flwr") is not None:
        # a thousand SuperNodes take minutes to start here: more than the default
        # flower_start_timeout (120 s), which they exceeded in a first try
        runs += [(I, "flower simulation",
                  dict(transport="flower", flower_start_timeout=FLOWER_START), FLOWER_ROUNDS)
                 for I in FLOWER_CLIENTS]
    else:
        log("engines: Flower is not installed: skipped")
    for I, name, opts, rounds in runs:
        data = ss.FederatedData.split(X, y, num_clients=I, seed=0)
        shards = opts.pop("shards", None)
        t0 = time.perf_counter()
        try:
            got = library_round(data, I, shards, rounds=rounds, **opts)
        except Exception as exc:              # recorded, not hidden: the engine failed
            out.append({"clients": I, "engine": name, "error": f"{type(exc).__name__}: "
                        f"{str(exc)[:300]}", "total_s": time.perf_counter() - t0})
            log(f"engines: {name}, I = {I}: {out[-1]['error']}")
            continue
        got.pop("x")
        base = inproc.get(I, {}).get("sharded", {}).get("round_s")
        rec = {"clients": I, "engine": name, **got, "total_s": time.perf_counter() - t0,
               "in_process_sharded_round_s": base,
               "ratio_to_in_process": None if base is None else got["round_s"] / base}
        out.append(rec)
        log(f"engines: {name}, I = {I}: median round {got['round_s'] * 1e3:.1f} ms"
            + ("" if base is None else f", {rec['ratio_to_in_process']:.2f}x the in-process "
               f"shards' round") + f" ({rec['total_s']:.0f} s in all)")
    return out


def network() -> dict:
    """The paper's network (Section V: 784-128-10, swish; Algorithm 1 with lambda = 1e-5) on
    Fashion-MNIST's 60,000 training rows over I = 1,000 clients (60 rows each), K = 100
    clients a round, B = 10 rows each, NET_ROUNDS rounds, each client answering for itself
    and with the in-process shards: the median round, the final full-data cost, the test
    accuracy and the largest difference of the two final points. Skipped (and said so)
    without the Debian package's files."""
    import ssca_solver as ss
    from problems.mlp import MLP, classification_uncon
    from ssca_solver.datasets import fashion_mnist

    try:
        (Xtr, ytr), (Xte, yte) = fashion_mnist()
    except Exception as exc:          # the data set is not installed here
        log(f"network: Fashion-MNIST not found ({exc}): skipped")
        return {"skipped": str(exc)}
    data = ss.FederatedData.split(Xtr, ytr, num_clients=NET_CLIENTS, seed=0)
    net = MLP(784, 128, 10)
    prob = classification_uncon(data, net, lam=1e-5)
    out = {"clients": NET_CLIENTS, "clients_per_round": NET_K, "batch_size": NET_BATCH,
           "rounds": NET_ROUNDS}
    points = {}
    for name, shards in (("each client answers", None), (f"shards={SHARDS}", SHARDS)):
        stamps = []
        t0 = time.perf_counter()
        res = prob.solve(seed=0, max_iter=NET_ROUNDS, clients_per_round=NET_K,
                         batch_size=NET_BATCH, eval_every=None, shards=shards,
                         callback=lambda it: stamps.append(time.perf_counter()))
        wall = time.perf_counter() - t0
        loss, acc = net.evaluate(res.x, Xte, yte)
        points[name] = res.x
        out[name] = {"round_s": float(statistics.median(np.diff(stamps))), "wall_s": wall,
                     "status": res.status, "rounds": int(res.nit),
                     "training_cost": float(res.fun), "test_loss": float(loss),
                     "test_accuracy": float(acc)}
        log(f"network, {name}: median round {out[name]['round_s'] * 1e3:.1f} ms, training "
            f"cost {res.fun:.4f}, test accuracy {acc:.4f} ({wall:.0f} s)")
    a, b = points.values()
    out["x_difference"] = float(np.max(np.abs(a - b)))
    return out


def big_run() -> dict:
    """100,000 clients of 10 rows: 50 rounds of Algorithm 2 with shards (module docstring);
    run in a child process (:func:`big`), whose peak memory is its own."""
    import ssca_solver as ss
    from problems.neyman_pearson import neyman_pearson

    rng = np.random.default_rng(1)
    n = BIG_CLIENTS * BIG_ROWS
    X = rng.standard_normal((n, D))
    X[:, -1] = 1.0
    y = (X @ rng.standard_normal(D) + rng.standard_normal(n) > 0).astype(float)
    t0 = time.perf_counter()
    data = ss.FederatedData.split(X, y, num_clients=BIG_CLIENTS, seed=0)
    del X, y
    split_s = time.perf_counter() - t0
    prob = neyman_pearson(data, alpha=ALPHA, lam=LAM, one_pass=True)
    stamps = []

    def callback(it):
        stamps.append(time.perf_counter())
        if it.t % 10 == 0:
            log(f"  100,000 clients: round {it.t}")

    t0 = time.perf_counter()
    res = prob.solve(seed=0, max_iter=BIG_ROUNDS, batch_size=BIG_BATCH, shards=SHARDS,
                     callback=callback)
    wall = time.perf_counter() - t0
    peak = peak_memory()
    return {"clients": BIG_CLIENTS, "rows_per_client": BIG_ROWS, "N": n, "d": D,
            "batch_size": BIG_BATCH, "shards": SHARDS, "rounds": int(res.nit),
            "status": res.status, "wall_s": wall, "split_s": split_s,
            "first_round_s": stamps[0] - t0 if stamps else None,
            "round_s": float(statistics.median(np.diff(stamps))) if len(stamps) > 1 else None,
            "peak_rss_bytes": int(peak), "rows_bytes": int(n * (D + 1) * 8),
            "objective": float(res.fun),
            "max_violation": float(max(0.0, np.max(res.constraints, initial=0.0)))}


def peak_memory() -> int:
    """This process's peak resident memory in bytes: VmHWM of /proc/self/status (Linux; it
    starts afresh at exec, while getrusage's ru_maxrss keeps the high-water mark of the
    process that forked this one), else ru_maxrss."""
    import resource

    try:
        with open("/proc/self/status") as f:
            lines = f.read().splitlines()
    except OSError:                       # not Linux
        lines = []
    for line in lines:
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def big() -> dict:
    """:func:`big_run` in a child process (its PID recorded; waited for)."""
    import json
    import subprocess

    child = subprocess.Popen([sys.executable, __file__, "--big-child"],
                             stdout=subprocess.PIPE, text=True)
    log(f"100,000 clients: child process {child.pid}")
    out, _ = child.communicate()
    if child.returncode != 0:
        return {"error": f"the child process {child.pid} exited with {child.returncode}"}
    return json.loads(out.strip().splitlines()[-1])


def plot(results, path, engine_runs=()):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    I = [r["clients"] for r in results]
    fig, axes = plt.subplots(1, 3 if engine_runs else 2, figsize=(15 if engine_runs else 10, 4))
    a, b = axes[0], axes[1]
    a.loglog(I, [r["library"]["round_s"] * 1e3 for r in results], "o-",
             label="library, each client answers")
    a.loglog(I, [r["sharded"]["round_s"] * 1e3 for r in results], "D-",
             label=f"library, shards={SHARDS}")
    a.loglog(I, [r["numpy_round_s"] * 1e3 for r in results], "s--", label="NumPy round")
    a.set_xlabel("clients I")
    a.set_ylabel("ms per round")
    a.legend()
    b.loglog(I, [r["ratio_one_by_one"] for r in results], "o-", label="each client answers")
    b.loglog(I, [r["ratio"] for r in results], "D-", label=f"shards={SHARDS}")
    b.axhline(1.5, color="gray", ls=":", label="target at I = 1,000")
    b.axhline(2.0, color="gray", ls="--", label="target at I = 10,000")
    b.set_xlabel("clients I")
    b.set_ylabel("library round / NumPy round")
    b.legend()
    if engine_runs:
        c = axes[2]
        base = {r["clients"]: r["sharded"]["round_s"] for r in results}
        labels = [f"in process, shards={SHARDS}\nI = {ENGINE_CLIENTS:,}"] + [
            f"{e['engine']}\nI = {e['clients']:,}" for e in engine_runs]
        engine_runs = [e for e in engine_runs if "round_s" in e]
        labels = labels[:1] + [f"{e['engine']}\nI = {e['clients']:,}" for e in engine_runs]
        values = [base.get(ENGINE_CLIENTS, np.nan)] + [e["round_s"] for e in engine_runs]
        c.barh(range(len(values)), np.array(values) * 1e3)
        c.set_yticks(range(len(values)), labels, fontsize=7)
        c.set_xscale("log")
        c.set_xlabel("ms per round (median)")
        c.invert_yaxis()
    fig.suptitle(f"Neyman-Pearson, N = {N:,}, d = {D}, full batches, in process\n"
                 + machine_title(machine()), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    if "--big-child" in sys.argv:
        import json

        print(json.dumps(big_run()))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="I in {10, 100, 1000} only")
    ap.add_argument("--big-only", action="store_true",
                    help="measure only the 100,000 clients again, into the existing results")
    ap.add_argument("--engines-only", action="store_true",
                    help="measure only the other engines again (with the in-process shards' "
                         "round at the same I beside them), into the existing results")
    args = ap.parse_args()
    if args.engines_only:
        import json

        import ssca_solver as ss

        path = RESULTS / "many_clients.json"
        out = json.loads(path.read_text())
        X, y = rows()
        t0 = time.perf_counter()
        inproc = {}
        for I in sorted({ENGINE_CLIENTS, *FLOWER_CLIENTS}):
            data = ss.FederatedData.split(X, y, num_clients=I, seed=0)
            inproc[I] = {"sharded": library_round(data, I, SHARDS)}
        out["engines"] = engines(X, y, inproc)
        out["engines_run"] = {"command": " ".join(sys.argv), "machine": machine(),
                              "wall_s": time.perf_counter() - t0}
        write_json("many_clients", out)
        plot(out["results"], RESULTS / "many_clients.png", out["engines"])
        return
    if args.big_only:
        import json

        path = RESULTS / "many_clients.json"
        out = json.loads(path.read_text())
        b = big()
        b.update(command=" ".join(sys.argv), machine=machine())
        out["hundred_thousand_clients"] = b
        write_json("many_clients", out)
        log(f"100,000 clients: {b.get('rounds')} rounds, peak memory "
            f"{b.get('peak_rss_bytes', 0) / 2 ** 20:.0f} MiB")
        return
    import ssca_solver as ss

    X, y = rows()
    pi = np.array([np.mean(y == 0), np.mean(y == 1)])
    results = []
    t_all = time.perf_counter()
    for I in QUICK if args.quick else CLIENTS:
        data = ss.FederatedData.split(X, y, num_clients=I, seed=0)
        # the same rows, client by client, for the batched round
        Xs = np.concatenate([c.X for c in data.clients])
        ys = np.concatenate([c.y for c in data.clients])
        starts = np.cumsum([0] + [c.X.shape[0] for c in data.clients[:-1]])
        ref = numpy_time(Xs, ys, starts, pi)
        lib = library_round(data, I)
        sh = library_round(data, I, SHARDS)
        sweep = {str(k): library_round(data, I, k)["round_s"] for k in SWEEP.get(I, ())}
        gap = float(np.max(np.abs(np.subtract(lib.pop("x"), sh.pop("x")))))
        rec = {"clients": I, "library": lib, "sharded": sh, "shards": SHARDS,
               "numpy_round_s": ref, "ratio": sh["round_s"] / ref,
               "ratio_one_by_one": lib["round_s"] / ref, "x_difference": gap,
               "other_shards_round_s": sweep}
        results.append(rec)
        log(f"I = {I:6d}: NumPy {ref * 1e3:6.2f} ms a round; library "
            f"{lib['round_s'] * 1e3:8.2f} ms ({rec['ratio_one_by_one']:.1f}x), with "
            f"{SHARDS} shards {sh['round_s'] * 1e3:6.2f} ms ({rec['ratio']:.2f}x); "
            f"|x difference| {gap:.1e}"
            + "".join(f"; {k} shards {v * 1e3:.2f} ms" for k, v in sweep.items()))
    out = {"description": __doc__.split("\n\n")[0], "command": " ".join(sys.argv),
           "machine": machine(), "N": N, "d": D, "rounds": ROUNDS, "shards": SHARDS,
           "results": results}
    if not args.quick:
        out["engines"] = engines(X, y, {r["clients"]: r for r in results})
        out["network"] = network()
    if not args.quick:
        out["hundred_thousand_clients"] = b = big()
        if "error" not in b:
            log(f"100,000 clients: {b['rounds']} rounds ({b['status']}), peak memory "
                f"{b['peak_rss_bytes'] / 2 ** 20:.0f} MiB (rows {b['rows_bytes'] / 2 ** 20:.0f}"
                f" MiB), median round {b['round_s']:.2f} s, wall {b['wall_s']:.0f} s")
        else:
            log(f"100,000 clients: {b['error']}")
    out["total_time"] = time.perf_counter() - t_all
    write_json("many_clients", out)
    plot(results, RESULTS / "many_clients.png", out.get("engines", ()))


if __name__ == "__main__":
    main()
