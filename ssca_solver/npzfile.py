"""The library's .npz files (checkpoints, saved Results): written atomically, read one
``.npy`` member at a time without unpickling and without allocating more than a member
declares. Errors are the caller's class (a :class:`~ssca_solver.errors.FileFieldError`),
raised with the member's name as ``field``; :func:`read` turns whatever else a malformed,
truncated or corrupted file raises into that class too, naming the file and the member.
"""

from __future__ import annotations

import math
import os
import tempfile
import zipfile
import zlib
from typing import Callable, Mapping, Optional

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


#: the member holding the file's metadata, a JSON string
META = "__meta__"
#: what reading a malformed, truncated or corrupted archive can raise (zipfile, zlib, NumPy's
#: .npy reader, json: JSONDecodeError is a ValueError, and the memory a member claims)
READ_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError, ValueError,
               KeyError, TypeError, AttributeError, IndexError, OverflowError, MemoryError,
               NotImplementedError, RuntimeError, zlib.error, UnicodeError)


def read(path: str, error, member: Callable, parse_meta: Callable, not_array: str,
         no_meta: str, refused: str, corrupt: str) -> tuple[dict, dict[str, np.ndarray]]:
    """(metadata, arrays) of the archive at ``path``: every member a ``.npy`` array of its own
    name, :data:`META` a JSON string, read first.

    Args:
      path: the file (checked by the caller to exist and to be a non-empty regular file).
      error: the caller's :class:`~ssca_solver.errors.FileFieldError` class.
      member: ``member(zf, info, name, meta)``, the array of one member (:func:`read_member`
        with the caller's bounds); ``meta`` is None for the metadata's own member.
      parse_meta: the metadata from its JSON text, checked (raising ``error`` with the path).
      not_array: the refusal of a member that is not a ``.npy`` array, or repeats a name
        (followed by "(repeated)" or "(name)").
      no_meta: the refusal of an archive without :data:`META`.
      refused: the start of the message of a refusal raised without a path, which is raised
        again as "{refused} member {field!r} {refusal}" with the path.
      corrupt: the start of the message for anything else (:data:`READ_ERRORS`): "{corrupt},
        or is truncated or corrupted (member {field!r}): {type}: {text}".
    """
    field = None
    try:
        with zipfile.ZipFile(path) as zf:
            infos = {}
            for info in zf.infolist():
                name = info.filename
                if not name.endswith(".npy") or name[:-4] in infos:
                    raise error(f"{not_array} ({'repeated' if name[:-4] in infos else 'name'})",
                                field=name)
                infos[name[:-4]] = info
            field = META
            if field not in infos:
                raise error(no_meta, field=field)
            raw = member(zf, infos[field], field, None)
            if raw.dtype.kind != "U" or raw.shape != ():
                raise error(f"is a {raw.dtype} array of shape {raw.shape}, not a JSON string",
                            field=field)
            meta = parse_meta(str(raw))
            arrays = {}
            for name, info in infos.items():
                if name != META:
                    field = name
                    arrays[name] = member(zf, info, name, meta)
    except error as exc:
        if exc.path is not None:
            raise
        raise error(f"{refused} member {exc.field!r} {exc}", path, exc.field) from None
    except READ_ERRORS as exc:
        at = f" (member {field!r})" if field else ""
        raise error(f"{corrupt}, or is truncated or corrupted{at}: {type(exc).__name__}: {exc}",
                    path, field) from None
    return meta, arrays
