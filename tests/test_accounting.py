"""Record-level privacy accounting (:mod:`ssca_solver.federated.accounting`), against
dp-accounting's own events: skipped without the ``privacy`` extra.

* A run's epsilon is the accountant's for the sampled-without-replacement Gaussian under the
  replace-one relation, with the event's multiplier half the noise's standard deviation over C
  (the sensitivity of a clipped sum is 2 C); passing the multiplier as it is understates
  epsilon: 1.45 instead of 3.58 (2.47x) for 1,000 rounds of 100 of 10,000 rows.
* A full-batch round is the Gaussian mechanism itself; rounds of several batch sizes compose.
* The client with the largest sampling ratio sets the run's record-level epsilon.
* The calibrated noise meets the target and is the smallest that does (to 0.1 %).
"""

from __future__ import annotations

import pytest

dpa = pytest.importorskip("dp_accounting")

from ssca_solver.federated import accounting as acc  # noqa: E402

DELTA = 1e-5


def direct(event) -> float:
    a = dpa.rdp.RdpAccountant(list(acc.ORDERS),
                              neighboring_relation=dpa.NeighboringRelation.REPLACE_ONE)
    a.compose(event)
    return float(a.get_epsilon(DELTA))


def test_sampled_rounds_are_the_accountants_event_with_half_the_multiplier():
    # noise of standard deviation 2 C on sums of batches of 100 of 10,000 rows, 1,000 rounds:
    # the event's multiplier is 1 (the figure: epsilon 3.58 at multiplier 1)
    eps = acc.record_epsilon(2.0, [10_000], [100] * 1000, DELTA)
    want = direct(dpa.SelfComposedDpEvent(
        dpa.SampledWithoutReplacementDpEvent(10_000, 100, dpa.GaussianDpEvent(1.0)), 1000))
    assert eps == pytest.approx(want, rel=1e-12)
    assert eps == pytest.approx(3.58, abs=5e-3)             # the figure
    # the multiplier passed as if the sensitivity were C: epsilon 1.45, 2.47x too small
    wrong = direct(dpa.SelfComposedDpEvent(
        dpa.SampledWithoutReplacementDpEvent(10_000, 100, dpa.GaussianDpEvent(2.0)), 1000))
    assert eps / wrong == pytest.approx(2.47, abs=0.01)


def test_full_batch_rounds_are_the_gaussian_mechanism_and_batches_compose():
    full = acc.record_epsilon(8.0, [50], [None] * 10, DELTA)
    assert full == pytest.approx(direct(dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(4.0), 10)),
                                 rel=1e-12)
    mixed = acc.record_epsilon(8.0, [50], [10] * 5 + [None] * 10, DELTA)
    assert mixed == pytest.approx(direct(dpa.ComposedDpEvent([
        dpa.SelfComposedDpEvent(dpa.SampledWithoutReplacementDpEvent(
            50, 10, dpa.GaussianDpEvent(4.0)), 5),
        dpa.SelfComposedDpEvent(dpa.GaussianDpEvent(4.0), 10)])), rel=1e-12)
    assert mixed > full
    # a batch at least a client's rows is every row
    assert acc.record_epsilon(8.0, [50], [64] * 10, DELTA) == pytest.approx(full, rel=1e-12)


def test_the_smallest_client_sets_the_record_level_epsilon():
    sizes = [50, 5000, 5000]
    both = acc.record_epsilon(3.0, sizes, [10] * 100, DELTA)
    small = acc.record_epsilon(3.0, [50], [10] * 100, DELTA)
    large = acc.record_epsilon(3.0, [5000], [10] * 100, DELTA)
    assert both == small > large


def test_calibrated_noise_meets_the_target_and_no_less_does():
    sizes, batches = [1000, 1200], [10] * 200
    z = acc.calibrate_noise(1.0, DELTA, sizes, batches)
    assert acc.record_epsilon(z, sizes, batches, DELTA) <= 1.0
    assert acc.record_epsilon(0.999 * z, sizes, batches, DELTA) > 1.0


@pytest.mark.parametrize("call, match", [
    (lambda: acc.record_epsilon(0.0, [10], [5], DELTA), "noise_multiplier"),
    (lambda: acc.record_epsilon(1.0, [10], [5], 1.5), "delta"),
    (lambda: acc.record_epsilon(1.0, [0], [5], DELTA), "rows"),
    (lambda: acc.calibrate_noise(-1.0, DELTA, [10], [5]), "target_epsilon"),
    (lambda: acc.calibrate_noise(1.0, DELTA, [10], []), "no rounds"),
])
def test_bad_arguments_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()
