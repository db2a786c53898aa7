"""Checkpoints: the whole solver state in one ``.npz`` file, no pickled code.

A checkpoint holds named NumPy arrays (the algorithm's state, the history so far, the
communication counters) and one JSON string of metadata (method, round, stage, seed, and a
fingerprint of the problem and options that must match on resume). It is written to a temporary
file and renamed, so a crash mid-write never leaves a torn checkpoint. Loading never unpickles
(``allow_pickle=False``).
"""

from __future__ import annotations

import json
import os
from typing import Mapping

import numpy as np

FORMAT = "ssca-solver-checkpoint/1"


def save(path: str, arrays: Mapping[str, np.ndarray], meta: dict) -> str:
    """Write ``arrays`` and ``meta`` (JSON-serialisable) to ``path`` atomically; return path."""
    payload = {k: np.asarray(v) for k, v in arrays.items()}
    payload["__meta__"] = np.array(json.dumps({"format": FORMAT, **meta}))
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:           # a file object: savez adds no ".npz" suffix
        np.savez(f, **payload)
    os.replace(tmp, path)
    return path


def load(path: str) -> tuple[dict[str, np.ndarray], dict]:
    """(arrays, meta) from a checkpoint written by :func:`save`."""
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except FileNotFoundError:
        raise FileNotFoundError(f"resume: no checkpoint at {path!r}") from None
    except (ValueError, OSError) as exc:
        raise ValueError(f"resume: {path!r} is not a checkpoint of this library ({exc})") from None
    raw = arrays.pop("__meta__", None)
    meta = json.loads(str(raw)) if raw is not None else {}
    if meta.get("format") != FORMAT:
        raise ValueError(f"resume: {path!r} is not a {FORMAT} checkpoint "
                         f"(format {meta.get('format')!r})")
    return arrays, meta


def check_matches(meta: dict, expected: dict, path: str) -> None:
    """Raise ValueError naming the first fingerprint entry that differs from the checkpoint's."""
    saved = meta.get("fingerprint", {})
    for key, value in expected.items():
        if saved.get(key) != value:
            raise ValueError(f"resume: the checkpoint {path!r} was written with {key} = "
                             f"{saved.get(key)!r}, this solve has {key} = {value!r}; resume "
                             "needs the same problem and options")
