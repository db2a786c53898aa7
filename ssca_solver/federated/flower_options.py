"""The solve options of ``transport="flower"`` (registered with the transport, not part of the
methods' options), with their checks. Importable without Flower: the options are checked
before the transport is built, and a misspelled or misplaced one is an error even where
``flwr`` is not installed.

Options (docs/engines.md):

- ``flower_engine``: "simulation" (default: Flower's Simulation Runtime in this process) or
  "deployment" (a running SuperLink and one SuperNode per client).
- ``flower_superlink``: deployment: the SuperLink's address "host:port" (its --host/--port;
  e.g. "127.0.0.1:9093"); required there.
- ``flower_bridge``: deployment: "host:port" where this process listens for the ServerApp the
  SuperLink starts (default "127.0.0.1:0": a free port on this machine).
- ``flower_start_timeout``: seconds for the Flower engine to start and every node to answer
  (default 120).
"""

from __future__ import annotations

from .. import validation as opt

#: option -> default
DEFAULTS = {"flower_engine": "simulation", "flower_superlink": None,
            "flower_bridge": "127.0.0.1:0", "flower_start_timeout": 120.0}


def _address(name: str, value) -> str:
    """``"host:port"`` (port 0..65535), as the Flower deployment options take it."""
    if not isinstance(value, str) or ":" not in value:
        raise ValueError(f"{name} must be 'host:port', got {value!r}")
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{name} must be 'host:port' with a port in 0..65535, got {value!r}")
    return value


def check(given: dict) -> dict:
    """The Flower options (defaults filled in) checked: ValueError naming the option."""
    values = {**DEFAULTS, **given}
    engine = opt.choice("flower_engine", values["flower_engine"], ("simulation", "deployment"))
    superlink = values["flower_superlink"]
    if engine == "deployment":
        if superlink is None:
            raise ValueError("flower_engine='deployment' needs flower_superlink='host:port', "
                             "the SuperLink's address, its --host:--port (e.g. '127.0.0.1:9093')")
        superlink = _address("flower_superlink", superlink)
    elif superlink is not None or "flower_bridge" in given:
        raise ValueError("flower_superlink and flower_bridge only apply to "
                         "flower_engine='deployment'")
    return {"flower_engine": engine, "flower_superlink": superlink,
            "flower_bridge": _address("flower_bridge", values["flower_bridge"]),
            "flower_start_timeout": opt.real("flower_start_timeout",
                                             values["flower_start_timeout"], low=0.0,
                                             low_open=True)}
