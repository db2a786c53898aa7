"""Time of one SSCA round with and without secure aggregation at the paper's scale (I = 10
clients, B = 100, the 784-128-10 network: d = 101,632), on the in-process and process
transports. Used by docs/privacy.md.

    PYTHONPATH=. python docs/examples/secure_round_time.py [--rounds 12] [--repeat 2] [--quick]

Each configuration runs ``--rounds`` rounds (no evaluations), ``--repeat`` times interleaved
with the others; the time of a round is the median gap between consecutive callbacks after the
first round (so process start-up, the probe and the final evaluation are not counted). Prints
one line per configuration and the ratio to the plain in-process round of the same run, then
the cost of the aggregation alone (a task that does no work); writes
docs/examples/secure_round_time.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

import ssca_solver as ss
from problems import mlp
from ssca_solver.datasets import fashion_mnist


def protocol_overhead(dim: int, clients: int, repeat: int) -> dict:
    """Seconds per aggregation of ``clients`` replies of ``dim`` floats from a task that does
    no work (so only the messages and the protocol count), in process, plain and secure."""
    from ssca_solver.federated import InProcessTransport, Request, build_clients, secagg
    from ssca_solver.federated.gather import Gatherer

    data = ss.FederatedData([(np.zeros((100, 1)), np.zeros(100)) for _ in range(clients)])
    vec = np.random.default_rng(0).normal(size=dim) * 1e-2

    def task(c, r):
        return c.reply(r, {"x": vec}, batch_size=100)

    sizes = data.client_sizes
    plain = Gatherer(InProcessTransport(build_clients(data, 0, {"t": task})), sizes)
    secure = Gatherer(InProcessTransport(build_clients(data, 0, secagg.client_tasks(
        {"t": task}))), sizes, secure=secagg.SecureAggregation(sizes, 2.0 ** 20))
    out = {}
    for name, g in (("plain", plain), ("secure", secure)):
        times = []
        for t in range(repeat):
            start = time.perf_counter()
            list(g.collect(Request("t", t + 1, np.zeros(dim), {})))
            times.append(time.perf_counter() - start)
        out[name] = float(np.median(times))
    return out


def paired_messages(prob, repeat: int) -> dict:
    """The messages of one round alone (the 10 clients compute their statistics at B = 100 in
    this process and the server combines them), plain then secure, alternating ``repeat``
    times: the paired difference is the cost of secure aggregation, little disturbed by the
    machine's load."""
    from ssca_solver.methods.ssca.algorithm import SSCARoundTask
    from ssca_solver.federated import InProcessTransport, Request, build_clients, secagg
    from ssca_solver.federated.gather import Gatherer

    data, sizes = prob.data, prob.data.client_sizes
    tasks = {"ssca.round": SSCARoundTask(prob.functions, prob.builders)}
    plain = Gatherer(InProcessTransport(build_clients(data, 0, tasks)), sizes)
    secure = Gatherer(InProcessTransport(build_clients(data, 0, secagg.client_tasks(tasks))),
                      sizes, secure=secagg.SecureAggregation(sizes, 2.0 ** 20))
    w = np.random.default_rng(0).normal(scale=0.05, size=prob.dim)
    tp, ts = [], []
    for t in range(1, repeat + 1):
        req = Request("ssca.round", t, w, {"batch_size": 100, "tau": 0.1})
        a = time.perf_counter()
        list(plain.collect(req))
        b = time.perf_counter()
        list(secure.collect(req))
        ts.append(time.perf_counter() - b)
        tp.append(b - a)
    return {"plain_s": float(np.median(tp)), "secure_s": float(np.median(ts)),
            "paired_difference_s": float(np.median(np.subtract(ts, tp))), "repeat": repeat}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--repeat", type=int, default=2,
                    help="runs of each configuration, interleaved (the load changes)")
    ap.add_argument("--quick", action="store_true", help="4 rounds, in-process only, once")
    args = ap.parse_args(argv)
    rounds = 4 if args.quick else args.rounds
    repeat = 1 if args.quick else args.repeat
    (X, y), _ = fashion_mnist()
    data = ss.FederatedData.split(X, y, num_clients=10, seed=0)
    net = mlp.MLP(784, 128, 10)
    prob = mlp.classification_uncon(data, net)
    configs = [("inprocess", False), ("inprocess", True)]
    if not args.quick:
        configs += [("process", False), ("process", True)]
    gaps_of = {cfg: [] for cfg in configs}
    comm_of = {}
    loads = []
    for k in range(repeat):
        for transport, secure in configs:
            stamps = []
            print(f"[{k + 1}/{repeat}] {transport:>9s} secure_aggregation={secure!s:<5s} ...",
                  end=" ", flush=True, file=sys.stderr)
            res = prob.solve(method="ssca", batch_size=100, tau=0.1, max_iter=rounds, seed=0,
                             eval_every=None, check_gradients=False, transport=transport,
                             secure_aggregation=secure,
                             callback=lambda it: stamps.append(time.perf_counter()))
            gaps = np.diff(stamps)
            gaps_of[(transport, secure)].extend(gaps)
            comm_of[(transport, secure)] = res.communication
            loads.append(os.getloadavg()[0])
            print(f"{np.median(gaps) * 1e3:.0f} ms per round (median of {gaps.size})",
                  file=sys.stderr)
    rows = []
    for (transport, secure), gaps in gaps_of.items():
        c = comm_of[(transport, secure)]
        rows.append({"transport": transport, "secure_aggregation": secure,
                     "round_s_median": float(np.median(gaps)),
                     "round_s_min": float(np.min(gaps)), "rounds_timed": len(gaps),
                     "up_words_per_client_round": c.up_per_client_round,
                     "down_words_per_client_round": c.down_per_client_round})
    overhead = protocol_overhead(net.dim, 10, 5 if args.quick else 15)
    paired = paired_messages(prob, 4 if args.quick else 12)
    base = rows[0]["round_s_median"]
    print(f"d = {net.dim}, I = 10, B = 100, {rounds} rounds x {repeat} runs per configuration; "
          f"load average {min(loads):.1f}-{max(loads):.1f} (2 cores)")
    for r in rows:
        r["ratio_to_plain_inprocess"] = r["round_s_median"] / base
        print(f"{r['transport']:>9s}  secure={r['secure_aggregation']!s:<5s}  "
              f"{r['round_s_median'] * 1e3:8.1f} ms  x{r['ratio_to_plain_inprocess']:.2f}  "
              f"words per client and round: {r['up_words_per_client_round']:,} up, "
              f"{r['down_words_per_client_round']:,} down")
    print(f"aggregation alone (10 replies of d floats from a task that does no work, in "
          f"process): plain {overhead['plain'] * 1e3:.1f} ms, secure "
          f"{overhead['secure'] * 1e3:.1f} ms (x{overhead['secure'] / overhead['plain']:.1f})")
    print(f"one round's messages alone (10 clients at B = 100, in process, plain and secure "
          f"alternating x{paired['repeat']}): plain {paired['plain_s'] * 1e3:.0f} ms, secure "
          f"{paired['secure_s'] * 1e3:.0f} ms, paired difference "
          f"{paired['paired_difference_s'] * 1e3:.0f} ms (median)")
    out = Path(__file__).with_suffix(".json")
    out.write_text(json.dumps({"dim": net.dim, "clients": 10, "batch_size": 100,
                               "rounds": rounds, "repeat": repeat,
                               "load_average": [min(loads), max(loads)], "rows": rows,
                               "aggregation_only_s": overhead, "paired_messages": paired},
                              indent=2))


if __name__ == "__main__":
    main()
