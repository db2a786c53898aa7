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

The package, by role: ``codec`` (messages <-> Flower records), ``clientapp`` (the
``ClientApp``s and the nodes' clients), ``grid`` (:class:`GridSession`, one run's Grid),
``engines`` (the simulation and deployment engines, the deployment's relay ``ServerApp``),
``transport`` (:class:`FlowerTransport` and the registry's :func:`make`) and ``launcher``
(:class:`LocalFederation`, a federation on this machine).
"""

from __future__ import annotations

try:
    import flwr.app  # noqa: F401
    import flwr.clientapp  # noqa: F401
    import flwr.serverapp  # noqa: F401
except ImportError as exc:          # pragma: no cover - depends on the environment
    raise ImportError("transport='flower' needs Flower: pip install 'ssca-solver[flower]' "
                      f"(Python >= 3.11; flwr[simulation]==1.42.*): {exc}") from exc

from ..messages import Dropout, Reply, Request
from .clientapp import client_app, load_callable, load_partition, node_app
from .codec import MESSAGE_TYPE, pack, unpack
from .engines import ENGINES, relay_app, split_address
from .grid import GridSession
from .launcher import LocalFederation
from .transport import DEFAULT_START_TIMEOUT, FlowerTransport, make

__all__ = [
    "DEFAULT_START_TIMEOUT", "ENGINES", "MESSAGE_TYPE", "Dropout", "FlowerTransport",
    "GridSession", "LocalFederation", "Reply", "Request", "client_app", "load_callable",
    "load_partition", "make", "node_app", "pack", "relay_app", "split_address", "unpack",
]
