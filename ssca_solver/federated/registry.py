"""Transports by name: ``solve(transport=NAME)`` builds the transport registered under NAME."""

from __future__ import annotations

import os
import sys
import warnings
from typing import Callable, Mapping, Optional, Sequence

from . import flower_options
from .client import Client
from .processes import ProcessTransport
from .threads import DEFAULT_CLIENT_THREADS, available_cpus, check_client_threads
from .timeouts import AUTO_FIRST
from .transport import InProcessTransport, Transport

#: ``client_threads`` of transport="flower": None, the Ray actors keep the thread count the
#: simulation gives them (this process's, so that the iterates equal the in-process ones bit
#: for bit); "auto" or a number limits them (docs/engines.md, "Threads")
FLOWER_CLIENT_THREADS = None


def _inprocess(clients, timeout):
    """``transport="inprocess"``: a number of seconds for ``client_timeout`` cannot be applied
    (the clients run in this process, one after the other, and cannot be interrupted), so it
    is warned about rather than silently ignored; "auto" and None need no warning."""
    if timeout is not None and not isinstance(timeout, str):
        warnings.warn(f"client_timeout={float(timeout):g} s does not apply to transport="
                      f"'inprocess': its clients run in this process, one after the other, and "
                      f"cannot be interrupted, so a client that never returns holds the solve; "
                      f"use transport='process' (or 'flower') for a limit that holds",
                      RuntimeWarning, stacklevel=_caller_outside_package())
    return InProcessTransport(clients)


def _caller_outside_package() -> int:
    """The stacklevel, seen from the function that calls this, of the first frame outside
    ssca_solver (the user's ``solve``), so that a warning points at the user's line."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    frame, level = sys._getframe(2), 2
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def _flower(clients, timeout, client_threads=FLOWER_CLIENT_THREADS, **options):
    """``transport="flower"``: imported when used (Flower is an optional extra)."""
    from .flower import make
    from .flower.clientapp import set_client_threads

    set_client_threads(clients, client_threads)
    return make(clients, timeout, **options)


def _check_process(given: dict) -> dict:
    return {"client_threads": check_client_threads(
        given.get("client_threads", DEFAULT_CLIENT_THREADS))}


def _check_flower(given: dict) -> dict:
    threads = check_client_threads(given.get("client_threads", FLOWER_CLIENT_THREADS))
    values = flower_options.check({k: v for k, v in given.items() if k != "client_threads"})
    if threads is not None and values["flower_engine"] == "deployment":
        raise ValueError("client_threads does not reach the SuperNodes of "
                         "flower_engine='deployment' (they run on their own machines): set "
                         "it where each node starts, in its node config (--node-config "
                         "\"partition-id=0 data='...' client-threads=1\")")
    return {**values, "client_threads": threads}


def _ray(clients, timeout, ray_address=None):
    """``transport="ray"``: imported when used (Ray is an optional extra)."""
    from .raytransport import RayTransport

    return RayTransport(clients, timeout, ray_address)


def _check_ray(given: dict) -> dict:
    from .raytransport import check_options

    return check_options(given)


#: name -> factory(clients, client_timeout, **its options) -> Transport
_TRANSPORTS: dict[str, Callable[..., Transport]] = {
    "inprocess": _inprocess,
    "process": lambda clients, timeout, client_threads=DEFAULT_CLIENT_THREADS: ProcessTransport(
        clients, timeout, client_threads),
    "flower": _flower,
    "ray": _ray,
}

#: the transports the library ships (they take client_timeout="auto" as it is)
_BUILTIN = frozenset(_TRANSPORTS)

#: name -> (its own solve options {name: default}, check(given) -> values): the factory takes
#: the checked values as keywords. ``client_threads`` (clients in other processes: their
#: BLAS/OpenMP/Numba threads) belongs to "process" and "flower".
_OPTIONS: dict[str, tuple[Mapping, Callable[[dict], dict]]] = {
    "process": ({"client_threads": DEFAULT_CLIENT_THREADS}, _check_process),
    "flower": ({**flower_options.DEFAULTS, "client_threads": FLOWER_CLIENT_THREADS},
               _check_flower),
    "ray": ({"ray_address": None}, _check_ray),
}

#: transports whose clients are the shards' workers under ``shards`` (a registered transport
#: too: its factory receives the workers as its clients); Flower keeps one client per
#: SuperNode
NOT_SHARDED = frozenset({"flower"})


def _defaults(defaults: Mapping) -> Callable[[dict], dict]:
    return lambda given: {**defaults, **given}


def register_transport(name: str, factory: Callable[..., Transport],
                       options: Optional[Mapping] = None,
                       check: Optional[Callable[[dict], dict]] = None) -> None:
    """Make ``solve(transport=name)`` use ``factory(clients, client_timeout, **options)``
    (``client_timeout``: seconds or None; the default "auto", which only the shipped
    transports adapt to measured answer times, reaches a registered one as 300 s).

    ``options``: the transport's own solve options {name: default} (names that no method
    option uses; a solve with another transport refuses them); ``check(given) -> values``
    checks the ones given and fills in the defaults (default: no check).

    The transport's ``stream(request, participants=None, tolerate_failures=False)`` must yield
    the replies of ``participants`` (None: every client) in that order, hand clients a
    read-only w and arrays (``request.read_only()``), raise
    :class:`~ssca_solver.errors.ClientError` (or the client's own exception) for a client that
    fails, or with ``tolerate_failures`` yield a :class:`~ssca_solver.federated.Dropout` for it
    and stay usable; and stop everything it started in ``close`` (see docs/architecture.md,
    "Adding a transport").
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a transport name must be a non-empty string, got {name!r}")
    if not callable(factory):
        raise TypeError("factory must be callable(clients, client_timeout) -> Transport")
    _TRANSPORTS[name] = factory
    _OPTIONS.pop(name, None)
    if options:
        _OPTIONS[name] = (dict(options), check or _defaults(dict(options)))


def transport_names() -> tuple[str, ...]:
    return tuple(_TRANSPORTS)


def transport_options(name: str) -> tuple[str, ...]:
    """The solve options the transport ``name`` takes (besides ``client_timeout``)."""
    return tuple(_OPTIONS[name][0]) if name in _OPTIONS else ()


def transport_option_names() -> tuple[str, ...]:
    """Every registered transport's own options (the names a solve accepts besides the
    method's)."""
    return tuple(dict.fromkeys(k for defaults, _ in _OPTIONS.values() for k in defaults))


def check_transport_options(name: str, given: dict) -> dict:
    """The options of transport ``name`` checked, with its defaults; options of another
    transport are an error (they would be ignored)."""
    mine = transport_options(name)
    other = [k for k in given if k not in mine]
    if other:
        owners = [repr(t) for t, (d, _) in _OPTIONS.items() if other[0] in d] or ["'?'"]
        hint = ""
        if "client_threads" in other and name == "inprocess":
            hint = ("; in-process clients run in your own process: limit its threads around "
                    "the solve, e.g. `with threadpoolctl.threadpool_limits(1): "
                    "prob.solve(...)` (docs/engines.md, \"Threads\")")
        raise ValueError(f"{', '.join(other)} only apply to transport={' or '.join(owners)} "
                         f"(the transport is {name!r}){hint}")
    return _OPTIONS[name][1](dict(given)) if name in _OPTIONS else {}


def make_transport(name: str, clients: Sequence[Client], timeout: Optional[float],
                   opts=None) -> Transport:
    """The transport registered as ``name`` over ``clients``; ``opts`` (the parsed
    RunOptions) supplies the transport's own options, checked (``opts.transport_options``),
    and ``shards``: the clients then go in that many shards (:mod:`.shards`), carried by the
    transport as its clients ("inprocess": in this process, without a carrier). "ray"
    without ``shards`` makes one shard per CPU of this machine (at most one per client)."""
    try:
        factory = _TRANSPORTS[name]
    except KeyError:
        raise ValueError(f"transport must be one of {', '.join(map(repr, _TRANSPORTS))}, got "
                         f"{name!r}") from None
    extra = dict(opts.transport_options) if opts is not None else {}
    if name not in _BUILTIN and isinstance(timeout, str) and timeout == "auto":
        # a registered transport receives seconds or None (only the built-in ones adapt
        # the limit): the first-request allowance of the built-in ones
        timeout = AUTO_FIRST
    shards = getattr(opts, "shards", None)
    if shards is None and name == "ray":
        shards = min(len(clients), available_cpus())
    if shards is None:
        return factory(clients, timeout, **extra)
    from .shards import ShardedTransport

    if name == "inprocess":
        return ShardedTransport(clients, shards)
    return ShardedTransport(clients, shards,
                            carrier=lambda workers: factory(workers, timeout, **extra))
