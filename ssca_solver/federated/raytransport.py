"""``transport="ray"``: the clients in shards, each shard a Ray actor.

Ray (https://docs.ray.io) runs the actors on a cluster: a local one that this transport starts
(bound to 127.0.0.1, its workers given this process's module search path, stopped at
``close``) unless Ray is already running in this process or
``ray_address`` names a running cluster (``"auto"``, or ``"ray://host:10001"``; the transport
then leaves it running). Each shard (:mod:`.shards`) is sent to its actor once, with its rows;
a request goes to every actor that holds a participant at once, and the answers are read in
shard order, each within ``client_timeout`` (:class:`~.timeouts.ClientTimeout`; "auto" allows
a task's first request :data:`~.timeouts.AUTO_FIRST` seconds, as for any transport that cannot
watch its clients' CPU time).

A failed actor is handled as a failed client process: an exception raised in it (a client's
function, without ``on_client_failure="drop"``) reaches the server as itself; an actor that
died or did not answer in time is killed and started afresh from its shard, and its clients
are Dropouts (``on_client_failure="drop"``) or a :class:`~ssca_solver.errors.ClientError`
names them. ``pids`` are the actors' process IDs.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from typing import Optional, Sequence

from ..errors import ClientError
from .messages import Dropout, Request, describe_error
from .threads import available_cpus
from .transport import TimedTransport, participant_order

#: the options of transport="ray" and their defaults
RAY_DEFAULTS = {"ray_address": None}


def ray_module():
    """``import ray``, or ImportError saying how to install it."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(f"transport='ray' needs Ray ({exc}): pip install "
                          "'ssca-solver[ray]'") from None
    return ray


def local_runtime_env() -> dict:
    """The runtime environment of a local cluster's workers: this process's module search
    path (its working directory included), so that the actors import the modules that
    define the problem's functions as this process does."""
    paths = [os.getcwd() if p == "" else p for p in sys.path]
    return {"env_vars": {"PYTHONPATH": os.pathsep.join(
        dict.fromkeys(p for p in paths if os.path.isdir(p)))}}


def check_options(given: dict) -> dict:
    """The options of transport="ray" checked: ``ray_address`` None or a string."""
    address = given.get("ray_address", RAY_DEFAULTS["ray_address"])
    if address is not None and not (isinstance(address, str) and address):
        raise ValueError(f"ray_address must be None (a local cluster), 'auto' or a cluster's "
                         f"address such as 'ray://host:10001', got {address!r}")
    return {"ray_address": address}


class _Holder:
    """The actor: holds one shard's worker and answers its requests."""

    def __init__(self, worker):
        self.worker = worker

    def pid(self) -> int:
        return os.getpid()

    def handle(self, request: Request):
        request.w.flags.writeable = False
        for a in request.arrays.values():
            a.flags.writeable = False
        return self.worker.handle(request)


class RayTransport(TimedTransport):
    """Each of ``clients`` (shard workers, :class:`~.shards.ShardWorker`) in a Ray actor
    (module docstring).

    Args:
      clients: objects with ``index`` and ``handle(request)`` (picklable: Ray sends them to
        the actors with cloudpickle, so closures and lambdas are fine).
      timeout: ``client_timeout`` (seconds, None or "auto").
      ray_address: None (a local cluster started here, unless Ray already runs in this
        process) or the address of a running cluster.
    """

    def __init__(self, clients: Sequence, timeout="auto", ray_address: Optional[str] = None):
        ray = self._ray = ray_module()
        self.timeout = timeout
        self._clients = tuple(clients)
        self.num_clients = len(self._clients)
        self._started = False
        if not ray.is_initialized():
            if ray_address is None:
                ray.init(num_cpus=available_cpus(), include_dashboard=False,
                         _node_ip_address="127.0.0.1", log_to_driver=True,
                         configure_logging=False, runtime_env=local_runtime_env())
            else:
                ray.init(address=ray_address, log_to_driver=True, configure_logging=False)
            self._started = True
        cpus = float(ray.cluster_resources().get("CPU", 1.0))
        share = min(1.0, cpus / max(1, self.num_clients))
        self._Actor = ray.remote(_Holder).options(num_cpus=share, max_restarts=0)
        self._held = [ray.put(c) for c in self._clients]     # sent once, reused on restart
        self._actors = [self._Actor.remote(h) for h in self._held]
        self.pids = ray.get([a.pid.remote() for a in self._actors])

    def _restart(self, i: int) -> None:
        ray = self._ray
        with contextlib.suppress(Exception):
            ray.kill(self._actors[i], no_restart=True)
        self._actors[i] = self._Actor.remote(self._held[i])
        self.pids[i] = ray.get(self._actors[i].pid.remote())

    def stream(self, request, participants=None, tolerate_failures=False):
        if not self._actors:
            raise RuntimeError("this transport is closed")
        ray = self._ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        order = participant_order(participants, self.num_clients)
        shared = ray.put(request)
        refs = [self._actors[i].handle.remote(shared) for i in order]
        start = time.monotonic()
        limit = self._timeout.seconds(request.task)
        slowest = None
        where = request.round if request.task != "evaluate" else "evaluation"
        for i, ref in zip(order, refs):
            left = None if limit is None else max(0.0, start + limit - time.monotonic())
            try:
                out = ray.get(ref, timeout=left)
            except RayTaskError as exc:          # raised in the actor: the worker's error
                cause = getattr(exc, "cause", None) or exc
                if tolerate_failures:
                    yield Dropout(i, request.task, request.round, describe_error(cause))
                    continue
                raise cause from None
            except (GetTimeoutError, RayActorError) as exc:
                late = isinstance(exc, GetTimeoutError)
                pid = self.pids[i]
                cause = (f"no answer within {self._timeout.describe(request.task)} (actor "
                         f"pid {pid})" if late else
                         f"its Ray actor (pid {pid}) died: {type(exc).__name__}")
                self._restart(i)
                if tolerate_failures:
                    yield Dropout(i, request.task, request.round, f"ClientError: {cause}")
                    continue
                raise ClientError(i, where, cause) from None
            took = time.monotonic() - start
            slowest = took if slowest is None else max(slowest, took)
            yield out
        if slowest is not None:
            self._timeout.record(request.task, slowest)

    def close(self) -> None:
        ray = self._ray
        for a in self._actors:
            with contextlib.suppress(Exception):
                ray.kill(a, no_restart=True)
        self._actors = []
        self._held = []
        if self._started:
            self._started = False
            with contextlib.suppress(Exception):
                ray.shutdown()
