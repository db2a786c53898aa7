"""No behaviour change from the reorganisation of issue 17: every iterate of a fixed set of runs
through every method (SSCA on both subproblem paths, Algorithms 1 and 2 with penalty steps,
fixed and adaptive batches, partial participation with secure aggregation, client processes;
FedAvg; primal-dual; augmented Lagrangian) equals, to 1e-12, the record made before it
(``tests/golden_runs.py``), and so do the status, the message and the rounds."""

import json

import numpy as np
import pytest

from golden_runs import RECORD, record_all, runs


@pytest.fixture(scope="module")
def now():
    return record_all()


@pytest.fixture(scope="module")
def before():
    with np.load(RECORD) as z:
        return {k: z[k] for k in z.files}


@pytest.mark.parametrize("name", sorted(runs()))
def test_same_iterates_status_and_message(name, now, before):
    old, new = json.loads(str(before[f"{name}/outcome"])), json.loads(str(now[f"{name}/outcome"]))
    assert new == old
    for field in ("iterates", "x", "fun", "multipliers"):
        a, b = before[f"{name}/{field}"], now[f"{name}/{field}"]
        assert a.shape == b.shape, field
        np.testing.assert_allclose(b, a, rtol=0, atol=1e-12 * max(1.0, float(np.max(np.abs(a),
                                                                                 initial=0))),
                                   err_msg=f"{name}: {field}")
