"""Solve options: one dataclass per method, parsed and validated once, here.

``parse(cls, options, method, problem)`` rejects unknown names with a suggestion (TypeError, as
scipy and cvxpy users expect), checks every value (ValueError naming the option; bools and
strings are refused where a number is expected, NumPy scalars of any type are accepted) and
returns the dataclass with normalised values (floats, ints, tuples).
"""

from __future__ import annotations

import difflib
import math
import numbers
import os
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Optional

import numpy as np

from .errors import DataError
from .federated import DEFAULT_CLIENT_TIMEOUT, transport_names
from .schedules import PowerStep


# -- value checks -------------------------------------------------------------------------------

def is_real(value) -> bool:
    """A real number: Python or NumPy int or float (or a 0-d such array), not a bool."""
    return (isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))) or (
        isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iuf")


def real(name: str, value, *, low: float = -math.inf, high: float = math.inf,
         low_open: bool = False) -> float:
    """``value`` as a finite float in [low, high] (or (low, high] with ``low_open``)."""
    if not is_real(value):
        raise ValueError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    v = float(value)
    ok = math.isfinite(v) and (v > low if low_open else v >= low) and v <= high
    if not ok:
        rel = ">" if low_open else ">="
        if high == math.inf:
            want = "a finite number" + ("" if low == -math.inf else f" {rel} {low:g}")
        else:
            want = f"a number {rel} {low:g} and <= {high:g}"
        raise ValueError(f"{name} must be {want}, got {value!r}")
    return v


def integer(name: str, value, *, low: int = 1) -> int:
    """``value`` as an int >= low (bools refused)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r} "
                         f"({type(value).__name__})")
    if value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def flag(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def seed_entropy(seed) -> int:
    """The run's seed as one integer, from anything ``np.random.default_rng`` accepts.

    None draws fresh entropy (recorded in checkpoints, so a resumed run draws the same batches).
    """
    if isinstance(seed, (bool, np.bool_)):
        raise ValueError(f"seed must be None, a non-negative integer, a sequence of them, a "
                         f"SeedSequence or a Generator, got {seed!r}")
    if isinstance(seed, np.random.Generator):
        seed = seed.bit_generator
    if isinstance(seed, np.random.BitGenerator):
        seed = seed.seed_seq
    if isinstance(seed, np.random.SeedSequence):
        ss = seed
    else:
        try:
            ss = np.random.SeedSequence(seed)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"seed must be None, a non-negative integer, a sequence of them, a "
                             f"SeedSequence or a Generator (what np.random.default_rng "
                             f"accepts), got {seed!r}: {exc}") from None
    # one integer that determines the stream: entropy and spawn key mixed by generate_state
    return int.from_bytes(ss.generate_state(4, np.uint32).tobytes(), "little")


def batch_size(value, data, allow_auto: bool = False):
    """B as an int, None for the full batch ("full" or None), or "auto" (when allowed);
    B <= every client's N_i."""
    if value is None or (isinstance(value, str) and value == "full"):
        return None
    if allow_auto and isinstance(value, str) and value == "auto":
        return "auto"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or value < 1:
        kinds = ", 'full' or 'auto'" if allow_auto else " or 'full'"
        raise ValueError(f"batch_size must be a positive integer{kinds}, got {value!r}")
    sizes = data.client_sizes
    i = int(np.argmin(sizes))
    if value > sizes[i]:
        raise DataError(f"batch_size={value} is larger than client {i}'s {sizes[i]} rows; "
                        f"each client draws B <= N_i rows (use batch_size<={sizes[i]} or 'full')")
    return int(value)


def penalties(value) -> tuple[float, ...]:
    """c_1 < c_2 < ... as floats (Theorem 2)."""
    seq = [value] if (is_real(value) or isinstance(value, (bool, np.bool_, str))) else list(value)
    if not seq:
        raise ValueError("penalty: give at least one value c > 0")
    out = tuple(real("penalty: every c", c, low=0.0, low_open=True) for c in seq)
    if any(b <= a for a, b in zip(out, out[1:])):
        raise ValueError(f"penalty: the sequence must be strictly increasing "
                         f"(c_1 < c_2 < ..., Theorem 2), got {list(out)}")
    return out


def start_point(value, dim: int) -> np.ndarray:
    """x0 as a finite float array of shape (dim,), zeros by default."""
    if value is None:
        return np.zeros(dim)
    try:
        x0 = np.array(value, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"x0 must be a finite real array of shape ({dim},), got {value!r}") \
            from None
    if x0.shape != (dim,) or not np.all(np.isfinite(x0)):
        raise ValueError(f"x0 must be a finite array of shape ({dim},), got shape {x0.shape}")
    return x0


def choice(name: str, value, allowed: tuple) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(repr(a) for a in allowed)}, "
                         f"got {value!r}")
    return value


def path_or_none(name: str, value) -> Optional[str]:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"{name} must be a file path, got {value!r}")
    return os.fspath(value)


# -- the options --------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunOptions:
    """Options every method shares (the runner's).

    Attributes:
      max_iter: rounds (per penalty value c_j for Algorithm 2).
      seed: seeds the clients' mini-batches: anything ``np.random.default_rng`` accepts. The
        batch of client i at round t is drawn from ``SeedSequence(seed, spawn_key=(i, t, k))``.
      x0: starting point w_1 (default zeros).
      eval_every: evaluate the full-data objective and constraints every k rounds for the
        history (None or 0: never; the final point is always evaluated).
      transport: "inprocess" (default), "process" (each client in its own process), or a
        name given to :func:`ssca_solver.federated.register_transport`.
      client_timeout: seconds a client process may take to answer one request before the
        solve stops with ClientError (default 600; None waits forever). Process and Flower
        transports: in-process clients cannot be interrupted.
      flower_engine: with ``transport="flower"``: "simulation" (default: Flower's Simulation
        Runtime in this process) or "deployment" (a running SuperLink and one SuperNode per
        client; see docs/engines.md).
      flower_superlink: deployment: the SuperLink's address "host:port" (its --host/--port;
        e.g. "127.0.0.1:9093"); required there.
      flower_bridge: deployment: "host:port" where this process listens for the ServerApp the
        SuperLink starts (default "127.0.0.1:0": a free port on this machine).
      flower_start_timeout: seconds for the Flower engine to start and every node to answer
        (default 120).
      callback: ``callback(it)`` after each round with an :class:`ssca_solver.runner.Iteration`
        (t, x, stage, penalty, step_norm, the latest full-data evaluation, the method's own
        round record and state). Return True (or raise StopIteration) to stop the run: status
        "stopped".
      progress: print a progress line to stderr every tenth of the rounds.
      checkpoint: a file path; the whole solver state is saved there (NumPy .npz, no pickled
        code) every ``checkpoint_every`` rounds, when the run stops, and when a client fails.
      checkpoint_every: rounds between checkpoints (default 100).
      resume: a checkpoint path to continue from (same problem and options; the seed is read
        from the checkpoint when not given).
      clients_per_round: K, the clients that take part in each round (None: all I). They are
        drawn from the run's seed for each round (the same on resume) as ``participation``
        says, and weighted so that the combined statistics stay unbiased (Horvitz-Thompson):
        E[sum over the sampled clients] = the sum over all I. Only the sampled clients are
        sent the round's request and counted in ``res.communication``; the full-data
        evaluations (history and KKT test) still ask every client. With K < I (or proportional
        draws) the estimate is random even on full batches, so method "ssca" runs its rho and
        gamma schedules there
        (no unit steps, backtracking or diagonal metric, which assume exact statistics).
      participation: how the K clients are drawn: "uniform" (default: K of I without
        replacement, each weighted I/K) or "proportional" (K draws with replacement with
        probability N_i/N; a client drawn k times answers once and counts k N / (K N_i)).
      on_client_failure: "raise" (default: a client that fails or does not answer within
        ``client_timeout`` ends the solve with ClientError or its own exception) or "drop"
        (it is left out of that round, the weights of those who answered are renormalised
        to the same total, and the run goes on; every dropout is recorded in
        ``res.dropouts`` and in checkpoints; a round in which every participant fails ends
        the solve with RoundFailedError; a full-data evaluation asks a failed client once
        more before leaving it out). With "drop" the server holds a round's replies
        until all have arrived (the renormalisation needs to know who answered).
      secure_aggregation: the server learns only the weighted sum of the clients' replies in
        each round and each evaluation (pairwise additive masks from X25519 key agreement,
        fixed-point encoding modulo 2^64, dropouts recovered from Shamir-shared seeds as in
        Bonawitz et al. 2017; see docs/privacy.md). Needs at least 2 clients per round and the
        ``cryptography`` package. Default False.
      secure_range: the largest magnitude a client's weighted value may have under secure
        aggregation (default 2^20); a larger one stops the solve with SecureAggregationError
        naming the array (never clipped). The fixed-point step is 2^-f with
        f = 62 - ceil(log2(secure_range)) - ceil(log2(clients per round)).
    """

    max_iter: int = 200
    seed: Any = None
    x0: Any = None
    eval_every: Optional[int] = 10
    transport: str = "inprocess"
    client_timeout: Optional[float] = DEFAULT_CLIENT_TIMEOUT
    flower_engine: str = "simulation"
    flower_superlink: Optional[str] = None
    flower_bridge: str = "127.0.0.1:0"
    flower_start_timeout: float = 120.0
    callback: Optional[Callable] = None
    progress: bool = False
    checkpoint: Any = None
    checkpoint_every: int = 100
    resume: Any = None
    clients_per_round: Optional[int] = None
    participation: str = "uniform"
    on_client_failure: str = "raise"
    secure_aggregation: bool = False
    secure_range: float = 2.0 ** 20


@dataclass(frozen=True)
class SSCAOptions(RunOptions):
    """Options of ``Problem.solve(method="ssca")`` with their defaults (and :class:`RunOptions`).

    Attributes:
      batch_size: "auto" (default: start at 32 rows per client and double while the gradient
        noise exceeds the gradient, up to every row, see
        :mod:`ssca_solver.algorithms.adaptive`), B (rows each client draws per round; paper:
        1, 10, 100), or "full" (or None: every row of every client, deterministic SCA).
      tau: proximal weight of eqs. (fs0bar)/(fsmbar): "auto" (default: with batch_size
        "auto" or "full" and every client in every round, the curvature along the gradient
        measured before round 1, then adapted by backtracking on full batches; on sampled
        rounds (a fixed B, or K < I clients per round or proportional participation, whatever
        the batch size): max(0.05, the heavy-ball stability bound at round 1 from the probe's
        curvature; docs/modelling.md), never adapted) or a number > 0 (paper: 0.1).
      rho: schedule of eq. (rho): "auto" (default), an EpochStep, a PowerStep, a callable
        t -> value, or a constant in (0, 1]. "auto" is EpochStep(0.15, 0.4) on rounds with
        sampled statistics (a fixed B, or K < I clients): 0.15 / (1 + e_t)^0.4 with e_t the
        passes over the data before round t, so the steps decay with the data read, not with
        the rounds; and PowerStep(0.9, 0.4) (0.9 / t^0.4) on rounds with exact ones (every row
        of every client: "full" with a numeric tau), where nothing needs averaging.
      gamma: schedule of eq. (gamma): "auto" (default) is EpochStep(0.3, 0.55) on sampled
        rounds and PowerStep(0.9, 0.55) on exact ones. Every default satisfies every
        condition of eqs. (rho)/(gamma); the paper's Section VI choices violate
        sum gamma^2 < inf and draw a warning. The schedules run with a fixed B, with "full"
        and a numeric tau, with K < I clients per round (or proportional participation), or
        when rho or gamma is given; otherwise rho_t = gamma_t = 1. (Before EpochStep the
        defaults were PowerStep(0.9, 0.4) and PowerStep(0.9, 0.55) on every round; the sampled
        rho was EpochStep(0.3, 0.4) before commit 23292e3.)
      penalty: c, a number or an increasing sequence c_1 < c_2 < ... (Theorem 2). Only used
        with stochastic constraints.
      slack_tol: the continuation raises c after a stage whose slack estimate (the mean over
        the stage's last tenth of rounds of max_m s_m / max(1, |U_m|)) exceeds this; relative
        to max(1, |U_m|) like ``feas_tol``.
      feas_tol: the stopping test's feasibility tolerance: max(F_m - U_m, 0) <= feas_tol *
        max(1, |U_m|) on the full data (e.g. U = 0.2: a violation up to 1e-4; U = 50: up to
        5e-3). Default 1e-4.
      kkt_tol: the stopping test's tolerance on the relative stationarity and complementarity
        residuals (see :class:`ssca_solver.KKTReport`). Default 1e-4.
      check_gradients: at round 1 every client checks each SampleFunction's gradient against a
        central difference of its values along the gradient on its batch; a sign error or a
        sum instead of a mean raises UserFunctionError naming the function. Default True.
      subproblem: "auto" (closed form when it applies, else CVXPY), "closed_form" or "cvxpy".
      solver: CVXPY solver name for the subproblem (default "CLARABEL", interior point).
      solver_options: dict of keyword arguments for that solver.
      surrogate_init: "tau" (Fbar^(0) = tau |w|^2, the paper's Section V convention, default)
        or "zero" (Fbar^(0) = 0, eq. (Fs0bar) as written); see PAPER_NOTES item 4.
    """

    batch_size: Any = "auto"
    tau: Any = "auto"
    rho: Any = "auto"
    gamma: Any = "auto"
    penalty: Any = (1e2, 1e3, 1e4, 1e5)
    slack_tol: float = 1e-3
    feas_tol: float = 1e-4
    kkt_tol: float = 1e-4
    check_gradients: bool = True
    subproblem: str = "auto"
    solver: str = "CLARABEL"
    solver_options: Optional[dict] = None
    surrogate_init: str = "tau"


@dataclass(frozen=True)
class FedAvgOptions(RunOptions):
    """Options of ``Problem.solve(method="fedavg")`` (and :class:`RunOptions`).

    Attributes:
      batch_size: B rows per local step ("full" for all rows).
      local_steps: E local SGD steps per round (E = 1: FedSGD).
      lr: the learning rate r_t: a PowerStep(abar, alphabar), a callable t -> value > 0 or a
        number. Default PowerStep(0.5, 0.3).
      momentum: server-side heavy-ball coefficient beta in [0, 1) (0: plain FedAvg).
    """

    max_iter: int = 100
    batch_size: Any = 10
    local_steps: int = 1
    lr: Any = field(default_factory=lambda: PowerStep(0.5, 0.3))
    momentum: float = 0.0


@dataclass(frozen=True)
class LagrangianOptions(RunOptions):
    """Options shared by the constrained baselines ``method="primal_dual"`` and
    ``method="augmented_lagrangian"`` (and :class:`RunOptions`); see docs/baselines.md.

    Attributes:
      max_iter: rounds. Default 500.
      batch_size: B rows per local step ("full" for all rows). Default 10.
      local_steps: E local SGD steps per round (E = 1: one stochastic gradient step per round,
        FedSGD-style). Default 1.
      lr: the primal learning rate r_t: a PowerStep(a, alpha) (a / t^alpha), a callable
        t -> value > 0 or a number > 0. Default PowerStep(0.5, 0.3), FedAvg's.
      multipliers0: the starting multipliers lambda_1 (M numbers >= 0). Default zeros.
      feas_tol, kkt_tol: the full-data KKT stopping test, the same as method "ssca"'s (see
        :class:`SSCAOptions`): the run stops, with status "converged", at the first evaluation
        (every ``eval_every`` rounds) where it passes. Defaults 1e-4.
      solver: CVXPY solver of the server's proximal step on the deterministic terms and domain
        (used unless they are c |w|^2 without a domain) and of the KKT report. Default
        "CLARABEL".
    """

    max_iter: int = 500
    batch_size: Any = 10
    local_steps: int = 1
    lr: Any = field(default_factory=lambda: PowerStep(0.5, 0.3))
    multipliers0: Any = None
    feas_tol: float = 1e-4
    kkt_tol: float = 1e-4
    solver: str = "CLARABEL"


@dataclass(frozen=True)
class PrimalDualOptions(LagrangianOptions):
    """Options of ``Problem.solve(method="primal_dual")`` (federated stochastic gradient
    descent-ascent on the Lagrangian; and :class:`LagrangianOptions`).

    Attributes:
      dual_lr: eta_t of the projected dual ascent lambda <- max(0, lambda + eta_t (Fhat - U)):
        a PowerStep, a callable t -> value > 0 or a number > 0. Default PowerStep(0.5, 0.3).
    """

    dual_lr: Any = field(default_factory=lambda: PowerStep(0.5, 0.3))


@dataclass(frozen=True)
class AugmentedLagrangianOptions(LagrangianOptions):
    """Options of ``Problem.solve(method="augmented_lagrangian")`` (federated stochastic
    augmented Lagrangian; and :class:`LagrangianOptions`).

    Attributes:
      rho: the penalty rho > 0 of L_rho, also the multiplier step
        lambda <- max(0, lambda + rho (Fhat - U)). Default 1.0.
      dual_every: K, rounds of primal steps between multiplier updates (1: every round, the
        linearised augmented Lagrangian method). Default 1.
    """

    rho: float = 1.0
    dual_every: int = 1


PARTICIPATION = ("uniform", "proportional")
ON_CLIENT_FAILURE = ("raise", "drop")


def check_clients(opts: RunOptions, num_clients: int) -> None:
    """The options that depend on the number of clients I: K in 1..I, and secure aggregation
    with at least 2 clients per round (the sum of one client is its message)."""
    K = opts.clients_per_round
    if K is not None and K > num_clients:
        raise ValueError(f"clients_per_round must be between 1 and the number of clients "
                         f"({num_clients}), got {K}")
    if opts.secure_aggregation and (K if K is not None else num_clients) < 2:
        raise ValueError("secure_aggregation needs at least 2 clients per round: the sum of "
                         "one client's reply is that reply (got "
                         + (f"clients_per_round={K})" if K is not None
                            else f"{num_clients} client)"))


def run_fingerprint(opts: RunOptions) -> dict:
    """The runner's options a resumed solve must share (None for the defaults, so checkpoints
    written before these options existed still resume)."""
    return {"clients_per_round": opts.clients_per_round,
            "participation": (opts.participation if opts.clients_per_round is not None
                              else None),
            "on_client_failure": (None if opts.on_client_failure == "raise"
                                  else opts.on_client_failure),
            "secure_aggregation": (opts.secure_range if opts.secure_aggregation else None)}


def parse(cls, options: dict, method: str):
    """Build the options dataclass ``cls``, rejecting unknown names with a suggestion, and check
    the options every method shares."""
    names = [f.name for f in fields(cls)]
    for key in options:
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"unknown solve option {key!r} for method '{method}'{hint} "
                            f"Valid options: {', '.join(names)}")
    opts = cls(**options)
    every = opts.eval_every
    if every is not None and not (not isinstance(every, (bool, np.bool_)) and every == 0):
        every = integer("eval_every (None or 0: never)", every, low=1)
    timeout = opts.client_timeout
    if timeout is not None:
        timeout = real("client_timeout (seconds, or None)", timeout, low=0.0, low_open=True)
    if opts.callback is not None and not callable(opts.callback):
        raise TypeError("callback must be callable(iteration) -> bool | None")
    per_round = opts.clients_per_round
    if per_round is not None:
        per_round = integer("clients_per_round (None: every client)", per_round, low=1)
    transport = choice("transport", opts.transport, transport_names())
    flower = _flower_options(opts, options, transport)
    return replace(
        opts, max_iter=integer("max_iter", opts.max_iter), eval_every=every or 0,
        clients_per_round=per_round,
        participation=choice("participation", opts.participation, PARTICIPATION),
        on_client_failure=choice("on_client_failure", opts.on_client_failure,
                                 ON_CLIENT_FAILURE),
        secure_aggregation=flag("secure_aggregation", opts.secure_aggregation),
        secure_range=real("secure_range", opts.secure_range, low=0.0, low_open=True),
        transport=transport, client_timeout=timeout, **flower,
        progress=flag("progress", opts.progress),
        checkpoint=path_or_none("checkpoint", opts.checkpoint),
        checkpoint_every=integer("checkpoint_every", opts.checkpoint_every),
        resume=path_or_none("resume", opts.resume))


def _address(name: str, value) -> str:
    """``"host:port"`` (port 0..65535), as the Flower deployment options take it."""
    if not isinstance(value, str) or ":" not in value:
        raise ValueError(f"{name} must be 'host:port', got {value!r}")
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{name} must be 'host:port' with a port in 0..65535, got {value!r}")
    return value


def _flower_options(opts, given: dict, transport: str) -> dict:
    """The flower_* options checked; given with another transport they are an error (they
    would be ignored)."""
    names = ("flower_engine", "flower_superlink", "flower_bridge", "flower_start_timeout")
    if transport != "flower":
        used = [k for k in names if k in given]
        if used:
            raise ValueError(f"{', '.join(used)} only apply to transport='flower' (the "
                             f"transport is {transport!r})")
        return {}
    engine = choice("flower_engine", opts.flower_engine, ("simulation", "deployment"))
    superlink = opts.flower_superlink
    if engine == "deployment":
        if superlink is None:
            raise ValueError("flower_engine='deployment' needs flower_superlink='host:port', "
                             "the SuperLink's address, its --host:--port (e.g. '127.0.0.1:9093')")
        superlink = _address("flower_superlink", superlink)
    elif superlink is not None or "flower_bridge" in given:
        raise ValueError("flower_superlink and flower_bridge only apply to "
                         "flower_engine='deployment'")
    return {"flower_engine": engine, "flower_superlink": superlink,
            "flower_bridge": _address("flower_bridge", opts.flower_bridge),
            "flower_start_timeout": real("flower_start_timeout", opts.flower_start_timeout,
                                         low=0.0, low_open=True)}
