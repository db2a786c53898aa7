"""Record-level differential privacy of method "ssca" (``solve(..., privacy=ss.Privacy(...))``,
the central Gaussian mechanism of ``ssca_solver/methods/ssca/privacy.py``): what the noise and
the clipping cost in utility, against epsilon.

For each epsilon in EPSILONS (delta = 1e-5, the noise calibrated by the accountant to the T
rounds asked for, the noise's own seed None: fresh entropy), and two points of comparison:

* ``inf``: the same solve without privacy (``privacy=None``) with ``eval_every=0,
  check_gradients=False`` and the same B, tau, T and seeds, so that the difference isolates
  the noise and the clipping (in distribution: under privacy the batches are drawn from the
  mechanism's secret, ``Privacy.seed=None``, not from the run's seed, so a private run's
  batches are not those of the ``inf`` run of the same seed);
* ``clip only``: ``ss.Privacy(noise_multiplier=1e-9, clip=C)``: the rows clipped as under
  privacy, the noise negligible (its epsilon is astronomical): the clipping's bias alone.

Under privacy nothing is evaluated by the solver (``res.fun`` is NaN): every point is
evaluated here, on the pooled training rows and on held-out rows.

Problems:

1. Neyman-Pearson logistic regression (``problems/neyman_pearson.py``, alpha = 0.3, active
   at the optimum, lambda = 1e-3) on the synthetic rows of ``benchmarks/many_clients.py``
   (N = 100,000, d = 30: 29 standard normal features and a column of ones, labels from a
   random linear model plus unit noise, seed 0), 20 % held out (seed 1), the 80,000 training
   rows split over 10 clients; the class fractions are counted once from the training labels
   and passed as ``class_fractions`` (treated as public). B = 100, tau = 0.1, T = 300,
   3 seeds. Metrics: the training objective F_0 + lambda |w|^2 and the constraint's
   violation max(F_1 - alpha, 0) on the pooled training rows, the test accuracy; the
   reference is the non-private optimum of ``prob.solve(method="ssca")`` with default options.
2. The paper's network (784-128-10, swish, ``problems/mlp.py``: ``classification_uncon``,
   lambda = 1e-5) on Fashion-MNIST, 10 clients (``FederatedData.split``, seed 0), start
   ``net.init(seed)``. Its SampleFunction has no ``per_sample_grad``: under privacy each client
   calls ``grad`` on each row alone (about 13 times the cost of a round without privacy here).
   B = 50, tau = 0.1, T = 800, 3 seeds (chosen so that the whole run takes about an hour on a
   2-core machine; B = 50 rather than 10: at the same epsilon the noise relative to the
   round's sum of clipped rows is about 3 times smaller). Metrics: the training cost
   (cross-entropy + lambda |w|^2 on the 60,000 training rows) and the test accuracy (10,000
   rows).

The clip C of each problem is picked by a small pilot at epsilon = 1 on seeds apart from the
reported ones (Neyman-Pearson: C in {1, 3, 10, 30, 100}, 3 seeds, the lowest median of
objective + 10 violation; the network: C in {0.1, 0.3, 1, 3}, 1 seed, the lowest training
cost). The pilot
reads the training data without privacy: the choice of C is not privatised (its cost in
epsilon is not accounted).

Recorded for each run: the accountant's numbers (``res.privacy``: noise multiplier, epsilon
spent, delta, rounds), the epsilon of the history after T/4, T/2 and T rounds, the fraction of
rows whose contribution exceeds C at the returned point, the metrics and the wall time; then
the medians over the seeds.

The distributed mechanism (``mechanism="distributed"`` with ``secure_aggregation=True``: each
client adds its share of the noise as discrete Gaussian integers before the masks) runs on
Neyman-Pearson at the same C, epsilons and seeds (``--distributed-only`` runs just it and
adds it to the results already there; ``--network-distributed-seeds K`` adds the network's on
its first K seeds, keeping Neyman-Pearson's distributed runs when they are there).

Usage: ``python benchmarks/privacy.py [--quick] [--distributed-only] [--publish |
--results-dir DIR]``
(``--quick``: a few rounds, one seed, small pilots: a smoke test of seconds). Writes
privacy.json and privacy.png (privacy_quick.* with ``--quick``).
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from _common import RESULTS, log, machine, machine_title, write_json  # noqa: E402

EPSILONS = (0.5, 1.0, 2.0, 4.0, 8.0)
DELTA = 1e-5
TAU = 0.1
INF, CLIP_ONLY = "inf", "clip only"
SETTINGS = tuple(EPSILONS) + (INF, CLIP_ONLY)
PILOT_EPSILON = 1.0
CLIP_ONLY_NOISE = 1e-9

# Neyman-Pearson
NP_N, NP_D, NP_CLIENTS, NP_TEST = 100_000, 30, 10, 0.2
NP_ALPHA, NP_LAM = 0.3, 1e-3
NP_B, NP_T, NP_SEEDS = 100, 300, (0, 1, 2)
NP_CLIPS, NP_PILOT_SEEDS = (1.0, 3.0, 10.0, 30.0, 100.0), (100, 101, 102)
#: the pilot's merit: objective + NP_MERIT_WEIGHT * violation (an exact penalty whose weight
#: exceeds the reference's multiplier)
NP_MERIT_WEIGHT = 10.0

# the network
NET_HIDDEN, NET_CLIENTS, NET_LAM = 128, 10, 1e-5
NET_B, NET_T, NET_SEEDS = 50, 800, (0, 1, 2)
NET_CLIPS, NET_PILOT_SEEDS = (0.1, 0.3, 1.0, 3.0), (100,)
#: training rows on which the fraction of clipped rows is measured (one grad per row)
NET_CLIP_SAMPLE = 1000

#: the metrics whose medians are kept, per problem
NP_METRICS = ("objective", "violation", "test_accuracy")
NET_METRICS = ("train_cost", "test_accuracy", "train_accuracy", "test_loss")

QUICK = dict(NP_T=20, NP_SEEDS=(0,), NP_CLIPS=(3.0, 10.0), NP_PILOT_SEEDS=(100,),
             NET_B=10, NET_T=5, NET_SEEDS=(0,), NET_CLIPS=(1.0, 5.0), NET_PILOT_SEEDS=(100,),
             NET_CLIP_SAMPLE=50)


def library_version() -> dict:
    """The commit of the measured library and whether ssca_solver/ or problems/ differ from
    it."""
    try:
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], check=True,
                                capture_output=True, text=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--",
                                "ssca_solver", "problems"], check=True, capture_output=True,
                               text=True).stdout.strip()
        return {"commit": commit, "ssca_solver_modified": bool(dirty)}
    except (OSError, subprocess.CalledProcessError):
        return {"commit": "unknown", "ssca_solver_modified": "unknown"}


def label(setting) -> str:
    return setting if isinstance(setting, str) else f"{setting:g}"


def privacy_of(setting, clip, mechanism="central"):
    import ssca_solver as ss

    if setting == INF:
        return None
    if setting == CLIP_ONLY:
        return ss.Privacy(noise_multiplier=CLIP_ONLY_NOISE, delta=DELTA, clip=clip, seed=None,
                          mechanism=mechanism)
    return ss.Privacy(epsilon=float(setting), delta=DELTA, clip=clip, seed=None,
                      mechanism=mechanism)


def solve(prob, setting, clip, B, T, seed, mechanism="central", **extra):
    """One solve: (result, wall seconds). ``inf``: no privacy, nothing evaluated.
    ``mechanism="distributed"``: with secure aggregation, each client adding its share of
    the noise before the masks."""
    from threadpoolctl import threadpool_limits

    opts = dict(method="ssca", batch_size=B, tau=TAU, max_iter=T, seed=seed, **extra)
    if mechanism == "distributed":
        opts["secure_aggregation"] = True
    priv = privacy_of(setting, clip, mechanism)
    if priv is None:
        opts.update(eval_every=0, check_gradients=False)
    else:
        opts["privacy"] = priv
    with threadpool_limits(1), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        res = prob.solve(**opts)
        wall = time.perf_counter() - t0
    return res, wall


def accountant_record(res, T: int) -> dict:
    """What the accountant says (``res.privacy``) and the history's epsilon after T/4, T/2
    and T rounds (None without privacy)."""
    if getattr(res, "privacy", None) is None:
        return {"privacy": None, "epsilon_history": None}
    p = {k: (float(v) if isinstance(v, (float, np.floating)) else v)
         for k, v in dict(res.privacy).items()}
    eps = np.asarray(res.history.epsilon, dtype=float)
    marks = sorted({max(1, T // 4), max(1, T // 2), len(eps)})
    hist = {str(t): float(eps[t - 1]) for t in marks if 1 <= t <= len(eps)}
    return {"privacy": p, "epsilon_history": hist,
            "history_matches_spent": bool(len(eps) and np.isclose(eps[-1], p["epsilon"],
                                                                  rtol=1e-9))}


def med(xs):
    xs = [x for x in xs if x is not None and np.isfinite(x)]
    return float(statistics.median(xs)) if xs else None


def medians(runs: list, metrics: tuple) -> list:
    """Per setting: the median (and range) of each metric over the seeds, the accountant's
    numbers and the median wall time."""
    out = []
    for s in SETTINGS:
        rs = [r for r in runs if r["setting"] == label(s)]
        if not rs:
            continue
        row = {"setting": label(s), "epsilon_target": s if not isinstance(s, str) else None,
               "seeds": len(rs)}
        for m in metrics:
            vals = [r[m] for r in rs]
            row[m] = med(vals)
            row[m + "_range"] = [float(min(vals)), float(max(vals))]
        priv = [r["privacy"] for r in rs if r["privacy"]]
        row["noise_multiplier"] = med([p["noise_multiplier"] for p in priv]) if priv else None
        row["epsilon_spent"] = med([p["epsilon"] for p in priv]) if priv else None
        row["delta"] = priv[0]["delta"] if priv else None
        row["rounds"] = med([r["rounds"] for r in rs])
        row["clipped_fraction"] = med([r.get("clipped_fraction") for r in rs])
        row["wall_s"] = med([r["wall_s"] for r in rs])
        out.append(row)
    return out


# -- Neyman-Pearson -----------------------------------------------------------------------------

def np_rows():
    """The synthetic rows of benchmarks/many_clients.py, 20 % held out."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((NP_N, NP_D))
    X[:, -1] = 1.0
    y = (X @ rng.standard_normal(NP_D) + rng.standard_normal(NP_N) > 0).astype(float)
    perm = np.random.default_rng(1).permutation(NP_N)
    cut = int(round(NP_N * (1 - NP_TEST)))
    tr, te = perm[:cut], perm[cut:]
    return X[tr], y[tr], X[te], y[te]


class NPCase:
    def __init__(self):
        import ssca_solver as ss
        from problems.neyman_pearson import neyman_pearson

        self.X, self.y, self.Xt, self.yt = np_rows()
        # counted once from the training labels and passed in: treated as public
        self.pi = (float(np.mean(self.y == 0)), float(np.mean(self.y == 1)))
        self.data = ss.FederatedData.split(self.X, self.y, num_clients=NP_CLIENTS, seed=0)
        self.prob = neyman_pearson(self.data, NP_ALPHA, NP_LAM, class_fractions=self.pi)
        self.s = 2.0 * self.y - 1.0
        self.wt = np.where(self.y == 1, 1.0 / self.pi[1], 1.0 / self.pi[0])
        self.xnorm = np.linalg.norm(self.X, axis=1)

    def evaluate(self, w) -> dict:
        m = self.s * (self.X @ w)
        loss = np.logaddexp(0.0, -m)
        one, zero = self.y == 1, self.y == 0
        f0 = float(loss[one].mean())
        f1 = float(loss[zero].mean())
        return {"objective": f0 + NP_LAM * float(w @ w), "constraint": f1,
                "violation": max(f1 - NP_ALPHA, 0.0),
                "test_accuracy": float(np.mean((self.Xt @ w > 0) == (self.yt == 1)))}

    def row_norms(self, w):
        """Each training row's contribution norm at w: (value, gradient) of the one class
        loss that is not zero on it (the other's are)."""
        m = self.s * (self.X @ w)
        v = self.wt * np.logaddexp(0.0, -m)
        g = self.wt * self.xnorm / (1.0 + np.exp(np.clip(m, -700, 700)))
        return np.sqrt(v * v + g * g)

    def run(self, setting, clip, seed, B, T, mechanism="central") -> dict:
        res, wall = solve(self.prob, setting, clip, B, T, seed, mechanism)
        rec = {"problem": "neyman_pearson", "setting": label(setting), "seed": seed,
               "mechanism": None if setting == INF else mechanism,
               "clip": None if setting == INF else clip, "B": B, "T": T,
               "status": res.status, "rounds": int(res.nit), "wall_s": wall,
               **self.evaluate(res.x), **accountant_record(res, T)}
        rec["clipped_fraction"] = (None if setting == INF else
                                   float(np.mean(self.row_norms(res.x) > clip)))
        return rec


def neyman_pearson_part(cfg) -> dict:
    case = NPCase()
    out = {"setup": {"N_total": NP_N, "N_train": int(len(case.y)), "N_test": int(len(case.yt)),
                     "d": NP_D, "clients": NP_CLIENTS, "alpha": NP_ALPHA, "lam": NP_LAM,
                     "B": cfg["NP_B"], "T": cfg["NP_T"], "tau": TAU, "delta": DELTA,
                     "seeds": list(cfg["NP_SEEDS"]),
                     "class_fractions": list(case.pi),
                     "class_fractions_note": "counted once from the training labels and "
                                             "passed as class_fractions: treated as public "
                                             "(not privatised)",
                     "data": "synthetic rows of benchmarks/many_clients.py (seed 0), 20 % "
                             "held out (seed 1), split over the clients with seed 0"}}
    # the non-private optimum (default options: certified)
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t0 = time.perf_counter()
        ref = case.prob.solve(method="ssca")
        wall = time.perf_counter() - t0
    out["reference"] = {"options": "prob.solve(method='ssca') (defaults)", "status": ref.status,
                        "rounds": int(ref.nit), "wall_s": wall,
                        "multiplier": float(np.asarray(ref.kkt.multipliers)[0]),
                        **case.evaluate(ref.x)}
    r = out["reference"]
    log(f"Neyman-Pearson reference: {ref.status} in {ref.nit} rounds, objective "
        f"{r['objective']:.4f}, constraint {r['constraint']:.4f} (alpha {NP_ALPHA}), "
        f"test accuracy {r['test_accuracy']:.4f}, multiplier {r['multiplier']:.3g}")
    B, T = cfg["NP_B"], cfg["NP_T"]

    # the pilot: C at epsilon = PILOT_EPSILON, on seeds apart from the reported ones
    pilot = []
    for clip in cfg["NP_CLIPS"]:
        for seed in cfg["NP_PILOT_SEEDS"]:
            rec = case.run(PILOT_EPSILON, clip, seed, B, T)
            rec["merit"] = rec["objective"] + NP_MERIT_WEIGHT * rec["violation"]
            pilot.append(rec)
            log(f"  NP pilot C = {clip:g} seed {seed}: objective {rec['objective']:.4f}, "
                f"violation {rec['violation']:.4f}, merit {rec['merit']:.4f}, clipped "
                f"{rec['clipped_fraction']:.3f}")
    by_clip = {f"{c:g}": med([p["merit"] for p in pilot if p["clip"] == c])
               for c in cfg["NP_CLIPS"]}
    clip = min(cfg["NP_CLIPS"], key=lambda c: by_clip[f"{c:g}"])
    out["pilot"] = {"epsilon": PILOT_EPSILON, "clips": list(cfg["NP_CLIPS"]),
                    "seeds": list(cfg["NP_PILOT_SEEDS"]),
                    "criterion": f"lowest median over the seeds of objective + "
                                 f"{NP_MERIT_WEIGHT:g} violation (pooled training rows)",
                    "median_merit_by_clip": by_clip, "chosen_clip": clip,
                    "note": "chosen on the training data without privacy: the choice of C "
                            "is not privatised", "runs": pilot}
    log(f"NP pilot: median merit by C {by_clip}: C = {clip:g}")

    runs = []
    for seed in cfg["NP_SEEDS"]:
        for setting in SETTINGS:
            rec = case.run(setting, clip, seed, B, T)
            runs.append(rec)
            p = rec["privacy"]
            log(f"  NP eps {label(setting):>9} seed {seed}: objective {rec['objective']:.4f}, "
                f"violation {rec['violation']:.4f}, test acc {rec['test_accuracy']:.4f}"
                + (f", z {p['noise_multiplier']:.3g}, spent {p['epsilon']:.3g}" if p else "")
                + f" ({rec['wall_s']:.1f} s)")
    out["clip"] = clip
    out["runs"] = runs
    out["medians"] = medians(runs, NP_METRICS)
    return out


def distributed_runs(case, name: str, part: dict, B: int, T: int, seeds, metrics) -> dict:
    """The distributed mechanism (secure aggregation; the clients add discrete Gaussian shares
    before the masks) on ``case`` at the clip the central pilot chose (``part["clip"]``),
    each epsilon, on ``seeds``, beside the central runs; ``metrics``: the medians' keys, the
    first two logged."""
    clip = part["clip"]
    runs = []
    for seed in seeds:
        for setting in EPSILONS:
            rec = case.run(setting, clip, seed, B, T, mechanism="distributed")
            runs.append(rec)
            p = rec["privacy"]
            log(f"  {name} distributed eps {label(setting):>4} seed {seed}: "
                + ", ".join(f"{m} {rec[m]:.4f}" for m in metrics[:2])
                + f", z {p['noise_multiplier']:.3g}, spent {p['epsilon']:.3g} "
                f"({rec['wall_s']:.1f} s)")
    return {"clip": clip, "B": B, "T": T, "seeds": list(seeds),
            "secure_aggregation": "secure_range 2^20 (default)", "runs": runs,
            "medians": medians(runs, metrics)}


# -- the network --------------------------------------------------------------------------------

class NetCase:
    def __init__(self, sample: int):
        import ssca_solver as ss
        from problems.mlp import MLP, classification_uncon
        from ssca_solver.datasets import fashion_mnist

        (self.X, self.y), (self.Xt, self.yt) = fashion_mnist()
        self.net = MLP(self.X.shape[1], NET_HIDDEN, 10)
        self.data = ss.FederatedData.split(self.X, self.y, num_clients=NET_CLIENTS, seed=0)
        self.prob = classification_uncon(self.data, self.net, NET_LAM)
        self.ce = self.net.cross_entropy()
        self.sample = np.random.default_rng(0).choice(len(self.y), sample, replace=False)

    def evaluate(self, w) -> dict:
        ce, acc = self.net.evaluate(w, self.X, self.y)
        test_loss, test_acc = self.net.evaluate(w, self.Xt, self.yt)
        return {"train_cost": ce + NET_LAM * float(w @ w), "train_cross_entropy": ce,
                "train_accuracy": acc, "test_loss": test_loss, "test_accuracy": test_acc,
                "norm2": float(w @ w)}

    def clipped_fraction(self, w, clip) -> float:
        """The fraction of the sampled training rows whose contribution (value, gradient)
        exceeds C at w."""
        over = 0
        for i in self.sample:
            v, g = self.ce.value_and_grad(w, self.X[i:i + 1], self.y[i:i + 1])
            over += float(v[0]) ** 2 + float(g @ g) > clip * clip
        return over / len(self.sample)

    def run(self, setting, clip, seed, B, T, mechanism="central") -> dict:
        res, wall = solve(self.prob, setting, clip, B, T, seed, mechanism,
                          x0=self.net.init(seed))
        rec = {"problem": "network", "setting": label(setting), "seed": seed,
               "mechanism": None if setting == INF else mechanism,
               "clip": None if setting == INF else clip, "B": B, "T": T,
               "status": res.status, "rounds": int(res.nit), "wall_s": wall,
               **self.evaluate(res.x), **accountant_record(res, T)}
        rec["clipped_fraction"] = (None if setting == INF else
                                   self.clipped_fraction(res.x, clip))
        return rec


def network_part(cfg) -> dict:
    try:
        case = NetCase(cfg["NET_CLIP_SAMPLE"])
    except Exception as exc:          # the data set is not installed here
        log(f"network: Fashion-MNIST not found ({exc}): skipped")
        return {"skipped": str(exc)}
    B, T = cfg["NET_B"], cfg["NET_T"]
    out = {"setup": {"net": f"{case.net.K}-{case.net.J}-{case.net.L} swish, no biases",
                     "data": "Fashion-MNIST (60,000 training rows, 10,000 test rows)",
                     "clients": NET_CLIENTS, "lam": NET_LAM, "B": B, "T": T, "tau": TAU,
                     "delta": DELTA, "seeds": list(cfg["NET_SEEDS"]),
                     "x0": "net.init(seed)",
                     "clipped_fraction_rows": int(len(case.sample)),
                     "per_sample_grad": hasattr(case.ce, "per_sample_grad")
                     and case.ce.per_sample_grad is not None}}
    out["start"] = {str(s): case.evaluate(case.net.init(s)) for s in cfg["NET_SEEDS"]}
    pilot = []
    for clip in cfg["NET_CLIPS"]:
        for seed in cfg["NET_PILOT_SEEDS"]:
            rec = case.run(PILOT_EPSILON, clip, seed, B, T)
            pilot.append(rec)
            log(f"  network pilot C = {clip:g} seed {seed}: training cost "
                f"{rec['train_cost']:.4f}, test acc {rec['test_accuracy']:.4f}, clipped "
                f"{rec['clipped_fraction']:.3f} ({rec['wall_s']:.0f} s)")
    by_clip = {f"{c:g}": med([p["train_cost"] for p in pilot if p["clip"] == c])
               for c in cfg["NET_CLIPS"]}
    clip = min(cfg["NET_CLIPS"], key=lambda c: by_clip[f"{c:g}"])
    out["pilot"] = {"epsilon": PILOT_EPSILON, "clips": list(cfg["NET_CLIPS"]),
                    "seeds": list(cfg["NET_PILOT_SEEDS"]),
                    "criterion": "lowest median training cost (pooled training rows)",
                    "median_cost_by_clip": by_clip, "chosen_clip": clip,
                    "note": "chosen on the training data without privacy: the choice of C "
                            "is not privatised", "runs": pilot}
    log(f"network pilot: median training cost by C {by_clip}: C = {clip:g}")
    runs = []
    for seed in cfg["NET_SEEDS"]:
        for setting in SETTINGS:
            rec = case.run(setting, clip, seed, B, T)
            runs.append(rec)
            p = rec["privacy"]
            log(f"  network eps {label(setting):>9} seed {seed}: training cost "
                f"{rec['train_cost']:.4f}, test acc {rec['test_accuracy']:.4f}"
                + (f", z {p['noise_multiplier']:.3g}, spent {p['epsilon']:.3g}" if p else "")
                + f" ({rec['wall_s']:.0f} s)")
    out["clip"] = clip
    out["runs"] = runs
    out["medians"] = medians(runs, NET_METRICS)
    return out


# -- the figure ---------------------------------------------------------------------------------

def plot(out: dict, path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    npart, net = out.get("neyman_pearson") or {}, out.get("network") or {}
    panels = [(npart, "objective", "NP: training objective F0 + lam|w|^2"),
              (npart, "violation", "NP: violation max(F1 - alpha, 0)"),
              (npart, "test_accuracy", "NP: test accuracy"),
              (net, "train_cost", "network: training cost"),
              (net, "test_accuracy", "network: test accuracy"),
              (None, "noise_multiplier", "noise multiplier z (accountant)")]
    fig, axes = plt.subplots(2, 3, figsize=(14, 7.6))
    eps = np.array(EPSILONS)
    for ax, (part, key, title) in zip(axes.ravel(), panels):
        ax.set_xscale("log")
        ax.set_xticks(eps)
        ax.set_xticklabels([f"{e:g}" for e in eps])
        ax.minorticks_off()
        ax.set_xlabel("epsilon (delta = 1e-5)")
        ax.set_title(title, fontsize=9)
        if part is None:
            for name, p, mk in (("Neyman-Pearson", npart, "o"), ("network", net, "s")):
                rows = {r["setting"]: r for r in p.get("medians", [])}
                z = [rows.get(f"{e:g}", {}).get("noise_multiplier") for e in eps]
                if any(v is not None for v in z):
                    ax.plot(eps, [np.nan if v is None else v for v in z], marker=mk,
                            label=f"{name} (B = {p['setup']['B']}, T = {p['setup']['T']})")
            ax.set_yscale("log")
            ax.legend(fontsize=7)
            continue
        if not part.get("medians"):
            ax.text(0.5, 0.5, "not run", ha="center", transform=ax.transAxes)
            continue
        rows = {r["setting"]: r for r in part["medians"]}
        y = np.array([rows[f"{e:g}"][key] if f"{e:g}" in rows else np.nan for e in eps],
                     dtype=float)
        lo = np.array([rows[f"{e:g}"][key + "_range"][0] for e in eps])
        hi = np.array([rows[f"{e:g}"][key + "_range"][1] for e in eps])
        ax.errorbar(eps, y, yerr=[y - lo, hi - y], marker="o", capsize=3,
                    label=f"private (C = {part['clip']:g}), median, range over seeds")
        dist = part.get("distributed") or {}
        if dist.get("medians"):
            drows = {r["setting"]: r for r in dist["medians"]}
            yd = np.array([drows[f"{e:g}"][key] if f"{e:g}" in drows else np.nan
                           for e in eps], dtype=float)
            ax.plot(eps * 1.06, yd, marker="^", ls="-", color="C1",
                    label="distributed (secure aggregation), median")
        for r in part["runs"]:
            if r["setting"] not in (INF, CLIP_ONLY):
                ax.plot(float(r["setting"]), r[key], ".", color="C0", alpha=0.35)
        for setting, color, style, name in ((INF, "C2", "--", "epsilon = inf (no privacy)"),
                                            (CLIP_ONLY, "C3", ":", "clip only (no noise)")):
            if setting in rows:
                v, (a, b) = rows[setting][key], rows[setting][key + "_range"]
                ax.axhline(v, color=color, ls=style, label=name)
                ax.axhspan(a, b, color=color, alpha=0.12)
        ref = part.get("reference")
        if ref and key in ref:
            ax.axhline(ref[key], color="0.4", ls="-.", lw=1,
                       label="non-private optimum (defaults, converged)")
        ax.legend(fontsize=7)
    npl = npart.get("setup", {})
    nel = net.get("setup", {})
    fig.suptitle("Record-level DP of method 'ssca' (central Gaussian; distributed on "
                 "Neyman-Pearson): Neyman-Pearson "
                 f"(N = {npl.get('N_train', '?'):,} training rows, d = {npl.get('d')}, B = "
                 f"{npl.get('B')}, T = {npl.get('T')}) and the 784-128-10 network on "
                 f"Fashion-MNIST (B = {nel.get('B')}, T = {nel.get('T')}), 10 clients, tau = "
                 f"{TAU}\n" + machine_title(out["machine"]), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="a few rounds, one seed, small pilots (a smoke test)")
    ap.add_argument("--skip-network", action="store_true", help="Neyman-Pearson only")
    ap.add_argument("--network-distributed-seeds", type=int, default=None, metavar="K",
                    help="with --distributed-only: also the network, on its first K seeds")
    ap.add_argument("--distributed-only", action="store_true",
                    help="run only the distributed mechanism on Neyman-Pearson, at the clip "
                         "of the results already there, and add it to them")
    args = ap.parse_args()
    cfg = dict(NP_B=NP_B, NP_T=NP_T, NP_SEEDS=NP_SEEDS, NP_CLIPS=NP_CLIPS,
               NP_PILOT_SEEDS=NP_PILOT_SEEDS, NET_B=NET_B, NET_T=NET_T, NET_SEEDS=NET_SEEDS,
               NET_CLIPS=NET_CLIPS, NET_PILOT_SEEDS=NET_PILOT_SEEDS,
               NET_CLIP_SAMPLE=NET_CLIP_SAMPLE)
    if args.quick:
        cfg.update(QUICK)
    stem = "privacy_quick" if args.quick else "privacy"
    t_all = time.perf_counter()
    if args.distributed_only:
        import json

        from _common import PUBLISHED

        src = RESULTS / f"{stem}.json"
        if not src.exists():
            src = PUBLISHED / f"{stem}.json"
            log(f"reading the central results from the published {src}")
        out = json.loads(src.read_text())
        log("Neyman-Pearson, distributed ...")
        t0 = time.perf_counter()
        command = "python benchmarks/privacy.py" + " ".join([""] + sys.argv[1:])
        k = args.network_distributed_seeds
        if not (k and out["neyman_pearson"].get("distributed")):
            dist = distributed_runs(NPCase(), "NP", out["neyman_pearson"], cfg["NP_B"],
                                    cfg["NP_T"], cfg["NP_SEEDS"], NP_METRICS)
            dist.update(command=command, date=datetime.date.today().isoformat(),
                        library=library_version(), machine=machine(),
                        wall_s=time.perf_counter() - t0)
            out["neyman_pearson"]["distributed"] = dist
            write_json(stem, out)
        else:
            log("Neyman-Pearson's distributed runs are there: kept")
        if k and (out.get("network") or {}).get("medians"):
            log("the network, distributed ...")
            t0 = time.perf_counter()
            nd = distributed_runs(NetCase(cfg["NET_CLIP_SAMPLE"]), "network", out["network"],
                                  cfg["NET_B"], cfg["NET_T"], list(cfg["NET_SEEDS"])[:k],
                                  NET_METRICS)
            nd.update(command=command, date=datetime.date.today().isoformat(),
                      library=library_version(), machine=machine(),
                      wall_s=time.perf_counter() - t0)
            out["network"]["distributed"] = nd
        path = write_json(stem, out)
        plot(out, RESULTS / f"{stem}.png")
        log(f"wrote {path} and {stem}.png ({(time.perf_counter() - t_all) / 60:.1f} min)")
        return
    out = {"description": __doc__.split("\n\n")[0],
           "command": "python benchmarks/privacy.py" + " ".join([""] + sys.argv[1:]),
           "date": datetime.date.today().isoformat(), "machine": machine(),
           "library": library_version(), "quick": bool(args.quick),
           "settings": {"epsilons": list(EPSILONS), "delta": DELTA, "tau": TAU,
                        "pilot_epsilon": PILOT_EPSILON,
                        "clip_only_noise_multiplier": CLIP_ONLY_NOISE,
                        "noise_seed": "Privacy(seed=None): the noise and, under privacy, "
                                      "the batches are drawn from fresh entropy (not "
                                      "reproducible); the run's seed draws only the batches "
                                      "of the runs without privacy (inf) and the network's "
                                      "start net.init(seed)",
                        "inf": "privacy=None, eval_every=0, check_gradients=False, the same "
                               "B, tau, T and seeds"}}
    log("Neyman-Pearson ...")
    t0 = time.perf_counter()
    out["neyman_pearson"] = neyman_pearson_part(cfg)
    out["neyman_pearson"]["wall_s"] = time.perf_counter() - t0
    log("Neyman-Pearson, distributed ...")
    out["neyman_pearson"]["distributed"] = distributed_runs(
        NPCase(), "NP", out["neyman_pearson"], cfg["NP_B"], cfg["NP_T"], cfg["NP_SEEDS"],
        NP_METRICS)
    out["wall_time_s"] = time.perf_counter() - t_all
    write_json(stem, {**out, "partial": True})
    if args.skip_network:
        out["network"] = {"skipped": "--skip-network"}
    else:
        log("the network ...")
        t0 = time.perf_counter()
        out["network"] = network_part(cfg)
        out["network"]["wall_s"] = time.perf_counter() - t0
    out["wall_time_s"] = time.perf_counter() - t_all
    out["library_at_end"] = library_version()
    path = write_json(stem, out)
    plot(out, RESULTS / f"{stem}.png")
    log(f"wrote {path} and {stem}.png ({out['wall_time_s'] / 60:.1f} min)")


if __name__ == "__main__":
    main()
