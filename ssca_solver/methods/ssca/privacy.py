"""Differential privacy for method "ssca" (``solve(..., privacy=ss.Privacy(...))``).

Not in the paper; it privatises the sums behind the statistics of eqs. (Fs0bar)/(Fsmbar).
A round of Algorithm 1 or 2 then runs as follows (record level):

* each client evaluates, for every row n of its batch, the values and gradients of every
  stochastic function at w_t, r_n = (f_0(w_t, x_n), grad f_0(w_t, x_n), ..., f_M, grad f_M)
  (M (d + 1) numbers), clips the row to norm C (r_n min(1, C / |r_n|)) and sends the
  clipped sums with the public n tau (:func:`clipped_arrays`);
* Gaussian noise of standard deviation sigma = z C a_max is added to the round's weighted sum
  of those sums, where a_i = h_i N_i / (B_i N) is client i's weight in eqs.
  (Fs0bar)/(Fsmbar) and z the noise multiplier: by the server (``mechanism="central"``,
  :func:`add_noise`), or by the participants of secure aggregation, each its share as a
  discrete Gaussian on its fixed-point words before the masks (``"distributed"``,
  :mod:`ssca_solver.federated.secagg`). Replacing one row of client i moves the weighted sum
  by at most 2 C a_i, so every row is protected by the Gaussian mechanism of multiplier z / 2
  relative to its sensitivity, sampled with probability B_i / N_i
  (:mod:`ssca_solver.federated.accounting`);
* the server turns the noised sums into the proximal-linear statistics
  (:func:`to_statistics`), and the round goes on as without privacy;
* nothing else reads the data: no probe, no gradient check, no full-data evaluation, no
  batch-size test. The run stops after the rounds the budget paid for, with status
  "private" (nothing is certified), and reports the (epsilon, delta) spent.

At ``level="client"`` each client clips its mean contribution over its batch instead
(:func:`client_arrays`) and the unit of privacy is a client's whole data. What the analyst
and everyone after the server receive (the iterates, the history, the result) is a function
of the noised sums alone.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np

from ...federated import accounting
from ...model.functions import checked_grad, checked_row_grads, checked_values


@dataclass(frozen=True)
class Privacy:
    """(epsilon, delta) differential privacy of a solve by method "ssca": the sums behind
    the statistics of eqs. (Fs0bar)/(Fsmbar) are clipped and noised (not in the paper; see
    the module docstring).

    Attributes:
      epsilon: the budget. With ``noise_multiplier`` None the noise is calibrated so that the
        ``max_iter`` rounds asked for spend at most epsilon (the accountant of
        :mod:`ssca_solver.federated.accounting`); with both given, a request whose rounds
        would spend more is refused before round 1. None: only account (``noise_multiplier``
        must then be given).
      delta: the delta of (epsilon, delta); default 1e-5 (below 1 / N for N up to 1e5 rows).
      clip: C, the norm each row's contribution (the values and gradients of every
        stochastic function at w_t, together) is clipped to. Rows whose contributions are
        larger are shrunk, which biases the statistics: choose C near the typical norm.
      noise_multiplier: z, the Gaussian noise's standard deviation over C times the largest
        client weight (None: calibrated to ``epsilon``).
      mechanism: "central" (default: the server adds the noise to the sum of the clipped
        sums; it is trusted with them) or "distributed" (with ``secure_aggregation=True``:
        each participant of the secure sum adds its share of the noise, a discrete Gaussian
        on its fixed-point words before the masks, so the server sees only the noised sum).
      level: "record" (default: neighbouring data sets differ in one row of one client; each
        row is clipped) or "client" (they differ in one client's whole data; each client's
        mean contribution over its batch is clipped, and ``clients_per_round`` amplifies).
      seed: the seed of the noise and of the batches (None: fresh entropy from the operating
        system, the private choice; a number makes both reproducible, and anyone who knows it
        can remove the noise: for experiments only). The run's ``seed`` draws neither.
    """

    epsilon: Optional[float] = None
    delta: float = 1e-5
    clip: float = 1.0
    noise_multiplier: Optional[float] = None
    mechanism: str = "central"
    level: str = "record"
    seed: Any = None

    def __post_init__(self):
        if self.epsilon is None and self.noise_multiplier is None:
            raise ValueError("Privacy needs epsilon (the budget; the noise is calibrated to "
                             "it) or noise_multiplier (the noise; the epsilon it gives is "
                             "reported)")
        if self.epsilon is not None and not _positive(self.epsilon):
            raise ValueError(f"Privacy: epsilon must be a positive number, got "
                             f"{self.epsilon!r}")
        if not (_number(self.delta) and 0 < self.delta < 1):
            raise ValueError(f"Privacy: delta must be in (0, 1), got {self.delta!r}")
        if not _positive(self.clip):
            raise ValueError(f"Privacy: clip must be a positive number (the norm of a row's "
                             f"contribution), got {self.clip!r}")
        if self.noise_multiplier is not None and not _positive(self.noise_multiplier):
            raise ValueError(f"Privacy: noise_multiplier must be a positive number, got "
                             f"{self.noise_multiplier!r}")
        if self.level not in LEVELS:
            raise ValueError(f"Privacy: level must be one of {', '.join(LEVELS)}, got "
                             f"{self.level!r}")
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"Privacy: mechanism must be one of {', '.join(MECHANISMS)}, got "
                             f"{self.mechanism!r}")


#: who adds the noise: the server, or the participants of secure aggregation
MECHANISMS = ("central", "distributed")
#: the unit of privacy: a row of a client, or a client's whole data
LEVELS = ("record", "client")


def _number(x) -> bool:
    return isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)


def _positive(x) -> bool:
    return _number(x) and math.isfinite(float(x)) and float(x) > 0


@dataclass(frozen=True)
class PrivacySpent:
    """What a private run spent (``res.privacy``).

    Attributes:
      epsilon, delta: the (epsilon, delta) of the rounds that ran, at ``level`` (by the
        accountant, over the rounds actually run).
      budget: the epsilon asked for (None: none was given).
      noise_multiplier: z (the noise's standard deviation is z C a_max).
      clip: C.
      rounds: the rounds that ran; ``planned``: the rounds the noise was calibrated for.
      batch_size: rows per client per round (None: every row).
      mechanism: "central" (the server adds the noise to the sum of the clipped sums) or
        "distributed" (the participants of secure aggregation add it, in integers).
      level: "record" (neighbouring data sets differ in one row of one client) or
        "client" (in one client's whole data).
      clients_per_round: K (None: every client in every round).
    """

    epsilon: float
    delta: float
    budget: Optional[float]
    noise_multiplier: float
    clip: float
    rounds: int
    planned: int
    batch_size: Optional[int]
    mechanism: str = "central"
    level: str = "record"
    clients_per_round: Optional[int] = None

    def as_dict(self) -> dict:
        return dict(vars(self))


class Plan:
    """The mechanism of a private solve, fixed before round 1: the noise multiplier (given,
    or calibrated to the budget over ``rounds`` rounds), the noise's scale and the accountant
    (:meth:`epsilon_after`).

    Args:
      privacy: the user's :class:`Privacy`.
      sizes: the clients' row counts N_i.
      batch: B (rows per client per round; None: every row).
      rounds: the rounds the run may take (``max_iter``).
      weight_factor: h, the participation weight of a client in a round (I / K with
        ``clients_per_round=K``, else 1).
      noised: the floats of a reply that carry data (M (d + 1)): under the distributed
        mechanism their rounding to the fixed point adds sqrt(noised) 2^-f to the
        sensitivity.
      secure_range, parties: the distributed mechanism's fixed point (f of
        :func:`ssca_solver.federated.secagg.fraction_bits` at the most participants).

    Raises ValueError before round 1 when ``noise_multiplier`` and ``epsilon`` are both given
    and the rounds would spend more than epsilon (naming the rounds that fit, or the noise
    that would do).
    """

    def __init__(self, privacy: Privacy, sizes: Sequence[int], batch: Optional[int],
                 rounds: int, weight_factor: float = 1.0, noised: int = 1,
                 secure_range: float = 2.0 ** 20, parties: int = 1,
                 per_round: Optional[int] = None):
        self.privacy = privacy
        self.sizes = tuple(int(n) for n in sizes)
        self.batch = None if batch is None else int(batch)
        self.rounds = int(rounds)
        self.per_round = None if per_round is None else int(per_round)
        N = float(sum(self.sizes))
        if privacy.level == "client":
            # h N_i / N: the weight of client i's (clipped) mean contribution
            self.max_weight = float(weight_factor) * max(self.sizes) / N
        else:
            # a_i = h N_i / (B_i N): the weight of one row of client i in the round's sum
            self.max_weight = float(weight_factor) * max(
                n / (min(self.batch, n) if self.batch is not None else n) / N
                for n in self.sizes)
        batches = [self.batch] * self.rounds
        if privacy.noise_multiplier is None:
            z = self._calibrate(float(privacy.epsilon))
        else:
            z = float(privacy.noise_multiplier)
        self.noise_multiplier = z
        self.sigma = z * float(privacy.clip) * self.max_weight
        if privacy.mechanism == "distributed":
            from ...federated.secagg import fraction_bits

            # each participant rounds its weighted words to 2^-f before its noise: a row
            # replaced moves them by up to 2 C a_max + sqrt(noised) 2^-f, and the noise covers
            # that sensitivity at the multiplier z / 2
            f = fraction_bits(float(secure_range), int(parties))
            self.sigma = 0.5 * z * (2.0 * float(privacy.clip) * self.max_weight
                                    + math.sqrt(int(noised)) * 2.0 ** -f)
            share = self.sigma * 2.0 ** f / math.sqrt(int(parties))
            tau = accounting.sum_divergence(share, int(parties))
            if tau > 1e-12:
                raise ValueError(f"privacy: each participant's noise is {share:.3g} in units "
                                 f"of the fixed point 2^-{f}, too coarse for the sum of "
                                 f"discrete Gaussians to be accounted as one (tau = "
                                 f"{tau:.3g}); give a smaller secure_range")
        self._rdp = self._round_rdp()
        if privacy.noise_multiplier is not None and privacy.epsilon is not None:
            spent = self.epsilon_after(self.rounds)
            if spent > privacy.epsilon:
                fit = self.rounds_within(float(privacy.epsilon))
                need = self._calibrate(float(privacy.epsilon))
                raise ValueError(
                    f"privacy: {self.rounds} rounds at noise_multiplier={z:g} spend "
                    f"epsilon = {spent:.3g} > the budget {privacy.epsilon:g} (delta = "
                    f"{privacy.delta:g}): ask for at most {fit} rounds (max_iter), or "
                    f"noise_multiplier >= {need:.4g}, or leave noise_multiplier=None to "
                    "have it calibrated")
        self.entropy = (secrets.randbits(128) if privacy.seed is None
                        else np.random.SeedSequence(privacy.seed).entropy)
        #: the seed of the clients' batch draws: the accountant's amplification by sampling
        #: holds only if the server does not know which rows a batch holds, and it knows the
        #: run's seed (a number of its own, independent of the noise's streams)
        self.batch_seed = int.from_bytes(np.random.SeedSequence(
            self.entropy, spawn_key=(1 << 32,)).generate_state(4, np.uint32).tobytes(), "little")

    def _calibrate(self, epsilon: float) -> float:
        """The smallest noise multiplier whose ``rounds`` rounds spend at most epsilon."""
        p = self.privacy
        if p.level == "client":
            return accounting.calibrate_client_noise(epsilon, float(p.delta), len(self.sizes),
                                                     self.per_round, self.rounds)
        return accounting.calibrate_noise(epsilon, float(p.delta), self.sizes,
                                          [self.batch] * self.rounds)

    def _round_events(self) -> list:
        """One round's DpEvents: per distinct client size (record level), or the one of a
        client's data (client level)."""
        z = self.noise_multiplier
        if self.privacy.level == "client":
            return [accounting.client_round_event(z, len(self.sizes), self.per_round)]
        return [accounting.round_event(z, n, self.batch) for n in sorted(set(self.sizes))]

    def _round_rdp(self) -> list:
        """One round's Renyi DP at the accountant's orders, for each of
        :meth:`_round_events`."""
        dpa = accounting.dp_accounting()
        out = []
        for event in self._round_events():
            acc = dpa.rdp.RdpAccountant(list(accounting.ORDERS),
                                        neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
            acc.compose(event)
            # the Renyi DP of one round (dp-accounting 0.6 keeps it in _rdp, the extra pins
            # that version; tests/test_privacy.py checks the sums against its accountant)
            out.append(np.asarray(acc._rdp, dtype=float))
        return out

    def epsilon_after(self, rounds: int) -> float:
        """The record-level epsilon (at the plan's delta) after ``rounds`` rounds: Renyi DP
        composes additively, so one round's curve times the rounds, converted (the largest
        over the clients' sizes)."""
        if rounds <= 0:
            return 0.0
        from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

        return max(float(compute_epsilon(list(accounting.ORDERS), rounds * rdp,
                                          float(self.privacy.delta))[0])
                   for rdp in self._rdp)

    def rounds_within(self, epsilon: float) -> int:
        """The most rounds at the plan's noise whose epsilon stays within ``epsilon``."""
        lo, hi = 0, self.rounds
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.epsilon_after(mid) <= epsilon:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def rng(self, t: int) -> np.random.Generator:
        """The noise generator of round t (independent across rounds, and across resumes
        when no seed was given)."""
        return np.random.default_rng(np.random.SeedSequence(self.entropy, spawn_key=(int(t),)))

    def spent(self, rounds: int) -> PrivacySpent:
        p = self.privacy
        return PrivacySpent(epsilon=self.epsilon_after(rounds), delta=float(p.delta),
                            budget=None if p.epsilon is None else float(p.epsilon),
                            noise_multiplier=self.noise_multiplier, clip=float(p.clip),
                            rounds=int(rounds), planned=self.rounds, batch_size=self.batch,
                            mechanism=p.mechanism, level=p.level,
                            clients_per_round=self.per_round)


# -- the client's side ---------------------------------------------------------------------------
def client_arrays(functions, builders, w, X, y, tau: float, clip: float, where: str) -> dict:
    """A client-level private reply: the client's mean contribution over its batch (every
    function's mean value and the gradient of its mean, one vector of M (d + 1) numbers)
    clipped to norm ``clip``, times the batch's n rows (so that the round's weight
    h N_i / (n N) gives it weight h N_i / N), in the layout of :func:`clipped_arrays`."""
    n = X.shape[0]
    v = np.array([checked_values(fn, w, X, y, n, where).mean() for fn in functions])
    g = np.array([checked_grad(fn, w, X, y, w.size, where) for fn in functions])
    norm = math.sqrt(float(v @ v) + float(np.sum(g * g)))
    scale = n * min(1.0, clip / max(norm, 1e-300))
    return _reply_arrays(scale * v, scale * g, n, builders, tau)


def clipped_sums(functions, w, X, y, clip: float, where: str) -> tuple:
    """(value sums (M,), gradient sums (M, d), rows clipped) over the rows of (X, y): each
    row's contribution (every function's value and gradient at w, one vector of M (d + 1)
    numbers) scaled to norm at most ``clip`` before the sums."""
    n = X.shape[0]
    values = np.stack([checked_values(fn, w, X, y, n, where) for fn in functions],
                      axis=1)                                                       # (n, M)
    grads = np.stack([checked_row_grads(fn, w, X, y, where) for fn in functions], axis=1)
    norms = np.sqrt(np.einsum("nm,nm->n", values, values)
                    + np.einsum("nmd,nmd->n", grads, grads))
    scale = np.minimum(1.0, clip / np.maximum(norms, 1e-300))
    return (scale @ values, np.einsum("n,nmd->md", scale, grads),
            int(np.count_nonzero(norms > clip)))


def clipped_arrays(functions, builders, w, X, y, tau: float, clip: float,
                   where: str) -> dict:
    """A private reply's arrays: per function m, ``"m:v"`` and ``"m:g"``, the clipped sums of
    :func:`clipped_sums` over the rows of (X, y), and ``"m:quad"`` = n tau (public: no data),
    packed as :func:`~.step.pack_statistics` packs statistics. The server turns them into the
    proximal-linear statistics (:func:`to_statistics`) after the noise."""
    v, g, _ = clipped_sums(functions, w, X, y, clip, where)
    return _reply_arrays(v, g, X.shape[0], builders, tau)


def _reply_arrays(v, g, n: int, builders, tau: float) -> dict:
    """The arrays of a private reply: value sums ``v`` (M,), gradient sums ``g`` (M, d) and
    the public n tau of each function's builder, packed as statistics are."""
    from .step import pack_statistics

    taus = np.array([b.tau if b.tau is not None else tau for b in builders], dtype=float)
    return pack_statistics([{"v": np.asarray(v[m]), "g": g[m], "quad": np.asarray(n * taus[m])}
                            for m in range(len(v))])


def sums_template(stats_template: Sequence[dict]) -> list:
    """The layout of a private reply (:func:`clipped_arrays`) for statistics laid out as
    ``stats_template`` (the state's)."""
    return [{"v": np.zeros(()), "g": np.zeros(np.shape(st["lin"])), "quad": np.zeros(())}
            for st in stats_template]


def to_statistics(arrays: dict, w: np.ndarray, stats_template: Sequence[dict]) -> dict:
    """The proximal-linear statistics (eqs. (fs0bar)/(fsmbar)) of a private reply's (or of a
    weighted sum of them: the map is linear) value sums v, gradient sums g and quad = n tau,
    at the point w they were taken at: lin = g - 2 quad w, const = v - g.w + quad |w|^2, in
    the layout of ``stats_template``. A missing array raises KeyError naming it."""
    from .step import pack_statistics, unpack_statistics

    sums = unpack_statistics(arrays, sums_template(stats_template))
    ww = float(w @ w)
    stats = []
    for s in sums:
        g, quad = np.asarray(s["g"], dtype=float), float(s["quad"])
        stats.append({"const": np.asarray(float(s["v"]) - float(g @ w) + quad * ww),
                      "lin": g - 2.0 * quad * w, "quad": np.asarray(quad)})
    return pack_statistics(stats)


# -- the server's side ---------------------------------------------------------------------------
def add_noise(stats: tuple, w: np.ndarray, sigma: float, scale: float,
              rng: np.random.Generator) -> tuple:
    """``stats`` plus ``scale`` times Gaussian noise of standard deviation ``sigma`` on each
    function's value sum and gradient sum, written in the proximal-linear statistics: lin
    gets xi_g, const gets xi_v - xi_g.w (``w``: the point the statistics were taken at);
    quad (n tau, no data) is unchanged."""
    out = []
    for st in stats:
        xi_v = float(rng.normal(0.0, sigma))
        xi_g = rng.normal(0.0, sigma, size=np.shape(st["lin"]))
        new = dict(st)
        new["lin"] = np.asarray(st["lin"], dtype=float) + scale * xi_g
        new["const"] = np.asarray(st["const"], dtype=float) + scale * (xi_v - xi_g @ w)
        out.append(new)
    return tuple(out)
