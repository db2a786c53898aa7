"""The two engines that give :class:`~.transport.FlowerTransport` a :class:`~.grid.GridSession`:
``_Simulation`` (Flower's Simulation Runtime in a thread of this process) and ``_Deployment``
(a Flower App submitted to a SuperLink with ``flwr run``, whose ``ServerApp``, ``relay_app``,
connects back to this process and relays its calls to the Grid, :func:`_relay_main`)."""

from __future__ import annotations

import concurrent.futures.thread  # noqa: F401  (its exit hook first, so ours runs before it)
import contextlib
import hashlib
import json
import os
import queue
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from multiprocessing.connection import Client as _ConnClient
from multiprocessing.connection import Listener
from typing import Optional, Sequence

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from ...errors import ClientError
from ..client import Client
from .clientapp import client_app, end_busy
from .grid import GridSession

ENGINES = ("simulation", "deployment")


def _same_blas_threads() -> dict:
    """Give the Ray actors this process's BLAS thread count (Ray starts workers with one
    thread, and a matrix product split over another number of threads rounds differently: the
    iterates would differ from the in-process ones in the last bits). Sets the variables in
    ``os.environ`` while the simulation starts (Ray's processes inherit them); returns the old
    values to restore."""
    try:
        from threadpoolctl import threadpool_info
        counts = [i["num_threads"] for i in threadpool_info()
                  if i.get("user_api") == "blas"]
    except Exception:                    # threadpoolctl missing: BLAS's own default
        counts = []
    n = str(max(counts) if counts else (os.cpu_count() or 1))
    saved = {}
    for k in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
        if k not in os.environ:          # a value the user set is inherited as it is
            saved[k] = None
            os.environ[k] = n
    return saved


#: seconds close() waits for the Simulation Runtime to stop before it shuts Ray down
CLOSE_WAIT = 15.0
#: simulations not closed yet: closed at interpreter exit before Python joins the Simulation
#: Runtime's worker threads (concurrent.futures does at exit, and would wait for them forever)
_LIVE: "weakref.WeakSet" = weakref.WeakSet()
#: the threads that finish the stop of simulations closed with ``wait=False`` (the Runtime's
#: and Ray's shutdown, a few seconds): a new simulation waits for them before it starts (Ray
#: is one per process), and so does the interpreter at exit
_STOPPING: list = []
_STOPPING_LOCK = threading.Lock()


def wait_stopped(timeout: Optional[float] = None) -> bool:
    """Wait until every simulation closed so far has stopped (at most ``timeout`` seconds
    each; None: as long as their stop takes, itself bounded by 2 x CLOSE_WAIT); whether they
    all have."""
    with _STOPPING_LOCK:
        threads = list(_STOPPING)
    for th in threads:
        th.join(timeout)
    with _STOPPING_LOCK:
        _STOPPING[:] = [th for th in _STOPPING if th.is_alive()]
        return not _STOPPING


def _close_live() -> None:
    for sim in list(_LIVE):
        with contextlib.suppress(Exception):
            sim.close()
    with contextlib.suppress(Exception):
        wait_stopped()


if hasattr(threading, "_register_atexit"):     # runs before concurrent.futures' exit hook
    threading._register_atexit(_close_live)


class _Simulation:
    """Flower's Simulation Runtime in a thread; its ServerApp hands over the Grid and waits."""

    def __init__(self, clients: Sequence[Client], start_timeout: float,
                 backend_config: Optional[dict]):
        from flwr.simulation import run_simulation

        wait_stopped()          # an earlier simulation's Ray must be down before this one's starts
        self._stop = threading.Event()
        #: where a client busy with a request marks its process (clientapp.deadline_guard)
        self.busy = tempfile.mkdtemp(prefix="ssca-flower-busy-")
        grids: queue.Queue = queue.Queue()
        self._failure: list = []
        server = ServerApp()

        @server.main()
        def main(grid: Grid, context: Context) -> None:
            grids.put(grid)
            self._stop.wait()

        config = backend_config if backend_config is not None else {
            # max_restarts: an actor whose process ended (a client past its deadline, a node
            # that died) is started again, so the pool keeps its size
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0, "max_restarts": -1},
            "init_args": {"logging_level": "error", "log_to_driver": False}}

        def run():
            try:
                run_simulation(server, client_app(clients), num_supernodes=len(clients),
                               backend_config=config)
            except BaseException as exc:    # reported by the transport
                self._failure.append(exc)
            finally:
                grids.put(None)

        self._thread = threading.Thread(target=run, name="ssca-flower-simulation",
                                        daemon=True)
        _LIVE.add(self)
        saved = _same_blas_threads()
        try:
            self._thread.start()
            try:
                grid = grids.get(timeout=start_timeout)
            except queue.Empty:
                self.close()
                raise ClientError(0, "start", f"Flower's simulation did not start within "
                                  f"flower_start_timeout={start_timeout:g} s") from None
            if grid is None:
                raise RuntimeError("Flower's simulation ended before it started") from (
                    self._failure[0] if self._failure else None)
            try:
                self.session = GridSession(grid, len(clients), start_timeout)
            except BaseException:
                self.close()
                raise
        finally:               # the actors run by now, with the environment they started with
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def close(self, wait: bool = True) -> None:
        """End the clients still busy (their answers are not wanted any more:
        :func:`~.clientapp.end_busy`), let the ServerApp return and the Simulation Runtime
        stop; if it still runs after CLOSE_WAIT seconds (a client busy where its mark could
        not be written), shut Ray down under it.

        ``wait=False``: return once the busy clients are ended and the stop is asked for; the
        Runtime's and Ray's shutdown (a few seconds) finish in a thread that the next
        simulation, and the interpreter at exit, wait for (:func:`wait_stopped`). A solve that
        failed (a client past ``client_timeout``) then raises without waiting for it."""
        if self not in _LIVE:             # closed already
            if wait:
                wait_stopped()
            return
        _LIVE.discard(self)
        self._stop.set()
        end_busy(self.busy)
        if wait:
            self._finish()
            return
        th = threading.Thread(target=self._finish, name="ssca-flower-stop")   # not a daemon
        with _STOPPING_LOCK:
            _STOPPING.append(th)
        th.start()

    def _finish(self) -> None:
        self._thread.join(timeout=CLOSE_WAIT)
        if self._thread.is_alive():
            end_busy(self.busy)
            with contextlib.suppress(Exception):
                import ray
                ray.shutdown()
            self._thread.join(timeout=CLOSE_WAIT)
        shutil.rmtree(self.busy, ignore_errors=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def split_address(name: str, value) -> tuple[str, int]:
    """``"host:port"`` -> (host, port), checked (option values of the deployment engine)."""
    if not isinstance(value, str) or value.count(":") < 1:
        raise ValueError(f"{name} must be 'host:port', got {value!r}")
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{name} must be 'host:port' with a port in 0..65535, got {value!r}")
    return host.strip("[]"), int(port)


_APP_PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "ssca-flower-relay"
version = "1.0.0"
description = "ssca-solver: relays the solver's requests to the Flower Grid"
license = "BSD-3-Clause"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "ssca-solver"

[tool.flwr.app.components]
serverapp = "ssca_relay:serverapp"
clientapp = "ssca_relay:clientapp"

[tool.flwr.app.config]
bridge = ""
key = ""
"""

_APP_MODULE = """\
\"\"\"The ServerApp of ssca-solver's Flower deployment engine (written by the transport).\"\"\"
from ssca_solver.federated.flower.clientapp import node_app
from ssca_solver.federated.flower.engines import relay_app

serverapp = relay_app     # relays the solver's requests to the Grid
clientapp = node_app      # on each SuperNode: the client of its partition-id
"""


def _relay_main(grid: Grid, context: Context) -> None:
    """The deployment ServerApp: connect back to the solver and serve its GridSession calls."""
    host, port = split_address("bridge", str(context.run_config["bridge"]))
    conn = _ConnClient((host, port), authkey=bytes.fromhex(str(context.run_config["key"])))
    try:
        num_clients, start_timeout, extra, blob = conn.recv()
        try:
            session = GridSession(grid, num_clients, start_timeout, extra, blob)
            conn.send(("ok", None))
        except Exception as exc:
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
            return
        while True:
            try:
                call = conn.recv()
            except EOFError:
                return
            if call is None:
                return
            name, args = call
            try:
                conn.send(("ok", getattr(session, name)(*args)))
            except Exception as exc:
                conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()


#: the deployment App's ServerApp (the SuperLink starts it for each ``flwr run``)
relay_app = ServerApp()
relay_app.main()(_relay_main)


class _Deployment:
    """A run on a SuperLink: ``flwr run`` submits the relay App; its ServerApp connects back."""

    def __init__(self, clients: Sequence[Client], superlink: str, bridge: str,
                 start_timeout: float, timeout: Optional[float]):
        import cloudpickle

        split_address("flower_superlink", superlink)
        host, port = split_address("flower_bridge", bridge)
        self.timeout = timeout
        key = secrets.token_bytes(32)
        self._listener = Listener((host, port), authkey=key)
        host, port = self._listener.address[:2]
        self._conn = None
        self._dir = tempfile.mkdtemp(prefix="ssca-flower-app-")
        self.run_id = None
        try:
            app = os.path.join(self._dir, "app")
            home = os.path.join(self._dir, "flwr-home")
            os.makedirs(app)
            os.makedirs(home)
            with open(os.path.join(app, "pyproject.toml"), "w") as f:
                f.write(_APP_PYPROJECT)
            with open(os.path.join(app, "ssca_relay.py"), "w") as f:
                f.write(_APP_MODULE)
            with open(os.path.join(home, "config.toml"), "w") as f:
                f.write(f'[superlink]\ndefault = "ssca"\n\n[superlink.ssca]\n'
                        f'address = "{superlink}"\ninsecure = true\n')
            config = f"bridge='{host}:{port}' key='{key.hex()}'"
            flwr = shutil.which("flwr", path=os.path.dirname(sys.executable)) or "flwr"
            deadline = time.monotonic() + start_timeout
            while True:          # the SuperLink may still be starting: retry while unavailable
                out = subprocess.run(
                    [flwr, "run", app, "ssca", "--run-config", config, "--format", "json"],
                    capture_output=True, text=True, cwd=self._dir,
                    timeout=max(1.0, deadline - time.monotonic()),
                    env={**os.environ, "FLWR_HOME": home})
                try:
                    answer = json.loads(out.stdout)
                except ValueError:
                    answer = {}
                if out.returncode == 0 and answer.get("success"):
                    break
                text = (out.stdout + out.stderr).strip()
                if "unavailable" not in text or time.monotonic() + 1 > deadline:
                    raise RuntimeError(f"'flwr run' failed (exit {out.returncode}) with the "
                                       f"SuperLink at {superlink}: {text[-2000:]}")
                time.sleep(1.0)
            self.run_id = answer.get("run-id")
            self._conn = self._accept(start_timeout)
            blob, extra = {}, {}       # each client's own seed and task table
            for i, c in enumerate(clients):
                blob[i] = cloudpickle.dumps(c.tasks)
                extra[i] = {"seed": c.seed, "tasks_hash": hashlib.sha256(blob[i]).hexdigest()}
            self._conn.send((len(clients), start_timeout, extra, blob))
            self._result(start_timeout + 30)
        except BaseException:
            self.close()
            raise
        self.session = self

    def _accept(self, start_timeout: float):
        result: list = []

        def accept():
            with contextlib.suppress(Exception):
                result.append(self._listener.accept())

        th = threading.Thread(target=accept, daemon=True)
        th.start()
        th.join(start_timeout)
        if not result:
            raise ClientError(0, "start", f"the Flower ServerApp did not connect back within "
                              f"flower_start_timeout={start_timeout:g} s (is the SuperLink at "
                              "flower_superlink running, and can it reach flower_bridge?)")
        return result[0]

    def _result(self, wait: Optional[float]):
        if wait is not None and not self._conn.poll(wait):
            raise ClientError(0, "start", f"the Flower ServerApp did not answer within "
                              f"{wait:g} s")
        kind, value = self._conn.recv()
        if kind == "error":
            raise RuntimeError(f"the Flower ServerApp failed: {value}")
        return value

    def _call(self, name: str, *args, wait: Optional[float] = None):
        self._conn.send((name, args))
        return self._result(wait)

    def send(self, request, participants, ttl, guard=None):
        return self._call("send", request, list(participants), ttl, guard, wait=ttl)

    def poll(self, token, wait):
        return self._call("poll", token, wait, wait=wait + 60)

    def forget(self, token):
        return self._call("forget", token, wait=60)

    def close(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.send(None)
            with contextlib.suppress(Exception):
                self._conn.close()
            self._conn = None
        with contextlib.suppress(Exception):
            self._listener.close()
        shutil.rmtree(self._dir, ignore_errors=True)
