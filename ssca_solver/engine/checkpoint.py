"""Checkpoints: the whole solver state in one ``.npz`` file, no pickled code.

A checkpoint holds named NumPy arrays (the algorithm's state, the history so far, the
communication counters) and one JSON string of metadata (method, round, stage, seed, and a
fingerprint of the problem, the data and the options that must match on resume). It is written
to a temporary file in the same directory and renamed, so a crash mid-write never leaves a torn
checkpoint, and the temporary file is removed when the write fails.

Writing: :func:`check_writable` checks a ``checkpoint=`` path before round 1 (a writable
directory, not a directory or a special file in its place, space for one checkpoint of the
estimated size); :class:`Writer` keeps a run going when a later write fails (a full disk, a
removed directory): it warns once, naming the path, the OS error and the last good checkpoint.

Reading (:func:`load`) trusts nothing in the file: it never unpickles, bounds every member's
declared size before reading it (against the :class:`Layout` of the solve, so a decompression
bomb is refused without decompressing), checks each array's header against its size, lets
``zipfile`` check every member's CRC, validates the metadata's fields, and turns every failure
into a :class:`~ssca_solver.errors.CheckpointError` naming the file and the field.
:func:`check_matches` and :meth:`Layout.check` then refuse a checkpoint of another problem,
other data (:func:`data_fingerprint`, a hash of each client's rows), other options, or one whose
stage, round or arrays do not fit the method.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import stat
import warnings
import zipfile
from typing import Mapping, Optional

import numpy as np

from .. import npzfile
from ..errors import CheckpointError, CheckpointNotFoundError

FORMAT = "ssca-solver-checkpoint/1"
#: bytes allowed for an .npy member's header (NumPy writes 128, or a multiple of 64)
HEADER_BYTES = 4096
#: the metadata member: this many bytes, plus PER_ITEM_META per client (its size and hash)
#: and per function (its name, bound and surrogate builder)
META_BYTES = 1 << 20
PER_ITEM_META = 1024
#: characters allowed per dropout's error text and task name (unicode: 4 bytes a character)
#: in a compressed member (a stored one, as written here, is bounded by the file's size)
ERROR_CHARS = 1 << 14
TASK_CHARS = 64
_DROPOUT_STRINGS = {"dropouts/task": TASK_CHARS, "dropouts/error": ERROR_CHARS}
_ZIP_OVERHEAD = 200        # local and central headers of one member, plus its name


# -- the data's fingerprint ----------------------------------------------------------------------

def _hash_array(h, name: str, a: Optional[np.ndarray]) -> None:
    if a is None:
        h.update(f"{name}:none;".encode())
        return
    a = np.asarray(a)
    if a.dtype.byteorder == ">":          # the same numbers hash the same on any machine
        a = a.astype(a.dtype.newbyteorder("<"))
    a = np.ascontiguousarray(a)
    h.update(f"{name}:{a.dtype.str}:{a.shape};".encode())
    h.update(memoryview(a).cast("B"))


def data_fingerprint(data) -> list[str]:
    """One BLAKE2b digest (hex, 16 bytes) per client of its rows: X and y with their shapes and
    dtypes. Computed once per solve (only with ``checkpoint=`` or ``resume=``)."""
    out = []
    for client in data.clients:
        h = hashlib.blake2b(digest_size=16)
        _hash_array(h, "X", client.X)
        _hash_array(h, "y", client.y)
        out.append(h.hexdigest())
    return out


# -- what a checkpoint of one solve holds ----------------------------------------------------------

#: rows of d floats a state array filled in during the run may have, unless the method says
#: otherwise (its ``state_rows``: method "ssca"'s quasi-Newton pairs, twice its memory)
STATE_ROWS = 16


class Layout:
    """The arrays a checkpoint of one solve may hold and how large they may be.

    Args:
      state: the method's state arrays of a fresh start (``Method.state_arrays(init(x0))``):
        their names and shapes.
      round_columns: the history's per-round columns and their row shapes (the recorder's).
      dim, num_functions, num_constraints, num_clients: the problem's sizes.
      num_stages: the method's stages.
    """

    def __init__(self, state: Mapping[str, np.ndarray], round_columns: Mapping[str, tuple],
                 dim: int, num_functions: int, num_constraints: int, num_clients: int,
                 num_stages: int, state_rows: int = STATE_ROWS):
        self.state = {k: (tuple(np.shape(v)), np.asarray(v).dtype) for k, v in state.items()}
        self.round_columns = {k: tuple(s) for k, s in round_columns.items()}
        self.eval_columns = {"eval_t": (), "objective": (), "constraints": (num_constraints,)}
        self.dim, self.F, self.M = int(dim), int(num_functions), int(num_constraints)
        self.clients, self.num_stages = int(num_clients), int(num_stages)
        self.state_rows = max(int(state_rows), STATE_ROWS)
        self.wide = max(self.dim, self.M, self.F, self.state_rows)

    def _state_bytes(self) -> int:
        """The largest state array: a fresh state's, or a row of d floats per function (a
        diagonal metric, the previous point) or state_rows rows of d floats (quasi-Newton
        pairs), whichever is larger."""
        fresh = max((8 * math.prod(s) for s, _ in self.state.values()), default=0)
        return max(fresh, 8 * (max(self.F, self.state_rows) + 2) * self.wide)

    def _dropouts(self, rounds: int) -> int:
        """Dropouts a run of ``rounds`` rounds can record at most: each client in each round,
        each evaluation and its retry, and the requests before round 1."""
        return self.clients * (4 * (rounds + 1) + 8)

    def limit(self, name: str, rounds: int) -> int:
        """The largest a member ``name`` (an array's name, without ``.npy``) of a checkpoint
        after ``rounds`` rounds may be, decompressed, header included (bytes)."""
        rows = rounds + 1
        if name == "__meta__":
            return META_BYTES + PER_ITEM_META * (self.clients + self.F + self.M)
        if name.startswith("state/"):
            return HEADER_BYTES + self._state_bytes()
        if name.startswith("history/"):
            col = name[len("history/"):]
            shape = self.round_columns.get(col, self.eval_columns.get(col, (self.wide,)))
            return HEADER_BYTES + 8 * rows * math.prod(shape)
        if name.startswith("tally/"):
            return HEADER_BYTES + 8
        if name in _DROPOUT_STRINGS:
            return HEADER_BYTES + 4 * _DROPOUT_STRINGS[name] * self._dropouts(rounds)
        if name.startswith("dropouts/"):
            return HEADER_BYTES + 8 * self._dropouts(rounds)
        return 0                             # not a member this library writes

    def estimate(self, rounds: int, meta_bytes: int = 4096) -> int:
        """The size in bytes of a checkpoint after ``rounds`` rounds, without dropouts (for the
        free-space check before round 1)."""
        members = (len(self.state) + len(self.round_columns) + len(self.eval_columns) + 8)
        state = sum(8 * math.prod(s) for s, _ in self.state.values())
        state += 8 * (self.F + 1) * self.dim            # a metric and a previous point
        state += 8 * self.state_rows * self.dim          # quasi-Newton pairs
        rows = sum(8 * math.prod(s) for s in self.round_columns.values()) + 16
        evals = 16 + 8 * self.M
        return (members * (128 + _ZIP_OVERHEAD) + 4 * meta_bytes + state
                + rounds * (rows + evals) + 64 * 6)

    # -- consistency of a loaded checkpoint with this solve ------------------------------------------
    def check(self, arrays: Mapping[str, np.ndarray], meta: dict, path: str) -> None:
        """Refuse (CheckpointError naming the file and the field) a checkpoint whose stage,
        round or arrays do not fit this solve's method and problem."""
        def bad(field, what):
            raise CheckpointError(f"resume: the checkpoint {path!r} is inconsistent: {field} "
                                  f"{what}", path, field)

        def numbers(key) -> np.ndarray:
            # a member the solve needs, of numbers
            if key not in arrays:
                bad(key, "is missing")
            a = arrays[key]
            if a.dtype.kind not in "biuf":
                bad(key, f"has dtype {a.dtype}, not a number")
            return a

        stage, rounds = meta["stage"], meta["round"]
        if stage >= self.num_stages:
            bad("stage", f"= {stage}, but the method has {self.num_stages} stage"
                         f"{'s' if self.num_stages != 1 else ''} (0 to {self.num_stages - 1})")
        for name, (shape, dtype) in self.state.items():
            key = f"state/{name}"
            a = numbers(key)
            if math.prod(shape) == 0:       # filled in later (a metric, a previous point)
                ok = a.ndim == len(shape) and all(n <= self.wide for n in a.shape)
            else:
                ok = a.shape == shape
            if not ok:
                bad(key, f"has shape {a.shape}; this solve's is {shape}"
                         + (f" (dim = {self.dim})" if name == "w" else ""))
            if name == "w" and not np.all(np.isfinite(a)):
                bad(key, "holds non-finite values")
        if "state/t" in arrays and int(arrays["state/t"]) != rounds:
            bad("state/t", f"= {int(arrays['state/t'])}, but the metadata's round = {rounds}")

        def rows(group) -> int:
            n = None
            for col, shape in group.items():
                key = f"history/{col}"
                a = numbers(key)
                if a.ndim == 0 or a.shape[1:] != shape:
                    bad(key, f"has shape {a.shape}; rows of shape {shape} were expected")
                if n is None:
                    n = a.shape[0]
                elif a.shape[0] != n:
                    bad(key, f"has {a.shape[0]} rows, the other columns {n}")
            return n or 0

        n = rows(self.round_columns)
        t = arrays["history/t"]
        if n > rounds or (n and int(t[-1]) != rounds):
            bad("history/t", f"has {n} rounds ending at {int(t[-1]) if n else None}, but the "
                             f"metadata's round = {rounds}")
        s = arrays["history/stage"]
        if n and (s.min() < 0 or s.max() > stage):
            bad("history/stage", f"holds stages {int(s.min())} to {int(s.max())}, beyond the "
                                 f"metadata's stage = {stage}")
        rows(self.eval_columns)
        for key in [k for k in arrays if k.startswith("tally/")]:
            a = arrays[key]
            if a.shape != () or a.dtype.kind not in "iu" or int(a) < 0:
                bad(key, f"is not a count (shape {a.shape}, dtype {a.dtype})")
        drops = [k for k in ("dropouts/client", "dropouts/round", "dropouts/task",
                             "dropouts/error") if k in arrays]
        if drops:
            lengths = {arrays[k].shape for k in drops}
            if len(drops) != 4 or len(lengths) != 1 or len(next(iter(lengths))) != 1:
                bad("dropouts", f"are incomplete or of different lengths ({drops})")
            c = arrays["dropouts/client"]
            if c.dtype.kind not in "iu" or (c.size and (c.min() < 0 or c.max() >= self.clients)):
                bad("dropouts/client", f"names clients outside 0..{self.clients - 1}")


# -- writing --------------------------------------------------------------------------------------

def checksum(a: np.ndarray) -> str:
    """A hash of one array (its dtype, shape and bytes), kept in the metadata's ``checksums``:
    an array edited by hand after the checkpoint was written no longer matches it."""
    a = np.asarray(a)
    h = hashlib.blake2b(digest_size=8)
    h.update(f"{a.dtype.str}{a.shape}".encode())
    h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def save(path: str, arrays: Mapping[str, np.ndarray], meta: dict) -> str:
    """Write ``arrays`` and ``meta`` (JSON-serialisable) to ``path`` atomically; return path.
    The metadata also gets each array's :func:`checksum`. The temporary file is removed when
    the write fails (and the error re-raised)."""
    payload = {k: np.asarray(v) for k, v in arrays.items()}
    sums = {k: checksum(v) for k, v in payload.items()}
    payload["__meta__"] = np.array(json.dumps({"format": FORMAT, **meta, "checksums": sums}))
    return npzfile.write(path, payload)


def check_writable(path: str, size: int) -> None:
    """Before round 1: CheckpointError unless a checkpoint of about ``size`` bytes can be
    written to ``path`` (its directory exists and takes a new file, the path is not a
    directory or a special file, the disk has the space)."""
    path = os.fspath(path)
    where = f"checkpoint={path!r}"

    def refuse(what):
        raise CheckpointError(f"{where}: {what}; nothing was run", path, "checkpoint")

    try:
        st = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):     # the directory is checked below
        st = None
    except OSError as exc:
        refuse(f"the path cannot be used ({exc.strerror or exc})")
    if st is not None and stat.S_ISDIR(st.st_mode):
        refuse("is a directory; give a file path, e.g. "
               f"{os.path.join(path, 'checkpoint.npz')!r}")
    if st is not None and not stat.S_ISREG(st.st_mode):
        refuse("exists and is not a regular file (a device, a pipe or a socket); it would be "
               "replaced")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.exists(directory):
        missing = directory
        while not os.path.exists(os.path.dirname(missing)):
            missing = os.path.dirname(missing)
        refuse(f"the directory {directory!r} does not exist ({missing!r} is missing); create "
               "it first, e.g. os.makedirs(...)")
    if not os.path.isdir(directory):
        refuse(f"{directory!r} is a file, not a directory")
    try:
        fd, tmp = npzfile.temporary(path)
    except OSError as exc:
        refuse(f"cannot create a file in {directory!r} ({exc.strerror or exc})")
    os.close(fd)
    os.unlink(tmp)
    free = shutil.disk_usage(directory).free
    if free < size:
        refuse(f"{directory!r} has {free} bytes free; a checkpoint of this solve needs "
               f"about {size}")


class Writer:
    """The checkpoints of one solve to one path: a write that fails with an OSError (a full
    disk, a removed directory, a directory put in the file's place) does not end the run;
    the first such failure warns (RuntimeWarning naming the path, the OS error and the last
    good checkpoint), and later writes are tried as scheduled.

    Args:
      path: the ``checkpoint=`` path.
      round: the round of a checkpoint already at ``path`` (resume from the same path).
    """

    def __init__(self, path: str, round: Optional[int] = None):
        self.path = os.fspath(path)
        self.round = round            # of the last good checkpoint written to path
        self.error: Optional[OSError] = None

    def guard(self, save):
        """``save(state) -> path`` made safe: on an OSError it warns (once) and returns the
        last good checkpoint's path, or None when there is none."""
        def guarded(state):
            try:
                written = save(state)
            except OSError as exc:
                return self.failed(exc, int(state.t))
            self.round = int(state.t)
            return written
        return guarded

    def failed(self, exc: OSError, t: int) -> Optional[str]:
        last = self.round if self.round is not None and os.path.isfile(self.path) else None
        if self.error is None:
            warnings.warn(
                f"checkpoint: could not write {self.path!r} after round {t} ({exc!r}); "
                + (f"the last good checkpoint there is of round {last}" if last is not None
                   else "no checkpoint of this solve is there")
                + "; the run goes on, and the next checkpoint is tried as scheduled (this "
                "warning is not repeated)", RuntimeWarning, stacklevel=2)
        self.error = exc
        return self.path if last is not None else None


# -- reading --------------------------------------------------------------------------------------

def _member_array(zf: zipfile.ZipFile, info: zipfile.ZipInfo, name: str, limit: int):
    """The array of one member (:func:`ssca_solver.npzfile.read_member`), its declared size
    bounded by ``limit``, this solve's state's."""
    return npzfile.read_member(zf, info, name, CheckpointError, limit=limit)


def _meta_fields(meta, path: str) -> dict:
    """The metadata's fields, checked: a dict with the format, a method, a seed, a stage and a
    round (non-negative integers), an elapsed time and scales (finite, non-negative)."""
    def bad(field, what):
        raise CheckpointError(f"resume: the checkpoint {path!r} has bad metadata: {field} "
                              f"{what}", path, field)

    if not isinstance(meta, dict):
        bad("__meta__", f"is a JSON {type(meta).__name__}, not an object")
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"resume: {path!r} is not a {FORMAT} checkpoint "
                              f"(format {meta.get('format')!r})", path, "format")
    for key in ("method", "seed", "stage", "round", "elapsed", "fingerprint"):
        if key not in meta:
            bad(key, "is missing")
    if not isinstance(meta["method"], str):
        bad("method", f"= {meta['method']!r} is not a name")
    if not isinstance(meta["fingerprint"], dict):
        bad("fingerprint", f"is a {type(meta['fingerprint']).__name__}, not an object")
    if meta["method"] != meta["fingerprint"].get("method", meta["method"]):
        bad("method", f"= {meta['method']!r}, but fingerprint.method = "
                      f"{meta['fingerprint']['method']!r}")
    if meta.get("x0") is None:
        # every checkpoint of this version keeps the start point's hash; without it a resume
        # given another x0 could not be refused
        bad("x0", "is missing (the start point's hash; written by an earlier version of "
                  "ssca-solver?); start afresh")
    seed = meta["seed"]
    if not (isinstance(seed, str) and seed.isdigit()):
        bad("seed", f"= {seed!r} is not a non-negative integer")
    start = meta.get("x0")           # the start point's hash (engine.session), when written
    if start is not None and not (isinstance(start, str) and len(start) == 32
                                  and all(c in "0123456789abcdef" for c in start)):
        bad("x0", f"= {start!r} is not the start point's hash (32 hexadecimal digits)")
    for key in ("stage", "round", "free_since"):
        v = meta.get(key)
        if v is None and key == "free_since":
            continue                  # no round has held an evaluation (or an older file)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            bad(key, f"= {v!r} is not a non-negative integer")
    for key in ("elapsed", "work_since", "grad_scale", "constraint_scale", "curvature",
                "local_curvature", "value_start"):
        v = meta.get(key)
        if v is None and key != "elapsed":     # work_since: absent in older files (0)
            continue
        if (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)
                or (v < 0 and key != "value_start")):
            bad(key, f"= {v!r} is not a finite {'' if key == 'value_start' else 'non-negative '}"
                     "number")
    return meta


def load(path: str, layout: Optional[Layout] = None,
         expected: Optional[dict] = None) -> tuple[dict[str, np.ndarray], dict]:
    """(arrays, meta) from a checkpoint written by :func:`save`; CheckpointError naming the
    file and the field for anything else (CheckpointNotFoundError, also a FileNotFoundError,
    when there is no file). The metadata is read first; with ``expected`` (a fingerprint) it
    must match (:func:`check_matches`) before any array is read. With ``layout`` every
    member's declared size is bounded by what that solve's state can take
    (:meth:`Layout.limit`) before it is read, and the arrays must fit the solve
    (:meth:`Layout.check`); without, members are bounded by the file's size."""
    path = os.fspath(path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise CheckpointNotFoundError(f"resume: no checkpoint at {path!r}", path) from None
    except OSError as exc:
        raise CheckpointError(f"resume: {path!r} cannot be read ({exc})", path) from None
    if stat.S_ISDIR(st.st_mode):
        raise CheckpointError(f"resume: {path!r} is a directory, not a checkpoint file", path)
    if st.st_size == 0:
        raise CheckpointError(f"resume: {path!r} is empty (0 bytes), not a checkpoint", path)

    def member(zf, info, name, meta):
        # the metadata first (meta None), then each array, bounded by what this solve's state
        # can take after the metadata's round (without a layout: by the file's size)
        if layout is None:
            return _member_array(zf, info, name, st.st_size)
        if meta is None:
            return _member_array(zf, info, name, layout.limit(name, 0))
        limit = layout.limit(name, meta["round"])
        if limit == 0:
            raise CheckpointError("is not a member this library writes", field=name)
        if name in _DROPOUT_STRINGS and info.compress_type == zipfile.ZIP_STORED:
            # clients' error texts have no length limit; a stored member is no
            # larger than the file, so it cannot be a decompression bomb
            limit = max(limit, st.st_size)
        return _member_array(zf, info, name, limit)

    def parse(text):
        meta = _meta_fields(json.loads(text), path)
        if expected is not None:
            check_matches(meta, expected, path)
        return meta

    meta, arrays = npzfile.read(
        path, CheckpointError, member, parse, not_array="is not an array of this library",
        no_meta="is missing (no metadata)",
        refused=f"resume: the checkpoint {path!r} is refused:",
        corrupt=f"resume: {path!r} is not a checkpoint of this library")
    if layout is not None:
        layout.check(arrays, meta, path)
    _check_sums(arrays, meta, path)
    return arrays, meta


def _check_sums(arrays: Mapping[str, np.ndarray], meta: dict, path: str) -> None:
    """Refuse arrays that are not the ones written with the metadata: a member edited, added
    or removed by hand after the checkpoint was written (its :func:`checksum` differs)."""
    def bad(field, what):
        raise CheckpointError(f"resume: the checkpoint {path!r} was edited after it was "
                              f"written: {field} {what}", path, field)

    sums = meta.get("checksums")
    if not isinstance(sums, dict):
        raise CheckpointError(f"resume: the checkpoint {path!r} has bad metadata: checksums "
                              + ("is missing (written by an earlier version of ssca-solver?); "
                                 "start afresh" if sums is None else
                                 f"is a {type(sums).__name__}, not an object"),
                              path, "checksums")
    for name, a in arrays.items():
        if name not in sums:
            bad(name, "is a member the checkpoint was not written with")
        if checksum(a) != sums[name]:
            bad(name, "differs from the array written (its checksum does not match)")
    for name in sums:
        if name not in arrays:
            bad(name, "is missing")


#: fingerprint entries added after checkpoints existed: a checkpoint without one resumes
LATER_KEYS = frozenset({"function_code"})


def check_matches(meta: dict, expected: dict, path: str) -> None:
    """Raise CheckpointError naming the first fingerprint entry that differs from the
    checkpoint's (for the data: the first client whose rows differ)."""
    saved = meta.get("fingerprint", {})
    for key, value in expected.items():
        if key in LATER_KEYS and key not in saved:
            continue          # written before the library checked it: nothing to compare
        if key not in saved and value is not None:
            raise CheckpointError(
                f"resume: the checkpoint {path!r} has no fingerprint.{key} (written by an "
                f"earlier version of ssca-solver?), so it cannot be checked against this "
                f"solve's {key}; start afresh", path, f"fingerprint.{key}")
        if key == "data" and isinstance(saved[key], list) and len(saved[key]) == len(value):
            differ = [i for i, (a, b) in enumerate(zip(saved[key], value)) if a != b]
            if differ:
                i = differ[0]
                raise CheckpointError(
                    f"resume: the checkpoint {path!r} was written for other data: the rows of "
                    f"client {i} differ (fingerprint.data[{i}]: {saved[key][i]!r} in the "
                    f"checkpoint, {value[i]!r} here; {len(differ)} of {len(value)} clients "
                    "differ); resume needs the same data", path, f"fingerprint.data[{i}]")
            continue
        if (key == "function_code" and isinstance(saved[key], list)
                and len(saved[key]) == len(value) and saved[key] != value):
            # a warning, not a refusal: fixing a function that crashed and resuming is
            # what checkpoints are for; continuing with another function must not be silent
            i = next(j for j, (a, b) in enumerate(zip(saved[key], value)) if a != b)
            names = expected.get("functions") or []
            name = names[i] if i < len(names) else f"#{i}"
            warnings.warn(
                f"resume: the checkpoint {path!r} was written for other code of the function "
                f"{name!r} (its value or gradient code, or what its closure holds, differs; or "
                "another Python version compiled it): the run continues from the "
                "checkpoint's state with the function as it is now, and its history mixes "
                "both; start afresh if the change was not a fix", RuntimeWarning, stacklevel=6)
            continue
        if saved.get(key) != value:
            raise CheckpointError(f"resume: the checkpoint {path!r} was written with {key} = "
                                  f"{saved.get(key)!r}, this solve has {key} = {value!r}; "
                                  "resume needs the same problem and options", path,
                                  f"fingerprint.{key}")
