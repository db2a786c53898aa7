"""What the server sees at batch size 1, with and without secure aggregation (docs/privacy.md).

Least squares f(w; x, y) = (x.w - y)^2 / 2 on the breast-cancer data (569 rows, 30 standardised
features and an intercept column of ones, 5 clients), one SSCA round message per client at
B = 1 for 40 rounds at a fixed w_t:

* plain: from w_t, tau and one client's message alone the server rebuilds the client's row.
  The message holds lin = g - 2 tau w_t with g = x (x.w_t - y); the intercept x_31 = 1 gives
  r = x.w_t - y = g_31, hence x = g / g_31 and y = x.w_t - g_31.
* secure: the same 40 rounds through secure aggregation. The masked words are tested for
  uniformity (chi-square on the top byte, Kolmogorov-Smirnov), the same reconstruction is
  applied to a masked message read as fixed point, and the decoded sum is compared with the
  plain weighted sum (quantisation bound n 2^-(f+1)).

    PYTHONPATH=. python docs/examples/privacy_reconstruction.py
"""

from __future__ import annotations

import numpy as np
from scipy import stats as sps

import ssca_solver as ss
from ssca_solver.methods.ssca.algorithm import SSCARoundTask
from ssca_solver.datasets import breast_cancer
from ssca_solver.methods.ssca.step import combine
from ssca_solver.federated import InProcessTransport, Request, Transport, build_clients
from ssca_solver.federated import secagg
from ssca_solver.federated.gather import Gatherer
from ssca_solver.engine.options import seed_entropy

TAU, ROUNDS, SEED = 0.1, 40, 0


class Spy(Transport):
    """An in-process transport that keeps every reply the server receives."""

    def __init__(self, clients):
        self.inner = InProcessTransport(clients)
        self.num_clients = self.inner.num_clients
        self.seen = []

    def stream(self, request, participants=None, tolerate_failures=False):
        for r in self.inner.stream(request, participants, tolerate_failures):
            self.seen.append(r)
            yield r


def reconstruct(lin, w):
    g = lin + 2 * TAU * w
    x = g / g[-1]
    return x, x @ w - g[-1]


def main():
    X, y = breast_cancer()
    data = ss.FederatedData.split(X, y, num_clients=5, seed=0)
    fn = ss.SampleFunction(lambda w, X, y: 0.5 * (X @ w - y) ** 2,
                           lambda w, X, y: X.T @ (X @ w - y) / len(y), name="lsq")
    prob = ss.Problem(fn, dim=X.shape[1], data=data)
    tasks = {"ssca.round": SSCARoundTask(prob.functions, prob.builders)}
    w = np.random.default_rng(1).normal(scale=0.1, size=X.shape[1])
    sizes = data.client_sizes

    def request(t):
        return Request("ssca.round", t, w, {"batch_size": 1, "tau": TAU})

    # plain
    spy = Spy(build_clients(data, seed_entropy(SEED), tasks))
    errors = []
    for t in range(1, ROUNDS + 1):
        for r in spy.exchange(request(t)):
            xh, yh = reconstruct(np.asarray(r.arrays["0:lin"]), w)
            c = data.clients[r.client]
            i = np.random.default_rng(np.random.SeedSequence(
                seed_entropy(SEED), spawn_key=(r.client, t, 0))).choice(c.X.shape[0], 1,
                                                                        replace=False)[0]
            errors.append(max(np.linalg.norm(xh - c.X[i]) / np.linalg.norm(c.X[i]),
                              abs(yh - c.y[i]) / max(1.0, abs(c.y[i]))))
    print(f"plain messages ({len(errors)}): relative error of the rebuilt row (x, y): median "
          f"{np.median(errors):.2g}, max {np.max(errors):.2g}")

    # secure
    spy = Spy(build_clients(data, seed_entropy(SEED), secagg.client_tasks(tasks)))
    secure = Gatherer(spy, sizes, secure=secagg.SecureAggregation(sizes, 2.0 ** 20))
    plain = Gatherer(InProcessTransport(build_clients(data, seed_entropy(SEED), tasks)), sizes)
    f = secagg.fraction_bits(2.0 ** 20, len(sizes))
    worst = 0.0
    for t in range(1, ROUNDS + 1):
        (agg,) = secure.collect(request(t))
        a = combine(list(plain.collect(request(t))), data.num_samples)[0]
        b = combine([agg], data.num_samples)[0]
        worst = max(worst, max(float(np.max(np.abs(np.asarray(a[k]) - np.asarray(b[k]))))
                               for k in a))
    masked = [r for r in spy.seen if "masked" in r.arrays]
    words = np.concatenate([np.asarray(r.arrays["masked"]) for r in masked])
    chi2 = sps.chisquare(np.bincount((words >> np.uint64(56)).astype(int), minlength=256))
    ks = sps.kstest(words.astype(float) / 2.0 ** 64, "uniform")
    bad = []
    for r in masked:
        lin = np.asarray(r.arrays["masked"]).view(np.int64)[1:1 + X.shape[1]] * 2.0 ** -f
        xh, _ = reconstruct(lin, w)
        c = data.clients[r.client]
        i = np.random.default_rng(np.random.SeedSequence(
            seed_entropy(SEED), spawn_key=(r.client, r.round, 0))).choice(c.X.shape[0], 1,
                                                                          replace=False)[0]
        bad.append(np.linalg.norm(xh - c.X[i]) / np.linalg.norm(c.X[i]))
    print(f"masked messages ({len(masked)}, {words.size} words): chi-square on the top byte "
          f"p = {chi2.pvalue:.3f}, KS against uniform p = {ks.pvalue:.3f}; the same "
          f"reconstruction: relative error of x median {np.median(bad):.3g}, min "
          f"{np.min(bad):.3g}")
    print(f"masked sum vs plain weighted sum: max |difference| {worst:.3g} over {ROUNDS} rounds "
          f"(bound n 2^-(f+1) = {len(sizes) * 2.0 ** -(f + 1):.3g}, f = {f})")


if __name__ == "__main__":
    main()
