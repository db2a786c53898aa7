"""Privacy accounting of what clients send: (epsilon, delta) of record-level differential
privacy over the rounds of a run, from Google's ``dp-accounting`` (the ``privacy`` extra).

Not in the paper. The mechanism it accounts for: in a round, every client sums over its batch
of B_i rows, drawn uniformly without replacement from its N_i rows (:meth:`Client.batch`), a
contribution per row clipped to norm C, and the sum (of all clients, or of one) receives
Gaussian noise of standard deviation ``noise_multiplier * C``. Neighbouring data sets differ in
one row *replaced* (the number of rows is public: the batch sizes and the weights N_i / N
depend on it), so a clipped sum moves by up to 2 C: the Gaussian's multiplier in
``dp-accounting``'s sense (sigma over the sensitivity under the neighbouring relation) is
``noise_multiplier / 2``. Passing ``noise_multiplier`` itself understates epsilon: for 1,000
rounds of 100 of 10,000 rows at noise 2 C, 1.45 instead of 3.58 at delta = 1e-5 (2.47x).

A row of client i is in a round's batch with probability B_i / N_i: dp-accounting's
``SampledWithoutReplacementDpEvent`` (Renyi accounting, Wang, Balle and Kasiviswanathan 2019,
which requires the replace-one relation); a round that reads every row (B_i >= N_i) is the
Gaussian mechanism itself. The rows of the client with the largest sampling ratio pay the
most: its epsilon is the run's record-level epsilon.
"""

from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np

#: Renyi orders of the accountant (dp-accounting's defaults span 1.25 .. 256; a few larger
#: ones serve small noise multipliers)
ORDERS = tuple([1.0 + x / 10.0 for x in range(1, 100)] + list(range(11, 64))
               + [128, 256, 512, 1024])


def dp_accounting():
    """``import dp_accounting``, or ImportError saying how to install it."""
    try:
        import dp_accounting as dpa
    except ImportError as exc:
        raise ImportError(f"privacy accounting needs dp-accounting ({exc}): pip install "
                          "'ssca-solver[privacy]'") from None
    return dpa


def _check(noise_multiplier: float, delta: float) -> None:
    if not (isinstance(noise_multiplier, (int, float)) and noise_multiplier > 0
            and math.isfinite(noise_multiplier)):
        raise ValueError(f"noise_multiplier must be a positive number (the noise's standard "
                         f"deviation over the clipping norm C), got {noise_multiplier!r}")
    if not (isinstance(delta, (int, float)) and 0 < delta < 1):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")


def round_event(noise_multiplier: float, rows: int, batch: Optional[int]):
    """The DpEvent of one round for a row of a client with ``rows`` rows that reads
    ``batch`` of them (None: all) and whose clipped sum gets Gaussian noise of standard
    deviation ``noise_multiplier`` C (module docstring: the event's multiplier is half of
    it, the replace-one sensitivity being 2 C)."""
    dpa = dp_accounting()
    rows = int(rows)
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    gaussian = dpa.GaussianDpEvent(noise_multiplier / 2.0)
    if batch is None or int(batch) >= rows:
        return gaussian
    if int(batch) < 1:
        raise ValueError(f"batch must be >= 1 or None (every row), got {batch}")
    return dpa.SampledWithoutReplacementDpEvent(rows, int(batch), gaussian)


def run_event(noise_multiplier: float, rows: int, batches: Sequence[Optional[int]]):
    """The DpEvent of the rounds whose batches (rows read per client, None: all) are
    ``batches``, for a client with ``rows`` rows: each distinct batch size's round event
    composed with itself as often as it occurs."""
    dpa = dp_accounting()
    counts: dict = {}
    for b in batches:
        key = None if b is None or int(b) >= int(rows) else int(b)
        counts[key] = counts.get(key, 0) + 1
    events = [dpa.SelfComposedDpEvent(round_event(noise_multiplier, rows, b), k)
              for b, k in counts.items()]
    return events[0] if len(events) == 1 else dpa.ComposedDpEvent(events)


def epsilon_of(event, delta: float) -> float:
    """Epsilon at ``delta`` of ``event`` by Renyi accounting under the replace-one relation."""
    dpa = dp_accounting()
    accountant = dpa.rdp.RdpAccountant(
        list(ORDERS), neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    accountant.compose(event)
    return float(accountant.get_epsilon(delta))


def record_epsilon(noise_multiplier: float, sizes: Sequence[int],
                   batches: Sequence[Optional[int]], delta: float) -> float:
    """Record-level epsilon at ``delta`` of a run whose rounds read ``batches`` rows per
    client (None: every row) from clients of ``sizes`` rows, each round's clipped sums
    noised with standard deviation ``noise_multiplier`` C: the largest over the clients
    (the one with the largest sampling ratio pays the most; clients of equal size are
    accounted once)."""
    _check(noise_multiplier, delta)
    batches = list(batches)
    if not batches:
        return 0.0
    return max(epsilon_of(run_event(noise_multiplier, n, batches), delta)
               for n in sorted(set(int(n) for n in sizes)))


def calibrate_noise(target_epsilon: float, delta: float, sizes: Sequence[int],
                    batches: Sequence[Optional[int]]) -> float:
    """The smallest noise multiplier (standard deviation over C) whose
    :func:`record_epsilon` over ``batches`` is at most ``target_epsilon`` (to dp-accounting's
    calibration tolerance, then rounded up so that the bound holds)."""
    if not (isinstance(target_epsilon, (int, float)) and target_epsilon > 0):
        raise ValueError(f"target_epsilon must be > 0, got {target_epsilon!r}")
    _check(1.0, delta)
    dpa = dp_accounting()
    batches = list(batches)
    if not batches:
        raise ValueError("no rounds to calibrate for")
    worst = min(int(n) for n in sizes)

    def fresh():
        return dpa.rdp.RdpAccountant(
            list(ORDERS), neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)

    # the smallest client's rows are the most exposed when every client reads the same
    # batch size; the check below covers the others
    z = float(dpa.calibrate_dp_mechanism(fresh, lambda z: run_event(z, worst, batches),
                                         float(target_epsilon), float(delta),
                                         dpa.LowerEndpointAndGuess(1e-3, 1.0), tol=1e-4))
    while record_epsilon(z, sizes, batches, delta) > target_epsilon:
        z *= 1.0 + 1e-4
    return z


def client_round_event(noise_multiplier: float, num_clients: int, per_round: Optional[int]):
    """The DpEvent of one round for one client's whole data (client-level privacy) when
    ``per_round`` of ``num_clients`` clients are drawn without replacement (None: all) and
    the sum of their clipped contributions gets Gaussian noise of standard deviation
    ``noise_multiplier`` C (sensitivity 2 C under replace-one, as for a row)."""
    dpa = dp_accounting()
    gaussian = dpa.GaussianDpEvent(noise_multiplier / 2.0)
    if per_round is None or int(per_round) >= int(num_clients):
        return gaussian
    return dpa.SampledWithoutReplacementDpEvent(int(num_clients), int(per_round), gaussian)


def client_epsilon(noise_multiplier: float, num_clients: int, per_round: Optional[int],
                   rounds: int, delta: float) -> float:
    """Client-level epsilon at ``delta`` of ``rounds`` rounds of :func:`client_round_event`."""
    _check(noise_multiplier, delta)
    if rounds <= 0:
        return 0.0
    dpa = dp_accounting()
    return epsilon_of(dpa.SelfComposedDpEvent(
        client_round_event(noise_multiplier, num_clients, per_round), int(rounds)), delta)


def calibrate_client_noise(target_epsilon: float, delta: float, num_clients: int,
                           per_round: Optional[int], rounds: int) -> float:
    """The smallest noise multiplier whose :func:`client_epsilon` over ``rounds`` rounds is
    at most ``target_epsilon`` (dp-accounting's calibration, then rounded up)."""
    if not (isinstance(target_epsilon, (int, float)) and target_epsilon > 0):
        raise ValueError(f"target_epsilon must be > 0, got {target_epsilon!r}")
    _check(1.0, delta)
    dpa = dp_accounting()

    def fresh():
        return dpa.rdp.RdpAccountant(
            list(ORDERS), neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)

    z = float(dpa.calibrate_dp_mechanism(
        fresh, lambda z: dpa.SelfComposedDpEvent(
            client_round_event(z, num_clients, per_round), int(rounds)),
        float(target_epsilon), float(delta), dpa.LowerEndpointAndGuess(1e-3, 1.0), tol=1e-4))
    while client_epsilon(z, num_clients, per_round, rounds, delta) > target_epsilon:
        z *= 1.0 + 1e-4
    return z


# -- distributed noise -----------------------------------------------------------------------------
#: request config: the standard deviation, in the units of the weighted sum, of the noise all
#: participants of a secure aggregation add together (each its share, sigma / sqrt(n)); the
#: arrays whose names end with DP_EXEMPT carry no data and get none
DP_NOISE = "dp_noise"
DP_EXEMPT = "dp_exempt"


def discrete_gaussian(rng: np.random.Generator, sigma: float, size: int) -> np.ndarray:
    """``size`` draws of the discrete Gaussian on the integers, P(x) proportional to
    exp(-x^2 / (2 sigma^2)): Canonne, Kamath and Steinke 2020 (Algorithm 3), rejection
    sampling from the discrete Laplace of scale t = floor(sigma) + 1, accepting Y with
    probability exp(-(|Y| - sigma^2 / t)^2 / (2 sigma^2)). The acceptance is computed in
    double precision (their exact rational arithmetic is not reproduced)."""
    if not (sigma > 0 and math.isfinite(sigma)):
        raise ValueError(f"discrete_gaussian: sigma must be a positive number, got {sigma!r}")
    t = math.floor(sigma) + 1.0
    p = -math.expm1(-1.0 / t)                 # the geometric's success probability
    out = np.empty(int(size), dtype=np.int64)
    todo = np.arange(int(size))
    while todo.size:
        k = todo.size
        y = rng.geometric(p, k).astype(np.int64) - rng.geometric(p, k).astype(np.int64)
        keep = rng.random(k) < np.exp(-(np.abs(y) - sigma * sigma / t) ** 2
                                      / (2.0 * sigma * sigma))
        out[todo[keep]] = y[keep]
        todo = todo[~keep]
    return out


def sum_divergence(sigma: float, parties: int) -> float:
    """tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma^2 k / (k + 1)): how far the sum of n
    independent discrete Gaussians of standard deviation ``sigma`` (integer units) may be
    from the discrete Gaussian of variance n sigma^2, in the Renyi divergences that account
    for it (Kairouz, Liu and Steinke 2021, "The Distributed Discrete Gaussian Mechanism for
    Federated Learning with Secure Aggregation"). Below 1e-100 from sigma = 5."""
    k = np.arange(1, max(int(parties), 1), dtype=float)
    return float(10.0 * np.sum(np.exp(-2.0 * math.pi ** 2 * sigma * sigma * k / (k + 1.0))))
