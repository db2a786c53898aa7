"""``solve_ssca``: the front door of Algorithms 1 and 2 with the penalty continuation.

Options are checked and translated here (unknown names raise TypeError with a suggestion, as
misspelled options should); the rounds themselves are :func:`ssca_solver.driver.step`.
"""

from __future__ import annotations

import difflib
import math
import sys
import time
import warnings
from dataclasses import dataclass, field, fields
from typing import Any, Callable, Optional

import numpy as np

from . import driver
from .diagnostics import ProblemTerms, evaluate, kkt_report, split_values
from .errors import DataError, ModelError
from .federated import Client, InProcessTransport, ProcessTransport, RoundRequest
from .result import Communication, SSCAResult, Stage
from .schedules import PowerStep, as_schedule, check_schedules, step_value
from .subproblems import ClosedFormSubproblem, CvxpySubproblem
from .surrogates import check_strongly_convex


@dataclass(frozen=True)
class SSCAOptions:
    """Options of ``Problem.solve(method="ssca")`` with their defaults.

    Attributes:
      batch_size: B, rows each client draws per round (paper: 1, 10, 100); "full" (or None)
        uses every row of every client (deterministic SCA).
      max_iter: rounds per penalty value c_j (T - 1 of Algorithms 1-2).
      tau: proximal weight of eqs. (fs0bar)/(fsmbar), > 0 (paper: 0.1).
      rho: schedule of eq. (rho) (PowerStep, callable t -> value, or constant in (0, 1]).
        Default PowerStep(0.9, 0.4).
      gamma: schedule of eq. (gamma). Default PowerStep(0.9, 0.55). Both defaults satisfy every
        condition of eqs. (rho)/(gamma); the paper's Section VI choices violate
        sum gamma^2 < inf and draw a warning.
      penalty: c, a number or an increasing sequence c_1 < c_2 < ... (Theorem 2). Only used
        with stochastic constraints.
      slack_tol: the continuation stops at the first c_j whose slack norm (the mean of |s^(t)|
        over the stage's last tenth of rounds, :func:`ssca_solver.driver.stage_slack`) is <=
        this. Absolute, in the units of the constraint functions: scale constraints to O(1).
      subproblem: "auto" (closed form when it applies, else CVXPY), "closed_form" (the
        Numba dual solver of :mod:`ssca_solver.subproblems.closed_form`; an error when it does
        not apply) or "cvxpy" (CVXPY with DPP Parameters, compiled once).
      solver: CVXPY solver name for the subproblem (default "CLARABEL", interior point).
      solver_options: dict of keyword arguments for that solver.
      seed: seeds every client's mini-batch generator (clients get independent streams).
      x0: starting point w_1 (default zeros).
      surrogate_init: "tau" (Fbar^(0) = tau |w|^2, the paper's Section V convention, default)
        or "zero" (Fbar^(0) = 0, eq. (Fs0bar) as written); see PAPER_NOTES item 4.
      eval_every: evaluate the full-data objective and constraints every k rounds for the
        history (None or 0: never; the final point is always evaluated).
      transport: "inprocess" (default) or "process" (each client in its own process).
      callback: ``callback(state, info)`` called after each round; its return value is ignored.
      progress: print a progress line to stderr every ``max(1, max_iter // 10)`` rounds.
    """

    batch_size: Any = 10
    max_iter: int = 200
    tau: float = 0.1
    rho: Any = field(default_factory=lambda: PowerStep(0.9, 0.4))
    gamma: Any = field(default_factory=lambda: PowerStep(0.9, 0.55))
    penalty: Any = (1e2, 1e3, 1e4, 1e5)
    slack_tol: float = 1e-3
    subproblem: str = "auto"
    solver: str = "CLARABEL"
    solver_options: Optional[dict] = None
    seed: Any = None
    x0: Any = None
    surrogate_init: str = "tau"
    eval_every: Optional[int] = 10
    transport: str = "inprocess"
    callback: Optional[Callable] = None
    progress: bool = False


def parse_options_for(cls, options: dict, method: str):
    """Build the options dataclass ``cls``, rejecting unknown names with a suggestion."""
    names = [f.name for f in fields(cls)]
    for key in options:
        if key not in names:
            close = difflib.get_close_matches(key, names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"unknown solve option {key!r} for method '{method}'{hint} "
                            f"Valid options: {', '.join(names)}")
    return cls(**options)


def parse_options(options: dict) -> SSCAOptions:
    """Build :class:`SSCAOptions`, rejecting unknown names with a suggestion."""
    return parse_options_for(SSCAOptions, options, "ssca")


def _penalties(value) -> list[float]:
    seq = [value] if np.isscalar(value) else list(value)
    if not seq:
        raise ValueError("penalty: give at least one value c > 0")
    out = []
    for c in seq:
        if not (isinstance(c, (int, float, np.number)) and math.isfinite(c) and c > 0):
            raise ValueError(f"penalty: every c must be a finite number > 0, got {c!r}")
        out.append(float(c))
    if any(b <= a for a, b in zip(out, out[1:])):
        raise ValueError(f"penalty: the sequence must be strictly increasing "
                         f"(c_1 < c_2 < ..., Theorem 2), got {out}")
    return out


def _batch_size(value, data) -> Optional[int]:
    if value is None or value == "full":
        return None
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"batch_size must be a positive integer or 'full', got {value!r}")
    sizes = data.client_sizes
    i = int(np.argmin(sizes))
    if value > sizes[i]:
        raise DataError(f"batch_size={value} is larger than client {i}'s {sizes[i]} rows; "
                        f"each client draws B <= N_i rows (use batch_size<={sizes[i]} or 'full')")
    return int(value)


def _check(opts: SSCAOptions, problem, explicit: set) -> None:
    if not isinstance(opts.max_iter, (int, np.integer)) or opts.max_iter < 1:
        raise ValueError(f"max_iter must be a positive integer, got {opts.max_iter!r}")
    if not (isinstance(opts.tau, (int, float)) and math.isfinite(opts.tau) and opts.tau > 0):
        raise ValueError(f"tau must be a finite number > 0, got {opts.tau!r}")
    if not (isinstance(opts.slack_tol, (int, float)) and opts.slack_tol >= 0):
        raise ValueError(f"slack_tol must be >= 0, got {opts.slack_tol!r}")
    if opts.subproblem not in ("auto", "cvxpy", "closed_form"):
        raise ValueError("subproblem must be 'auto', 'closed_form' or 'cvxpy', got "
                         f"{opts.subproblem!r}")
    if opts.surrogate_init not in ("tau", "zero"):
        raise ValueError(f"surrogate_init must be 'tau' or 'zero', got {opts.surrogate_init!r}")
    if opts.transport not in ("inprocess", "process"):
        raise ValueError(f"transport must be 'inprocess' or 'process', got {opts.transport!r}")
    if opts.eval_every not in (None, 0) and (not isinstance(opts.eval_every, (int, np.integer))
                                             or opts.eval_every < 0):
        raise ValueError(f"eval_every must be None or a positive integer, got {opts.eval_every!r}")
    if opts.callback is not None and not callable(opts.callback):
        raise TypeError("callback must be callable(state, info)")
    if problem.num_constraints == 0 and "penalty" in explicit:
        warnings.warn("penalty has no effect: the problem has no stochastic constraints",
                      UserWarning, stacklevel=4)
    if not problem.functions:
        raise ModelError("the problem has no SampleFunction: there is nothing stochastic to "
                         "solve by SSCA; solve it with CVXPY directly")


def _x0(value, dim) -> np.ndarray:
    if value is None:
        return np.zeros(dim)
    x0 = np.asarray(value, dtype=float)
    if x0.shape != (dim,) or not np.all(np.isfinite(x0)):
        raise ValueError(f"x0 must be a finite array of shape ({dim},), got shape {x0.shape}")
    return x0


def closed_form_obstacle(problem) -> Optional[str]:
    """Why the closed form does not apply to ``problem`` (None when it does).

    It applies when every stochastic function's builder has scalar curvature (the
    proximal-linear builder) and the deterministic part is lambda |w|^2 (or absent) with no
    domain, and the objective has curvature (a stochastic objective, or lambda > 0).
    """
    for f, b in zip(problem.functions, problem.builders):
        if not b.scalar_curvature:
            return f"{f.name} uses {b!r}, whose curvature is not a scalar"
    det = problem.deterministic
    if det.has_domain:
        return "the problem has a domain (deterministic constraints)"
    lam = det.norm2_coefficient()
    if lam is None:
        return f"the deterministic terms ({', '.join(det.labels)}) are not a multiple of |w|^2"
    if problem.objective is None and not lam > 0:
        return "the objective has no curvature (deterministic objective without lambda |w|^2)"
    return None


def make_subproblem(problem, opts):
    """The subproblem solver chosen by ``opts.subproblem`` ("auto" prefers the closed form)."""
    if opts.subproblem in ("auto", "closed_form"):
        why = closed_form_obstacle(problem)
        if why is None:
            return ClosedFormSubproblem(problem.dim, problem.builders,
                                        problem.objective is not None, problem.bounds,
                                        problem.deterministic.norm2_coefficient())
        if opts.subproblem == "closed_form":
            raise ModelError(f"subproblem='closed_form' does not apply: {why}")
    return CvxpySubproblem(problem.dim, problem.builders, problem.objective is not None,
                           problem.bounds, problem.deterministic, opts.solver,
                           opts.solver_options)


def make_clients(problem, seed) -> list[Client]:
    """One :class:`Client` per block of the problem's data, with independent random streams."""
    seeds = np.random.SeedSequence(seed).spawn(problem.data.num_clients)
    return [Client(i, cd, problem.functions, problem.builders, s)
            for i, (cd, s) in enumerate(zip(problem.data.clients, seeds))]


class _Tally:
    """Passes a round's messages through to the server, counting floats as they go by.

    At round 1 (``problem`` given) the first message's statistics are checked for strong
    convexity before the server uses them.
    """

    def __init__(self, problem=None):
        self.problem = problem
        self.count = self.floats = 0
        self.first = None

    def __call__(self, messages):
        for msg in messages:
            n = msg.num_floats()
            if self.count == 0:
                self.first = n
                if self.problem is not None:
                    p = self.problem
                    for fn, b, st in zip(p.functions, p.builders, msg.stats):
                        check_strongly_convex(b, st, p.dim, fn.name)
            self.count += 1
            self.floats += n
            yield msg


def solve_ssca(problem, **options) -> SSCAResult:
    """Solve ``problem`` by mini-batch SSCA: Algorithm 1 (no stochastic constraint) or
    Algorithm 2 (Problem 5 with slacks and penalty c) inside the penalty continuation of
    Theorem 2, then report KKT diagnostics on the full data. Options: :class:`SSCAOptions`.
    """
    opts = parse_options(options)
    _check(opts, problem, set(options))
    B = _batch_size(opts.batch_size, problem.data)
    rho, gamma = as_schedule(opts.rho, "rho"), as_schedule(opts.gamma, "gamma")
    check_schedules(rho, gamma, stochastic=B is not None)
    x0 = _x0(opts.x0, problem.dim)
    M = problem.num_constraints
    penalties = _penalties(opts.penalty) if M else [0.0]
    eval_every = opts.eval_every or 0
    N, d = problem.data.num_samples, problem.dim
    terms = ProblemTerms(problem.objective is not None, problem.bounds, problem.deterministic)

    subproblem = make_subproblem(problem, opts)
    clients = make_clients(problem, opts.seed)
    transport = (ProcessTransport if opts.transport == "process" else InProcessTransport)(clients)

    state = driver.init(x0, problem.builders, opts.tau, opts.surrogate_init)
    rec = driver.Recorder(M)
    up = down = eval_up = eval_down = 0
    up_round = None
    stages, info, status, message = [], None, None, None
    start = time.perf_counter()
    every = max(1, opts.max_iter // 10)
    with transport:
        for j, c in enumerate(penalties):
            for k in range(opts.max_iter):
                t = state.t + 1
                r, g = step_value(rho, t, "rho"), step_value(gamma, t, "gamma")
                tally = _Tally(problem if t == 1 else None)
                msgs = tally(transport.stream(RoundRequest(t, state.w, B, float(opts.tau))))
                state, info = driver.step(state, msgs, N, r, g, c, subproblem)
                up_round = tally.first
                up += tally.floats
                down += tally.count * d
                rec.round(info)
                if eval_every and t % eval_every == 0:
                    ev = evaluate(transport, state.w, N, with_grad=False)
                    eval_up, eval_down = eval_up + ev.floats_up, eval_down + ev.floats_down
                    f0, cons = split_values(ev.values, terms)
                    rec.evaluation(t, f0 + problem.deterministic.value(state.w), cons)
                if opts.callback is not None:
                    opts.callback(state, info)
                if opts.progress and ((k + 1) % every == 0 or k == 0):
                    _progress(info, k + 1, opts.max_iter, j, len(penalties), M, rec)
            sn = driver.stage_slack(rec.slack, opts.max_iter)
            stages.append(Stage(c, opts.max_iter, sn))
            if M and sn <= opts.slack_tol:
                status = "converged"
                message = (f"mean slack norm over the stage's last rounds {sn:.3g} <= slack_tol={opts.slack_tol:g} at penalty "
                           f"c = {c:g} (stage {j + 1} of {len(penalties)}), {state.t} rounds")
                break
        if status is None:
            if M:
                status = "infeasible"
                message = (f"the slack stayed positive (|s| = {stages[-1].slack_norm:.3g} > "
                           f"slack_tol={opts.slack_tol:g}) at the largest penalty c = "
                           f"{penalties[-1]:g}: the constraints may be infeasible, or c or "
                           "max_iter too small (see docs/modelling.md)")
            else:
                status = "max_iter"
                message = (f"ran max_iter={opts.max_iter} rounds of Algorithm 1 (SSCA has no "
                           "internal stopping test; judge the point by its KKT report)")
        final = evaluate(transport, state.w, N, with_grad=True)
    if subproblem.inaccurate_rounds:
        warnings.warn(f"{len(subproblem.inaccurate_rounds)} subproblem solves were only "
                      f"'optimal_inaccurate' (rounds {subproblem.inaccurate_rounds[:5]}...); "
                      "see res.solver_info", RuntimeWarning, stacklevel=3)
    eval_up, eval_down = eval_up + final.floats_up, eval_down + final.floats_down
    f0, cons = split_values(final.values, terms)
    kkt = kkt_report(state.w, final, terms, info.solution.multipliers, opts.solver)
    comm = Communication(rounds=state.t, num_clients=len(clients),
                         up_per_client_round=int(up_round), down_per_client_round=d,
                         up_total=int(up), down_total=int(down), eval_up_total=int(eval_up),
                         eval_down_total=int(eval_down))
    return SSCAResult(x=state.w.copy(), status=status, message=message,
                      fun=f0 + problem.deterministic.value(state.w), constraints=cons,
                      slack=info.solution.slack.copy(), penalty=(penalties[len(stages) - 1]
                                                                 if M else None),
                      kkt=kkt, history=rec.history(), communication=comm, stages=tuple(stages),
                      nit=state.t, subproblem=getattr(subproblem, "name", "cvxpy"), time=time.perf_counter() - start,
                      constraint_names=tuple(c.name for c in problem.constraints),
                      solver_info={"solver": (opts.solver if isinstance(
                                       subproblem, CvxpySubproblem) else "closed_form"),
                                   "retries": subproblem.retries,
                                   "parametrized": getattr(subproblem, "parametrize", None),
                                   "inaccurate_rounds": tuple(subproblem.inaccurate_rounds)})


def _progress(info, k, max_iter, j, num_stages, M, rec):
    parts = [f"[ssca] round {info.t:>5d}"]
    if M:
        parts.append(f"c={info.penalty:<8.2g} ({j + 1}/{num_stages}) {k:>4d}/{max_iter}")
        parts.append(f"|slack|={np.linalg.norm(info.solution.slack):.3g}")
    else:
        parts.append(f"{k:>4d}/{max_iter}")
    parts.append(f"surrogate={info.solution.value:.5g}")
    if rec.eval_t:
        parts.append(f"F0={rec.eval_obj[-1]:.5g} (t={rec.eval_t[-1]})")
        if M:
            parts.append(f"max F-U={np.max(rec.eval_cons[-1]):.3g}")
    print("  ".join(parts), file=sys.stderr, flush=True)
