"""Solve options: ``RunOptions`` (what every method shares, the runner's) and the helpers that
parse them once.

``parse(cls, options, method)`` rejects unknown names with a suggestion (TypeError, as scipy
and cvxpy users expect), checks every value (ValueError naming the option; bools and strings
are refused where a number is expected, NumPy scalars of any type are accepted) and returns
the dataclass with normalised values (floats, ints, tuples). Each method's own options class
derives from ``RunOptions`` and sits with the method (``ssca_solver.methods``); a transport's
own options (``flower_*``) are declared with the transport
(:func:`ssca_solver.federated.register_transport`) and parsed here into
``RunOptions.transport_options``.
"""

from __future__ import annotations

import difflib
import numbers
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Optional

import numpy as np

from ..errors import DataError
from ..federated import DEFAULT_CLIENT_TIMEOUT, transport_names
from ..federated.registry import (NOT_SHARDED, check_transport_options,
                                  transport_option_names)
from ..schedules import PowerStep
# the value checks, here too for the methods' options (``opt.real``, ...)
from ..validation import choice, flag, integer, is_real, path_or_none, real  # noqa: F401


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


#: the adaptive batch schedules of ``batch_size`` (SSCA's): chosen by cost, and growing
ADAPTIVE_BATCHES = ("auto", "grow")


def batch_size(value, data, allow_auto: bool = False):
    """B as an int, None for the full batch ("full" or None), or "auto" or "grow" (the
    adaptive schedules, when allowed); B <= every client's N_i."""
    if value is None or (isinstance(value, str) and value == "full"):
        return None
    if allow_auto and isinstance(value, str) and value in ADAPTIVE_BATCHES:
        return value
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or value < 1:
        kinds = ", 'full', 'auto' or 'grow'" if allow_auto else " or 'full'"
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


def learning_rate(name: str, value):
    """A step-size option of the SGD-type methods: a PowerStep, a callable t -> value or a
    number > 0 (returned as a float)."""
    if isinstance(value, (bool, np.bool_, str)) or not (callable(value) or is_real(value)):
        raise ValueError(f"{name} must be a PowerStep, a callable t -> value or a number > 0, "
                         f"got {value!r}")
    return value if callable(value) else real(name, value, low=0.0, low_open=True)


def describe_schedule(schedule) -> str:
    """A step-size schedule as text for a checkpoint's fingerprint: its value for PowerStep,
    EpochStep and constants, else the callable's qualified name (its repr would hold a memory
    address)."""
    from ..schedules import EpochStep

    if isinstance(schedule, (PowerStep, EpochStep, int, float, str)) or type(schedule).__name__ == "_Constant":
        return repr(schedule)
    return f"{getattr(schedule, '__module__', '?')}.{getattr(schedule, '__qualname__', '?')}"


# -- the options --------------------------------------------------------------------------------

@dataclass(frozen=True)
class RunOptions:
    """Options every method shares (the runner's).

    Attributes:
      max_iter: rounds of the whole run, every penalty stage of Algorithm 2 included (as
        scipy's maxiter); how they are spread over the stages is reported in ``res.stages``.
      seed: seeds the clients' mini-batches: anything ``np.random.default_rng`` accepts. The
        batch of client i at round t is drawn from ``SeedSequence(seed, spawn_key=(i, t, k))``.
      x0: starting point w_1 (default zeros).
      eval_every: evaluate the full-data objective and constraints every k rounds for the
        history (None or 0: never; the final point is always evaluated).
      transport: "inprocess" (default), "process" (each client in its own process), "ray"
        (the clients in shards, each a Ray actor, :mod:`ssca_solver.federated.raytransport`;
        its option ``ray_address``: None starts a local cluster), "flower", or a name given
        to :func:`ssca_solver.federated.register_transport`.
      client_timeout: how long a client may take to answer one request before the solve
        stops with ClientError (or, with ``on_client_failure="drop"``, leaves it out): seconds
        (honoured exactly), None (wait forever) or "auto" (the default), which follows the
        answer times measured in the run, task by task: the first request of a task (a
        round, a full-data evaluation, a probe) may take 60 s, extended 10 s at a time up to
        300 s while the client's process computes (imports, JIT compiling; Flower, which
        cannot see its clients' CPU: 300 s), each later one the larger of 60 s and 10 times
        the slowest answer of the last 20 requests of that task
        (:class:`ssca_solver.federated.ClientTimeout`, docs/running.md). Process and Flower
        transports: in-process clients cannot be interrupted.
      flower_engine, flower_superlink, flower_bridge, flower_start_timeout: the options of
        ``transport="flower"`` (:mod:`ssca_solver.federated.flower_options`, docs/engines.md);
        with another transport they are an error.
      client_threads: ``transport="process"`` and ``"flower"``: the threads each client
        process's BLAS, OpenMP and Numba pools may use: "auto" (the default of "process") at
        most max(1, CPUs // client processes), an integer exactly that, None (the default of
        "flower") as the processes inherit them (:func:`ssca_solver.federated.transports.
        limit_threads`, docs/engines.md "Threads"). With "inprocess" an error: the clients
        run in your process, whose threads you limit yourself (``threadpoolctl``).
      callback: ``callback(it)`` after each round with an :class:`ssca_solver.engine.runner.Iteration`
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
      shards: group the clients into this many shards of consecutive clients, each
        answering for all its clients with one reply (None, the default: every client
        answers for itself). A shard holds its clients' rows once, evaluates the clients
        whose weights agree in one call of each function (their batches drawn as each
        client's own), and sends the weighted sum of its clients' replies: the server's
        work per round grows with the shards, not the clients, and each round's numbers equal
        the one-client-at-a-time ones up to rounding (which a run may amplify, as a change of
        BLAS threads does) (:mod:`ssca_solver.federated.shards`,
        docs/running.md "Many clients"). With ``transport="process"`` each shard is a forked
        process, with ``"ray"`` a Ray actor (default there: one shard per CPU); not with
        "flower". With ``secure_aggregation`` the shards are its participants (each masks
        its clients' sum); methods whose server reads only weighted sums of replies
        (ssca, fedavg, primal_dual, augmented_lagrangian). Messages are counted as the
        clients' own.
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
    client_timeout: Any = DEFAULT_CLIENT_TIMEOUT
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
    shards: Optional[int] = None
    #: the chosen transport's own options, checked (set by :func:`parse`, not by the user)
    transport_options: dict = field(default_factory=dict, metadata={"internal": True})


PARTICIPATION = ("uniform", "proportional")
ON_CLIENT_FAILURE = ("raise", "drop")


def check_clients(opts: RunOptions, num_clients: int) -> None:
    """The options that depend on the number of clients I: K in 1..I, and secure aggregation
    with at least 2 clients per round (the sum of one client is its message)."""
    K = opts.clients_per_round
    if K is not None and K > num_clients:
        raise ValueError(f"clients_per_round must be between 1 and the number of clients "
                         f"({num_clients}), got {K}")
    if opts.shards is not None and opts.shards > num_clients:
        raise ValueError(f"shards must be between 1 and the number of clients "
                         f"({num_clients}), got {opts.shards}")
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
    names = [f.name for f in fields(cls) if not f.metadata.get("internal")]
    transport_only = transport_option_names()
    valid = names + [k for k in transport_only if k not in names]
    for key in options:
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"unknown solve option {key!r} for method '{method}'{hint} "
                            f"Valid options: {', '.join(valid)}")
    opts = cls(**{k: v for k, v in options.items() if k in names})
    every = opts.eval_every
    if every is not None and not (not isinstance(every, (bool, np.bool_)) and every == 0):
        every = integer("eval_every (None or 0: never)", every, low=1)
    timeout = opts.client_timeout
    if timeout is not None and not (isinstance(timeout, str) and timeout == "auto"):
        timeout = real("client_timeout (seconds, None or 'auto')", timeout, low=0.0,
                       low_open=True)
    if opts.callback is not None and not callable(opts.callback):
        raise TypeError("callback must be callable(iteration) -> bool | None")
    per_round = opts.clients_per_round
    if per_round is not None:
        per_round = integer("clients_per_round (None: every client)", per_round, low=1)
    transport = choice("transport", opts.transport, transport_names())
    shards = opts.shards
    if shards is not None:
        shards = integer("shards (None: every client answers for itself)", shards, low=1)
        if transport in NOT_SHARDED:
            raise ValueError(f"shards does not apply to transport={transport!r}: it keeps "
                             "one client per node (use 'inprocess', 'process' or 'ray')")

    own = check_transport_options(transport, {k: v for k, v in options.items()
                                              if k in transport_only and k not in names})
    return replace(
        opts, max_iter=integer("max_iter", opts.max_iter), eval_every=every or 0,
        clients_per_round=per_round, shards=shards,
        participation=choice("participation", opts.participation, PARTICIPATION),
        on_client_failure=choice("on_client_failure", opts.on_client_failure,
                                 ON_CLIENT_FAILURE),
        secure_aggregation=flag("secure_aggregation", opts.secure_aggregation),
        secure_range=real("secure_range", opts.secure_range, low=0.0, low_open=True),
        transport=transport, client_timeout=timeout, transport_options=own,
        progress=flag("progress", opts.progress),
        checkpoint=path_or_none("checkpoint", opts.checkpoint),
        checkpoint_every=integer("checkpoint_every", opts.checkpoint_every),
        resume=path_or_none("resume", opts.resume))
