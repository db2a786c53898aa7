"""Transports by name: ``solve(transport=NAME)`` builds the transport registered under NAME."""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from .client import Client
from .transports import InProcessTransport, ProcessTransport, Transport



def _flower(clients, timeout, **options):
    """``transport="flower"``: imported when used (Flower is an optional extra)."""
    from .flower import make

    return make(clients, timeout, **options)


#: name -> factory(clients, client_timeout, **its options) -> Transport
_TRANSPORTS: dict[str, Callable[..., Transport]] = {
    "inprocess": lambda clients, timeout: InProcessTransport(clients),
    "process": lambda clients, timeout: ProcessTransport(clients, timeout),
    "flower": _flower,
}

#: name -> the solve options (RunOptions fields) its factory takes as keywords
_OPTIONS: dict[str, tuple[str, ...]] = {
    "flower": ("flower_engine", "flower_superlink", "flower_bridge", "flower_start_timeout"),
}


def register_transport(name: str, factory: Callable[..., Transport]) -> None:
    """Make ``solve(transport=name)`` use ``factory(clients, client_timeout)``.

    The transport's ``stream(request, participants=None, tolerate_failures=False)`` must yield
    the replies of ``participants`` (None: every client) in that order, hand clients a
    read-only w and arrays (``request.read_only()``), raise
    :class:`~ssca_solver.errors.ClientError` (or the client's own exception) for a client that
    fails, or with ``tolerate_failures`` yield a :class:`~ssca_solver.federated.Dropout` for it
    and stay usable; and stop everything it started in ``close`` (see docs/architecture.md).
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"a transport name must be a non-empty string, got {name!r}")
    if not callable(factory):
        raise TypeError("factory must be callable(clients, client_timeout) -> Transport")
    _TRANSPORTS[name] = factory
    _OPTIONS.pop(name, None)


def transport_names() -> tuple[str, ...]:
    return tuple(_TRANSPORTS)


def transport_options(name: str) -> tuple[str, ...]:
    """The solve options the transport ``name`` takes (besides ``client_timeout``)."""
    return _OPTIONS.get(name, ())


def make_transport(name: str, clients: Sequence[Client], timeout: Optional[float],
                   opts=None) -> Transport:
    """The transport registered as ``name`` over ``clients``; ``opts`` (the parsed
    RunOptions) supplies the options listed by :func:`transport_options`."""
    try:
        factory = _TRANSPORTS[name]
    except KeyError:
        raise ValueError(f"transport must be one of {', '.join(map(repr, _TRANSPORTS))}, got "
                         f"{name!r}") from None
    extra = {k: getattr(opts, k) for k in transport_options(name)} if opts is not None else {}
    return factory(clients, timeout, **extra)
