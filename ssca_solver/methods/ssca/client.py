"""Method "ssca"'s client side of a round (Algorithms 1-2, steps 3-4): the statistics q_m of
every stochastic function on the client's mini-batch, and the gradient-noise numbers of the
adaptive batch size (:mod:`.adaptive`)."""

from __future__ import annotations

import functools
from typing import Sequence

import numpy as np

from ...errors import UserFunctionError, not_finite_at_point
from ...model.functions import (checked_hessp, difference_hessians, difference_products,
                                has_curvature, raw_value_and_grad, whole_hessian)
from ...model.surrogates import ProximalLinear, proximal_linear_statistics
from ...federated.messages import Request, optional_int, own_factor, secagg_active, summed
from . import adaptive as ad
from . import privacy
from .step import pack_statistics, run_key, stacked_run, stat_key, stat_runs

#: the task name of a round
TASK = "ssca.round"
#: request config: a point where a function is not finite is answered with NONFINITE (the
#: server's backtracking rejects it) instead of an error
REJECT_NONFINITE = "reject_nonfinite"
#: the reply array of a client whose functions were not finite at the point
NONFINITE = "nonfinite"
#: reply array of a round that asks for curvature (request config ``curvature``): one row per
#: function asked for (:func:`curvature_of`, in index order), the packed upper triangle of
#: the sum over the batch's rows of its Hessian (:func:`pack_symmetric`), (k, d (d + 1) / 2);
#: with the request array ``SKETCH``, the (k, d) sums of its Hessian times each of those
#: rows, (k, k', d)
CURVATURE = "curv"
#: request array: the k directions (rows, (k, d)) of the Hessian's sketch (:mod:`.newton`)
SKETCH = "sketch"
#: request array: the indices of the functions whose curvature the round asks for (absent:
#: every function's; :func:`.acceptance.curvature_wanted`)
CURVATURE_OF = "curv_of"
#: request config: differential privacy: clip each row's contribution (every function's value
#: and gradient at w_t) to this norm before the sums (:mod:`.privacy`)
DP_CLIP = "dp_clip"
#: request config: "client" to clip each client's mean contribution instead of each row
DP_LEVEL = "dp_level"


@functools.lru_cache(maxsize=8)
def _upper(d: int) -> tuple:
    """np.triu_indices(d), computed once per d (read-only): every client packs and the server
    unpacks each function's Hessian every round."""
    rows, cols = np.triu_indices(d)
    rows.setflags(write=False)
    cols.setflags(write=False)
    return rows, cols


def pack_symmetric(H: np.ndarray) -> np.ndarray:
    """The upper triangle of a symmetric (d, d) matrix, row by row: d (d + 1) / 2 floats; of
    a stack of them (k, d, d), one such row each (k, d (d + 1) / 2)."""
    rows, cols = _upper(H.shape[-1])
    return H[..., rows, cols]


def unpack_symmetric(packed: np.ndarray, d: int) -> np.ndarray:
    """The symmetric (d, d) matrix of :func:`pack_symmetric`'s floats; of rows of them
    (k, d (d + 1) / 2), the k matrices (k, d, d)."""
    packed = np.asarray(packed)
    H = np.zeros(packed.shape[:-1] + (d, d))
    rows, cols = _upper(d)
    H[..., rows, cols] = packed
    H[..., cols, rows] = packed
    return H


def component_blocks(functions, builders) -> list:
    """Runs of at least two consecutive functions that are components of one
    :class:`~ssca_solver.VectorSampleFunction` with the proximal-linear builder (its own
    ``statistics``): [(vector, [m, ...], [k, ...])]."""
    blocks, run = [], []

    def close():
        if len(run) >= 2:
            blocks.append((run[0][1], [m for m, _, _ in run], [k for _, _, k in run]))
        run.clear()

    for m, (fn, b) in enumerate(zip(functions, builders)):
        of = getattr(fn, "component_of", None)
        if of is None or type(b).statistics is not ProximalLinear.statistics:
            close()
            continue
        if run and run[0][1] is not of[0]:
            close()
        run.append((m, of[0], of[1]))
    close()
    return blocks


def scalar_blocks(functions, builders) -> list:
    """Runs of at least two consecutive plain SampleFunctions (not components of a
    VectorSampleFunction) with the proximal-linear builder (its own ``statistics``):
    [[m, ...]]. Each function is still called on its own; :func:`scalar_statistics` checks
    their answers and forms eq. (fsmbar)'s statistics for the run at once."""
    blocks, run = [], []
    for m, (fn, b) in enumerate(zip(functions, builders)):
        if (getattr(fn, "component_of", None) is None
                and type(b).statistics is ProximalLinear.statistics):
            run.append(m)
            continue
        if len(run) >= 2:
            blocks.append(run)
        run = []
    if len(run) >= 2:
        blocks.append(run)
    return blocks


#: up to this many rows in a batch, :func:`scalar_statistics` sums a run's values as the rows
#: of one (functions, rows) array (its memory: this many floats per function)
SUM_ROWS_TOGETHER = 64


def scalar_statistics(blocks, functions, builders, w, X, y, tau: float,
                      pieces=None) -> dict:
    """{m: q_m} for the functions of ``blocks`` (:func:`scalar_blocks`): the proximal-linear
    statistics of eq. (fsmbar), the same floats :meth:`~ssca_solver.ProximalLinear.statistics`
    gives one function at a time, with the checks of the answers' shapes and finiteness made
    once for the run. A run where a function raises, answers with a wrong shape or is not
    finite is left out: its functions then go one by one, whose errors name the function,
    client and round. ``pieces``: a list to which each run's stacked statistics are added
    (:func:`_split_statistics`)."""
    out = {}
    n, d = X.shape[0], w.size
    ww = w @ w
    # a few rows: the functions' values summed as one array's rows (the same floats as
    # each one's own sum), not one reduction per function
    together = n <= SUM_ROWS_TOGETHER
    for ms in blocks:
        sums, grads = np.empty(len(ms)), np.empty((len(ms), d))
        values = np.empty((len(ms), n)) if together else None
        try:
            for i, m in enumerate(ms):
                v, g = raw_value_and_grad(functions[m], w, X, y)
                v, g = np.asarray(v, dtype=float), np.asarray(g, dtype=float)
                if v.shape != (n,) or g.shape != (d,):
                    raise ValueError("shape")
                if together:
                    values[i] = v
                else:
                    sums[i] = v.sum()
                grads[i] = g
        except Exception:
            continue
        if together:
            sums = values.sum(axis=1)
        if not (np.all(np.isfinite(sums)) and np.all(np.isfinite(grads))):
            continue
        _split_statistics(out, ms, proximal_linear_statistics(
            sums, grads, n, w, n * _taus(builders, ms, tau), ww), pieces)
    return out


def block_statistics(blocks, functions, builders, w, X, y, tau: float,
                     pieces=None) -> dict:
    """{m: q_m} for the functions of ``blocks`` (:func:`component_blocks`): the proximal-linear
    statistics of eq. (fsmbar) of every component from one evaluation of their vector
    function, as :meth:`~ssca_solver.ProximalLinear.statistics` gives them one by one. A block
    whose evaluation raises or is not finite is left out: its functions then go one by one,
    whose errors name the component, client and round. ``pieces``: as
    :func:`scalar_statistics`'s."""
    out = {}
    n = X.shape[0]
    for vec, ms, ks in blocks:
        try:
            v, J = vec.evaluate(w, X, y)
        except Exception:
            continue
        V, G = v[:, ks], J[ks]
        sums = V.sum(axis=0)
        if not (np.all(np.isfinite(sums)) and np.all(np.isfinite(G))):
            continue
        _split_statistics(out, ms, proximal_linear_statistics(sums, G, n, w,
                                                              n * _taus(builders, ms, tau)),
                          pieces)
    return out


def _taus(builders, ms, tau: float) -> np.ndarray:
    """Each function's tau: its builder's own, else the round's."""
    return np.array([builders[m].tau if builders[m].tau is not None else tau for m in ms],
                    dtype=float)


def _split_statistics(out: dict, ms, stats, pieces=None) -> None:
    """out[m] = function m's statistics, rows of K functions' (const, lin, quad); with
    ``pieces`` (a list) the K functions' stacked arrays are added to it instead, as
    (ms, {"const": (K,), "lin": (K, d), "quad": (K,)}), for :func:`pack_pieces`, and out[m]
    is None (:func:`piece_statistics` makes the dict where one is needed)."""
    const, lin, quad = stats
    if pieces is not None:
        pieces.append((list(ms), {"const": np.asarray(const, dtype=float),
                                  "lin": np.asarray(lin, dtype=float),
                                  "quad": np.asarray(quad, dtype=float)}))
        out.update(dict.fromkeys(ms))
        return
    for i, m in enumerate(ms):
        out[m] = _row_statistics(const, lin, quad, i)


def _row_statistics(const, lin, quad, i: int) -> dict:
    """Row i of K functions' stacked (const, lin, quad) as one function's statistics."""
    return {"const": np.asarray(const[i]), "lin": lin[i], "quad": np.asarray(quad[i])}


def piece_statistics(pieces, only=None) -> dict:
    """{m: function m's statistics} of the functions whose rows the ``pieces`` hold (those of
    ``only``, a set, when given): the dicts :func:`_split_statistics` makes without them."""
    out = {}
    for ms, arrays in pieces:
        for i, m in enumerate(ms):
            if only is None or m in only:
                out[m] = _row_statistics(arrays["const"], arrays["lin"], arrays["quad"], i)
    return out


def pack_pieces(stats, runs, pieces) -> dict:
    """:func:`~.step.pack_statistics` of ``stats`` in the layout ``runs``, the same arrays,
    with a stacked run's rows taken as slices of the ``pieces`` that hold them
    (:func:`_split_statistics`: consecutive functions of one piece are one slice) instead of
    copied one function at a time: with hundreds of constraints read at once a reply is
    packed in a few array operations. ``stats[m]`` is None for a function whose row a piece
    holds."""
    where = {}
    for p, (ms, _) in enumerate(pieces):
        for i, m in enumerate(ms):
            where[m] = (p, i)
    if not where:
        return pack_statistics(stats, runs)
    out = {}
    for run in runs:
        first, stop, sig = run
        if not stacked_run(run):
            missing = {m for m in range(first, stop) if stats[m] is None}
            rows = piece_statistics(pieces, missing) if missing else {}
            for m in range(first, stop):
                st = stats[m] if stats[m] is not None else rows[m]
                for name, v in st.items():
                    out[stat_key(m, name)] = v
            continue
        # segments [(piece or None, start row, count, first function)]
        segs, m = [], first
        while m < stop:
            at = where.get(m)
            if at is None:
                segs.append((None, m, 1, m))
                m += 1
                continue
            p, i = at
            k = 1
            while (m + k < stop and where.get(m + k) == (p, i + k)):
                k += 1
            segs.append((p, i, k, m))
            m += k
        for name, shape in sig:
            parts = [np.asarray(stats[f][name], dtype=float)[None, ...] if p is None
                     else pieces[p][1][name][i:i + k] for p, i, k, f in segs]
            out[run_key(first, stop - 1, name)] = (np.array(parts[0], dtype=float)
                                                   if len(parts) == 1 else
                                                   np.concatenate(parts).astype(float,
                                                                                copy=False))
    return out


def curvature_of(request: Request, count: int) -> frozenset:
    """The indices of the functions whose curvature ``request`` asks for: none without its
    config ``curvature``, those of its array ``curv_of`` with it (each checked: an index
    outside the ``count`` functions is a malformed request), else all of them."""
    if not request.config.get("curvature"):
        return frozenset()
    listed = request.arrays.get(CURVATURE_OF)
    if listed is None:
        return frozenset(range(count))
    idx = np.asarray(listed).ravel()
    if idx.size and (not np.all(idx == np.round(idx)) or idx.min() < 0 or idx.max() >= count):
        raise ValueError(f"request array {CURVATURE_OF!r} must list function indices in "
                         f"[0, {count}); got {idx.tolist()}")
    return frozenset(int(i) for i in idx)


class SSCARoundTask:
    """Client side of one round (Algorithms 1-2, steps 3-4): draw the mini-batch of
    (seed, client, round) and return q_m(w_t, batch) for every stochastic function m, as sums
    over the batch rows, each under the name ``"m:statistic"``.

    Request config: ``batch_size`` (None: every row), ``tau`` (the proximal weight of builders
    without their own), ``noise`` (also send, per function, the squared difference of the
    batch halves' mean gradients, ``"noise:m"``: adaptive sampling), ``curvature`` (also send,
    per function, the sum over the batch's rows of its Hessian at w_t, packed, one row per
    function in ``"curv"``: the statistics of the server's Newton model; with the request
    array ``"sketch"`` (k, d), its Hessian times each of those k directions instead, (k, d)
    per function; with the request array ``"curv_of"``, only for the functions it lists),
    ``dp_clip`` (the sums of the rows' values and gradients, each row clipped to this norm,
    :mod:`.privacy`; nothing else is sent) and ``reject_nonfinite`` (a function that is not
    finite at w_t is answered with the one array ``"nonfinite"`` instead of an error: the
    backtracking's trial point is rejected).
    """

    def __init__(self, functions: Sequence, builders: Sequence):
        self.functions = tuple(functions)
        self.builders = tuple(builders)
        self.blocks = component_blocks(self.functions, self.builders)
        self.scalar_blocks = scalar_blocks(self.functions, self.builders)
        # (number of functions, the runs of the statistics' layout, step.stat_runs), which the
        # builders fix: taken from the first reply's statistics and kept (a reply of another
        # layout fails to pack in them: a KeyError, or a ValueError on the shapes)
        self._runs = None

    def pooling(self, request: Request):
        """The batch the shards pool for ``request`` (:class:`~ssca_solver.federated.shards.
        Pooling`), or None when a pooled evaluation would not give the sum of the clients'
        replies: the noise numbers of a sampled round (the squared difference of each
        client's batch halves), or a builder other than the proximal-linear one (whose
        statistics need not be sums over rows, e.g. a curvature clipped at 0)."""
        from ...federated.shards import Pooling

        batch = optional_int(request.config.get("batch_size"))
        if request.config.get("noise") and batch is not None:
            return None
        if request.config.get(DP_LEVEL) == "client":      # each client clipped on its own
            return None
        if any(type(b).statistics is not ProximalLinear.statistics for b in self.builders):
            return None
        return Pooling(batch)

    def row_sums(self, request: Request, X, y, where: str) -> dict:
        """The arrays of a reply from one client holding the rows (X, y) as its whole batch
        (the shards' pooled evaluation, :meth:`pooling`)."""
        n = X.shape[0]
        return self._arrays(request, X, y, n, n, where, 1.0)

    def __call__(self, client, request: Request):
        X, y, b = client.batch(request.round, optional_int(request.config.get("batch_size")))
        where = f"client {client.index}, round {request.round}"
        combined = summed(request) and bool(request.config.get("noise"))
        arrays = self._arrays(request, X, y, b, client.num_rows, where,
                              own_factor(client, request) if combined else 1.0)
        return client.reply(request, arrays, batch_size=b)

    def _arrays(self, request: Request, X, y, b: int, rows: int, where: str,
                factor: float) -> dict:
        """The reply's arrays from the batch (X, y) of b of the client's ``rows`` rows
        (``factor``: h_i in a summed request)."""
        tau = float(request.config["tau"])
        clip = request.config.get(DP_CLIP)
        if clip is not None:          # differential privacy: the clipped sums alone
            clipped = (privacy.client_arrays if request.config.get(DP_LEVEL) == "client"
                       else privacy.clipped_arrays)
            return clipped(self.functions, self.builders, request.w, X, y, tau, float(clip),
                           where)
        noisy = bool(request.config.get("noise")) and b < rows
        stats, noise, curvature = [], [], []
        sketch = request.arrays.get(SKETCH) if request.config.get("curvature") else None
        omega = None if sketch is None else np.asarray(sketch, dtype=float).T     # (d, k)
        wanted = curvature_of(request, len(self.functions))
        # consecutive components of one VectorSampleFunction, and runs of plain functions:
        # their statistics at once (not with the noise split, which goes function by function)
        read, pieces = {}, []
        if not noisy:
            read.update(block_statistics(self.blocks, self.functions, self.builders,
                                         request.w, X, y, tau, pieces))
            read.update(scalar_statistics(self.scalar_blocks, self.functions, self.builders,
                                          request.w, X, y, tau, pieces))
        try:
            # the functions that give no curvature: their Hessians (or the sketch's products)
            # from central differences of their gradients, every function at each point
            differenced = {}
            if wanted:
                lacking = [m for m in sorted(wanted) if not has_curvature(self.functions[m])]
                fns = [self.functions[m] for m in lacking]
                if lacking:
                    found = (difference_hessians(fns, request.w, X, y, where) if omega is None
                             else difference_products(fns, request.w, X, y, omega, where))
                    differenced = dict(zip(lacking, found))
            for m, (fn, builder) in enumerate(zip(self.functions, self.builders)):
                t = builder.tau if builder.tau is not None else tau
                if m in read:
                    stats.append(read[m])
                elif noisy:
                    st, v = ad.split_statistics(builder, fn, request.w, X, y, t, where)
                    stats.append(st)
                    noise.append(v)
                else:
                    stats.append(builder.statistics(fn, request.w, X, y, t, where))
                if m not in wanted:
                    continue
                if omega is not None:
                    P = (differenced[m] if m in differenced
                         else checked_hessp(fn, request.w, X, y, omega, where))
                    curvature.append(P.T)
                else:
                    curvature.append(differenced[m] if m in differenced
                                     else whole_hessian(fn, request.w, X, y, request.w.size,
                                                        where))
        except UserFunctionError as exc:
            # a trial point of the backtracking outside a function's domain (overflow, log of
            # a negative number): say so, and the server retries from the last accepted point
            # (under secure aggregation every reply must carry the same arrays: it raises)
            if not (request.config.get(REJECT_NONFINITE) and not_finite_at_point(exc)
                    and not secagg_active(request)):
                raise
            return {NONFINITE: np.ones(1)}
        if self._runs is None or self._runs[0] != len(stats):
            # the layout from every function's dict, the first time (the pieces' rows too)
            held = piece_statistics(pieces)
            stats = [st if st is not None else held[m] for m, st in enumerate(stats)]
            self._runs = (len(stats), stat_runs(stats))
        arrays = pack_pieces(stats, self._runs[1], pieces)
        if curvature:
            # the functions' rows in index order, the sums over the batch's rows
            stacked = np.stack(curvature) * X.shape[0]
            arrays[CURVATURE] = (stacked if omega is not None
                                 else np.ascontiguousarray(pack_symmetric(stacked)))
        combined = summed(request) and bool(request.config.get("noise"))
        if combined and not noisy:        # every summed reply has the same arrays: a full
            noise = [0.0] * len(self.functions)      # batch's share of the noise is 0
        if noisy or combined:
            noise = np.array(noise)
            if combined:
                # weighted with a = h N_i / (B N), scaled by N and summed: send what becomes
                # this client's share h^2 (N_i/N)^2 |m_A - m_B|^2 / 4 (1 - B/N_i)
                N = float(request.config["num_samples"])
                noise = factor * rows * b * noise * max(0.0, 1.0 - b / rows) / (4.0 * N * N)
            arrays[ad.NOISE.rstrip(":")] = noise
        return arrays
