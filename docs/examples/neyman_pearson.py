"""Neyman-Pearson classification over 5 clients: sweep alpha, compare with the pooled optimum.

Run:  python docs/examples/neyman_pearson.py   (about 20 s; writes neyman_pearson.png here)
"""
from pathlib import Path

import numpy as np

import ssca_solver as ss
from problems.neyman_pearson import neyman_pearson, pooled_reference
from ssca_solver.datasets import breast_cancer

X, y = breast_cancer()
data = ss.FederatedData.split(X, y, num_clients=5, seed=0)
alphas = [0.1, 0.15, 0.2, 0.3, 0.5]
rows = []
for alpha in alphas:
    res = neyman_pearson(data, alpha, lam=1e-2).solve(batch_size=50, max_iter=600,
                                                      penalty=[10.0, 100.0], seed=0,
                                                      eval_every=None)
    _, ref_obj, ref_con, ref_mu = pooled_reference(X, y, alpha, lam=1e-2)
    rows.append((alpha, res.fun, ref_obj, res.constraints[0] + alpha, ref_con, res.kkt.multipliers[0],
                 ref_mu))
    print(f"alpha={alpha:<5g} SSCA: objective {res.fun:.4f}, class-0 loss "
          f"{res.constraints[0] + alpha:.4f}, mu {res.kkt.multipliers[0]:.3f} ({res.status})   "
          f"pooled CVXPY: {ref_obj:.4f}, {ref_con:.4f}, mu {ref_mu:.3f}")
print("\nthe last solve's report:\n" + res.report())

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

fine = np.linspace(0.08, 0.6, 30)
curve = [pooled_reference(X, y, a, lam=1e-2) for a in fine]
fig, ax = plt.subplots(figsize=(5.5, 4))
ax.plot([c[2] for c in curve], [c[1] for c in curve], "-", label="pooled optimum (CVXPY)")
ax.plot([r[3] for r in rows], [r[1] for r in rows], "o", label="SSCA over 5 clients")
ax.set(xlabel="class-0 logistic loss (constraint)",
       ylabel="class-1 loss + ridge (objective)", title="Neyman-Pearson trade-off")
ax.legend()
fig.tight_layout()
fig.savefig(Path(__file__).with_suffix(".png"), dpi=110)
