"""Partial participation: which K of the I clients take part in round t, and their weights.

The server combines the sampled clients' replies with their usual weights N_i / (B_i N) times
a factor h_i, chosen so that the combination is unbiased over the draw of the clients
(Horvitz-Thompson): E[sum_{i in S_t} h_i x_i] = sum_{i=1}^I x_i for any fixed x_1..x_I.

* ``"uniform"``: K of I without replacement; every client is drawn with probability K/I, so
  h_i = I / K.
* ``"proportional"``: K independent draws with replacement, client i with probability
  p_i = N_i / N (Li et al. 2020, "On the convergence of FedAvg on non-IID data", scheme I); a
  client drawn k_i times answers once and gets h_i = k_i / (K p_i) = k_i N / (K N_i), whose
  expectation is 1 (Hansen-Hurwitz).

The draw of round t comes from ``SeedSequence(seed, spawn_key=(PARTICIPATION_KEY, t))``: a
pure function of the run's seed and the round, so a resumed run draws the same clients. The
clients' own mini-batches use three-part spawn keys (client, round, draw) and never this one.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

#: The first spawn-key word of the participation draws (ASCII "part").
PARTICIPATION_KEY = 0x70617274


class Sampler:
    """The participants of each round and their factors h_i.

    Args:
      sizes: N_i of every client.
      per_round: K (1 <= K <= I).
      scheme: "uniform" or "proportional".
      seed: the run's seed entropy (an int).
    """

    def __init__(self, sizes: Sequence[int], per_round: int, scheme: str, seed: int):
        self.sizes = np.asarray(sizes, dtype=float)
        self.num_clients = len(self.sizes)
        if not 1 <= int(per_round) <= self.num_clients:
            raise ValueError(f"clients_per_round must be between 1 and {self.num_clients}, "
                             f"got {per_round}")
        if scheme not in ("uniform", "proportional"):
            raise ValueError(f"participation must be 'uniform' or 'proportional', got "
                             f"{scheme!r}")
        self.per_round = int(per_round)
        self.scheme = scheme
        self.seed = int(seed)

    def draw(self, round: int) -> tuple[list[int], np.ndarray]:
        """(participants in increasing index order, their factors h_i) for ``round``."""
        rng = np.random.default_rng(
            np.random.SeedSequence(self.seed, spawn_key=(PARTICIPATION_KEY, int(round))))
        I, K = self.num_clients, self.per_round
        if self.scheme == "uniform":
            chosen = np.sort(rng.choice(I, size=K, replace=False))
            return [int(i) for i in chosen], np.full(K, I / K)
        p = self.sizes / self.sizes.sum()
        draws = rng.choice(I, size=K, replace=True, p=p)
        chosen, counts = np.unique(draws, return_counts=True)
        h = counts / (K * p[chosen])
        return [int(i) for i in chosen], h
