"""Fairness-constrained logistic regression with clients that hold different groups.

Run:  python docs/examples/fairness.py   (about 10 s)
"""
import cvxpy as cp

import ssca_solver as ss
from problems.fairness import (accuracy_and_gap, diabetes_fairness, fair_logistic, logistic,
                               skewed_clients, slsqp_reference)

X, Y = diabetes_fairness()
data = skewed_clients(X, Y)  # two clients mostly s = 1, two mostly s = 0
print("clients (rows, share of s = 1):",
      [(c.num_rows, round(float(c.y[:, 1].mean()), 2)) for c in data.clients])
free = ss.Problem(logistic(), dim=X.shape[1], data=data,
                  regularizer=lambda w: 1e-2 * cp.sum_squares(w)).solve(
    batch_size=50, max_iter=600, seed=0, eval_every=None)
acc, gap = accuracy_and_gap(free.x, X, Y)
print(f"unconstrained:          accuracy {acc:.3f}, demographic-parity gap of predictions {gap:+.3f}")
eps = 0.05
res = fair_logistic(data, eps).solve(batch_size=50, max_iter=1500, penalty=[10.0, 100.0],
                                     seed=0, eval_every=None)
acc, gap = accuracy_and_gap(res.x, X, Y)
print(f"|DP(w)| <= {eps} (SSCA):  accuracy {acc:.3f}, gap of predictions {gap:+.3f}, "
      f"objective {res.fun:.4f}")
ref = slsqp_reference(X, Y, eps)
acc, gap = accuracy_and_gap(ref.x, X, Y)
print(f"|DP(w)| <= {eps} (SLSQP, pooled): accuracy {acc:.3f}, gap {gap:+.3f}, objective {ref.fun:.4f}")
print("\n" + res.report())
