"""No behaviour change from the reorganisation of issue 17: every iterate of a fixed set of runs
through every method (SSCA on both subproblem paths, Algorithms 1 and 2 with penalty steps,
fixed and adaptive batches, partial participation with secure aggregation, client processes;
FedAvg; primal-dual; augmented Lagrangian) equals the record (``tests/golden_runs.py``), and so
do the status, the message and the rounds.

Under the arithmetic the record was made with (:func:`golden_runs.arithmetic`: the same CPU
kernels and library versions) every iterate equals it to 1e-12 (relative to the largest
entry); under another, rounding differences grow over the rounds, so the iterates are compared
to 1e-5 (relative) there while the status, the message and the rounds must still be equal."""

import json

import numpy as np
import pytest

from golden_runs import RECORD, arithmetic, record_all, runs


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
    same = str(before.get("__arithmetic__", "")) == arithmetic()
    tol = 1e-12 if same else 1e-5
    for field in ("iterates", "x", "fun", "multipliers"):
        a, b = before[f"{name}/{field}"], now[f"{name}/{field}"]
        assert a.shape == b.shape, field
        np.testing.assert_allclose(b, a, rtol=0, atol=tol * max(1.0, float(np.max(np.abs(a),
                                                                                initial=0))),
                                   err_msg=f"{name}: {field}")
