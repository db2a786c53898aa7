"""Front doors of the constrained baselines: ``method="primal_dual"`` (federated stochastic
gradient descent-ascent on the Lagrangian) and ``method="augmented_lagrangian"``.

The methods are :class:`ssca_solver.algorithms.lagrangian.Lagrangian`, run by the same runner,
client layer, evaluation and full-data KKT stopping test as method "ssca" (the session builds
the test from its own KKT report; success only when it passes). Equations, references and
options: docs/baselines.md.
"""

from __future__ import annotations

import numpy as np

from . import options as opt
from .algorithms.lagrangian import AUGMENTED, PRIMAL_DUAL, Lagrangian
from .errors import ModelError
from .options import AugmentedLagrangianOptions, PrimalDualOptions
from .result import Result
from .session import Session, describe_schedule, fingerprint

__all__ = ["PrimalDualOptions", "AugmentedLagrangianOptions", "solve_primal_dual",
           "solve_augmented_lagrangian"]


def _schedule(name: str, value):
    """A PowerStep, a callable t -> value, or a number > 0 (checked now)."""
    if isinstance(value, (bool, np.bool_, str)) or not (callable(value) or opt.is_real(value)):
        raise ValueError(f"{name} must be a PowerStep, a callable t -> value or a number > 0, "
                         f"got {value!r}")
    return value if callable(value) else opt.real(name, value, low=0.0, low_open=True)


def _multipliers(value, M: int):
    if value is None:
        return None
    try:
        lam = np.array(value, dtype=float).reshape(-1)
    except (TypeError, ValueError):
        raise ValueError(f"multipliers0 must be {M} numbers >= 0, got {value!r}") from None
    if lam.size != M or not np.all(np.isfinite(lam)) or np.any(lam < 0):
        raise ValueError(f"multipliers0 must be {M} finite numbers >= 0 (one per stochastic "
                         f"constraint), got {value!r}")
    return tuple(float(v) for v in lam)


def _parse(cls, problem, options: dict, method: str):
    o = opt.parse(cls, options, method)
    if not problem.functions:
        raise ModelError(f"method {method!r}: the problem has no SampleFunction: there is "
                         "nothing stochastic to solve; solve it with CVXPY directly")
    if not isinstance(o.solver, str):
        raise ValueError(f"solver must be a CVXPY solver name, got {o.solver!r}")
    values = {"batch_size": opt.batch_size(o.batch_size, problem.data),
              "local_steps": opt.integer("local_steps", o.local_steps),
              "lr": _schedule("lr", o.lr),
              "multipliers0": _multipliers(o.multipliers0, problem.num_constraints),
              "feas_tol": opt.real("feas_tol", o.feas_tol, low=0.0),
              "kkt_tol": opt.real("kkt_tol", o.kkt_tol, low=0.0)}
    if cls is PrimalDualOptions:
        values["dual_lr"] = _schedule("dual_lr", o.dual_lr)
    else:
        values["rho"] = opt.real("rho", o.rho, low=0.0, low_open=True)
        values["dual_every"] = opt.integer("dual_every", o.dual_every)
    return o.__class__(**{**vars(o), **values})


def _solve(problem, options: dict, kind: str) -> Result:
    cls = PrimalDualOptions if kind == PRIMAL_DUAL else AugmentedLagrangianOptions
    o = _parse(cls, problem, options, kind)
    pd = kind == PRIMAL_DUAL
    algorithm = Lagrangian(problem, kind, o.batch_size, o.local_steps, o.lr,
                           dual_lr=o.dual_lr if pd else None, rho=0.0 if pd else o.rho,
                           dual_every=1 if pd else o.dual_every, multipliers0=o.multipliers0,
                           solver=o.solver)
    settings = ({"dual_lr": describe_schedule(o.dual_lr)} if pd
                else {"rho": o.rho, "dual_every": o.dual_every})
    fp = fingerprint(problem, kind, batch_size=o.batch_size, local_steps=o.local_steps,
                     lr=describe_schedule(o.lr), multipliers0=o.multipliers0, solver=o.solver,
                     **settings)
    with Session(problem, algorithm, o, fp, algorithm.init,
                 kkt_test=lambda rep: rep.passed(o.feas_tol, o.kkt_tol),
                 solver=o.solver) as session:
        runner, state = session.runner, session.state
        if not session.resumed and o.eval_every:
            try:
                session.measure_scale(state.w)     # the scale of the relative stationarity
            except BaseException as exc:
                runner.failed(exc, state)
                raise
        state, reason = runner.run(state, o.max_iter - state.t)
        fun, cons, kkt, comm, history = session.final_report(state, o.solver)
    status, message = _status(reason, state, kkt, o, kind)
    M = problem.num_constraints
    return Result(x=state.w.copy(), status=status, message=message, fun=fun, constraints=cons,
                  slack=np.zeros(M), penalty=None, kkt=kkt, history=history,
                  communication=comm, stages=(), nit=state.t, method=kind, subproblem=None,
                  time=runner.elapsed, constraint_names=tuple(c.name for c in
                                                              problem.constraints),
                  extras={"multipliers": state.multipliers.copy(),
                          "local_steps": o.local_steps, "batch_size": o.batch_size,
                          "server_prox": algorithm.prox is not None, **settings})


def _status(reason, state, kkt, o, kind):
    """(status, message): "converged" only when the full-data KKT test passed."""
    if reason == "converged":
        return "converged", kkt.passed_message(state.t, o.feas_tol, o.kkt_tol)
    if reason == "stopped":
        return "stopped", f"stopped by the callback after round {state.t}"
    name, value, tol = kkt.residuals(o.feas_tol, o.kkt_tol)[0]
    if not o.eval_every:
        return "max_iter", (f"ran {state.t} rounds without a stopping test (eval_every=None): "
                            f"at the end {name} = {value:.3g} (tolerance {tol:g})")
    advice = ("with mini-batches and steps that do not vanish the iterates end at a noise "
              "floor: a larger batch_size (or 'full'), smaller or decreasing lr"
              + (" and dual_lr" if kind == PRIMAL_DUAL else "") + ", or more rounds"
              if o.batch_size is not None else
              "more rounds (max_iter), or other step sizes"
              + (" (lr, dual_lr)" if kind == PRIMAL_DUAL else " (lr, rho)"))
    return "max_iter", (f"the full-data KKT test did not pass in {state.t} rounds: {name} = "
                        f"{value:.3g} > {tol:g} (relative) at the returned point; try "
                        f"{advice}")


def solve_primal_dual(problem, **options) -> Result:
    """Federated stochastic gradient descent-ascent on the Lagrangian (Local SGDA; E = 1:
    stochastic Arrow-Hurwicz) on ``problem``. Options:
    :class:`ssca_solver.options.PrimalDualOptions`; equations: docs/baselines.md.

    Status "converged" only when the full-data KKT test (the same as method "ssca"'s) passed;
    else "stopped" (callback) or "max_iter" naming the residual that failed. The method's own
    multipliers lambda are in ``res.extras["multipliers"]`` and ``res.history.multipliers``;
    ``res.kkt.multipliers`` are those of the KKT conditions at ``res.x``, as for every method.
    """
    return _solve(problem, options, PRIMAL_DUAL)


def solve_augmented_lagrangian(problem, **options) -> Result:
    """Federated stochastic augmented Lagrangian (method of multipliers, Hestenes-Powell-
    Rockafellar, with E local SGD steps on L_rho per round and a multiplier step every
    ``dual_every`` rounds) on ``problem``. Options:
    :class:`ssca_solver.options.AugmentedLagrangianOptions`; equations: docs/baselines.md.
    Status as for :func:`solve_primal_dual`."""
    return _solve(problem, options, AUGMENTED)
