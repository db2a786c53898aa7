"""The library's .npz files (checkpoints, saved Results): written atomically, read one
``.npy`` member at a time without unpickling and without allocating more than a member
declares. Errors are the caller's class (a :class:`~ssca_solver.errors.FileFieldError`),
raised with the member's name as ``field``.
"""

from __future__ import annotations

import math
import os
import tempfile
import zipfile
from typing import Mapping, Optional

import numpy as np


def temporary(path: str) -> tuple[int, str]:
    """A new temporary file next to ``path`` (same directory, so os.replace is atomic)."""
    directory = os.path.dirname(os.path.abspath(path))
    return tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")


def write(path: str, payload: Mapping[str, np.ndarray]) -> str:
    """``np.savez`` of ``payload`` to ``path`` through a temporary file and os.replace: an
    existing file is replaced whole or not at all, and the temporary file is removed when the
    write fails (the error re-raised). No ".npz" suffix is added. Returns ``path``."""
    path = os.fspath(path)
    fd, tmp = temporary(path)
    try:
        with os.fdopen(fd, "wb") as f:      # a file object: np.savez adds no ".npz"
            np.savez(f, **payload)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass                            # already gone: nothing left behind
        raise
    return path


def read_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, name: str, error,
                limit: Optional[int] = None, stored_only: bool = False,
                header_bytes: Optional[int] = None) -> np.ndarray:
    """The array of one ``.npy`` member: its declared size checked against ``limit`` (before
    decompressing), its header against its size (no allocation larger than declared), never
    a pickled object; ``stored_only`` refuses compressed members. Reading to the end makes
    zipfile check the CRC. Any refusal raises ``error(message, field=name)``."""
    if limit is not None and info.file_size > limit:
        raise error(f"declares {info.file_size} bytes decompressed, more than the {limit} "
                    "this file can hold here (refused without decompressing it)", field=name)
    if stored_only and info.compress_type != zipfile.ZIP_STORED:
        raise error("is compressed (only stored members are written)", field=name)
    if info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size:
        raise error(f"is stored with {info.compress_size} bytes but declares "
                    f"{info.file_size}", field=name)
    extra = {} if header_bytes is None else {"max_header_size": header_bytes}
    with zf.open(info) as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(f, **extra)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(f, **extra)
        else:
            raise error(f"has .npy format {version}, not written by this library", field=name)
        if dtype.hasobject:
            raise error("holds Python objects (pickles), which are never loaded", field=name)
        data = info.file_size - f.tell()
        need = math.prod(shape) * dtype.itemsize
        if need != data:
            raise error(f"declares shape {shape} of {dtype} ({need} bytes) but holds {data} "
                        "bytes", field=name)
    with zf.open(info) as f:
        a = np.lib.format.read_array(f, allow_pickle=False)
        if f.read(1):                       # also makes zipfile check the CRC
            raise error("has data after its array", field=name)
    return a
