"""The sketch of the Lagrangian's Hessian (hessian="sketch") against the quasi-Newton model
(hessian="lbfgs", what "auto" picks above d = 256) and, where its floats are affordable, the
whole Hessians (hessian="newton"), in one run: rounds to the certificate, floats sent up and
wall time.

Problems (5 clients, full batches, default options otherwise, seed 0):

* ``spiked``: least squares whose features have 6 directions of variance up to 1e3 above a
  flat bulk of variance 1 (``problems.least_squares.spiked``, n = 2,000 rows, d = 600 and
  1,200), s.t. the mean prediction equal to a target and a norm ball; a Hessian of low
  effective rank. |x - x*| / |x*| against the pooled optimum.
* ``multinomial``: the multinomial logistic models of ``benchmarks/rounds.py`` (10 classes,
  the cross-entropy on class 8 <= 0.7 of its unconstrained value, + 1e-4 |w|^2): scikit-learn's
  digits (d = 650) and the synthetic rows with p = 49 and 99 features (d = 500, 1,000);
  ``problems.suite.softmax_loss`` gives the exact Hessian's products (``hessp``).

Usage: ``python benchmarks/sketch.py [--publish | --results-dir DIR]``. Writes sketch.json and
sketch.png.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import RESULTS, log, machine, machine_title, write_json  # noqa: E402

#: the whole Hessians only up to this d (hessp of the identity: d products per function)
NEWTON_MAX_D = 700
MODES = ("sketch", "lbfgs", "newton")


def _run(prob, mode, x_ref=None) -> dict:
    t0 = time.perf_counter()
    res = prob.solve(seed=0, batch_size="full", hessian=mode, max_iter=3000)
    rec = {"status": res.status, "rounds": int(res.nit), "wall": time.perf_counter() - t0,
           "objective": float(res.fun), "floats_up": int(res.communication.up_total)}
    if x_ref is not None:
        rec["relative_error"] = float(np.linalg.norm(res.x - x_ref) / np.linalg.norm(x_ref))
    return rec


def cases():
    import cvxpy as cp
    import ssca_solver as ss
    from problems import least_squares, suite
    from rounds import MULTI_K, MULTI_LAM, multinomial_rows

    for d in (600, 1200):
        prob, X, y, target, r = least_squares.spiked(d=d, clients=5)
        yield (f"spiked d = {d}", prob,
               least_squares.ill_conditioned_reference(X, y, target, r))
    for name, (X, y) in [("digits", suite._digits()),
                         ("multinomial p = 49", multinomial_rows(49)),
                         ("multinomial p = 99", multinomial_rows(99))]:
        d = MULTI_K * X.shape[1]
        data = ss.FederatedData.split(X, y, num_clients=5, seed=0)
        f0 = suite.softmax_loss(MULTI_K)
        f1 = suite.softmax_loss(MULTI_K, 8, float(np.mean(y == 8)))
        reg = {"regularizer": lambda w: MULTI_LAM * cp.sum_squares(w)}
        free = ss.Problem(f0, dim=d, data=data, **reg).solve(seed=0, max_iter=3000)
        U = 0.7 * float(f1.value(free.x, X, y).mean())
        yield f"{name} (d = {d})", ss.Problem(f0, [f1 <= U], dim=d, data=data, **reg), None


def plot(results, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [r["name"] for r in results]
    x = np.arange(len(names))
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    for i, mode in enumerate(MODES):
        rounds = [r[mode]["rounds"] if r.get(mode) else np.nan for r in results]
        floats = [r[mode]["floats_up"] if r.get(mode) else np.nan for r in results]
        a.bar(x + (i - 1) * 0.27, rounds, 0.27, label=mode)
        b.bar(x + (i - 1) * 0.27, floats, 0.27, label=mode)
    for ax, label in ((a, "rounds to the certificate"), (b, "floats sent up, all rounds")):
        ax.set_xticks(x)
        ax.set_xticklabels(names, rotation=20, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    fig.suptitle("hessian='sketch' / 'lbfgs' / 'newton' (whole Hessians, d <= "
                 f"{NEWTON_MAX_D}), full batches, 5 clients\n" + machine_title(machine()),
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    from ssca_solver.methods.ssca.options import sketch_rank

    t_all = time.perf_counter()
    results = []
    for name, prob, x_ref in cases():
        rec = {"name": name, "d": prob.dim, "k": sketch_rank(prob.dim)}
        for mode in MODES:
            if mode == "newton" and prob.dim > NEWTON_MAX_D:
                rec[mode] = None
                continue
            rec[mode] = _run(prob, mode, x_ref)
            log(f"{name}: {mode} {rec[mode]['status']} {rec[mode]['rounds']} rounds "
                f"{rec[mode]['wall']:.1f} s, {rec[mode]['floats_up']:,} floats up")
        rec["rounds_sketch_over_lbfgs"] = rec["sketch"]["rounds"] / rec["lbfgs"]["rounds"]
        results.append(rec)
    out = {"description": __doc__.split("\n\n")[0], "command": " ".join(sys.argv),
           "machine": machine(), "results": results, "total_time": time.perf_counter() - t_all}
    write_json("sketch", out)
    plot(results, RESULTS / "sketch.png")


if __name__ == "__main__":
    main()
