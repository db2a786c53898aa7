"""A :class:`~ssca_solver.Result` as a file and as plain data.

**The file** (:func:`save`, :func:`load`; ``res.save(path)`` and ``ss.load_result(path)``) is
one ``.npz`` archive, readable without this library: named ``.npy`` arrays (the point ``x``,
``constraints``, ``slack``, the KKT report's multipliers and residual arrays under ``kkt/``,
every history column under ``history/``, and arrays found in ``extras`` and ``solver_info``)
and one member ``__meta__``: a JSON string (standard JSON: no NaN tokens) holding the format
and its version, the versions of Python, ssca-solver, NumPy, SciPy and CVXPY that wrote it, and
every other field: status, message, nit, method, subproblem, time, fun, penalty, the
constraints' names, the KKT report's scalars, the communication counts, the penalty stages,
the dropouts, ``solver_info`` and ``extras``. Read it by hand with
``np.load(path, allow_pickle=False)`` and ``json.loads(str(f["__meta__"]))``.

What is kept exactly: every array (dtype and shape), every number (non-finite ones too, as
the strings ``"nan"``, ``"inf"``, ``"-inf"`` in the JSON), strings, tuples, lists and dicts in
``extras`` and ``solver_info``. What is not: an exception in ``extras`` (``extras["error"]`` of
a run with status "error") comes back as its text, ``"TypeName: message"``; any other object
that is neither an array, a number, a string, None nor a tuple, list or dict of those comes back
as its ``repr`` (with a warning when it is saved). A run's options are saved only as far as the
Result holds them (``extras``, ``solver_info``).

:func:`load` never unpickles (``allow_pickle=False``, object arrays refused before reading)
and trusts nothing in the file: every member must be a stored (uncompressed) ``.npy`` array
whose header agrees with its size, the metadata must name this format and a version this
library reads, and every field is checked (type, shape, lengths that must agree); anything
else raises :class:`ResultFileError` naming the file and the field.

**Plain data**: :func:`to_dict` (``res.to_dict()``) gives dicts, lists, Python scalars and
NumPy arrays; :func:`to_json` (``res.to_json()``) standard JSON text of it (NaN and infinities
become ``null``); :func:`history_columns` (``res.history_columns()``) one row per round as a
dict of equal-length 1-D arrays, which ``pandas.DataFrame`` takes as it is (pandas is not
needed here).
"""

from __future__ import annotations

import json
import math
import os
import platform
import stat
import sys
import warnings
import zipfile
from typing import Any, Mapping

import numpy as np

from .. import status as st
from .. import npzfile
from ..errors import ResultFileError
from ..federated.messages import Dropout
from .history import History
from .certificate import KKTReport
from .result import Communication, Result, Stage

#: the ``format`` of the metadata, and the version of the layout this library writes and reads
FORMAT = "ssca-solver-result"
VERSION = 1
#: the Result fields the file holds (tests/test_result_io.py checks that it is all of them, so
#: that a new field is not silently lost)
SAVED_FIELDS = ("x", "status", "message", "fun", "constraints", "slack", "penalty", "kkt",
                "history", "communication", "stages", "nit", "method", "subproblem", "time",
                "constraint_names", "solver_info", "extras", "dropouts", "tolerances")
#: the history's full-data evaluation columns (one row per evaluation, not per round)
EVAL_COLUMNS = ("eval_t", "objective", "constraints")
_KKT_ARRAYS = ("multipliers", "feasibility", "complementarity", "feasibility_rel",
               "complementarity_rel")
_KKT_FLOATS = ("stationarity", "domain_violation", "scale", "stationarity_rel")
_COMMUNICATION_INTS = ("rounds", "num_clients", "up_per_client_round", "down_per_client_round",
                       "up_total", "down_total", "eval_up_total", "eval_down_total")
_HEADER_BYTES = 4096



# -- numbers in JSON ---------------------------------------------------------------------------

def _number(x) -> Any:
    """A float for the JSON metadata: itself when finite, else "nan", "inf" or "-inf"."""
    x = float(x)
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


_NONFINITE = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}


# -- extras, solver_info and other free-form values ------------------------------------------

class _Encoder:
    """Free-form values (``extras``, ``solver_info``, the domain multipliers) as tagged JSON,
    with their arrays as members ``<prefix>/<i>``. A value is a JSON null, bool, int, finite
    float or string, or an object with one tag: {"float": "nan"}, {"array": member},
    {"tuple": [...]}, {"list": [...]}, {"dict": [[key, value], ...]}, {"text": "..."}."""

    def __init__(self, arrays: dict):
        self.arrays = arrays

    def encode(self, value, prefix: str, where: str):
        if value is None or isinstance(value, (bool, str)):
            return value
        if isinstance(value, np.bool_):
            return bool(value)
        if isinstance(value, (int, np.integer)):
            return int(value)
        if isinstance(value, (float, np.floating)):
            v = _number(value)
            return v if isinstance(v, float) else {"float": v}
        if isinstance(value, np.ndarray):
            if value.dtype.hasobject:
                return self._text(repr(value), where)
            name = f"{prefix}/{sum(k.startswith(prefix + '/') for k in self.arrays)}"
            self.arrays[name] = value
            return {"array": name}
        if isinstance(value, (tuple, list)):
            tag = "tuple" if isinstance(value, tuple) else "list"
            return {tag: [self.encode(v, prefix, f"{where}[{i}]") for i, v in enumerate(value)]}
        if isinstance(value, dict):
            return {"dict": [[self.encode(k, prefix, f"{where} key {k!r}"),
                              self.encode(v, prefix, f"{where}[{k!r}]")]
                             for k, v in value.items()]}
        if isinstance(value, BaseException):
            return {"text": f"{type(value).__name__}: {value}"}
        return self._text(repr(value), where, type(value).__name__)

    @staticmethod
    def _text(text: str, where: str, kind: str = "object array") -> dict:
        warnings.warn(f"Result.save: {where} (a {kind}) is saved as its repr, a string",
                      RuntimeWarning, stacklevel=_outside())
        return {"text": text}


def _outside() -> int:
    """The stacklevel of the first caller outside this package's diagnostics (the user's
    ``res.save``), for a warning of :class:`_Encoder`."""
    here = os.path.dirname(os.path.abspath(__file__))
    frame, level = sys._getframe(1), 1
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) \
            == here:
        frame, level = frame.f_back, level + 1
    return level


class _Reader:
    """Checked access to a loaded file's metadata and arrays; :meth:`bad` raises
    ResultFileError naming the file and the field."""

    def __init__(self, path: str, meta: dict, arrays: dict):
        self.path, self.meta, self.arrays = path, meta, arrays
        self.used = {"__meta__"}

    def bad(self, field: str, what: str):
        raise ResultFileError(f"load_result: {self.path!r} is refused: {field} {what}",
                              self.path, field)

    # scalars of the metadata
    def get(self, obj: Mapping, key: str, field: str):
        if not isinstance(obj, dict):
            self.bad(field.rsplit(".", 1)[0], f"is a JSON {type(obj).__name__}, not an object")
        if key not in obj:
            self.bad(field, "is missing")
        return obj[key]

    def string(self, value, field: str, optional: bool = False) -> Any:
        if value is None and optional:
            return None
        if not isinstance(value, str):
            self.bad(field, f"= {value!r} is not a string")
        return value

    def integer(self, value, field: str, optional: bool = False) -> Any:
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            self.bad(field, f"= {value!r} is not a non-negative integer")
        return value

    def number(self, value, field: str, optional: bool = False) -> Any:
        if value is None and optional:
            return None
        if isinstance(value, str) and value in _NONFINITE:
            return _NONFINITE[value]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.bad(field, f"= {value!r} is not a number")
        return float(value)

    def items(self, value, field: str) -> list:
        if not isinstance(value, list):
            self.bad(field, f"is a JSON {type(value).__name__}, not a list")
        return value

    # arrays
    def array(self, name: str, shape=None, kinds: str = "f") -> np.ndarray:
        """Member ``name``, of a dtype kind in ``kinds`` and ``shape`` (None entries: any)."""
        if name not in self.arrays:
            self.bad(name, "is missing (no such array in the file)")
        self.used.add(name)
        a = self.arrays[name]
        if a.dtype.kind not in kinds:
            self.bad(name, f"is an array of {a.dtype}, not of numbers")
        if shape is not None and (a.ndim != len(shape) or any(
                s is not None and n != s for n, s in zip(a.shape, shape))):
            want = "(" + ", ".join("any" if s is None else str(s) for s in shape) + \
                ("," if len(shape) == 1 else "") + ")"
            self.bad(name, f"has shape {a.shape}, not {want}")
        return a

    def value(self, value, field: str):
        """A free-form value written by :class:`_Encoder`."""
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if not isinstance(value, dict) or len(value) != 1:
            self.bad(field, f"= {value!r} is not a value this format writes")
        (tag, body), = value.items()
        if tag == "float":
            if body not in _NONFINITE:
                self.bad(field, f"= {body!r} is not 'nan', 'inf' or '-inf'")
            return _NONFINITE[body]
        if tag == "array":
            if not isinstance(body, str) or "/" not in body or body == "__meta__":
                self.bad(field, f"names the array {body!r}, not a member of its group")
            return self.array(body, kinds="biufcUS")
        if tag in ("tuple", "list"):
            out = [self.value(v, f"{field}[{i}]") for i, v in enumerate(self.items(body, field))]
            return tuple(out) if tag == "tuple" else out
        if tag == "dict":
            out = {}
            for i, pair in enumerate(self.items(body, field)):
                if not isinstance(pair, list) or len(pair) != 2:
                    self.bad(f"{field}[{i}]", "is not a [key, value] pair")
                key = self.value(pair[0], f"{field} key {i}")
                try:
                    out[key] = self.value(pair[1], f"{field}[{key!r}]")
                except TypeError:               # an unhashable key
                    self.bad(f"{field} key {i}", f"= {key!r} cannot be a dict key")
            return out
        if tag == "text":
            return self.string(body, field)
        self.bad(field, f"has the unknown tag {tag!r}")


# -- saving --------------------------------------------------------------------------------------

def versions() -> dict:
    """The versions of Python, ssca-solver, NumPy, SciPy and CVXPY installed here (None for a
    package that is not installed), as a saved Result records them."""
    from importlib import metadata

    out = {"python": platform.python_version()}
    for dist in ("ssca-solver", "numpy", "scipy", "cvxpy"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def _layout(result: Result) -> tuple[dict, dict]:
    """(metadata, arrays) of ``result`` as the file holds them."""
    arrays: dict = {"x": np.asarray(result.x), "constraints": np.asarray(result.constraints),
                    "slack": np.asarray(result.slack)}
    enc = _Encoder(arrays)
    k = result.kkt
    for name in _KKT_ARRAYS:
        arrays[f"kkt/{name}"] = np.asarray(getattr(k, name))
    history = result.history.as_dict()
    for name, column in history.items():
        arrays[f"history/{name}"] = np.asarray(column)
    c = result.communication
    meta = {
        "format": FORMAT, "version": VERSION, "versions": versions(),
        "method": result.method, "status": result.status, "message": result.message,
        "nit": int(result.nit), "subproblem": result.subproblem, "time": _number(result.time),
        "fun": _number(result.fun),
        "penalty": None if result.penalty is None else _number(result.penalty),
        "constraint_names": [str(n) for n in result.constraint_names],
        "kkt": {"multiplier_source": k.multiplier_source,
                "stationarity_kind": k.stationarity_kind,
                **{name: _number(getattr(k, name)) for name in _KKT_FLOATS},
                "domain_multipliers": enc.encode(tuple(k.domain_multipliers),
                                                 "kkt/domain_multipliers",
                                                 "kkt.domain_multipliers"),
                "objective_gap": _number(k.objective_gap),
                "objective_gap_note": k.objective_gap_note},
        "communication": {**{name: int(getattr(c, name)) for name in _COMMUNICATION_INTS},
                          "clients_per_round": (None if c.clients_per_round is None
                                                else int(c.clients_per_round))},
        "stages": [{"penalty": _number(s.penalty), "rounds": int(s.rounds),
                    "slack_norm": _number(s.slack_norm)} for s in result.stages],
        "dropouts": [{"client": int(d.client), "task": str(d.task), "round": int(d.round),
                      "error": str(d.error)} for d in result.dropouts],
        "history": list(history),
        "solver_info": enc.encode(dict(result.solver_info), "solver_info", "solver_info"),
        "extras": enc.encode(dict(result.extras), "extras", "extras"),
        "tolerances": {str(k): _number(v) for k, v in result.tolerances.items()},
    }
    return meta, arrays


def save(result: Result, path) -> str:
    """Write ``result`` to ``path`` (one ``.npz`` archive, see the module docstring) and return
    the path. The file is written to a temporary file in the same directory and renamed, so an
    existing file is replaced whole or not at all; no suffix is added (``"run.npz"`` is the
    usual name)."""
    path = os.fspath(path)
    meta, arrays = _layout(result)
    payload = {name: np.asarray(a) for name, a in arrays.items()}
    payload["__meta__"] = np.array(json.dumps(meta, allow_nan=False))
    return npzfile.write(path, payload)


# -- loading -------------------------------------------------------------------------------------

def _member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, name: str, meta=None) -> np.ndarray:
    """One ``.npy`` member (:func:`ssca_solver.npzfile.read_member`): stored, its header
    checked against its size before its data is read (every member alike: ``meta``, the
    metadata read before it, is not needed)."""
    return npzfile.read_member(zf, info, name, ResultFileError, stored_only=True,
                               header_bytes=_HEADER_BYTES)


def _read(path: str) -> tuple[dict, dict]:
    """(metadata, arrays) of the file, the metadata checked for the format and version."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(2, "load_result: no saved Result at this path", path) from None
    if stat.S_ISDIR(info.st_mode):
        raise ResultFileError(f"load_result: {path!r} is a directory, not a saved Result", path)
    if not stat.S_ISREG(info.st_mode):
        raise ResultFileError(f"load_result: {path!r} is a special file (a FIFO, a device or a "
                              "socket), not a saved Result", path)
    if info.st_size == 0:
        raise ResultFileError(f"load_result: {path!r} is empty (0 bytes), not a saved Result",
                              path)
    return npzfile.read(path, ResultFileError, _member, lambda text: _parsed(text, path),
                        not_array="is not a .npy array",
                        no_meta="is missing (no metadata: not a saved Result)",
                        refused=f"load_result: {path!r} is refused:",
                        corrupt=f"load_result: {path!r} is not a Result saved by this library")


def _parsed(text: str, path: str) -> dict:
    """The metadata from its JSON text (no NaN tokens), checked for the format and version."""
    meta = json.loads(text, parse_constant=_no_constant)
    _check_format(meta, path)
    return meta


def _no_constant(name):
    raise ValueError(f"the JSON holds {name}, which save never writes")


def _check_format(meta, path: str) -> None:
    def bad(field, what):
        raise ResultFileError(f"load_result: {path!r} is refused: {field} {what}", path, field)

    if not isinstance(meta, dict):
        bad("__meta__", f"is a JSON {type(meta).__name__}, not an object")
    fmt = meta.get("format")
    if fmt != FORMAT:
        hint = (" (a checkpoint: resume from it with solve(resume=...))"
                if isinstance(fmt, str) and fmt.startswith("ssca-solver-checkpoint") else "")
        bad("format", f"= {fmt!r}: not a saved Result ({FORMAT!r}){hint}")
    version = meta.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        bad("version", f"= {version!r} is not a format version")
    if version > VERSION:
        bad("version", f"= {version}: written by a newer ssca-solver (this one reads result "
                       f"format version {VERSION}); upgrade ssca-solver to load it")


def metadata(path) -> dict:
    """The JSON metadata of a saved Result (format, version, ``versions`` of the software that
    wrote it, and the fields kept there), after the checks of :func:`load`."""
    path = os.fspath(path)
    meta, arrays = _read(path)
    _build(_Reader(path, meta, arrays))
    return meta


def load(path) -> Result:
    """The Result saved at ``path`` by :func:`save` (``res.save``): every field as it was
    (see the module docstring for exceptions and other objects in ``extras``). Never unpickles;
    a file that is not a saved Result, or a malformed, truncated or corrupted one, raises
    :class:`ResultFileError` naming the file and the field (FileNotFoundError when there is no
    file)."""
    path = os.fspath(path)
    meta, arrays = _read(path)
    return _build(_Reader(path, meta, arrays))


def _build(r: _Reader) -> Result:
    meta = r.meta
    names = tuple(r.string(n, f"constraint_names[{i}]")
                  for i, n in enumerate(r.items(r.get(meta, "constraint_names",
                                                      "constraint_names"), "constraint_names")))
    M = len(names)
    status = r.string(r.get(meta, "status", "status"), "status")
    if status not in st.STATUSES:
        r.bad("status", f"= {status!r} is not one of {', '.join(st.STATUSES)}")
    x = r.array("x", (None,))
    cons = r.array("constraints", (M,))
    slack = r.array("slack", (None,))
    if slack.size not in (0, M):
        r.bad("slack", f"has {slack.size} entries, not {M} (the constraints) or 0")

    kmeta = r.get(meta, "kkt", "kkt")
    kkt = KKTReport(
        **{name: r.array(f"kkt/{name}", (M,)) for name in _KKT_ARRAYS},
        multiplier_source=r.string(r.get(kmeta, "multiplier_source", "kkt.multiplier_source"),
                                   "kkt.multiplier_source"),
        stationarity_kind=r.string(r.get(kmeta, "stationarity_kind", "kkt.stationarity_kind"),
                                   "kkt.stationarity_kind"),
        **{name: r.number(r.get(kmeta, name, f"kkt.{name}"), f"kkt.{name}")
           for name in _KKT_FLOATS},
        domain_multipliers=r.value(r.get(kmeta, "domain_multipliers",
                                         "kkt.domain_multipliers"), "kkt.domain_multipliers"),
        # files written before the bound existed have none: NaN, no note
        objective_gap=r.number(kmeta.get("objective_gap", "nan"), "kkt.objective_gap"),
        objective_gap_note=r.string(kmeta.get("objective_gap_note", ""),
                                    "kkt.objective_gap_note"))
    if not isinstance(kkt.domain_multipliers, tuple):
        r.bad("kkt.domain_multipliers", "is not a tuple")

    cmeta = r.get(meta, "communication", "communication")
    comm = Communication(
        **{name: r.integer(r.get(cmeta, name, f"communication.{name}"),
                           f"communication.{name}") for name in _COMMUNICATION_INTS},
        clients_per_round=r.integer(r.get(cmeta, "clients_per_round",
                                          "communication.clients_per_round"),
                                    "communication.clients_per_round", optional=True))

    stages = []
    for i, s in enumerate(r.items(r.get(meta, "stages", "stages"), "stages")):
        f = f"stages[{i}]"
        stages.append(Stage(penalty=r.number(r.get(s, "penalty", f + ".penalty"), f + ".penalty"),
                            rounds=r.integer(r.get(s, "rounds", f + ".rounds"), f + ".rounds"),
                            slack_norm=r.number(r.get(s, "slack_norm", f + ".slack_norm"),
                                                f + ".slack_norm")))
    dropouts = []
    for i, d in enumerate(r.items(r.get(meta, "dropouts", "dropouts"), "dropouts")):
        f = f"dropouts[{i}]"
        dropouts.append(Dropout(
            client=r.integer(r.get(d, "client", f + ".client"), f + ".client"),
            task=r.string(r.get(d, "task", f + ".task"), f + ".task"),
            round=r.integer(r.get(d, "round", f + ".round"), f + ".round"),
            error=r.string(r.get(d, "error", f + ".error"), f + ".error")))

    history = _history(r, M)
    solver_info = r.value(r.get(meta, "solver_info", "solver_info"), "solver_info")
    extras = r.value(r.get(meta, "extras", "extras"), "extras")
    for field, value in (("solver_info", solver_info), ("extras", extras)):
        if not isinstance(value, dict):
            r.bad(field, f"is a {type(value).__name__}, not a dict")
    # (a file written before the tolerances were kept has none)
    tolerances = meta.get("tolerances", {})
    if not isinstance(tolerances, dict):
        r.bad("tolerances", f"is a {type(tolerances).__name__}, not a dict")
    tolerances = {k: r.number(v, f"tolerances.{k}") for k, v in tolerances.items()}
    unused = sorted(set(r.arrays) - r.used)
    if unused:
        r.bad(unused[0], "is an array no field of the metadata refers to")
    return Result(
        x=x, status=status,
        message=r.string(r.get(meta, "message", "message"), "message"),
        fun=r.number(r.get(meta, "fun", "fun"), "fun"),
        constraints=cons, slack=slack,
        penalty=r.number(r.get(meta, "penalty", "penalty"), "penalty", optional=True),
        kkt=kkt, history=history, communication=comm, stages=tuple(stages),
        nit=r.integer(r.get(meta, "nit", "nit"), "nit"),
        method=r.string(r.get(meta, "method", "method"), "method"),
        subproblem=r.string(r.get(meta, "subproblem", "subproblem"), "subproblem",
                            optional=True),
        time=r.number(r.get(meta, "time", "time"), "time"),
        constraint_names=names, solver_info=solver_info, extras=extras,
        dropouts=tuple(dropouts), tolerances=tolerances)


def _history(r: _Reader, M: int) -> History:
    """The history's columns, in their saved order: the round columns of one length (that of
    ``t``), the evaluation columns of another (that of ``eval_t``), ``constraints`` with M
    columns."""
    names = r.items(r.get(r.meta, "history", "history"), "history")
    for i, n in enumerate(names):
        r.string(n, f"history[{i}]")
    if len(set(names)) != len(names):
        r.bad("history", "names a column twice")
    for need in ("t", "stage", *EVAL_COLUMNS):
        if need not in names:
            r.bad("history", f"has no column {need!r}")
    rounds = len(r.array("history/t", (None,), "iu"))
    evals = len(r.array("history/eval_t", (None,), "iu"))
    columns = {}
    for name in names:
        field = f"history/{name}"
        if name == "constraints":
            columns[name] = r.array(field, (evals, M))
        elif name in EVAL_COLUMNS:
            columns[name] = r.array(field, (evals,), "biuf")
        else:
            a = r.array(field, None, "biuf")
            if a.ndim not in (1, 2) or len(a) != rounds:
                r.bad(field, f"has shape {a.shape}, not ({rounds},) or ({rounds}, any): one "
                             "row per round")
            columns[name] = a
    return History(columns)


# -- plain data ----------------------------------------------------------------------------------

def _plain(value):
    """``value`` as plain Python/NumPy data: dataclasses and dicts as dicts, tuples as lists,
    NumPy scalars as Python ones, arrays as (copied) arrays, exceptions as their text; other
    objects as they are."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, BaseException):
        return f"{type(value).__name__}: {value}"
    if isinstance(value, (KKTReport, Communication, Stage, Dropout)):
        return {f: _plain(getattr(value, f)) for f in value.__dataclass_fields__}
    return value


def to_dict(result: Result) -> dict:
    """``result`` as plain data: one key per Result field (``kkt``, ``communication``, each
    stage and dropout as dicts; ``history`` as a dict of its arrays; ``constraint_names`` and
    ``stages`` as lists; exceptions in ``extras`` as their text), plus ``success``. The arrays
    are copies. JSON text of it: :func:`to_json`."""
    out = {}
    for name in result.__dataclass_fields__:
        value = getattr(result, name)
        out[name] = (_plain(value.as_dict()) if isinstance(value, History) else _plain(value))
    out["success"] = result.success
    return out


def jsonable(value):
    """``value`` (e.g. :func:`to_dict`'s) as data ``json.dumps`` writes as standard JSON:
    arrays as (nested) lists, NaN and infinities as None (JSON has no such numbers), NumPy
    scalars as Python ones, tuples as lists, dict keys as strings, exceptions as their text;
    any other object as its ``repr``."""
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist())
    if isinstance(value, np.generic):
        return jsonable(value.item())
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, (tuple, list)):
        return [jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (KKTReport, Communication, Stage, Dropout, BaseException)):
        return jsonable(_plain(value))
    return repr(value)


def to_json(result: Result, **kwargs) -> str:
    """Standard JSON text of :func:`to_dict` (through :func:`jsonable`: NaN and infinities as
    ``null``); ``kwargs`` go to ``json.dumps`` (e.g. ``indent=2``). For an exact copy of the
    result use :func:`save`."""
    return json.dumps(jsonable(to_dict(result)), allow_nan=False, **kwargs)


def history_columns(result: Result) -> dict[str, np.ndarray]:
    """The history with one row per round, as a dict of equal-length 1-D arrays (what
    ``pandas.DataFrame`` takes): ``t``, ``stage`` and the method's round columns, a column
    ``name[m]`` for each column m of a 2-D one (``slack[0]``, ``multipliers[0]``, ...), then
    ``evaluated`` (True in the rounds with a full-data evaluation) and the evaluations'
    ``objective`` and ``constraints[m]`` (F_m - U_m), NaN in the other rounds. An evaluation
    at a round that has no row of its own gets one, with NaN in the round columns."""
    h = result.history.as_dict()
    t = np.asarray(h["t"])
    eval_t = np.asarray(h.get("eval_t", np.zeros(0, dtype=int)))
    rows = np.union1d(t, eval_t).astype(t.dtype if t.size else eval_t.dtype)
    where = np.searchsorted(rows, t)
    complete = len(rows) == len(t)

    def spread(values: np.ndarray, at: np.ndarray, full: bool) -> np.ndarray:
        if full:
            return values.copy()
        out = np.full(len(rows), np.nan)
        out[at] = values
        return out

    out = {"t": rows}
    for name, column in h.items():
        if name in EVAL_COLUMNS or name == "t":
            continue
        column = np.asarray(column)
        for suffix, values in _split(name, column):
            out[suffix] = spread(values, where, complete)
    at = np.searchsorted(rows, eval_t)
    evaluated = np.zeros(len(rows), dtype=bool)
    evaluated[at] = True
    out["evaluated"] = evaluated
    if "objective" in h:
        out["objective"] = spread(np.asarray(h["objective"], dtype=float), at, False)
    if "constraints" in h:
        for suffix, values in _split("constraints", np.asarray(h["constraints"], dtype=float)):
            out[suffix] = spread(values, at, False)
    return out


def _split(name: str, column: np.ndarray):
    """(name, column) for a 1-D column; (name[m], column[:, m]) for each m of a 2-D one."""
    if column.ndim == 1:
        yield name, column
        return
    flat = column.reshape(column.shape[0], math.prod(column.shape[1:]))
    for m in range(flat.shape[1]):
        yield f"{name}[{m}]", flat[:, m]
