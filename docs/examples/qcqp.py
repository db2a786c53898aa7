"""A stochastic QCQP with three stochastic quadratic constraints, against CVXPY.

Run:  python docs/examples/qcqp.py   (about 5 s)
"""
import numpy as np

import ssca_solver as ss
from problems.qcqp import make_samples, pooled_reference, stochastic_qcqp

d = 5
R, U = make_samples(N=600, d=d, M=3, seed=0)
data = ss.FederatedData.split(R, None, num_clients=6, seed=0)
res = stochastic_qcqp(data, U, d).solve(batch_size=20, max_iter=600, tau=0.5,
                                        penalty=[10.0, 100.0], seed=0, eval_every=None)
w, value, duals = pooled_reference(R, U, d)
print(res.report())
print(f"\nCVXPY on the pooled sample averages: objective {value:.5f}, multipliers "
      f"{np.round(duals, 4)}; SSCA's |w - w*|_inf = {np.max(np.abs(res.x - w)):.2e}")
