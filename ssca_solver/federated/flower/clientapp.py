"""The client side: the ``ClientApp`` that answers the server's messages with
:meth:`Client.handle`, secure aggregation's client secrets kept in the node's Flower
``Context`` between messages, and (deployment) each SuperNode's client built from its own rows
(:func:`load_partition`) and the task table the server sends."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import os
import signal
import sys
import threading
import time
from typing import Optional, Sequence

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from ...model.data import ClientData
from ..client import Client
from ..messages import Request
from ..threads import available_cpus, client_thread_count, limit_threads
from .codec import _META, _error_record, pack, unpack


def _read_only(request: Request) -> Request:
    """The request with read-only arrays, as InProcessTransport hands it to clients."""
    for v in [request.w, *getattr(request, "arrays", {}).values()]:
        if isinstance(v, np.ndarray):
            v.flags.writeable = False
    return request


_STATE = "ssca.secagg-state"

#: A client still busy this many seconds past the server's deadline, or as long again as its
#: limit if that is longer, ends its own process (simulation: the Ray actor's worker; Ray starts
#: a new one): a late client may still finish by itself, a stuck one does not hold its actor.
KILL_GRACE = 5.0


def kill_time(deadline: float, limit: float) -> float:
    """When a client busy with a request due at ``deadline`` (limit ``limit`` seconds) ends its
    process: ``deadline + max(KILL_GRACE, limit)``."""
    return deadline + max(KILL_GRACE, limit)


def _start_time(pid: int) -> Optional[str]:
    """The start time of process ``pid`` (field 22 of /proc/PID/stat), None where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


@contextlib.contextmanager
def deadline_guard(kill_at: Optional[float], busy: Optional[str] = None):
    """End this process if the code in the block still runs at ``kill_at`` (a ``time.time()``;
    None: never): a user function that never returns must not hold the actor, the simulation's
    shutdown or the interpreter. From the main thread with SIGALRM at its default action the
    kernel ends the process (ITIMER_REAL), even inside C code that holds the GIL; otherwise a
    watchdog thread sends SIGKILL.

    ``busy``: a directory where, while the block runs, a file named by this process's PID
    holds its start time, so that the server can end the process at once when it closes
    (:func:`end_busy`)."""
    mark = None
    if busy is not None:
        with contextlib.suppress(OSError):
            mark = os.path.join(busy, str(os.getpid()))
            with open(mark, "w") as f:
                f.write(_start_time(os.getpid()) or "")
    try:
        if kill_at is None:
            yield
            return
        left = max(0.001, kill_at - time.time())
        if (hasattr(signal, "setitimer")
                and threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGALRM) == signal.SIG_DFL):
            signal.setitimer(signal.ITIMER_REAL, left)
            try:
                yield
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            return
        done = threading.Event()

        def watch():
            if not done.wait(left):
                os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=watch, name="ssca-deadline", daemon=True).start()
        try:
            yield
        finally:
            done.set()
    finally:
        if mark is not None:
            with contextlib.suppress(OSError):
                os.remove(mark)


def end_busy(busy: str) -> list:
    """SIGKILL every process that :func:`deadline_guard` marks busy in ``busy`` (checked by its
    start time, so a PID used again by another process is left alone); their PIDs."""
    ended = []
    with contextlib.suppress(OSError):
        for name in os.listdir(busy):
            if not name.isdigit():
                continue
            pid = int(name)
            try:
                with open(os.path.join(busy, name)) as f:
                    started = f.read().strip()
            except OSError:
                continue
            if started and _start_time(pid) == started:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                    ended.append(pid)
    return ended


#: the attribute of a simulation's Client that carries ``client_threads`` to its ClientApp (the
#: clients travel to the Ray actors in the app's closure): (threads, at_most) or absent
_THREADS = "_ssca_client_threads"
#: a deployment node's option: ``--node-config "... client-threads=N"`` (N or "auto")
NODE_THREADS = "client-threads"


def set_client_threads(clients: Sequence[Client], value) -> Optional[tuple]:
    """Make the simulation's ClientApp limit the thread pools of the processes that run
    ``clients`` (``client_threads``: None leaves them alone; "auto": at most
    max(1, CPUs // actors), the actors being min(clients, CPUs), Ray's one CPU each; n:
    exactly n). Returns (threads, at_most) or None."""
    threads = client_thread_count(value, min(len(clients), available_cpus()))
    for c in clients:
        if threads is None:
            if hasattr(c, _THREADS):
                delattr(c, _THREADS)
        else:
            setattr(c, _THREADS, threads)
    return threads


def _threads_for(client: Client, context: Context) -> Optional[tuple]:
    """(threads, at_most) for the process answering as ``client``: the simulation's
    ``client_threads``, or a deployment node's ``client-threads`` (its node config; "auto":
    the CPUs of its machine, which may host other nodes: give a number there)."""
    threads = getattr(client, _THREADS, None)
    if threads is None and NODE_THREADS in context.node_config:
        value = context.node_config[NODE_THREADS]
        if isinstance(value, str) and value.strip().isdigit():
            value = int(value)
        threads = client_thread_count(value, 1)
    return threads


#: (pid, (threads, at_most)) last applied in this process by :func:`_limit`
_LIMITED: list = [None]


def _limit(threads: Optional[tuple]) -> None:
    """Apply ``threads`` in this process: the pools and the environment once per process,
    Numba's count (per thread) on every message, in the thread that runs the client."""
    if threads is None:
        return
    if _LIMITED[0] != (os.getpid(), threads):
        limit_threads(*threads)
        _LIMITED[0] = (os.getpid(), threads)
        return
    with contextlib.suppress(Exception):
        import numba

        numba.set_num_threads(min(threads[0], int(numba.config.NUMBA_NUM_THREADS)))


def _restore_state(client: Client, context: Context) -> None:
    """Secure aggregation's secrets of this node, from its Flower Context (kept by the node's
    own SuperNode, or the simulation, between messages: a ClientApp process or Ray actor does
    not outlive a message), as plain arrays (:func:`secagg.export_state`; nothing unpickled)."""
    if _STATE in context.state:
        from .. import secagg

        record = context.state[_STATE]
        secagg.import_state(client, {k: record[k].numpy() for k in record.keys()})
    elif getattr(client, "_secagg", None):
        client._secagg.clear()          # a store left by an earlier message in this process


def _save_state(client: Client, context: Context) -> None:
    if getattr(client, "_secagg", None) is None:
        return                          # no secure aggregation task ran here
    from .. import secagg

    context.state[_STATE] = ArrayRecord({k: Array(np.ascontiguousarray(v))
                                         for k, v in secagg.export_state(client).items()})


def _answer(message: Message, context: Context, client_for) -> Message:
    """The ClientApp's handler: the request -> the client's Reply (or its error)."""
    partition = int(context.node_config["partition-id"])
    try:
        request, extra = unpack(message.content)
        if extra.get("hello"):
            content = RecordDict({_META: ConfigRecord({"partition": partition})})
            return Message(content, reply_to=message)
        if int(extra["client"]) != partition:
            raise RuntimeError(f"a request for client {extra['client']} reached the node of "
                               f"partition-id {partition}")
        deadline = extra.get("deadline")
        if deadline is not None and time.time() > deadline:
            raise TimeoutError("the request reached the client after the server's deadline "
                               "(client_timeout): not run")
        kill_at = extra.get("kill_at")
        if kill_at is None and extra.get("kill_in") is not None:
            # deployment: seconds from now (this node's clock), when this message's ClientApp
            # process ends if the client is still busy (the server gave up before that)
            kill_at = time.time() + float(extra["kill_in"])
        client = client_for(partition, context, extra, message.content)
        _limit(_threads_for(client, context))
        _restore_state(client, context)
        try:
            with deadline_guard(kill_at, extra.get("busy")):
                reply = client.handle(_read_only(request))
        finally:
            _save_state(client, context)
        return Message(pack(reply), reply_to=message)
    except BaseException as exc:         # travels to the server as text
        return Message(_error_record(exc, partition), reply_to=message)


class ClientTable:
    """The simulation's clients by ``partition-id``, as the ``ClientApp``'s closure holds them.

    Flower's Ray backend passes the ``ClientApp`` (its loader, whose closure holds the app) as
    an argument of every actor call, so whatever the app holds is pickled again for every
    message: the clients' rows and every function of the problem (cloudpickle writes a
    lambda's code and closure each time: 300 constraints as separate functions took 100 ms a
    message). Pickled where Ray is running, this table instead puts the clients into Ray's
    object store once and travels as a reference to them (:class:`SharedClientTable`), which
    each actor process reads at its first message and keeps. Elsewhere (no Ray) it pickles as
    the clients themselves. Keeping them is what the process engine does too: a client is
    stateless between messages (:mod:`ssca_solver.federated.client`), and secure
    aggregation's secrets travel in the node's ``Context`` (:func:`_restore_state`)."""

    def __init__(self, clients: Sequence[Client]):
        self.clients = {c.index: c for c in clients}
        self.key = os.urandom(16).hex()
        self._ref = None
        self._lock = threading.Lock()

    def __getitem__(self, partition: int) -> Client:
        return self.clients[partition]

    def __reduce__(self):
        ray = sys.modules.get("ray")
        if ray is None or not ray.is_initialized():
            return (ClientTable, (list(self.clients.values()),))
        with self._lock:                 # the backend may submit from more than one thread
            if self._ref is None:
                self._ref = ray.put(self.clients)
        return (SharedClientTable, (self.key, self._ref))


#: this process's copy of the last shared table it read: key -> {partition: Client}
_SHARED: dict = {}


class SharedClientTable:
    """A :class:`ClientTable` read from Ray's object store (``ref``) at its first lookup in
    this process, and kept for the later messages of the same table (``key``; a new table,
    i.e. a new solve, replaces it)."""

    def __init__(self, key: str, ref):
        self.key, self.ref = key, ref

    def __getitem__(self, partition: int) -> Client:
        clients = _SHARED.get(self.key)
        if clients is None:
            import ray

            clients = ray.get(self.ref)
            _SHARED.clear()
            _SHARED[self.key] = clients
        return clients[partition]


def client_app(clients: Sequence[Client]) -> ClientApp:
    """A ``ClientApp`` whose node of ``partition-id`` i answers as ``clients[i]`` (simulation:
    the clients travel in the app's closure as a :class:`ClientTable`)."""
    table = ClientTable(clients)

    def client_for(partition, context, extra, content):
        return table[partition]

    app = ClientApp()

    @app.query("ssca")
    def query(message: Message, context: Context) -> Message:
        return _answer(message, context, client_for)

    return app


#: deployment nodes: (task-table hash, seed, partition) -> Client, cached for the process
_NODE_CLIENTS: dict = {}
_NODE_DATA: dict = {}


def load_callable(spec: str):
    """``"package.module:function"`` -> the function (a node's data loader)."""
    if not isinstance(spec, str) or spec.count(":") != 1:
        raise ValueError(f"expected 'module:function', got {spec!r}")
    module, name = spec.split(":")
    fn = getattr(importlib.import_module(module), name, None)
    if not callable(fn):
        raise ValueError(f"{spec!r}: {module} has no callable {name!r}")
    return fn


def load_partition(spec: str, partition: int) -> ClientData:
    """A SuperNode's rows from its node config's ``data``: a ``.npz`` file with ``X`` (and
    ``y``), or ``"module:function"``, called as ``function(partition_id)`` and returning X or
    (X, y)."""
    if spec.endswith(".npz"):
        with np.load(spec, allow_pickle=False) as f:
            return ClientData(f["X"], f["y"] if "y" in f.files else None)
    loaded = load_callable(spec)(partition)
    X, y = loaded if isinstance(loaded, tuple) else (loaded, None)
    return ClientData(np.asarray(X), None if y is None else np.asarray(y))


def _node_client(partition, context, extra, content) -> Client:
    """On a SuperNode: the Client of this node's partition, its rows from its own loader."""
    import cloudpickle

    key = (extra["tasks_hash"], int(extra["seed"]), partition)
    client = _NODE_CLIENTS.get(key)
    if client is None:
        spec = context.node_config.get("data")
        if spec is None:
            raise ValueError("this SuperNode has no 'data' in its node config: start it with "
                             "--node-config \"partition-id=I data='FILE.npz'\" (or "
                             "data='module:function')")
        if (spec, partition) not in _NODE_DATA:
            _NODE_DATA[(spec, partition)] = load_partition(str(spec), partition)
        blob = content["ssca.tasks"]["tasks"]
        if hashlib.sha256(blob).hexdigest() != extra["tasks_hash"]:
            raise ValueError("the task table does not match its hash")
        tasks = cloudpickle.loads(blob)
        client = Client(partition, _NODE_DATA[(spec, partition)], int(extra["seed"]), tasks)
        _NODE_CLIENTS.clear()            # one run at a time per node process
        _NODE_CLIENTS[key] = client
    return client


#: the deployment App's ClientApp (``flwr run`` loads it on every SuperNode)
node_app = ClientApp()


@node_app.query("ssca")
def _node_query(message: Message, context: Context) -> Message:
    return _answer(message, context, _node_client)
