"""The federated layer: clients keep their rows and answer tasks by name.

Algorithms 1 and 2, steps 3-4: the server broadcasts w_t; client i draws its own mini-batch and
returns statistics. This layer only carries requests to task handlers that an algorithm
registered (:mod:`ssca_solver.methods`) and brings the replies back; it knows no algorithm.
"""

from .client import Client, TaskHandler, build_clients
from .messages import AGGREGATE, Dropout, Reply, Request, aggregation_weight, array
from .registry import make_transport, register_transport, transport_names
from .processes import ProcessTransport
from .timeouts import DEFAULT_CLIENT_TIMEOUT, ClientTimeout
from .transport import InProcessTransport, Transport

__all__ = ["Client", "TaskHandler", "build_clients", "AGGREGATE", "Dropout", "Reply", "Request",
           "aggregation_weight", "array",
           "DEFAULT_CLIENT_TIMEOUT", "ClientTimeout", "InProcessTransport", "ProcessTransport",
           "Transport",
           "make_transport", "register_transport", "transport_names"]
