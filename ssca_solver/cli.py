"""Command line: ``python -m ssca_solver demo`` and ``python -m ssca_solver network``
(also installed as ``ssca-solver``).

The demo models Neyman-Pearson classification on scikit-learn's breast-cancer data spread over
5 clients (minimise the logistic loss on class 1 subject to the loss on class 0 <= alpha, plus a
small exact ridge term), solves it by Algorithm 2 with the penalty continuation and the default
options (those given on the command line aside), and prints the report next to the pooled
CVXPY optimum for comparison.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np


def _demo(args) -> int:
    import ssca_solver as ss
    from problems.neyman_pearson import neyman_pearson, pooled_reference
    from ssca_solver.datasets import breast_cancer

    X, y = breast_cancer()
    data = ss.FederatedData.split(X, y, num_clients=args.clients, seed=args.seed)
    print("Neyman-Pearson classification, breast-cancer data (scikit-learn), "
          f"{data.num_samples} rows over {data.num_clients} clients {data.client_sizes}")
    print(f"  minimise mean logistic loss on class 1 + {args.lam:g} |w|^2   subject to   "
          f"mean logistic loss on class 0 <= {args.alpha:g}      (d = {X.shape[1]})")
    given = {name: value for name, value in (("batch_size", args.batch_size),
                                             ("tau", args.tau), ("penalty", args.penalty),
                                             ("max_iter", args.rounds))
             if value is not None}
    print("  SSCA with the default options"
          + (" except " + ", ".join(f"{k}={v}" for k, v in given.items()) if given else "")
          + "\n")
    prob = neyman_pearson(data, args.alpha, lam=args.lam)
    res = prob.solve(method="ssca", seed=args.seed, progress=True, **given)
    print()
    print(res.report())
    t0 = time.perf_counter()
    _, ref_obj, ref_con, ref_mu = pooled_reference(X, y, args.alpha, lam=args.lam)
    print(f"\nreference     CVXPY + Clarabel on the pooled data ({time.perf_counter() - t0:.2f} s):"
          f" objective {ref_obj:.6g}, constraint F - U = {ref_con - args.alpha: .3g}, "
          f"mu = {ref_mu:.4g}")
    print(f"              SSCA's relative objective gap: {(res.fun - ref_obj) / abs(ref_obj):+.2%}")
    return 0 if res.status not in (ss.status.INFEASIBLE, ss.status.ERROR) else 1


def _network(args) -> int:
    import ssca_solver as ss
    from problems.mlp import MLP, classification_con, classification_uncon
    from ssca_solver.datasets import image_dataset

    (X, y), (Xt, yt) = image_dataset(args.data, args.data_dir)
    net = MLP(X.shape[1], args.hidden, int(max(y.max(), yt.max())) + 1, args.activation,
              args.bias)
    data = ss.FederatedData.split(X, y, num_clients=args.clients, seed=args.seed)
    kind = (f"Algorithm 2: min |w|^2 s.t. F(w) <= {args.U:g}" if args.U is not None
            else f"Algorithm 1: min F(w) + {args.lam:g} |w|^2")
    print(f"{args.data}: {len(y)} training rows over {args.clients} clients, {len(yt)} test rows;"
          f" network {net.K}-{net.J}-{net.L} ({args.activation}), d = {net.dim:,}")
    print(f"  {kind}; B = {args.batch_size}, tau = {args.tau:g}, rho = {args.a1:g}/t^"
          f"{args.alpha:g}, gamma = {args.a2:g}/t^{args.alpha + 0.05:g} (the paper's form)\n")
    prob = (classification_con(data, net, args.U) if args.U is not None
            else classification_uncon(data, net, args.lam))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ss.ScheduleWarning)  # the paper's schedules; see docs
        res = prob.solve(method="ssca", batch_size=args.batch_size, max_iter=args.rounds,
                         tau=args.tau, rho=ss.PowerStep(args.a1, args.alpha),
                         gamma=ss.PowerStep(args.a2, args.alpha + 0.05),
                         **({"penalty": [args.c]} if args.U is not None else {}),
                         x0=net.init(args.seed), seed=args.seed,
                         eval_every=max(1, args.rounds // 10), progress=True)
    print()
    print(res.report())
    cost, acc = net.evaluate(res.x, X, y)
    _, tacc = net.evaluate(res.x, Xt, yt)
    print(f"\nnetwork       training cost F = {cost:.4f}, training accuracy {acc:.2%}, "
          f"test accuracy {tacc:.2%}, |w|^2 = {res.x @ res.x:.4g}")
    return 1 if res.status == ss.status.ERROR else 0   # a max_iter network run is the paper's


def _auto_or(kind):
    def parse(text):
        return text if text in ("auto", "full", "grow") else kind(text)
    parse.__name__ = kind.__name__
    return parse


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ssca_solver",
                                     description="ssca-solver command line")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="Neyman-Pearson classification on built-in data")
    demo.add_argument("--alpha", type=float, default=0.2, help="bound on the class-0 loss")
    demo.add_argument("--lam", type=float, default=1e-2, help="ridge weight (exact term)")
    demo.add_argument("--clients", type=int, default=5)
    demo.add_argument("--batch-size", type=_auto_or(int), default=None,
                      help="rows per client per round, 'full', 'grow' or 'auto' (default: "
                      "full batches where a full pass is cheap, else growing)")
    demo.add_argument("--rounds", type=int, default=None,
                      help="max_iter: the rounds of the whole run (default 800: 200 per "
                      "penalty value of the default sequence)")
    demo.add_argument("--tau", type=_auto_or(float), default=None,
                      help="proximal weight, or 'auto' (default: measured and adapted)")
    demo.add_argument("--penalty", type=float, nargs="+", default=None,
                      help="the penalty sequence c_1 < c_2 < ... (default: the library's)")
    demo.add_argument("--seed", type=int, default=0)
    net = sub.add_parser("network", help="the paper's Section V network (Algorithm 1 or 2)")
    net.add_argument("--data", choices=["digits", "fashion-mnist", "mnist"], default="digits",
                     help="digits: built in; fashion-mnist: Debian package "
                     "dataset-fashion-mnist or --data-dir; mnist: needs --data-dir")
    net.add_argument("--data-dir", default=None, help="folder with the four IDX files")
    net.add_argument("--hidden", type=int, default=32, help="J (the paper: 128)")
    net.add_argument("--activation", choices=["swish", "relu"], default="swish")
    net.add_argument("--bias", action="store_true", help="add biases (the authors' code)")
    net.add_argument("--clients", type=int, default=10)
    net.add_argument("--batch-size", type=int, default=10)
    net.add_argument("--rounds", type=int, default=100)
    net.add_argument("--tau", type=float, default=0.1)
    net.add_argument("--a1", type=float, default=0.6)
    net.add_argument("--a2", type=float, default=0.9)
    net.add_argument("--alpha", type=float, default=0.3)
    net.add_argument("--lam", type=float, default=1e-5, help="lambda of prob:class-uncon")
    net.add_argument("--U", type=float, default=None, help="run prob:class-con with this U")
    net.add_argument("--c", type=float, default=1e5, help="penalty c (the paper: 1e5)")
    net.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    # the command's printing only: main() called in a process (tests, notebooks) must not
    # change how that process prints arrays afterwards
    with np.printoptions(precision=4, suppress=True):
        if args.command == "demo":
            return _demo(args)
        if args.command == "network":
            from ssca_solver.datasets import DatasetNotFound

            try:
                return _network(args)
            except DatasetNotFound as exc:
                print(f"error: {exc}", file=sys.stderr)
                return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
