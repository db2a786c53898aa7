"""A fixed set of short runs through every method and the main paths of each (closed form and
CVXPY, Algorithm 1 and 2 with a penalty step, fixed and adaptive batches, partial
participation with secure aggregation, forked client processes), recorded as every round's
iterate, the final status and message, and the final full-data report.

``tests/test_same_iterates.py`` compares today's code with the record in
``tests/data/golden_runs.npz``, made by ``python tests/golden_runs.py --write``. Re-record only
for a change that is meant to move iterates, and say which runs moved and why in the commit
(git keeps the history of each re-recording). Runs that pin ``hessian="lbfgs"`` or
``"none"`` keep the quasi-Newton and first-order paths covered now that the built-in losses
carry their Hessians (``"auto"`` picks the Newton model, the ``*_newton`` runs).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
RECORD = os.path.join(HERE, "data", "golden_runs.npz")


def _problems():
    sys.path.insert(0, os.path.dirname(HERE))
    import cvxpy as cp

    import ssca_solver as ss
    from problems.logistic import logistic_loss
    from problems.mlp import MLP, classification_uncon
    from problems.neyman_pearson import neyman_pearson
    from ssca_solver.datasets import breast_cancer, digits

    X, y = breast_cancer()
    data = ss.FederatedData.split(X, y, num_clients=5, seed=0)
    loss = logistic_loss()
    ridge = ss.Problem(loss, dim=X.shape[1], data=data,
                       regularizer=lambda w: 1e-2 * cp.sum_squares(w))
    box = ss.Problem(loss, dim=X.shape[1], data=data,
                     regularizer=lambda w: 1e-2 * cp.sum_squares(w),
                     domain=lambda w: [cp.norm(w, "inf") <= 0.5])
    np_prob = neyman_pearson(data, alpha=0.2)
    (Xd, yd), _ = digits()
    net = MLP(K=64, J=8, L=10)
    ddata = ss.FederatedData.split(Xd[:600], yd[:600], num_clients=4, seed=0)
    mlp = classification_uncon(ddata, net)
    return {"ridge": ridge, "box": box, "np": np_prob, "mlp": mlp}, net


def runs():
    """{name: (problem key, method, options)}: the fixed set. (Algorithm 2's max_iter bounds
    the whole run since issue 21; the runs recorded with max_iter per stage give it times the
    number of stages, 4 or 3, and run the same rounds.)"""
    G = dict(batch_size="grow")       # the growing batches (the default on small data once)
    return {
        "ssca_alg1_default": ("ridge", "ssca", dict(G, max_iter=30, hessian="lbfgs")),
        # the first-order surrogates (recorded before issue 19's quasi-Newton model)
        "ssca_alg1_certified": ("ridge", "ssca", dict(G, max_iter=400, hessian="none")),
        "ssca_alg2_certified": ("np", "ssca", dict(G, max_iter=1600, hessian="none")),
        # the quasi-Newton model on full batches
        "ssca_alg1_lbfgs": ("ridge", "ssca", dict(G, max_iter=400, hessian="lbfgs")),
        "ssca_alg2_lbfgs": ("np", "ssca", dict(G, max_iter=1600, hessian="lbfgs")),
        # every function has a hess: the clients' curvature
        "ssca_alg1_newton": ("ridge", "ssca", dict(G, max_iter=400)),
        "ssca_alg2_newton": ("np", "ssca", dict(G, max_iter=1600)),
        "ssca_process_newton": ("np", "ssca", dict(G, max_iter=40, transport="process")),
        "ssca_alg1_fixed_batch": ("ridge", "ssca", dict(max_iter=20, batch_size=10, tau=0.1)),
        "ssca_alg1_full_tau": ("ridge", "ssca", dict(max_iter=15, batch_size="full", tau=1.0)),
        "ssca_alg2_stages": ("np", "ssca", dict(G, max_iter=36, penalty=[0.01, 0.1, 1.0],
                                                 eval_every=4, hessian="lbfgs")),
        "ssca_alg2_default": ("np", "ssca", dict(G, max_iter=160, hessian="none")),
        "ssca_cvxpy_box": ("box", "ssca", dict(G, max_iter=10, subproblem="cvxpy")),
        "ssca_partial_secure": ("ridge", "ssca", dict(G, max_iter=10, clients_per_round=3,
                                                      secure_aggregation=True)),
        "ssca_process": ("np", "ssca", dict(G, max_iter=40, transport="process",
                                            hessian="lbfgs")),
        "ssca_mlp": ("mlp", "ssca", dict(max_iter=10, batch_size=10, tau=0.1,
                                          x0=np.random.default_rng(0).normal(0, 0.3, 592))),
        # the defaults, every option left out (batches chosen by a full pass's cost: full here)
        "ssca_alg1_auto": ("ridge", "ssca", dict(max_iter=400)),
        "ssca_alg2_auto": ("np", "ssca", dict(max_iter=1600)),
        "fedavg": ("ridge", "fedavg", dict(max_iter=15, batch_size=10, local_steps=2,
                                           lr=0.1, momentum=0.5)),
        "fedavg_partial": ("ridge", "fedavg", dict(max_iter=10, batch_size=10,
                                                   clients_per_round=2)),
        "primal_dual": ("np", "primal_dual", dict(max_iter=15, batch_size=10)),
        "augmented_lagrangian": ("np", "augmented_lagrangian", dict(max_iter=15,
                                                                    batch_size=10)),
    }


def arithmetic() -> str:
    """A fingerprint of this machine's floating-point arithmetic as the runs see it: the bits
    of a few results of NumPy's BLAS/LAPACK kernels and vectorised functions, whose rounding
    depends on the CPU's instruction set and the libraries' versions. Runs recorded under one
    fingerprint repeat to the last bit under it; under another, rounding differences of 1e-16
    grow over the rounds of a long run (to 1e-8 relative over 150 rounds of Algorithm 2)."""
    import hashlib

    rng = np.random.default_rng(0)
    A = rng.standard_normal((257, 257))
    v = rng.standard_normal(100_003)
    parts = [A @ A, np.linalg.solve(A, A[:, 0]), np.linalg.cholesky(A @ A.T + np.eye(257)),
             np.array([v.sum(), v @ v]), np.exp(v[:4096]), np.log1p(np.abs(v[:4096]))]
    h = hashlib.blake2b(digest_size=8)
    for p in parts:
        h.update(np.ascontiguousarray(p).tobytes())
    return h.hexdigest()


def record_all() -> dict:
    """Run every case; {name/field: array} with the iterates and the outcome, and the
    arithmetic they were recorded under (``__arithmetic__``)."""
    problems, _ = _problems()
    out = {"__arithmetic__": np.array(arithmetic())}
    for name, (key, method, options) in runs().items():
        xs = []
        res = problems[key].solve(method=method, seed=0, progress=False,
                                  callback=lambda it: xs.append(np.array(it.x)), **options)
        out[f"{name}/iterates"] = np.array(xs)
        out[f"{name}/x"] = res.x
        out[f"{name}/fun"] = np.array(res.fun)
        out[f"{name}/multipliers"] = np.asarray(res.kkt.multipliers, dtype=float)
        out[f"{name}/outcome"] = np.array(json.dumps(
            {"status": res.status, "message": res.message, "nit": int(res.nit)}))
    return out


if __name__ == "__main__":
    if "--write" not in sys.argv:
        sys.exit("usage: python tests/golden_runs.py --write   (re-records the reference)")
    os.makedirs(os.path.dirname(RECORD), exist_ok=True)
    np.savez_compressed(RECORD, **record_all())
    print("wrote", RECORD)
