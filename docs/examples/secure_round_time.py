"""Time of one SSCA round with and without secure aggregation at the paper's scale (I = 10
clients, B = 100, the 784-128-10 network: d = 101,632), on the in-process and process
transports. Used by docs/privacy.md.

    PYTHONPATH=. python docs/examples/secure_round_time.py [--rounds 12] [--quick]

Each configuration runs ``--rounds`` rounds (no evaluations); the time of a round is the median
gap between consecutive callbacks after the first round (so process start-up, the probe and the
final evaluation are not counted). Prints one line per configuration and the ratio to the plain
in-process round of the same run; writes docs/examples/secure_round_time.json.
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--quick", action="store_true", help="4 rounds, in-process only")
    args = ap.parse_args(argv)
    rounds = 4 if args.quick else args.rounds
    (X, y), _ = fashion_mnist()
    data = ss.FederatedData.split(X, y, num_clients=10, seed=0)
    net = mlp.MLP(784, 128, 10)
    prob = mlp.classification_uncon(data, net)
    configs = [("inprocess", False), ("inprocess", True)]
    if not args.quick:
        configs += [("process", False), ("process", True)]
    rows = []
    for transport, secure in configs:
        stamps = []
        print(f"{transport:>9s} secure_aggregation={secure!s:<5s} ...", end=" ", flush=True,
              file=sys.stderr)
        res = prob.solve(method="ssca", batch_size=100, tau=0.1, max_iter=rounds, seed=0,
                         eval_every=None, check_gradients=False, transport=transport,
                         secure_aggregation=secure,
                         callback=lambda it: stamps.append(time.perf_counter()))
        gaps = np.diff(stamps)
        c = res.communication
        rows.append({"transport": transport, "secure_aggregation": secure,
                     "round_s_median": float(np.median(gaps)),
                     "round_s_min": float(np.min(gaps)), "rounds_timed": int(gaps.size),
                     "up_words_per_client_round": c.up_per_client_round,
                     "down_words_per_client_round": c.down_per_client_round})
        print(f"{np.median(gaps) * 1e3:.0f} ms per round (median of {gaps.size})",
              file=sys.stderr)
    base = rows[0]["round_s_median"]
    print(f"d = {net.dim}, I = 10, B = 100, rounds = {rounds}; load average "
          f"{os.getloadavg()[0]:.2f}")
    for r in rows:
        r["ratio_to_plain_inprocess"] = r["round_s_median"] / base
        print(f"{r['transport']:>9s}  secure={r['secure_aggregation']!s:<5s}  "
              f"{r['round_s_median'] * 1e3:8.1f} ms  x{r['ratio_to_plain_inprocess']:.2f}  "
              f"words per client and round: {r['up_words_per_client_round']:,} up, "
              f"{r['down_words_per_client_round']:,} down")
    out = Path(__file__).with_suffix(".json")
    out.write_text(json.dumps({"dim": net.dim, "clients": 10, "batch_size": 100,
                               "rounds": rounds, "load_average": os.getloadavg()[0],
                               "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
