"""A deterministic set (|w|_inf <= 0.6) next to a stochastic constraint (Neyman-Pearson).

Run:  python docs/examples/box_domain.py   (about 10 s)
"""
import numpy as np

import ssca_solver as ss
from problems.neyman_pearson import neyman_pearson, pooled_reference
from ssca_solver.datasets import breast_cancer

X, y = breast_cancer()
data = ss.FederatedData.split(X, y, num_clients=5, seed=0)
res = neyman_pearson(data, 0.15, lam=1e-2, box=0.6).solve(batch_size=50, max_iter=600,
                                                          penalty=[10.0, 100.0], seed=0,
                                                          eval_every=None)
w, obj, con, mu = pooled_reference(X, y, 0.15, lam=1e-2, box=0.6)
print(res.report())
print(f"\npooled CVXPY: objective {obj:.5f}, class-0 loss {con:.4f}, mu {mu:.4f}, "
      f"{int(np.sum(np.abs(w) > 0.6 - 1e-6))} coordinate(s) on the box; SSCA: "
      f"{int(np.sum(np.abs(res.x) > 0.6 - 1e-4))}")
