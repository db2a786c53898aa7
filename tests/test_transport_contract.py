"""The transport contract every engine keeps: participants, dropouts, extra request arrays.

``stream(request, participants, tolerate_failures)`` yields in the order of ``participants``;
with ``tolerate_failures`` a client that raised, died or timed out yields a Dropout and the
transport answers the next request from every client (a dead process client is restarted).
"""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np
import pytest

import ssca_solver as ss
from ssca_solver.federated import (Dropout, InProcessTransport, ProcessTransport, Reply, Request,
                                   build_clients)

NUM = 4


def _handler(c, r):
    if r.config.get("raise_on") == c.index:
        raise KeyError(f"client {c.index} has no such row")
    if r.config.get("sleep_on") == c.index:
        time.sleep(30)
    extra = r.arrays.get("extra", np.zeros(1))
    assert "extra" not in r.arrays or not extra.flags.writeable     # read-only, like w
    return c.reply(r, {"a": np.array([c.index, r.round, float(extra.sum())]),
                       "pid": np.array([os.getpid()])})


def _transport(kind, timeout=20.0):
    data = ss.FederatedData([(np.full((4, 3), float(i)), np.ones(4)) for i in range(NUM)])
    clients = build_clients(data, 1, {"t": _handler})
    return InProcessTransport(clients) if kind == "inprocess" else ProcessTransport(clients,
                                                                                    timeout)


@pytest.mark.parametrize("kind", ["inprocess", "process"])
def test_participants_are_asked_in_their_order_and_extra_arrays_reach_them(kind):
    with _transport(kind) as t:
        req = Request("t", 3, np.zeros(2), {}, {"extra": np.arange(5.0)})
        assert req.num_floats() == 2 + 5
        replies = t.exchange(req, participants=[2, 0, 3])
        assert [r.client for r in replies] == [2, 0, 3]
        assert [r.arrays["a"][2] for r in replies] == [10.0] * 3
        assert [r.client for r in t.exchange(req)] == list(range(NUM))
        for bad in ([0, 0], [NUM], [-1], [True]):
            with pytest.raises(ValueError, match="participants"):
                t.exchange(req, participants=bad)


@pytest.mark.parametrize("kind", ["inprocess", "process"])
def test_a_raising_client_is_a_dropout_when_tolerated_and_an_error_otherwise(kind):
    with _transport(kind) as t:
        req = Request("t", 1, np.zeros(2), {"raise_on": 1})
        out = t.exchange(req, participants=[0, 1, 2], tolerate_failures=True)
        assert [type(r) for r in out] == [Reply, Dropout, Reply]
        assert out[1] == Dropout(1, "t", 1, out[1].error)
        assert out[1].error.startswith("KeyError: ") and "no such row" in out[1].error
        with pytest.raises(KeyError):
            t.exchange(req)
        assert len(t.exchange(Request("t", 2, np.zeros(2), {}))) == NUM


def _kill(pids):
    """SIGKILL exactly the client processes a test started (some may be gone already)."""
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="signals and fork")
def test_a_killed_process_client_is_a_dropout_and_is_restarted():
    with _transport("process") as t:
        pids = list(t.pids)
        try:
            os.kill(pids[2], signal.SIGKILL)
            out = t.exchange(Request("t", 1, np.zeros(2), {}), tolerate_failures=True)
            assert [type(r) for r in out] == [Reply, Reply, Dropout, Reply]
            assert "SIGKILL" in out[2].error and out[2].client == 2
            assert t.pids[2] != pids[2] and t.pids[:2] == pids[:2]
            again = t.exchange(Request("t", 2, np.zeros(2), {}))
            assert [int(r.arrays["pid"][0]) for r in again] == t.pids
        finally:
            _kill(set(pids + t.pids))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="signals and fork")
def test_a_late_process_client_is_a_dropout_within_the_timeout():
    with _transport("process", timeout=1.0) as t:
        pids = list(t.pids)
        try:
            start = time.monotonic()
            out = t.exchange(Request("t", 1, np.zeros(2), {"sleep_on": 0}),
                             tolerate_failures=True)
            assert time.monotonic() - start < 10
            assert isinstance(out[0], Dropout) and "no answer within" in out[0].error
            assert [r.client for r in out[1:]] == [1, 2, 3]
            assert len(t.exchange(Request("t", 2, np.zeros(2), {}))) == NUM
        finally:
            _kill(set(pids + t.pids))
