"""SGD-based federated baselines: FedAvg (E local SGD steps), FedSGD (E = 1), with momentum.

The comparisons of the paper's Section VI. Each round the server sends w_t; client i runs E
local SGD steps of batch B on its own rows with learning rate r_t = abar / t^alphabar and sends
its model back; the server averages the models with weights N_i / N. With E = 1 this is FedSGD
(mini-batch SGD with batch B per client). ``momentum`` beta > 0 adds server-side heavy-ball
momentum on the averaged update (v <- beta v + (w_t - wbar_t); w_{t+1} = w_t - v), the "SGD with
momentum" of the authors' public code. Clients go through the same federated layer as SSCA
(messages only), with the same partition, start and evaluation.

Only unconstrained problems with an exact ridge term (or none) are supported: SGD has no way to
handle the stochastic constraints of Problem 3.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np

from .diagnostics import ProblemTerms, evaluate, kkt_report, split_values
from .driver import Recorder, StepInfo
from .errors import ModelError
from .federated import InProcessTransport, LocalSGDRequest, ProcessTransport
from .result import Communication, SSCAResult
from .schedules import PowerStep, ScheduleError
from .subproblems.base import SubproblemSolution


@dataclass(frozen=True)
class FedAvgOptions:
    """Options of ``Problem.solve(method="fedavg")``.

    Attributes:
      batch_size: B rows per local step ("full" for all rows).
      local_steps: E local SGD steps per round (E = 1: FedSGD).
      lr: the learning rate r_t: a PowerStep(abar, alphabar), a callable t -> value > 0 or a
        number. Default PowerStep(0.5, 0.3).
      momentum: server-side heavy-ball coefficient beta in [0, 1) (0: plain FedAvg).
      max_iter: rounds T.
      seed, x0, eval_every, transport, callback, progress: as for method "ssca".
    """

    batch_size: Any = 10
    local_steps: int = 1
    lr: Any = field(default_factory=lambda: PowerStep(0.5, 0.3))
    momentum: float = 0.0
    max_iter: int = 100
    seed: Any = None
    x0: Any = None
    eval_every: Optional[int] = 10
    transport: str = "inprocess"
    callback: Optional[Callable] = None
    progress: bool = False


def _lr_value(lr, t: int) -> float:
    v = float(lr(t)) if callable(lr) else float(lr)
    if not (math.isfinite(v) and v > 0):
        raise ScheduleError(f"lr_t must be a finite number > 0; lr({t}) = {v!r}")
    return v


def solve_fedavg(problem, **options) -> SSCAResult:
    """FedAvg / FedSGD (McMahan et al.), the SGD baselines of Section VI, on ``problem``.

    Returns an :class:`SSCAResult` (status "max_iter"; no slacks) so that both kinds of run
    are read the same way; ``res.subproblem`` is "fedavg".
    """
    from .solve import _batch_size, _x0, make_clients, parse_options_for

    opts = parse_options_for(FedAvgOptions, options, "fedavg")
    if problem.num_constraints:
        raise ModelError("method 'fedavg' cannot handle stochastic constraints; use 'ssca'")
    if problem.objective is None:
        raise ModelError("method 'fedavg' needs a stochastic objective (a SampleFunction)")
    ridge = problem.deterministic.norm2_coefficient()
    if ridge is None:
        raise ModelError("method 'fedavg' supports deterministic terms only of the form "
                         "lambda |w|^2 (no domain)")
    if not (isinstance(opts.local_steps, (int, np.integer)) and opts.local_steps >= 1):
        raise ValueError(f"local_steps must be a positive integer, got {opts.local_steps!r}")
    if not 0 <= opts.momentum < 1:
        raise ValueError(f"momentum must lie in [0, 1), got {opts.momentum!r}")
    if not isinstance(opts.max_iter, (int, np.integer)) or opts.max_iter < 1:
        raise ValueError(f"max_iter must be a positive integer, got {opts.max_iter!r}")
    if opts.transport not in ("inprocess", "process"):
        raise ValueError(f"transport must be 'inprocess' or 'process', got {opts.transport!r}")
    B = _batch_size(opts.batch_size, problem.data)
    w = _x0(opts.x0, problem.dim)
    N, d = problem.data.num_samples, problem.dim
    terms = ProblemTerms(True, problem.bounds, problem.deterministic)
    clients = make_clients(problem, opts.seed)
    rec = Recorder(0)
    v = np.zeros(d)
    up = down = eval_up = eval_down = 0
    start = time.perf_counter()
    empty = np.zeros(0)
    with (ProcessTransport if opts.transport == "process" else InProcessTransport)(clients) as tr:
        for t in range(1, opts.max_iter + 1):
            lr = _lr_value(opts.lr, t)
            msgs = tr.exchange(LocalSGDRequest(t, w.copy(), B, int(opts.local_steps), lr,
                                               ridge))
            up += sum(m.num_floats() for m in msgs)
            down += len(msgs) * d
            avg = sum(m.num_rows * m.w for m in msgs) / N
            step = w - avg
            v = opts.momentum * v + step
            w_prev, w = w, w - v
            info = StepInfo(t, lr, 1.0, 0.0, SubproblemSolution(avg, empty, empty, float("nan")),
                            float(np.linalg.norm(w - w_prev)))
            rec.round(info)
            if opts.eval_every and t % opts.eval_every == 0:
                ev = evaluate(tr, w, N, with_grad=False)
                eval_up, eval_down = eval_up + ev.floats_up, eval_down + ev.floats_down
                f0, _ = split_values(ev.values, terms)
                rec.evaluation(t, f0 + problem.deterministic.value(w), empty)
            if opts.callback is not None:
                opts.callback(w, info)
            if opts.progress and (t % max(1, opts.max_iter // 10) == 0 or t == 1):
                import sys
                last = f"  F0={rec.eval_obj[-1]:.5g} (t={rec.eval_t[-1]})" if rec.eval_t else ""
                print(f"[fedavg] round {t:>5d}/{opts.max_iter}  lr={lr:.3g}{last}",
                      file=sys.stderr, flush=True)
        final = evaluate(tr, w, N, with_grad=True)
    eval_up, eval_down = eval_up + final.floats_up, eval_down + final.floats_down
    f0, _ = split_values(final.values, terms)
    kkt = kkt_report(w, final, terms, empty)
    comm = Communication(opts.max_iter, len(clients), d, d, int(up), int(down), int(eval_up),
                         int(eval_down))
    return SSCAResult(x=w, status="max_iter", message=f"ran max_iter={opts.max_iter} rounds of "
                      f"FedAvg (E = {opts.local_steps}, B = {opts.batch_size})",
                      fun=f0 + problem.deterministic.value(w), constraints=empty, slack=empty,
                      penalty=None, kkt=kkt, history=rec.history(), communication=comm,
                      stages=(), nit=opts.max_iter, subproblem="fedavg",
                      time=time.perf_counter() - start, solver_info={"solver": "fedavg"})

