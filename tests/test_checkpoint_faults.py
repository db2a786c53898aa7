"""Checkpoints under faults (issue 20): nothing lost, nothing silently wrong.

1. A ``checkpoint=`` path is checked before round 1 (a missing directory, a file in its place,
   a directory or a special file as the checkpoint, a directory that takes no new file, no
   space for one checkpoint): CheckpointError (a ValueError) naming the path, and no round run.
   A write that fails later (a full disk, a removed directory) warns once and the run goes on;
   a failure after it carries ``exc.state`` and names the last good checkpoint; no temporary
   file is left behind.
2. A checkpoint carries a hash of each client's rows and the constraints' bounds: a resume with
   other data of the same shape, or another bound of the same printed name, is refused naming
   the field.
3. An empty, truncated, bit-flipped, oversized (a decompression bomb) or malformed file and
   inconsistent metadata (a stage beyond the method's, a negative round, a state array of the
   wrong length) are refused with CheckpointError naming the file and the field.
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import tracemalloc
import warnings
import zipfile

import numpy as np
import pytest

import ssca_solver as ss
from ssca_solver import npzfile
from ssca_solver.engine import checkpoint as ckpt

OPTS = dict(batch_size=4, max_iter=6, seed=0, eval_every=None)


def _data(shift: float = 0.0, client: int = 1) -> ss.FederatedData:
    rng = np.random.default_rng(2)
    parts = [(rng.normal(size=(n, 2)), rng.normal(size=n)) for n in (12, 9, 10)]
    X, y = parts[client]
    parts[client] = (X + shift, y)
    return ss.FederatedData(parts)


def _lsq() -> ss.SampleFunction:
    return ss.SampleFunction(lambda w, X, y: 0.5 * (X @ w - y) ** 2,
                             lambda w, X, y: X.T @ (X @ w - y) / len(y), name="lsq")


def _problem(data=None, bound=None) -> ss.Problem:
    sq = ss.SampleFunction(lambda w, X, y: (X @ w) ** 2,
                           lambda w, X, y: 2 * X.T @ (X @ w) / len(y), name="sq")
    return ss.Problem(_lsq(), [] if bound is None else [sq <= bound], dim=2,
                      data=data or _data())


@pytest.fixture()
def written(tmp_path):
    """(problem, path) of a checkpoint after 3 rounds."""
    prob, path = _problem(), tmp_path / "run.npz"
    prob.solve(checkpoint=path, **{**OPTS, "max_iter": 3})
    return prob, path


def _rounds_counter():
    seen = []
    return seen, (lambda it: seen.append(it.t))


def _files(directory) -> list[str]:
    return sorted(os.listdir(directory))


def _rewrite(src, dst, arrays=None, meta=None, checksums=True) -> str:
    """A copy of checkpoint ``src`` at ``dst`` with ``arrays`` replaced (None: dropped) and
    the metadata updated by ``meta`` (or replaced by it when it is a string). With
    ``checksums`` the metadata's checksums are those of the new arrays (so what is tested is
    the check of their contents, not of their checksums)."""
    with np.load(src, allow_pickle=False) as f:
        payload = {k: f[k] for k in f.files}
    for k, v in (arrays or {}).items():
        if v is None:
            payload.pop(k, None)
        else:
            payload[k] = v
    if isinstance(meta, str):
        payload["__meta__"] = np.array(meta)
    else:
        new = json.loads(str(payload["__meta__"]))
        if checksums:
            new["checksums"] = {k: ckpt.checksum(v) for k, v in payload.items()
                                if k != "__meta__"}
        payload["__meta__"] = np.array(json.dumps({**new, **(meta or {})}))
    with open(dst, "wb") as out:
        np.savez(out, **payload)
    return str(dst)


def _refused(prob, path, *fields, **options):
    """Resume from ``path``: CheckpointError naming the file and each of ``fields``."""
    seen, count = _rounds_counter()
    with pytest.raises(ss.CheckpointError) as info:
        prob.solve(resume=path, callback=count, **{**OPTS, "seed": None, **options})
    text = str(info.value)
    assert str(path) in text, text
    for field in fields:
        assert field in text, text
    assert seen == []                                # no round ran
    return info.value


# -- 1. the checkpoint path before round 1, and write failures later --------------------------

@pytest.mark.parametrize("case", ["missing directory", "file as directory", "directory",
                                  "fifo", "not writable", "no space"])
def test_a_checkpoint_path_that_cannot_be_written_is_refused_before_round_1(
        tmp_path, monkeypatch, case):
    """Today each of these was found only at the first write (a raw FileNotFoundError,
    NotADirectoryError or IsADirectoryError after the rounds, with exc.state None); a FIFO
    was silently replaced by a file."""
    (tmp_path / "a_file").write_text("x")
    path, expect = {
        "missing directory": (tmp_path / "no" / "such" / "run.npz", "does not exist"),
        "file as directory": (tmp_path / "a_file" / "run.npz", "is a file, not a directory"),
        "directory": (tmp_path, "is a directory"),
        "fifo": (tmp_path / "pipe", "not a regular file"),
        "not writable": (tmp_path / "run.npz", "cannot create a file"),
        "no space": (tmp_path / "run.npz", "bytes free"),
    }[case]
    if case == "fifo":
        os.mkfifo(path)
    if case == "not writable":       # chmod does not stop root: the probe file's creation fails
        def denied(*args, **kwargs):
            raise PermissionError(errno.EACCES, "Permission denied")
        monkeypatch.setattr(npzfile.tempfile, "mkstemp", denied)
    if case == "no space":
        real = shutil.disk_usage
        monkeypatch.setattr(ckpt.shutil, "disk_usage",
                            lambda p: real(p)._replace(free=1000))
    before = _files(tmp_path)
    seen, count = _rounds_counter()
    with pytest.raises(ss.CheckpointError) as info:
        _problem().solve(checkpoint=path, callback=count, **OPTS)
    assert isinstance(info.value, ValueError) and expect in str(info.value)
    assert str(path) in str(info.value) and seen == []
    assert _files(tmp_path) == before                 # not even a probe file left


class _DiskFull:
    """np.savez in the checkpoint module that fails from its ``first``-th call on, after
    writing a few bytes, as a full disk does."""

    def __init__(self, first: int):
        self.first, self.calls = first, 0
        self.real = np.savez

    def __call__(self, f, **arrays):
        self.calls += 1
        if self.calls >= self.first:
            f.write(b"PK\x03\x04 partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.real(f, **arrays)


def test_a_write_failure_later_warns_once_and_the_run_goes_on(tmp_path, monkeypatch):
    """Today a full disk at a later checkpoint raised a raw OSError (the run lost, exc.state
    None) and left the temporary file behind."""
    path = tmp_path / "run.npz"
    full = _DiskFull(first=2)
    monkeypatch.setattr(ckpt.np, "savez", full)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = _problem().solve(checkpoint=path, checkpoint_every=2, **OPTS)
    assert res.nit == 6 and full.calls == 3                # rounds 2 (written), 4, 6 (failed)
    mine = [w for w in caught if "checkpoint" in str(w.message)]
    assert len(mine) == 1, [str(w.message) for w in caught]
    text = str(mine[0].message)
    assert str(path) in text and "No space left on device" in text and "round 2" in text
    assert _files(tmp_path) == ["run.npz"]                  # no temporary file
    monkeypatch.setattr(ckpt.np, "savez", full.real)
    arrays, meta = ckpt.load(path)
    assert meta["round"] == 2                               # the last good one, intact


def test_a_failure_after_a_failed_write_names_the_last_good_checkpoint(tmp_path, monkeypatch):
    """The directory removed mid-run, then a user function that raises: the error carries
    exc.state (the last good round) and exc.checkpoint is None (nothing left on disk); with
    the disk full instead, exc.checkpoint names the last good checkpoint (round 2)."""
    fail = {"now": False}

    def grad(w, X, y):
        if fail["now"]:
            raise RuntimeError("boom")
        return X.T @ (X @ w - y) / len(y)

    def problem():
        fail["now"] = False
        return ss.Problem(ss.SampleFunction(lambda w, X, y: 0.5 * (X @ w - y) ** 2, grad,
                                            name="lsq"), dim=2, data=_data())

    def at(t_remove, t_fail):
        def callback(it):
            if it.t == t_remove:
                shutil.rmtree(sub)
            fail["now"] = it.t >= t_fail
        return callback

    opts = {**OPTS, "max_iter": 20, "checkpoint_every": 2}
    sub = tmp_path / "sub"
    sub.mkdir()
    with warnings.catch_warnings(record=True) as caught, \
            pytest.raises(ss.UserFunctionError) as info:
        warnings.simplefilter("always")
        problem().solve(checkpoint=sub / "run.npz", callback=at(3, 7), **opts)
    err = info.value
    assert err.state is not None and err.state.t == 7 and err.checkpoint is None
    assert len([w for w in caught if "could not write" in str(w.message)]) == 1
    assert not os.path.exists(sub)

    path = tmp_path / "run.npz"
    full = _DiskFull(first=2)
    monkeypatch.setattr(ckpt.np, "savez", full)
    with warnings.catch_warnings(record=True), pytest.raises(ss.UserFunctionError) as info:
        warnings.simplefilter("always")
        problem().solve(checkpoint=path, callback=at(None, 7), **opts)
    err = info.value
    assert err.state is not None and err.state.t == 7 and err.checkpoint == str(path)
    assert _files(tmp_path) == ["run.npz"]
    monkeypatch.setattr(ckpt.np, "savez", full.real)
    assert ckpt.load(path)[1]["round"] == 2


# -- 2. the fingerprint: data and bounds -------------------------------------------------------

def test_a_resume_with_other_data_of_the_same_shape_is_refused(written):
    """Today accepted: the history mixed both data sets."""
    _, path = written
    err = _refused(_problem(_data(shift=1e-9)), path, "client 1", "data")
    assert err.field == "fingerprint.data[1]"
    # the same rows in new arrays resume
    same = ss.FederatedData([(np.array(c.X), np.array(c.y)) for c in _data().clients])
    assert _problem(same).solve(resume=path, **{**OPTS, "seed": None}).nit == 6


def test_a_resume_with_another_bound_of_the_same_name_is_refused(tmp_path):
    """The constraint's name prints the bound with %g ("sq <= 0.5"): today a bound changed
    in its 7th digit resumed."""
    path = tmp_path / "run.npz"
    _problem(bound=0.5).solve(checkpoint=path, callback=lambda it: it.t == 3, **OPTS)
    _refused(_problem(bound=0.5 + 1e-9), path, "bounds")


# -- 3. malformed, truncated, bit-flipped, oversized, inconsistent --------------------------------

def _member_offset(path, name: str) -> int:
    """The file offset of member ``name``'s data (stored, uncompressed)."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(name)
    with open(path, "rb") as f:
        f.seek(info.header_offset + 26)
        n, m = np.frombuffer(f.read(4), dtype="<u2")
    return info.header_offset + 30 + int(n) + int(m)


@pytest.mark.parametrize("case", ["empty", "truncated", "flipped state", "flipped meta"])
def test_a_damaged_file_is_refused_naming_it(written, tmp_path, case):
    """Today: EOFError, BadZipFile ("File is not a zip file", "Bad CRC-32"), without the
    path."""
    prob, good = written
    raw = bytearray(good.read_bytes())
    path = tmp_path / "bad.npz"
    if case == "empty":
        raw = b""
    elif case == "truncated":
        raw = raw[: len(raw) // 2]
    elif case.startswith("flipped"):
        name = "state/w.npy" if case == "flipped state" else "__meta__.npy"
        at = _member_offset(good, name) + 128 + 3             # past the .npy header
        raw[at] ^= 0x10
    path.write_bytes(bytes(raw))
    err = _refused(prob, path)
    assert type(err.__cause__) is not zipfile.BadZipFile      # ours, not a raw one
    if case == "flipped state":
        assert "state/w" in str(err)
    if case == "flipped meta":
        assert "__meta__" in str(err)


@pytest.mark.parametrize("meta, field", [
    ("{not json", "__meta__"),
    ("[1, 2, 3]", "__meta__"),
    ({"seed": None}, "seed"),
    ({"stage": "one"}, "stage"),
    ({"elapsed": float("nan")}, "elapsed"),
    ({"work_since": -3.0}, "work_since"),
    ({"free_since": "12"}, "free_since"),
    ({"format": "something-else/9"}, "format"),
])
def test_malformed_metadata_is_refused_naming_the_field(written, tmp_path, meta, field):
    """Today: JSONDecodeError, AttributeError, or TypeError from int(None)."""
    prob, good = written
    if isinstance(meta, dict) and meta.get("seed", 0) is None:
        src = json.loads(str(np.load(good)["__meta__"]))
        del src["seed"]
        meta = json.dumps(src)
    path = _rewrite(good, tmp_path / "bad.npz", meta=meta)
    err = _refused(prob, path, field)
    assert field in (err.field or "")


def _bomb(good, path, megabytes: int = 64) -> None:
    """``good`` with its state/w replaced by a deflated member of ``megabytes`` MB of zeros
    (a valid .npy header declaring that many floats): a few hundred kB on disk."""
    n = megabytes * (1 << 20) // 8
    with zipfile.ZipFile(good) as src, \
            zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as out:
        for info in src.infolist():
            if info.filename != "state/w.npy":
                out.writestr(info.filename, src.read(info))
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            header, {"descr": "<f8", "fortran_order": False, "shape": (n,)})
        with out.open("state/w.npy", "w", force_zip64=True) as f:
            f.write(header.getvalue())
            zeros = bytes(1 << 20)
            for _ in range(megabytes):
                f.write(zeros)


def test_a_decompression_bomb_is_refused_without_decompressing(written, tmp_path):
    """Today np.load inflated the whole member (64 MB here) before anything was checked."""
    prob, good = written
    path = tmp_path / "bomb.npz"
    _bomb(good, path)
    assert os.path.getsize(path) < 1 << 20
    tracemalloc.start()
    try:
        err = _refused(prob, path, "state/w", "refused without decompressing")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak
    assert err.field == "state/w"


@pytest.mark.parametrize("edit, field", [
    ({"meta": {"stage": 99}}, "stage"),
    ({"meta": {"round": -1}}, "round"),
    ({"arrays": {"state/w": np.zeros(3)}}, "state/w"),
    ({"arrays": {"state/t": np.asarray(7)}}, "state/t"),
    ({"arrays": {"history/step_norm": np.zeros(2)}}, "history/step_norm"),
    ({"arrays": {"state/w": None}}, "state/w"),
])
def test_inconsistent_contents_are_refused_naming_the_field(written, tmp_path, edit, field):
    """Today stage 99 was accepted (the solve returned without running), a negative round
    too, and a state w of the wrong length was blamed on the user's function."""
    prob, good = written
    path = _rewrite(good, tmp_path / "bad.npz", **edit)
    err = _refused(prob, path, field)
    assert err.field == field
    assert not isinstance(err, ss.UserFunctionError)



@pytest.mark.parametrize("edit, field", [
    ({"state/tau": np.asarray(-1.0)}, "state/tau"),
    ({"state/w": np.zeros(2, dtype=np.int64)}, "state/w"),
    ({"state/stats/0/quad": np.asarray(-5.0)}, "state/stats/0/quad"),
    ({"state/bonus": np.ones(3)}, "state/bonus"),
])
def test_an_array_edited_after_writing_is_refused_naming_it(written, tmp_path, edit, field):
    """Issue 20's probe: a state that fits the solve's shapes but not what was written (a
    negative tau, an integer w, a negative curvature) was accepted and blamed on the solver
    (DivergenceError at round 31) or the user's function; each array's checksum is kept in
    the metadata now (a member added is refused by it too)."""
    prob, good = written
    path = _rewrite(good, tmp_path / "bad.npz", arrays=edit, checksums=False)
    err = _refused(prob, path, field)
    assert err.field == field


@pytest.mark.parametrize("meta, field", [
    ({"method": "fedavg"}, "method"),
    ({"x0": "<delete>"}, "x0"),
    ({"x0": None}, "x0"),
    ({"checksums": "<delete>"}, "checksums"),
])
def test_metadata_that_contradicts_itself_or_lacks_a_hash_is_refused(written, tmp_path, meta,
                                                                     field):
    """Issue 20's probe: a method other than the fingerprint's, or a checkpoint without the
    start point's hash (so another x0 could not be refused) or without the arrays' checksums,
    was accepted."""
    prob, good = written
    src = json.loads(str(np.load(good)["__meta__"]))
    src.update(meta)
    for k in [k for k, v in meta.items() if v == "<delete>"]:
        del src[k]
    err = _refused(prob, _rewrite(good, tmp_path / "bad.npz", meta=json.dumps(src)), field)
    assert err.field == field


def test_a_long_client_error_in_the_dropouts_still_resumes(written, tmp_path):
    """A guard on the size limits (passes at a6c4ee9 too): a dropout's error text has no
    length limit (a client's traceback), and a checkpoint holding a long one resumes."""
    prob, good = written
    long = "ClientError: " + "x" * 1_500_000      # beyond 16384 characters a dropout
    path = _rewrite(good, tmp_path / "drops.npz", arrays={
        "dropouts/client": np.array([1], dtype=np.int64),
        "dropouts/round": np.array([2], dtype=np.int64),
        "dropouts/task": np.array(["ssca.round"]), "dropouts/error": np.array([long])})
    res = prob.solve(resume=path, **{**OPTS, "seed": None})
    assert res.nit == 6 and [d.error for d in res.dropouts] == [long]


def test_resume_with_edited_function_code_is_not_silent(tmp_path):
    """Issue 20's last silent case: the same name, other code (a constant edited) resumed
    the old run silently; now a warning names the function (not a refusal: fixing a function
    that crashed and resuming is legitimate). The same code resumes without it."""
    import ssca_solver as ss

    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 3))
    y = X @ np.array([1.0, -1.0, 0.5])
    data = ss.FederatedData.split(X, y, num_clients=2, seed=0)

    def problem(scale):
        f = ss.SampleFunction(lambda w, X, y: scale * 0.5 * (X @ w - y) ** 2,
                              lambda w, X, y: scale * X.T @ (X @ w - y) / len(X), name="ls")
        return ss.Problem(f, dim=3, data=data)

    path = str(tmp_path / "run.npz")
    problem(1.0).solve(seed=0, max_iter=5, checkpoint=path, batch_size="full")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        same = problem(1.0).solve(seed=0, max_iter=8, checkpoint=path, resume=path,
                                  batch_size="full")
    assert same.nit >= 5
    with pytest.warns(RuntimeWarning, match="other code of the function 'ls'"):
        problem(2.0).solve(seed=0, max_iter=12, checkpoint=path, resume=path,
                           batch_size="full")


def test_the_fingerprint_is_hashed_only_for_a_solve_that_writes_or_reads_a_checkpoint(
        tmp_path, monkeypatch):
    """Hashing every function's code and closure costs milliseconds a solve with hundreds of
    functions: a solve without ``checkpoint`` or ``resume`` does not compute it; one with a
    checkpoint does, and the file carries it (with the data's hash)."""
    from ssca_solver.engine import session

    calls = []
    real = session.code_hash
    monkeypatch.setattr(session, "code_hash", lambda *a, **k: calls.append(1) or real(*a, **k))
    prob = _problem(bound=1.0)
    prob.solve(**OPTS)
    assert calls == []
    path = tmp_path / "run.npz"
    prob.solve(checkpoint=path, **OPTS)
    assert len(calls) == len(prob.functions)
    meta = json.loads(str(np.load(path)["__meta__"]))
    assert meta["fingerprint"]["function_code"] and meta["fingerprint"]["data"]
    res = prob.solve(resume=path, **{**OPTS, "seed": None})
    assert res.nit == OPTS["max_iter"] and len(calls) == 2 * len(prob.functions)
