"""Algorithms 1 and 2 as ``init``/``step`` over a small immutable state.

One round (steps 3-5 of Algorithms 1 and 2):

    q_i       <- client i on its mini-batch at w_t              (federated layer)
    qhat      =  sum_i N_i / (B N) q_i                          (eqs. (Fs0bar)/(Fsmbar))
    stats_t   =  (1 - rho_t) stats_{t-1} + rho_t qhat           (same equations, on statistics)
    wbar, s   =  argmin of Problem 2 / Problem 5 at stats_t     (subproblem layer)
    w_{t+1}   =  (1 - gamma_t) w_t + gamma_t wbar               (eq. (updatew))

Because every builder's surrogate is affine in its statistics, averaging statistics is the same as
averaging surrogates. Algorithm 2's penalty continuation (Theorem 2 and the paragraph after it)
is a loop over c_1 < c_2 < ... around the same step, warm-started from the last state.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence as SequenceBase
from typing import Iterable, Mapping, NamedTuple, Sequence

import numpy as np

from ..._kernels import FOLD_WIDTH, axpy, convex_step, fold, scaled
from ...federated import Reply, aggregation_weight
from ...model.surrogates import Linearization, ProximalLinear
from ...subproblems.base import SubproblemSolution
from .state import SSCAState


FOLD_BUFFER_BYTES = 8_000_000
"""Bytes of client messages the server holds before adding them to the averaged statistics:
all ten 0.8 MB messages of the paper's network (added FOLD_WIDTH per pass), but a message of
10^6 floats or more is added as soon as it arrives, so a round's memory stays a few copies of
d floats (benchmarks/memory.py)."""


#: builders whose Fbar^(0) (:meth:`~ssca_solver.SurrogateBuilder.initial_statistics`) only
#: their type and tau decide: :func:`init` computes it once for all functions that share them
_PLAIN_BUILDERS = (ProximalLinear, Linearization)

#: a run of at least this many consecutive functions whose statistics have the same names and
#: shapes travels as one array per statistic, the functions its rows (:func:`stat_runs`)
STACK_RUN = 8


def stat_key(m: int, name: str) -> str:
    """The name under which a client's reply carries statistic ``name`` of function m."""
    return f"{m}:{name}"


def run_key(first: int, last: int, name: str) -> str:
    """The name of statistic ``name`` of functions first..last (inclusive), stacked."""
    return f"{first}..{last}:{name}"


class Statistics(SequenceBase):
    """Every function's statistics (a sequence of dicts, one per function: eqs.
    (Fs0bar)/(Fsmbar)'s averaged statistics) that also carries
    their layout's runs (:func:`stat_runs`) and the arrays they were read from in that layout
    (:func:`pack_statistics`'s, ``packed``: the dicts hold views of its stacked rows). The
    server's statistics are this from the replies' average on: with hundreds of constraints
    a round then neither derives the runs again nor restacks the rows, and
    :func:`.adaptive.rescale_all` scales a stacked run as one array. Read from packed arrays
    (:func:`unpack_statistics`), a function's dict is made when it is first read: a round that
    reads the stacked arrays alone makes none. A tuple of the same dicts means the same
    statistics (the attributes only save work); ``tuple(stats)`` gives one."""

    __slots__ = ("_items", "runs", "packed", "_starts")

    def __init__(self, items=(), runs=None, packed=None):
        self._items = list(items)
        self.runs, self.packed, self._starts = runs, packed, None

    @classmethod
    def from_packed(cls, packed: Mapping, runs, count: int) -> "Statistics":
        """The statistics of ``count`` functions laid out in ``runs`` (:func:`stat_runs`),
        read from ``packed`` (:func:`pack_statistics`'s arrays, which must hold every key of
        the layout) when each function is first read."""
        obj = cls((), runs, packed)
        obj._items = [None] * count
        return obj

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(len(self._items))))
        item = self._items[i]
        if item is None:
            m = range(len(self._items))[i]              # a negative index, and IndexError
            item = self._items[m] = self._read(m)
        return item

    def __iter__(self):
        for m in range(len(self._items)):
            yield self[m]

    def _read(self, m: int) -> dict:
        """Function m's dict from the packed arrays (a stacked run's rows as views)."""
        if self._starts is None:
            self._starts = [run[0] for run in self.runs]
        first, stop, sig = self.runs[bisect.bisect_right(self._starts, m) - 1]
        if stacked_run((first, stop, sig)):
            return {name: self.packed[run_key(first, stop - 1, name)][m - first, ...]
                    for name, _ in sig}
        return {name: self.packed[stat_key(m, name)] for name, _ in sig}

    def __reduce__(self):
        return (Statistics, (tuple(self), self.runs, self.packed))

    def __repr__(self) -> str:
        return f"Statistics({tuple(self)!r})"

    def stacked(self, name: str):
        """Statistic ``name`` of every function as one new array whose rows are the
        functions (a stacked run's rows as they are, the other functions' own arrays: the
        same numbers); None when the statistics carry no packed arrays, or the functions'
        arrays of ``name`` differ in shape (a diagonal curvature beside scalar ones)."""
        if self.packed is None or not self.runs:
            return None
        parts, shape = [], None
        for run in self.runs:
            first, stop, sig = run
            here = dict(sig).get(name)
            if here is None or (shape is not None and here != shape):
                return None
            shape = here
            if stacked_run(run):
                parts.append(self.packed[run_key(first, stop - 1, name)])
            else:
                parts.extend(np.asarray(self[m][name])[None, ...] for m in range(first, stop))
        return np.concatenate(parts).astype(float, copy=False)


def stat_runs(stats: Sequence[Mapping]) -> list:
    """The functions in runs of consecutive ones whose statistics have the same names and
    shapes: [(first, stop, ((name, shape), ...))], ``stop`` exclusive. A run of at least
    STACK_RUN functions is sent stacked (:func:`pack_statistics`); the client and the server
    both derive the runs from the statistics' layout, which Problem fixes (a
    :class:`Statistics` carries its own)."""
    known = getattr(stats, "runs", None)
    if known is not None:
        return known
    runs, first = [], 0
    layout = _layout(stats[0]) if len(stats) else None
    for m in range(1, len(stats) + 1):
        if m < len(stats) and stats[m] is stats[m - 1]:
            continue                       # the same dict (init's shared start): same layout
        here = _layout(stats[m]) if m < len(stats) else None      # None: past the end
        if here != layout:
            runs.append((first, m, _signature(stats[first])))
            first, layout = m, here
    return runs


def _layout(st: Mapping) -> dict:
    """A function's statistics' names and shapes (what :func:`_signature` sorts), compared as
    a dict: with hundreds of constraints a round derives the runs more than once."""
    return {k: v.shape if isinstance(v, np.ndarray) else np.shape(v) for k, v in st.items()}


def _signature(st: Mapping) -> tuple:
    """A function's statistics' names and shapes, in name order."""
    return tuple(sorted(_layout(st).items()))


def stacked_run(run) -> bool:
    """Whether a run of :func:`stat_runs` travels stacked (STACK_RUN functions or more)."""
    return run[1] - run[0] >= STACK_RUN


def stat_keys(stats: Sequence[Mapping], runs=None) -> list:
    """The names of the arrays that carry ``stats``' layout in a reply, in order (``runs``:
    :func:`stat_runs` of ``stats``, when already known)."""
    keys = []
    for run in runs if runs is not None else stat_runs(stats):
        first, stop, sig = run
        if stacked_run(run):
            keys += [run_key(first, stop - 1, name) for name, _ in sig]
        else:
            keys += [stat_key(m, name) for m in range(first, stop) for name, _ in sig]
    return keys


def pack_statistics(stats: Sequence[dict], runs=None) -> dict:
    """Statistics of every function (a tuple of dicts) as one flat dict of named arrays: a
    function's own (``"m:name"``), or, for a run of STACK_RUN functions or more with the same
    layout, one array per statistic whose rows are the functions (``"first..last:name"``):
    with hundreds of constraints a reply then carries three arrays, not three per
    constraint, and the server checks and adds each once. A :class:`Statistics` read from
    such arrays gives them back (the same values: its dicts are views of them)."""
    if getattr(stats, "packed", None) is not None:
        return dict(stats.packed)       # the caller's dict; the arrays are the statistics'
    out = {}
    for run in runs if runs is not None else stat_runs(stats):
        first, stop, sig = run
        if stacked_run(run):
            for name, _ in sig:
                out[run_key(first, stop - 1, name)] = np.array(
                    [stats[m][name] for m in range(first, stop)], dtype=float)
        else:
            for m in range(first, stop):
                for name, v in stats[m].items():
                    out[stat_key(m, name)] = v
    return out


def unpack_statistics(arrays: Mapping, template: Sequence[Mapping], runs=None) -> tuple:
    """Every function's statistics (a :class:`Statistics`; stacked ones as views of their
    rows) from a reply's ``arrays`` packed in the layout of ``template``
    (:func:`pack_statistics`); a missing array raises KeyError naming it."""
    if runs is None:
        runs = stat_runs(template)
    packed = {key: arrays[key] for key in stat_keys(template, runs)}
    # each function's dict (a stacked run's rows as views, 0-d for a scalar) when first read
    return Statistics.from_packed(packed, runs, len(template))


class StepInfo(NamedTuple):
    """What one round produced, for the history and for callbacks."""

    t: int
    rho: float
    gamma: float
    penalty: float
    solution: SubproblemSolution
    step_norm: float  # |wbar - w_t|: zero exactly at a fixed point of the iteration


class RoundInfo:
    """A round's :class:`StepInfo` with what the adaptive defaults did: the batch (None:
    full), the tau clients used, the norm test's noise ratio and whether the step was
    rejected."""

    __slots__ = ("step", "batch", "tau", "noise_ratio", "rejected")

    def __init__(self, step: StepInfo, batch, tau: float, noise_ratio: float, rejected: int):
        self.step, self.batch, self.tau = step, batch, tau
        self.noise_ratio, self.rejected = noise_ratio, rejected

    @property
    def t(self):
        return self.step.t

    @property
    def solution(self):
        return self.step.solution

    @property
    def step_norm(self):
        return self.step.step_norm


def init(w0: np.ndarray, builders: Sequence, tau: float, surrogate_init: str,
         num_constraints: int = 0, penalty: float = 0.0) -> SSCAState:
    """Initial state: w_1 = w0 and Fbar^(0) as chosen by ``surrogate_init`` ("tau" or "zero").

    ``"zero"`` is eq. (Fs0bar) literally (Fbar^(0) = 0); ``"tau"`` starts the curvature at
    tau, i.e. Fbar^(0)(w) = tau |w|^2, the convention behind the closed forms of Section V
    (PAPER_NOTES item 4).
    """
    w0 = np.asarray(w0, dtype=float).copy()
    # the built-in builders' Fbar^(0) depends on their type and tau alone: computed once per
    # (type, tau), the functions' statistics then new arrays in the replies' layout (a
    # stacked run's rows together), so hundreds of constraints cost no per-function calls
    shared, stats = {}, []
    for b in builders:
        t = b.tau if b.tau is not None else tau
        key = (type(b), t) if type(b) in _PLAIN_BUILDERS else None
        if key is None:
            stats.append(b.initial_statistics(w0.size, t, surrogate_init))
            continue
        if key not in shared:
            shared[key] = b.initial_statistics(w0.size, t, surrogate_init)
        stats.append(shared[key])
    runs = stat_runs(stats)
    packed = {k: np.array(v, dtype=float) for k, v in pack_statistics(stats, runs).items()}
    return SSCAState(0, w0, unpack_statistics(packed, stats, runs), float(penalty),
                     np.zeros(num_constraints))


def combine(replies: Sequence[Reply], num_samples: int) -> tuple:
    """sum_i N_i / (B_i N) q_{m,i}: the mini-batch estimate of eqs. (Fs0bar)/(Fsmbar), as one
    dict of statistics per function (the plain reference of :func:`average_with_messages`).

    With B_i = B for every client this is exactly the paper's weight N_i / (B N); each client's
    sums are turned into an unbiased estimate of its share N_i/N of the full average. Each
    weight is multiplied by the reply's server-side factor ``weight`` (partial participation,
    renormalisation after dropouts; 1 otherwise).
    """
    out: dict = {}
    for msg in replies:
        wgt = aggregation_weight(msg, num_samples)
        for key, v in msg.arrays.items():
            m, name = key.split(":", 1)
            first, _, last = m.partition("..")
            rows = [(int(first), v)] if not last else [
                (k, v[k - int(first)]) for k in range(int(first), int(last) + 1)]
            for k, row in rows:
                acc = out.setdefault(k, {})
                if name in acc:
                    axpy(wgt, row, acc[name])
                else:
                    acc[name] = scaled(wgt, row)
    return tuple(out[m] for m in sorted(out))


def average_statistics(previous: tuple, new: tuple, rho: float) -> tuple:
    """(1 - rho) previous + rho new, statistic by statistic (eqs. (Fs0bar)/(Fsmbar)).

    One new array per statistic (the state stays immutable), no temporaries.
    """
    out = []
    for p, n in zip(previous, new):
        d = {}
        for k in p:
            d[k] = scaled(1.0 - rho, p[k])
            axpy(rho, n[k], d[k])
        out.append(d)
    return tuple(out)


def average_with_messages(previous: tuple, messages: Iterable[Reply], num_samples: int,
                          rho: float, allow_empty: bool = False) -> tuple:
    """(1 - rho) previous + rho sum_i h_i N_i/(B_i N) q_i, with a bounded number of messages
    held (h_i: the reply's ``weight``, 1 when every client takes part).

    The same numbers as ``average_statistics(previous, combine(messages, N), rho)`` (eqs.
    (Fs0bar)/(Fsmbar)) up to rounding, without the intermediate combined statistics.
    ``messages`` is consumed once, in order (a list, or a transport's ``stream``); no message
    at all is an error, or None with ``allow_empty``. Messages are
    held until they add up to ``FOLD_BUFFER_BYTES`` (or run out), then added FOLD_WIDTH per
    pass over the statistics (:func:`ssca_solver._kernels.fold`) and dropped: the server's
    memory stays bounded however many clients answer, and at the paper's scale (ten messages
    of 0.8 MB) all of them are added in two passes.
    """
    out, group, held = None, [], 0
    runs = stat_runs(previous)
    # the previous statistics in the replies' layout (a stacked run's rows copied together)
    before = pack_statistics(previous, runs)
    keys = list(before)

    def flush():
        nonlocal out, held
        wgts = [rho * aggregation_weight(g, num_samples) for g in group]
        if out is None:
            out = {k: np.empty(np.shape(before[k])) for k in keys}
            sources, beta = before, 1.0 - rho
        else:
            sources, beta = out, 1.0
        for key in keys:
            fold(beta, sources[key], wgts, [g.arrays[key] for g in group], out[key])
        group.clear()
        held = 0

    expected = set(keys)
    for msg in messages:
        if set(msg.arrays) != expected:
            from ...errors import ReplyError

            missing, extra = sorted(expected - set(msg.arrays)), sorted(set(msg.arrays) - expected)
            raise ReplyError(msg.client, msg.round,
                             f"its statistics are {sorted(msg.arrays)}; the server expects "
                             f"{sorted(expected)} (missing {missing}, unexpected {extra})",
                             kind="layout", array=(missing or extra or [None])[0])
        group.append(msg)
        held += 8 * msg.num_floats()
        del msg          # the group holds it; no loop variable may keep a folded one alive
        if held >= FOLD_BUFFER_BYTES or len(group) >= 2 * FOLD_WIDTH:
            flush()
    if group:
        flush()
    if out is None:
        if not allow_empty:
            raise ValueError("average_with_messages: no client messages")
        return None
    return unpack_statistics(out, previous, runs)


def move(state: SSCAState, stats: tuple, rho: float, gamma: float,
         subproblem) -> tuple[SSCAState, StepInfo]:
    """Steps 4-5 of a round from the averaged statistics: solve Problem 2/5 and take eq.
    (updatew) from ``state.w``; the new state keeps ``stats`` and the multipliers."""
    t = state.t + 1
    penalty = state.penalty
    sol = subproblem.solve(stats, penalty, round=t, nu0=state.nu, center=state.w)
    # eq. (updatew) straight from w-bar's terms when the solver gives few enough of them
    target = sol.terms if len(sol.terms) <= FOLD_WIDTH else sol.w
    w_next, step_norm = convex_step(state.w, gamma, target)
    info = StepInfo(t, rho, gamma, penalty, sol, step_norm)
    return state._replace(t=t, w=w_next, stats=stats,
                          nu=np.asarray(sol.multipliers, dtype=float)), info


def step(state: SSCAState, messages: Iterable[Reply], num_samples: int, rho: float,
         gamma: float, subproblem) -> tuple[SSCAState, StepInfo]:
    """One round of Algorithm 1 (M = 0) or Algorithm 2 (penalty ``state.penalty``) from the
    clients' messages.

    ``messages`` may be a list or a transport's ``stream`` (the server then holds a bounded
    number of messages, see :func:`average_with_messages`); eq. (updatew) and the step norm
    |wbar - w_t| are one pass.
    """
    stats = average_with_messages(state.stats, messages, num_samples, rho)
    return move(state, stats, rho, gamma, subproblem)


def stage_slack(slack_rows: Sequence[np.ndarray], rounds: int) -> float:
    """Estimate of |s_j*| for a stage: the mean of max_m |s_m^(t)| over its last tenth of rounds
    (the rows may be relative slacks s_m / max(1, |U_m|)).

    Theorem 2 is about the limit point s_j* of s^(t) at fixed c_j. One round's slack is a noisy
    estimate of it: near an active constraint the recursively averaged constraint surrogate
    can be unsatisfiable in isolated rounds (Lemma 1's nu = c case) even when c exceeds the
    true multiplier, so the last tenth of the stage (at least one round) is averaged.
    """
    window = max(1, rounds // 10)
    rows = np.asarray(slack_rows[-window:], dtype=float)
    if rows.size == 0 or rows.ndim < 2 or rows.shape[1] == 0:
        return 0.0
    return float(np.mean(np.max(np.abs(rows), axis=1)))
