"""SSCA's state: everything the method carries from one round to the next, in one immutable
value (as optax keeps all of an optimiser's state in its state value), and its checkpoint
form. Nothing the method remembers lives anywhere else: a checkpoint of the state is a
checkpoint of the run, and a resumed run takes the decisions the uninterrupted one takes.
"""

from __future__ import annotations

from typing import Mapping, NamedTuple, Sequence

import numpy as np


class Memory(NamedTuple):
    """What the adaptive defaults remember between rounds besides the iterate, the averaged
    surrogates and the backtracking's reference point (:class:`SSCAState`).

    Attributes:
      tiny: accepted steps lost in rounding since the last real one (the settling test).
      stall: accepted rounds with the quasi-Newton model whose merit did not fall below the
        best point's (the stall test).
      saturation: accepted rounds in a row whose subproblem kept a slack at multiplier c
        while the full-data evidence says c is too small.
      c_too_small: the stage ended on saturation (evidence for the continuation to raise c).
      corrected: the pending trial point is a second-order correction (not corrected again).
      nonfinite_trial: the latest round rejected a trial point where a function was not
        finite.
      rejected_length: |w_t - w_accepted| / max(1, |w_accepted|) of the latest rejected trial
        step (NaN: none rejected yet).
      rejected_trial: |w_t - w_accepted| of the latest rejected trial step while rejections
        follow each other (NaN: none), to tell whether doubling tau shortens them.
      best_w, best_stats: the point of lowest merit with the model and its full-batch
        statistics (empty: none yet).
      multipliers: |mu| of the latest full-data KKT fit (empty: no fit yet), the
        continuation's evidence.
      anchor_w, anchor_violation, anchor_tau: the run's latest accepted full-batch point
        whose largest relative violation is the run's least (any within ``feas_tol``
        counting as least), that violation and the tau its round used (empty, inf and NaN:
        none yet); where, and with which tau, the next stage starts when a stage's iterates
        ran away (:func:`.continuation.restart_point`).
    """

    tiny: int = 0
    stall: int = 0
    saturation: int = 0
    c_too_small: bool = False
    corrected: bool = False
    nonfinite_trial: bool = False
    rejected_length: float = float("nan")
    rejected_trial: float = float("nan")
    best_w: np.ndarray = np.zeros(0)
    best_stats: tuple = ()
    multipliers: np.ndarray = np.zeros(0)
    anchor_w: np.ndarray = np.zeros(0)
    anchor_violation: float = float("inf")
    anchor_tau: float = float("nan")


class SSCAState(NamedTuple):
    """The server's state after round ``t``.

    Attributes:
      t: rounds done so far (the paper's t - 1 for w_t).
      w: current point w_t, shape (d,).
      stats: recursively averaged statistics, one dict per stochastic function (objective first
        when it is stochastic): the surrogates Fbar_m^(t) in the form of their statistics.
      penalty: c in force (Algorithm 2; 0 for Algorithm 1).
      nu: the last round's subproblem multipliers (M,), the next solve's warm start.
      batch: the batch size clients draw next round (adaptive sampling; 0: the solve's
        fixed batch_size).
      tau: the proximal weight clients use next round (adaptive; 0: the solve's tau).
      noise: running estimate of (gradient noise / gradient)^2 (adaptive sampling).
      since: rounds since the batch size last changed.
      merit: the exact-penalty merit F_0 + R + c sum (F_m - U_m)_+ at w_t (full batches).
      prev_w, prev_stats: the point and full-data statistics of the last accepted step, from
        which a rejected step is retried with a larger tau (full batches).
      rejects: steps rejected in a row (full batches).
      metric: the diagonal metrics D_m (one row per stochastic function) that replace the
        proximal term tau |w - w_t|^2 by tau (w - w_t)' diag(D_m) (w - w_t) (adaptive defaults
        on the closed-form path; empty: the scalar curvature of the paper).
      qn_s, qn_y: the quasi-Newton pairs (rows, oldest first; y Powell-damped) of the
        full-batch phase's model of the Lagrangian's Hessian (:mod:`.quasi_newton`; empty:
        none yet, or the first-order surrogates).
      shrink: the factor on gamma_t of the guarded full-batch rounds (a fixed tau, a builder
        with its own curvature, or given schedules: halved at each step the exact-penalty
        merit rejects; 1: never rejected).
      kappa: the factor on the curvature of the builders with their own (DiagonalCurvature)
        under tau="auto", set at round 1 so that their surrogate majorises F along the probe's
        direction (1: none).
      curvature: the probe's curvature along the gradient at x0 (NaN: not measured), from
        which round 1 sets ``kappa``.
      hess: the Newton model's Hessian of the Lagrangian at the last accepted full-batch point
        (d x d; empty: none, or the quasi-Newton or first-order surrogates; :mod:`.newton`),
        or with ``hess_eig`` its sketch's eigenvectors (k x d, rows).
      hess_eig: the sketch's k eigenvalues and the complement's (k + 1,; empty: no sketch;
        :class:`~ssca_solver.methods.ssca.newton.SketchModel`).
      curv_top: under the Newton model, each constraint's largest Hessian eigenvalue (>= 0)
        there (M,; empty: none), the least curvature of its surrogate (:mod:`.acceptance`).
      memory: the adaptive defaults' counters and evidence (:class:`Memory`).
    """

    t: int
    w: np.ndarray
    stats: tuple
    penalty: float = 0.0
    nu: np.ndarray = np.zeros(0)
    batch: int = 0
    tau: float = 0.0
    noise: float = 0.0
    since: int = 0
    merit: float = float("nan")
    prev_w: np.ndarray = np.zeros(0)
    prev_stats: tuple = ()
    rejects: int = 0
    metric: np.ndarray = np.zeros((0, 0))
    qn_s: np.ndarray = np.zeros((0, 0))
    qn_y: np.ndarray = np.zeros((0, 0))
    shrink: float = 1.0
    kappa: float = 1.0
    curvature: float = float("nan")
    hess: np.ndarray = np.zeros((0, 0))
    hess_eig: np.ndarray = np.zeros(0)
    curv_top: np.ndarray = np.zeros(0)
    memory: Memory = Memory()


def remember(state: SSCAState, **changes) -> SSCAState:
    """``state`` with the fields ``changes`` of its :class:`Memory` replaced."""
    return state._replace(memory=state.memory._replace(**changes))


# -- the checkpoint form ----------------------------------------------------------------------
#: the state's scalar fields and how a checkpoint's array turns back into each
_SCALARS = {"t": int, "penalty": float, "batch": int, "tau": float, "noise": float,
            "since": int, "merit": float, "rejects": int, "shrink": float, "kappa": float,
            "curvature": float}
#: the state's arrays of floats
_ARRAYS = ("w", "nu", "prev_w", "metric", "qn_s", "qn_y", "hess", "hess_eig", "curv_top")
#: the memory's scalar fields
_MEMORY = {"tiny": int, "stall": int, "saturation": int, "c_too_small": bool,
           "corrected": bool, "nonfinite_trial": bool, "rejected_length": float,
           "rejected_trial": float, "anchor_violation": float, "anchor_tau": float}
#: groups of per-function statistics: (state field or memory field, checkpoint prefix)
_GROUPS = (("stats", "stats"), ("prev_stats", "prev_stats"), ("best_stats", "mem/best"))


def to_arrays(state: SSCAState) -> dict:
    """The state as named arrays (a checkpoint's ``state/`` members): every field, the
    memory's under ``mem/``, and each group of statistics as ``<group>/<m>/<name>``."""
    mem = state.memory
    out = {name: np.asarray(getattr(state, name)) for name in _SCALARS}
    out.update({name: np.asarray(getattr(state, name), dtype=float) for name in _ARRAYS})
    out.update({f"mem/{name}": np.asarray(float(getattr(mem, name))) for name in _MEMORY})
    out["mem/best_w"] = np.asarray(mem.best_w, dtype=float)
    out["mem/multipliers"] = np.asarray(mem.multipliers, dtype=float)
    out["mem/anchor_w"] = np.asarray(mem.anchor_w, dtype=float)
    for field, prefix in _GROUPS:
        group = getattr(mem if field == "best_stats" else state, field)
        for m, st in enumerate(group):
            for k, v in st.items():
                out[f"{prefix}/{m}/{k}"] = np.asarray(v)
    return out


def from_arrays(arrays: Mapping[str, np.ndarray], specs: Sequence[Sequence]) -> SSCAState:
    """The state from :func:`to_arrays`'s arrays; ``specs``: each stochastic function's
    statistic specs (name, shape). A missing field or a group of statistics present only in
    part raises ValueError naming it (the checkpoint is then refused)."""
    def need(key):
        if key not in arrays:
            raise ValueError(f"the checkpoint has no state member {key!r}")
        return arrays[key]

    def group(prefix, required):
        keys = [(m, spec.name, spec.shape, f"{prefix}/{m}/{spec.name}")
                for m, fn_specs in enumerate(specs) for spec in fn_specs]
        present = [key in arrays for *_, key in keys]
        if not any(present) and not required:
            return ()
        if not all(present):
            missing = [key for (*_, key), ok in zip(keys, present) if not ok]
            raise ValueError(f"the checkpoint has no statistic {missing[0]!r} (of "
                             f"{len(keys)} in the group {prefix!r}): it is incomplete or was "
                             "written for other surrogate builders")
        out = [{} for _ in specs]
        for m, name, shape, key in keys:
            out[m][name] = np.array(arrays[key], dtype=float).reshape(shape)
        return tuple(out)

    fields = {name: cast(need(name)) for name, cast in _SCALARS.items()}
    fields.update({name: np.array(need(name), dtype=float) for name in _ARRAYS})
    memory = Memory(**{name: cast(float(need(f"mem/{name}"))) for name, cast in _MEMORY.items()},
                    best_w=np.array(need("mem/best_w"), dtype=float),
                    best_stats=group("mem/best", False),
                    multipliers=np.array(need("mem/multipliers"), dtype=float),
                    anchor_w=np.array(need("mem/anchor_w"), dtype=float))
    state = SSCAState(stats=group("stats", True), prev_stats=group("prev_stats", False),
                      memory=memory, **fields)
    for point, stats in (("prev_w", "prev_stats"), ("mem/best_w", "mem/best")):
        size = (state.prev_w if point == "prev_w" else memory.best_w).size
        held = state.prev_stats if point == "prev_w" else memory.best_stats
        if size and not held:
            raise ValueError(f"the checkpoint holds {point!r} but not its statistics "
                             f"({stats}/...)")
    _check(state)
    return state


def _check(state: SSCAState) -> None:
    """Refuse values no run writes (a damaged or edited checkpoint)."""
    if not 0.0 < state.shrink <= 1.0:
        raise ValueError(f"the checkpoint's state/shrink is {state.shrink!r}; it must be in "
                         "(0, 1]")
    if not (np.isfinite(state.kappa) and state.kappa >= 1.0):
        raise ValueError(f"the checkpoint's state/kappa is {state.kappa!r}; it must be a "
                         "finite number >= 1")
    anchor = state.memory.anchor_w
    if anchor.size not in (0, state.w.size):
        raise ValueError(f"the checkpoint's state/mem/anchor_w has {anchor.size} entries; it "
                         f"must be empty or have the point's {state.w.size}")
