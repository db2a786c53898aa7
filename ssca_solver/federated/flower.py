"""The Flower transport: the runner's requests travel as Flower messages to a ``ClientApp``.

``solve(transport="flower")`` runs the ordinary runner in the user's thread; its transport is a
:class:`FlowerTransport`, which hands each request to a Flower ``Grid`` (one message per
client, ``message_type="query.ssca"``) and yields the replies in client order. On the other
side a Flower ``ClientApp`` hosts the library's stateless :class:`~ssca_solver.federated.Client`
objects and answers with :meth:`Client.handle`. Two engines (option ``flower_engine``):

* ``"simulation"`` (default): Flower's Simulation Runtime in this process (``ServerApp`` in a
  thread, ``ClientApp`` instances in Ray actors). The ``ServerApp``'s ``main`` only hands its
  ``Grid`` to the transport and waits until the transport is closed. The clients (rows, seed,
  task table) reach the ``ClientApp`` through its closure; the virtual node with
  ``partition-id`` i hosts client i.
* ``"deployment"``: a running SuperLink (``flower_superlink``: the address of its HTTP APIs,
  one port in Flower 1.42) and one SuperNode per client, each started with
  ``--node-config "partition-id=i data='FILE.npz'"`` (``X`` and ``y`` in the file) or
  ``data='module:fn'`` (``fn(i)`` runs on the node and returns ``X`` or ``(X, y)``): the rows
  never leave the node (:func:`load_partition`).
  The transport writes a small Flower App, submits it with ``flwr run``; the SuperLink starts
  its ``ServerApp``, which connects back to this process over an authenticated local
  connection (``flower_bridge``) and relays the requests to its ``Grid``. The server sends
  each node the run's seed and the task table (pickled code, as a Flower App ships code to the
  nodes); nodes send back only arrays and scalars, which the server never unpickles.
  Secure aggregation's client secrets stay on the node between messages, in its Flower
  ``Context`` (Flower starts a fresh ClientApp process per message).

Every field of :class:`~ssca_solver.federated.messages.Request` and ``Reply`` crosses exactly
(arrays of any dtype through Flower's ``Array``, scalars through JSON, which keeps ints, floats,
bools, strings and None as they are), so the iterates equal those of ``transport="inprocess"``
bit for bit. A client whose code raises, a node that fails (Flower returns an error message) or
no answer within ``client_timeout`` seconds: with ``tolerate_failures=False`` a
:class:`~ssca_solver.errors.ClientError` naming the client and the round (a library error such as
``UserFunctionError`` keeps its type), with ``tolerate_failures=True`` a ``Dropout``; the
transport stays usable either way (each message has its own id, so a late reply can never
answer another request). See docs/engines.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
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
import traceback
from multiprocessing.connection import Client as _ConnClient
from multiprocessing.connection import Listener
from typing import Any, Iterator, Mapping, Optional, Sequence

import numpy as np

try:
    from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
except ImportError as exc:          # pragma: no cover - depends on the environment
    raise ImportError("transport='flower' needs Flower: pip install 'ssca-solver[flower]' "
                      f"(Python >= 3.11; flwr[simulation]==1.42.*): {exc}") from exc

from .. import errors
from ..data import ClientData
from ..errors import ClientError
from .client import Client
from .messages import Dropout, Reply, Request
from .transports import DEFAULT_CLIENT_TIMEOUT, Transport, participant_order

#: The Flower message type of every request (Flower allows train/evaluate/query[.action]).
MESSAGE_TYPE = "query.ssca"
ENGINES = ("simulation", "deployment")
#: Seconds to wait for every node to join and answer the handshake (option
#: ``flower_start_timeout``).
DEFAULT_START_TIMEOUT = 120.0

_META, _ARRAYS = "ssca.meta", "ssca.arrays"
#: the message classes that may cross; a node cannot make the server build anything else
_CLASSES = {"Request": Request, "Reply": Reply, "Dropout": Dropout}


# -- messages <-> Flower records ----------------------------------------------------------------

def _scalar(value, where: str):
    """A JSON-safe plain scalar (NumPy scalars become Python ones of the same kind)."""
    if isinstance(value, np.generic):
        value = value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"{where}: {value!r} ({type(value).__name__}) cannot cross the Flower "
                    "transport; config values must be int, float, bool, str or None")


def pack(obj, extra: Optional[Mapping[str, Any]] = None) -> RecordDict:
    """A :class:`Request`, :class:`Reply` or ``Dropout`` as a Flower ``RecordDict``, exactly.

    Arrays (single fields and mappings of arrays, any dtype) go into one ``ArrayRecord``;
    everything else into a JSON text that also records each field's kind and the arrays' order.
    ``extra`` adds JSON-safe metadata (read back by :func:`unpack`'s second value).
    """
    name = type(obj).__name__
    if _CLASSES.get(name) is not type(obj):
        raise TypeError(f"cannot send a {name} over the Flower transport")
    arrays: dict = {}
    spec: dict = {}
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if isinstance(v, np.ndarray):
            arrays[f.name] = Array(np.asarray(v))
            spec[f.name] = ["array"]
        elif isinstance(v, Mapping) and v and all(isinstance(a, (np.ndarray, np.generic))
                                                  for a in v.values()):
            for k, a in v.items():
                arrays[f"{f.name}/{k}"] = Array(np.asarray(a))
            spec[f.name] = ["arrays", [str(k) for k in v]]
        elif isinstance(v, Mapping):
            spec[f.name] = ["map", {str(k): _scalar(a, f"{name}.{f.name}[{k!r}]")
                                    for k, a in v.items()}]
        else:
            spec[f.name] = ["value", _scalar(v, f"{name}.{f.name}")]
    text = json.dumps({"class": name, "fields": spec, "extra": dict(extra or {})},
                      allow_nan=True)
    return RecordDict({_ARRAYS: ArrayRecord(arrays), _META: ConfigRecord({"json": text})})


def unpack(content: RecordDict):
    """(the message object, its extra metadata) from :func:`pack`'s record."""
    head = json.loads(content[_META]["json"])
    cls = _CLASSES[head["class"]]
    record = content[_ARRAYS]
    kwargs = {}
    for fname, (kind, *rest) in head["fields"].items():
        if kind == "array":
            kwargs[fname] = record[fname].numpy()
        elif kind == "arrays":
            kwargs[fname] = {k: record[f"{fname}/{k}"].numpy() for k in rest[0]}
        else:
            kwargs[fname] = rest[0]
    return cls(**kwargs), head["extra"]


def _error_record(exc: BaseException, client: int) -> RecordDict:
    """What a client sends when its code raised: type, text and traceback (no pickle)."""
    try:
        text = str(exc)
    except Exception:
        text = f"<str() of the {type(exc).__name__} failed>"
    info = {"client": client, "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
            "message": text, "traceback": traceback.format_exc()}
    return RecordDict({_META: ConfigRecord({"error": json.dumps(info)})})


class _Failure:
    """A client's failure as the server sees it: its code raised, or its node failed."""

    def __init__(self, cause: str, kind: str = "node", type_name: str = "",
                 message: str = "", tb: Optional[str] = None):
        self.cause, self.kind, self.type_name, self.message, self.tb = \
            cause, kind, type_name, message, tb


def _outcome(msg: Message, node: int):
    """A reply Message -> Reply, or a _Failure."""
    if msg.has_error():
        return _Failure(f"its Flower node {node} failed: {msg.error.reason}")
    content = msg.content
    meta = content[_META]
    if "error" in meta:
        info = json.loads(meta["error"])
        return _Failure(f"raised {info['type']}: {info['message']}", "raised",
                        info["type"], info["message"], info["traceback"])
    try:
        reply, _ = unpack(content)
    except Exception as exc:
        return _Failure(f"its reply could not be read ({type(exc).__name__}: {exc})")
    if not isinstance(reply, Reply):
        return _Failure(f"it answered with a {type(reply).__name__}, not a Reply")
    return reply


# -- the client side ----------------------------------------------------------------------------

def _read_only(request: Request) -> Request:
    """The request with read-only arrays, as InProcessTransport hands it to clients."""
    for v in [request.w, *getattr(request, "arrays", {}).values()]:
        if isinstance(v, np.ndarray):
            v.flags.writeable = False
    return request


_STATE = "ssca.secagg-state"


def _restore_state(client: Client, context: Context) -> None:
    """Secure aggregation's secrets of this node, from its Flower Context (kept by the node's
    own SuperNode, or the simulation, between messages: a ClientApp process or Ray actor does
    not outlive a message), as plain arrays (:func:`secagg.export_state`; nothing unpickled)."""
    if _STATE in context.state:
        from . import secagg

        record = context.state[_STATE]
        secagg.import_state(client, {k: record[k].numpy() for k in record.keys()})
    elif getattr(client, "_secagg", None):
        client._secagg.clear()          # a store left by an earlier message in this process


def _save_state(client: Client, context: Context) -> None:
    if getattr(client, "_secagg", None) is None:
        return                          # no secure aggregation task ran here
    from . import secagg

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
        client = client_for(partition, context, extra, message.content)
        _restore_state(client, context)
        try:
            reply = client.handle(_read_only(request))
        finally:
            _save_state(client, context)
        return Message(pack(reply), reply_to=message)
    except BaseException as exc:         # travels to the server as text
        return Message(_error_record(exc, partition), reply_to=message)


def client_app(clients: Sequence[Client]) -> ClientApp:
    """A ``ClientApp`` whose node of ``partition-id`` i answers as ``clients[i]`` (simulation:
    the clients travel in the app's closure)."""
    table = {c.index: c for c in clients}

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


# -- the server side: one Grid ------------------------------------------------------------------

class GridSession:
    """Requests out and replies in through one Flower ``Grid`` (where the Grid lives).

    Args:
      grid: the ServerApp's Grid.
      num_clients: I; the handshake maps client i to the node whose ``partition-id`` is i.
      start_timeout: seconds to wait for every node to join and answer the handshake.
      extra: client -> metadata sent with each of its requests (deployment: its seed and
        task-table hash; None in simulation).
      tasks_blob: client -> its pickled task table (deployment; None in simulation).
    """

    def __init__(self, grid: Grid, num_clients: int, start_timeout: float,
                 extra: Optional[dict] = None, tasks_blob: Optional[dict] = None):
        self.grid = grid
        self.num_clients = int(num_clients)
        self.extra = dict(extra or {})
        self.tasks_blob = tasks_blob
        self.pending: dict = {}          # token -> {message id: client}
        self._next = 0
        self.nodes = self._handshake(float(start_timeout))

    def _handshake(self, start_timeout: float) -> dict:
        deadline = time.monotonic() + start_timeout
        hello = Request("hello", 0, np.zeros(0))
        found: dict = {}
        asked: set = set()
        pending: dict = {}
        while len(found) < self.num_clients:
            new = [n for n in self.grid.get_node_ids() if n not in asked]
            if new:
                msgs = [Message(pack(hello, {"hello": True}), dst_node_id=n,
                                message_type=MESSAGE_TYPE, group_id="hello") for n in new]
                for mid, n in zip(self.grid.push_messages(msgs), new):
                    pending[mid] = n
                asked.update(new)
            for msg in (self.grid.pull_messages(list(pending)) if pending else ()):
                n = pending.pop(msg.metadata.reply_to_message_id, None)
                if n is None:
                    continue
                if msg.has_error() or "partition" not in msg.content[_META]:
                    why = msg.error.reason if msg.has_error() else "no partition in its answer"
                    raise ClientError("?", "start", f"Flower node {n} failed the handshake: "
                                      f"{why}")
                p = int(msg.content[_META]["partition"])
                if not 0 <= p < self.num_clients:
                    raise ValueError(f"Flower node {n} has partition-id {p}, but there are "
                                     f"{self.num_clients} clients (partition-id 0.."
                                     f"{self.num_clients - 1})")
                if p in found:
                    raise ValueError(f"Flower nodes {found[p]} and {n} both have "
                                     f"partition-id {p}: give each node its own")
                found[p] = n
            if len(found) < self.num_clients:
                if time.monotonic() > deadline:
                    missing = sorted(set(range(self.num_clients)) - set(found))
                    raise ClientError(missing[0], "start", f"no Flower node answered for "
                                      f"partition-id(s) {missing} within flower_start_timeout="
                                      f"{start_timeout:g} s ({len(asked)} node(s) joined)")
                time.sleep(0.02)
        return found

    def send(self, request: Request, participants: Sequence[int], ttl: float) -> int:
        """Push one message per participant; a token for :meth:`poll`."""
        msgs = []
        for i in participants:
            content = pack(request, {**self.extra.get(i, {}), "client": int(i)})
            if self.tasks_blob is not None:
                content["ssca.tasks"] = ConfigRecord({"tasks": self.tasks_blob[i]})
            msgs.append(Message(content, dst_node_id=self.nodes[i], message_type=MESSAGE_TYPE,
                                group_id=str(request.round), ttl=ttl))
        ids = list(self.grid.push_messages(msgs))
        self._next += 1
        self.pending[self._next] = dict(zip(ids, participants))
        return self._next

    def poll(self, token: int, wait: float) -> list:
        """[(client, Reply or _Failure)] of the replies that arrived, waiting up to ``wait``
        seconds for at least one."""
        ids = self.pending.get(token, {})
        deadline = time.monotonic() + wait
        pause = 0.002
        while ids:
            out = []
            for msg in self.grid.pull_messages(list(ids)):
                i = ids.pop(msg.metadata.reply_to_message_id, None)
                if i is not None:
                    out.append((i, _outcome(msg, self.nodes[i])))
            if out or time.monotonic() >= deadline:
                return out
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(2 * pause, 0.02)
        return []

    def forget(self, token: int) -> None:
        self.pending.pop(token, None)


# -- engines ------------------------------------------------------------------------------------

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


class _Simulation:
    """Flower's Simulation Runtime in a thread; its ServerApp hands over the Grid and waits."""

    def __init__(self, clients: Sequence[Client], start_timeout: float,
                 backend_config: Optional[dict]):
        from flwr.simulation import run_simulation

        self._stop = threading.Event()
        grids: queue.Queue = queue.Queue()
        self._failure: list = []
        server = ServerApp()

        @server.main()
        def main(grid: Grid, context: Context) -> None:
            grids.put(grid)
            self._stop.wait()

        config = backend_config if backend_config is not None else {
            "client_resources": {"num_cpus": 1, "num_gpus": 0.0},
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

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


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
from ssca_solver.federated import flower

serverapp = flower.relay_app     # relays the solver's requests to the Grid
clientapp = flower.node_app      # on each SuperNode: the client of its partition-id
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

    def send(self, request, participants, ttl):
        return self._call("send", request, list(participants), ttl, wait=self.timeout)

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


# -- the transport ------------------------------------------------------------------------------

def _raise_failure(i: int, request: Request, failure: _Failure):
    where = request.round if request.task != "evaluate" else "evaluation"
    if failure.kind == "raised":
        module, _, name = failure.type_name.rpartition(".")
        cls = getattr(errors, name, None) if module == errors.__name__ else None
        if (isinstance(cls, type) and issubclass(cls, errors.SSCAError)   # built from its text
                and not any("__init__" in vars(k) for k in cls.__mro__
                            if k.__module__ == errors.__name__)):
            exc = cls(failure.message)
            exc.add_note(f"raised in client {i}, round {request.round} (Flower node); client "
                         f"traceback:\n{failure.tb}")
            raise exc
    raise ClientError(i, where, failure.cause, failure.tb)


class FlowerTransport(Transport):
    """Requests as Flower messages to a ``ClientApp`` hosting the clients (see the module).

    Args:
      clients: the clients (simulation: shipped to the ClientApp; deployment: only their seed
        and task table are used, each node loads its own rows).
      timeout: seconds a client may take to answer one request (``client_timeout``); None
        waits forever.
      engine: "simulation" or "deployment".
      superlink: the SuperLink's address (deployment), e.g. "127.0.0.1:9093".
      bridge: where this process listens for the deployment ServerApp ("host:port", port 0: a
        free one).
      start_timeout: seconds for the engine to start and every node to answer.
      backend_config: the simulation's Ray backend config (None: one CPU per node, quiet).
    """

    def __init__(self, clients: Sequence[Client], timeout: Optional[float] = DEFAULT_CLIENT_TIMEOUT,
                 engine: str = "simulation", superlink: Optional[str] = None,
                 bridge: str = "127.0.0.1:0", start_timeout: float = DEFAULT_START_TIMEOUT,
                 backend_config: Optional[dict] = None):
        if engine not in ENGINES:
            raise ValueError(f"flower_engine must be one of {ENGINES}, got {engine!r}")
        self.num_clients = len(clients)
        self.timeout = timeout
        self.engine = engine
        self._closed = False
        if engine == "simulation":
            self._engine = _Simulation(clients, start_timeout, backend_config)
        else:
            if superlink is None:
                raise ValueError("flower_engine='deployment' needs flower_superlink='host:port' "
                                 "(the SuperLink's --host:--port, e.g. 127.0.0.1:9093)")
            self._engine = _Deployment(clients, superlink, bridge, start_timeout, timeout)
        self._session = self._engine.session

    def stream(self, request: Request, participants=None,
               tolerate_failures: bool = False) -> Iterator:
        """Yield, in the order of ``participants`` (None: every client), each one's Reply, or a
        Dropout when it failed and ``tolerate_failures`` is True (else ClientError)."""
        if self._closed:
            raise RuntimeError("this transport is closed")
        order = participant_order(participants, self.num_clients)
        ttl = 3600.0 if self.timeout is None else max(self.timeout + 60.0, 60.0)
        token = self._session.send(request, order, ttl)
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        got: dict = {}
        try:
            for i in order:
                while i not in got:
                    left = 1.0 if deadline is None else deadline - time.monotonic()
                    if left <= 0:
                        cause = f"no answer within client_timeout={self.timeout:g} s"
                        for j in order:
                            got.setdefault(j, _Failure(cause))
                        break
                    for j, outcome in self._session.poll(token, min(left, 1.0)):
                        got[j] = outcome
                outcome = got.pop(i)
                if isinstance(outcome, Reply) and outcome.client != i:
                    outcome = _Failure(f"it answered as client {outcome.client}")
                if isinstance(outcome, Reply):
                    yield outcome
                elif tolerate_failures:
                    yield Dropout(i, request.task, request.round, outcome.cause)
                else:
                    _raise_failure(i, request, outcome)
        finally:
            with contextlib.suppress(Exception):
                self._session.forget(token)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._engine.close()


def make(clients, timeout, flower_engine="simulation", flower_superlink=None,
         flower_bridge="127.0.0.1:0", flower_start_timeout=DEFAULT_START_TIMEOUT):
    """The registry's factory for ``transport="flower"`` (options of the same names)."""
    return FlowerTransport(clients, timeout, flower_engine, flower_superlink, flower_bridge,
                           flower_start_timeout)


# -- a federation on this machine (tests, benchmarks, trying the deployment engine) -------------

class LocalFederation:
    """A SuperLink and one SuperNode per client on 127.0.0.1 (free ports), each node holding
    its client's rows in ``directory/client{i}.npz`` (node config ``partition-id=i
    data='...'``): what docs/engines.md runs by hand on several machines, here as child
    processes. Every process is recorded by PID (:attr:`pids`) and stopped by that PID in
    :meth:`close` (SIGTERM, then SIGKILL after ``grace`` seconds).

    Args:
      data: the FederatedData whose blocks the nodes hold.
      directory: where the .npz files, logs and FLWR_HOME go.
    """

    def __init__(self, data, directory, grace: float = 15.0):
        self.directory = os.fspath(directory)
        self.grace = grace
        self.procs: list = []
        port = _free_port()
        self.superlink = f"127.0.0.1:{port}"
        env = {**os.environ, "FLWR_HOME": os.path.join(self.directory, "flwr-home")}
        bindir = os.path.dirname(sys.executable)
        tool = lambda name: shutil.which(name, path=bindir) or name   # noqa: E731
        try:
            self._start([tool("flower-superlink"), "--insecure", "--host", "127.0.0.1",
                         "--port", str(port), "--disable-runtime-dependency-installation"],
                        "superlink.log", env)
            for i, c in enumerate(data.clients):
                path = os.path.join(self.directory, f"client{i}.npz")
                np.savez(path, **({"X": c.X} if c.y is None else {"X": c.X, "y": c.y}))
                self._start([tool("flower-supernode"), "--insecure", "--superlink",
                             self.superlink, "--port", str(_free_port()), "--node-config",
                             f"partition-id={i} data='{path}'"], f"supernode{i}.log", env)
        except BaseException:
            self.close()
            raise

    def _start(self, argv, log_name, env):
        with open(os.path.join(self.directory, log_name), "w") as log:
            self.procs.append(subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                               env=env, stdin=subprocess.DEVNULL))

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + self.grace
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
