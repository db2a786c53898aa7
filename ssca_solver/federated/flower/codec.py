"""Messages <-> Flower records: a :class:`Request`, :class:`Reply` or ``Dropout`` packed exactly
into a Flower ``RecordDict`` (arrays of any dtype through ``Array``, scalars through JSON), a
client's error as a record of text, and a reply ``Message`` read back as a Reply or a
:class:`_Failure`."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping, Optional

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict

from ..messages import Dropout, Reply, Request, exception_parts

#: The Flower message type of every request (Flower allows train/evaluate/query[.action]).
MESSAGE_TYPE = "query.ssca"

_META, _ARRAYS = "ssca.meta", "ssca.arrays"
#: the message classes that may cross; a node cannot make the server build anything else
_CLASSES = {"Request": Request, "Reply": Reply, "Dropout": Dropout}


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
    name, text, tb = exception_parts(exc)
    info = {"client": client, "type": name, "message": text, "traceback": tb}
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
        reason = msg.error.reason
        if "ActorDiedError" in reason or "ActorUnavailableError" in reason:
            # the Ray actor's process ended (it died, or was ended past its deadline)
            return _Failure(f"its Flower node {node} failed: its Ray actor's process died "
                            f"({reason})")
        return _Failure(f"its Flower node {node} failed: {reason}")
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
