"""transport="flower" with flower_engine="deployment": a SuperLink and two SuperNodes on
127.0.0.1 (free ports), each node loading its own rows from a .npz file named in its node
config. Slow (Flower 1.42 starts a fresh ClientApp process per message and polls every few
seconds): run with ``pytest -m slow tests/test_flower_deployment.py``. Every process is started
here, recorded by its PID and stopped by that PID."""

import os

import numpy as np
import pytest

pytest.importorskip("flwr", reason="Flower is an optional extra: pip install 'ssca-solver[flower]'")

import ssca_solver as ss  # noqa: E402
from problems.neyman_pearson import neyman_pearson  # noqa: E402
from conftest import HOOK_MARK, hooked_least_squares  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def federation(tmp_path_factory, cancer):
    """(SuperLink address, the FederatedData whose blocks the nodes hold, the PIDs)."""
    from ssca_solver.federated.flower import LocalFederation

    X, y = cancer
    data = ss.FederatedData.split(X, y, num_clients=2, seed=0)
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    with LocalFederation(data, tmp_path_factory.mktemp("federation")) as fed:
        assert len(fed.pids) == 3
        yield fed.superlink, data, fed.pids
        procs = fed.procs
    assert all(p.poll() is not None for p in procs)     # stopped, by their PIDs


def test_a_superlink_and_two_supernodes_give_the_in_process_iterates(federation):
    superlink, data, pids = federation
    prob = neyman_pearson(data, alpha=0.3)
    opts = dict(max_iter=4, penalty=(10.0,), batch_size=20, tau=0.1, seed=5, eval_every=2,
                check_gradients=False)
    runs = {}
    for transport, extra in (("inprocess", {}),
                             ("flower", dict(flower_engine="deployment", client_timeout=120,
                                             flower_superlink=superlink,
                                             flower_start_timeout=120))):
        xs = []
        res = prob.solve(transport=transport, callback=lambda it: xs.append(it.x.copy()),
                         **opts, **extra)
        runs[transport] = (np.array(xs), res)
    (xa, a), (xb, b) = runs["inprocess"], runs["flower"]
    assert xa.shape == (4, 31) and np.array_equal(xa, xb)
    assert np.array_equal(a.x, b.x) and a.communication == b.communication


def test_secure_aggregation_runs_on_the_deployment_runtime(federation):
    """The clients' secrets live in each node's Flower Context between the messages of one
    aggregation (Flower starts a fresh ClientApp process per message)."""
    superlink, data, pids = federation
    prob = neyman_pearson(data, alpha=0.3)
    opts = dict(max_iter=2, penalty=(10.0,), batch_size=20, tau=0.1, seed=5, eval_every=None,
                check_gradients=False, secure_aggregation=True)
    xs = {}
    for transport, extra in (("inprocess", {}),
                             ("flower", dict(flower_engine="deployment", client_timeout=120,
                                             flower_superlink=superlink,
                                             flower_start_timeout=120))):
        got = []
        prob.solve(transport=transport, callback=lambda it: got.append(it.x.copy()), **opts,
                   **extra)
        xs[transport] = np.array(got)
    assert xs["inprocess"].shape == (2, 31) and np.array_equal(xs["inprocess"], xs["flower"])


# -- a user function that never returns on a SuperNode ------------------------------------------

def _stuck_problem(flag):
    """Least squares on two clients; client 1's functions sleep for good once ``flag``
    exists (its rows are marked in column 0)."""
    import time

    def stuck_if_armed(X):
        if X[0, 0] == HOOK_MARK and os.path.exists(flag):
            time.sleep(10 ** 6)

    return hooked_least_squares(stuck_if_armed, num_clients=2)


def _descendants(pids) -> dict:
    """{pid: (state, command)} of every process below ``pids`` (from /proc)."""
    table = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        table[int(name)] = (int(fields[1]), fields[0], cmd)
    out, frontier = {}, list(pids)
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, state, cmd) in table.items():
            if ppid == parent and pid not in out:
                out[pid] = (state, cmd)
                frontier.append(pid)
    return out


def _running(pid: int):
    """The command line of process ``pid`` while it runs (None: gone or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] in "ZX":
                return None
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None


def test_a_stuck_function_on_a_supernode_is_ended_and_the_node_serves_the_next_run(tmp_path):
    """client_timeout=25 and client 1's function sleeps for good from round 2: the server
    raises on time, and the node's ClientApp process for that message (Flower starts one per
    message) ends itself max(5 s, the limit) after it took the message, so the node answers
    the next run. Before: the server raised on time, but the stuck process lived on (orphaned
    after the federation stopped) and the node answered no later run ("no Flower node
    answered for partition-id(s) [1] within flower_start_timeout=120 s")."""
    import signal
    import time

    from ssca_solver.federated.flower import LocalFederation

    flag = str(tmp_path / "stuck-now")
    prob = _stuck_problem(flag)
    seen: dict = {}
    opts = dict(transport="flower", flower_engine="deployment", flower_start_timeout=120,
                batch_size=5, seed=0, eval_every=None, check_gradients=False, tau=1.0)
    armed = {}

    def arm(it):
        if it.t == 1:
            armed["at"] = time.monotonic()
            open(flag, "w").close()

    (tmp_path / "federation").mkdir()
    fed = LocalFederation(prob.data, tmp_path / "federation")
    try:
        with pytest.raises(ss.ClientError, match=r"^client 1, round 2: no answer within "
                           r"client_timeout=25 s"):
            prob.solve(flower_superlink=fed.superlink, client_timeout=25, max_iter=3,
                       callback=arm, **opts)
        assert time.monotonic() - armed["at"] < 25 + 5     # a ClientApp starts in seconds
        os.remove(flag)
        node = fed.pids[2]

        def stuck():
            now = _descendants([node])
            seen.update(now)
            return [p for p, (state, cmd) in now.items()
                    if "flwr-clientapp" in cmd and state not in "ZX"]

        deadline = time.monotonic() + 25 + 25 + 30
        while stuck() and time.monotonic() < deadline:
            time.sleep(1.0)
        assert not stuck(), "the stuck ClientApp process was not ended"
        res = prob.solve(flower_superlink=fed.superlink, client_timeout=60, max_iter=2, **opts)
        assert res.nit == 2
    finally:
        seen.update(_descendants(fed.pids))
        fed.close()
        for pid, (state, cmd) in seen.items():
            # what the federation's close left (an orphaned ClientApp): only a process seen
            # below our nodes and still running the same command (not a PID used again)
            if _running(pid) == cmd:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
