"""Options of ``Problem.solve(method="ssca")``, with their checks."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Optional

from ...engine import options as opt
from ...errors import ModelError
from .adaptive import FULL_PASS_WORK
from ...schedules import as_schedule


@dataclass(frozen=True)
class SSCAOptions(opt.RunOptions):
    """Options of ``Problem.solve(method="ssca")`` with their defaults (and
    :class:`~ssca_solver.engine.options.RunOptions`).

    Attributes:
      batch_size: "auto" (default: chosen by a full pass's cost: every row from round 1 when
        every client's rows times d is at most FULL_PASS_WORK = 2^24 row-parameters, where a
        full local pass costs about a round's fixed part; else as "grow"), "grow" (start at
        32 rows per client and double every 10 rounds (the norm test's noise ratio is
        recorded; it could ask sooner only with MIN_ROUNDS below GROW_EVERY), up to every row,
        see :mod:`ssca_solver.methods.ssca.adaptive`), B (rows each client draws per round;
        paper: 1, 10, 100), or "full" (or None: every row of every client, deterministic SCA).
      tau: proximal weight of eqs. (fs0bar)/(fsmbar): "auto" (default: with batch_size
        "auto" or "full" and every client in every round, the curvature along the gradient
        measured before round 1, then adapted by backtracking on full batches; on sampled
        rounds (a fixed B, or K < I clients per round or proportional participation, whatever
        the batch size): max(0.05, the heavy-ball stability bound at round 1 from the probe's
        curvature; docs/solver-settings.md, "SSCA as heavy ball"), never adapted) or a
        number > 0 (paper: 0.1).
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
        when rho or gamma is given; otherwise rho_t = gamma_t = 1.
      penalty: c, a number or an increasing sequence c_1 < c_2 < ... (Theorem 2). Only used
        with stochastic constraints.
      max_iter (shared, :class:`~ssca_solver.engine.options.RunOptions`): rounds of the whole
        run. Default 200 for Algorithm 1 and 200 per penalty value for Algorithm 2 (800 with
        the default four); the rounds left are shared equally among the stages left, and a
        stage that ends early (its iterates settle) leaves its rounds to the later ones.
      slack_tol: the continuation raises c after a stage whose slack estimate (the mean over
        the stage's last tenth of rounds of max_m s_m / max(1, |U_m|)) exceeds this and whose
        violation stopped falling; relative to max(1, |U_m|) like ``feas_tol``. A slack_tol
        given below ``feas_tol`` draws a warning: it raises c more eagerly, but the stop test
        does not read it, so it cannot make the result more feasible; lower ``feas_tol``.
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
      hessian: "auto" (default), "newton", "sketch", "lbfgs" or "none": the model of the
        Lagrangian's Hessian that full batches with tau="auto" (the backtracking regime) add
        to the objective's surrogate, making each round an SQP step with the same
        exact-penalty backtracking. "newton": the clients send each function's Hessian at
        the round's point (its ``hess``, or ``hessp`` of the identity,
        :class:`~ssca_solver.SampleFunction`, or for a function with neither central
        differences of its gradient, 2 d gradient calls on the client's rows,
        :func:`~ssca_solver.model.functions.difference_hessians`: d (d + 1) / 2 floats per
        function per client per round) and the model is the full-data Hessian of the Lagrangian
        F_0 + sum_m nu_m F_m, made positive definite (:mod:`ssca_solver.methods.ssca.newton`);
        "sketch": the clients send each function's Hessian times k directions the server
        chooses (``hessp``, or ``hess`` times them, or central differences of the gradient
        along them: k d floats, k = :func:`sketch_rank`) and
        the model is the randomized Nystrom approximation of the Lagrangian's Hessian on them
        plus its k-th eigenvalue on the rest (:class:`~ssca_solver.methods.ssca.newton.
        SketchModel`; it pays where the Hessian's spectrum falls fast, see
        docs/solver-settings.md); "lbfgs": a damped limited-memory BFGS model built from the
        gradients the rounds already carry (:mod:`ssca_solver.methods.ssca.quasi_newton`);
        "auto": "newton" when d (d + 1) / 2 <= NEWTON_MAX_FLOATS (d <= 256) and every
        stochastic function has a ``hess``, or the k functions without one can be
        differenced at a round's fixed cost: 2 d max_i N_i d k <= FULL_PASS_WORK (2^24
        row-parameters, the rule of batch_size="auto"); else "lbfgs";
        "none": the paper's first-order surrogates (eqs. (fs0bar)/(fsmbar)) in every round.
        Sampled rounds, a fixed tau and a diagonal metric always use the first-order
        surrogates.
      eval_budget: "auto" (default), None, or the largest share b of the clients' work (rows
        read) the scheduled full-data evaluations may take, e.g. 0.15: one runs at a multiple
        of ``eval_every`` once the rounds since the last read N (1 - b) / b rows. None: one
        every ``eval_every`` rounds, whatever it costs. "auto": b = 0.15 while the batches
        grow (``batch_size`` "auto" or "grow", every client in every round, ``eval_every``
        not given), where a round of 32 rows per client costs a small fraction of an evaluation's N rows
        and the full-batch rounds that follow are free evaluations; None at a fixed B or
        with ``clients_per_round`` (there the evaluations are the status's only evidence: an
        infeasible or stalled stage needs 4) or when ``eval_every`` is given. On full
        batches with tau="auto" the rounds' own statistics are the evaluations (free),
        whatever the budget.
      privacy: None (default) or an :class:`~ssca_solver.Privacy`: (epsilon, delta)
        differential privacy of each row (or, ``level="client"``, of each client's data;
        :mod:`ssca_solver.methods.ssca.privacy`, docs/privacy.md). Each contribution is
        clipped on the client, Gaussian noise calibrated by the accountant to the
        ``max_iter`` rounds is added by the server (or, ``mechanism="distributed"`` with
        secure aggregation, by the participants of the secure sum; a request that cannot
        meet the budget is refused before round 1), and nothing else reads the data: it needs a fixed ``batch_size`` (B or "full") and a numeric ``tau``, and runs
        without the probe, the gradient check, the full-data evaluations and the model of
        the Hessian. Status "private"; ``res.privacy`` holds the (epsilon, delta) spent.
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
    hessian: str = "auto"
    eval_budget: Any = "auto"
    privacy: Any = None

    def checked(self, problem, given: dict) -> "SSCAOptions":
        """The options with SSCA's own values checked and normalised (after
        :func:`ssca_solver.engine.options.parse` checked the shared ones); ``given``: the
        options as the user passed them."""
        if not problem.functions:
            raise ModelError("the problem has no SampleFunction: there is nothing stochastic to "
                             "solve by SSCA; solve it with CVXPY directly")
        if problem.num_constraints == 0 and "penalty" in given:
            warnings.warn("penalty has no effect: the problem has no stochastic constraints",
                          UserWarning, stacklevel=5)
        if self.solver_options is not None and not isinstance(self.solver_options, dict):
            raise ValueError(f"solver_options must be a dict, got {self.solver_options!r}")
        if not isinstance(self.solver, str):
            raise ValueError(f"solver must be a CVXPY solver name, got {self.solver!r}")
        if ("slack_tol" in given and problem.num_constraints and opt.is_real(self.slack_tol)
                and opt.is_real(self.feas_tol) and self.slack_tol < self.feas_tol):
            warnings.warn(
                f"slack_tol={self.slack_tol!r} is below feas_tol={self.feas_tol!r}: it raises c "
                "more eagerly between penalty stages, but the run stops as soon as the KKT "
                "test passes with violations up to feas_tol, whatever the slack; to ask for a "
                "smaller violation lower feas_tol", UserWarning, stacklevel=5)
        private = _private(self, problem, given)
        max_iter = self.max_iter
        if "max_iter" not in given and problem.num_constraints:
            # the default budget: ROUNDS_PER_STAGE rounds for each penalty value c_j
            max_iter = ROUNDS_PER_STAGE * len(opt.penalties(self.penalty))
        B = opt.batch_size(self.batch_size, problem.data, allow_auto=True)
        if isinstance(B, int) and B >= max(problem.data.client_sizes):
            # every client's batch is all its rows: the statistics are exact, so the rounds
            # are full-batch rounds (unit steps, backtracking), not the paper's sampled ones
            # (20 one-row clients at B = 1 ended 2e-4 from the optimum at a "noise floor")
            B = None
        return self.__class__(**{
            **vars(self), **private,
            "batch_size": B, "max_iter": max_iter,
            "tau": _tau(self.tau),
            "rho": as_schedule(self.rho, "rho"), "gamma": as_schedule(self.gamma, "gamma"),
            "penalty": opt.penalties(self.penalty) if problem.num_constraints else (0.0,),
            "slack_tol": opt.real("slack_tol", self.slack_tol, low=0.0),
            "feas_tol": opt.real("feas_tol", self.feas_tol, low=0.0),
            "kkt_tol": opt.real("kkt_tol", self.kkt_tol, low=0.0),
            "check_gradients": opt.flag("check_gradients", private.get(
                "check_gradients", self.check_gradients)),
            "subproblem": opt.choice("subproblem", self.subproblem,
                                     ("auto", "closed_form", "cvxpy")),
            "surrogate_init": opt.choice("surrogate_init", self.surrogate_init,
                                         ("tau", "zero")),
            "hessian": _hessian(private.get("hessian", self.hessian), problem),
            "eval_budget": _eval_budget(self.eval_budget, B, given,
                                        self.clients_per_round is None)})


#: the default max_iter of Algorithm 2 is this many rounds per penalty value (800 with the
#: default four); Algorithm 1's is RunOptions.max_iter (200)
ROUNDS_PER_STAGE = 200


#: the share of the clients' work the scheduled evaluations may take in the sampled rounds of
#: batch_size="auto" (eval_budget="auto"): there a batch of 32 rows per client reads 1/780 of
#: the rows an evaluation reads, so one every eval_every rounds would be most of the run's
#: work, for a status its full-batch rounds then settle with free evaluations
AUTO_EVAL_BUDGET = 0.15


#: the most floats of one function's curvature per client per round that hessian="auto" sends:
#: d (d + 1) / 2 for d = 256, the floats of 128 gradients, where a Newton step saves the
#: hundreds of first-order or quasi-Newton rounds an ill-conditioned problem costs; above it
#: the sketch's k d floats are held to the same budget (:func:`sketch_rank`)
NEWTON_MAX_FLOATS = 256 * 257 // 2
#: the fewest directions of the sketch (hessian="sketch"), whatever d
SKETCH_MIN_RANK = 8
#: the most directions of the sketch
SKETCH_MAX_RANK = 64


def sketch_rank(dim: int) -> int:
    """k, the directions of the Hessian's sketch at ``dim`` variables: NEWTON_MAX_FLOATS / d
    (the floats of the Newton model at d = 256), within [SKETCH_MIN_RANK, SKETCH_MAX_RANK]
    and below d: 50 at d = 650, 32 at d = 1,000, 8 from d = 4,112 on."""
    k = min(SKETCH_MAX_RANK, max(SKETCH_MIN_RANK, NEWTON_MAX_FLOATS // max(int(dim), 1)))
    return max(1, min(k, int(dim) - 1))


def _private(o: SSCAOptions, problem, given: dict) -> dict:
    """Under ``privacy``, the options it fixes (no gradient check, no evaluations, no model of
    the Hessian), after refusing the ones that would read the data without noise or that the
    accountant cannot follow; {} without privacy."""
    from ...model.surrogates import ProximalLinear
    from .privacy import Privacy

    p = o.privacy
    if p is None:
        return {}
    if not isinstance(p, Privacy):
        raise TypeError(f"privacy must be None or an ss.Privacy(epsilon=..., delta=..., "
                        f"clip=...), got {p!r}")

    def refuse(why):
        raise ValueError(f"privacy: {why}")

    if p.mechanism == "distributed" and not o.secure_aggregation:
        refuse("mechanism='distributed' adds each client's share of the noise before the "
               "masks of secure aggregation; without secure_aggregation=True each message "
               "would carry only its share (use mechanism='central', or secure_aggregation)")
    if isinstance(o.batch_size, str) and o.batch_size in opt.ADAPTIVE_BATCHES:
        refuse(f"batch_size={o.batch_size!r} grows the batches by a test on the data; give "
               "the rows each client draws per round (an integer B) or 'full', which fixes "
               "the noise the accountant calibrates before round 1")
    if isinstance(o.tau, str):
        refuse("tau='auto' measures the curvature on the clients' data before round 1; give "
               "tau as a number (the paper's choice is 0.1)")
    if given.get("eval_every"):
        refuse("full-data evaluations (eval_every) read the data without noise; leave "
               "eval_every out (evaluate res.x on data of your own)")
    if given.get("check_gradients"):
        refuse("the gradient check reads the clients' data without noise; check your "
               "gradients with ss.check_grad on data of your own")
    if given.get("hessian", "none") not in ("none", None):
        refuse(f"hessian={given['hessian']!r}: the curvature of the data is not privatised; "
               "leave hessian out")
    if o.on_client_failure == "drop":
        refuse("on_client_failure='drop' renormalises the weights of the clients who "
               "answered, which raises a row's weight beyond what the noise was calibrated "
               "for")
    if o.clients_per_round is not None and o.participation == "proportional":
        refuse("participation='proportional' draws a client several times, which raises a "
               "row's weight beyond what the noise was calibrated for; use 'uniform'")
    other = [f.name for f, b in zip(problem.functions, problem.builders)
             if type(b).statistics is not ProximalLinear.statistics]
    if other:
        raise ModelError(f"privacy: {', '.join(other)} has a surrogate other than the "
                         "proximal-linear one, whose statistics are not the sums of per-row "
                         "values and gradients that are clipped; use the default surrogate")
    return {"check_gradients": False, "eval_every": 0, "hessian": "none"}


def _hessian(value, problem) -> str:
    """The model of the Lagrangian's Hessian the options ask for, "auto" resolved."""
    value = opt.choice("hessian", "none" if value is None else value,
                       ("auto", "newton", "sketch", "lbfgs", "none"))
    if value == "sketch" and problem.dim < 2:
        raise ValueError("hessian='sketch' needs at least 2 variables (use 'newton')")
    if value == "auto":
        # above NEWTON_MAX_FLOATS the quasi-Newton model, not the sketch: on the benchmarks'
        # multinomial models the sketch took fewer rounds only where the Hessian's spectrum
        # falls fast (docs/solver-settings.md has the figures)
        d = problem.dim
        if d * (d + 1) // 2 > NEWTON_MAX_FLOATS:
            return "lbfgs"
        lacking = sum(1 for f in problem.functions if f.hess is None)
        if not lacking:
            return "newton"
        # the functions without hess: their Hessians from central differences of their
        # gradients on the client (difference_hessians), 2 d gradient calls each, which read
        # 2 d N_i d row-parameters a function: affordable while that is at most
        # FULL_PASS_WORK, the work batch_size="auto" counts as a round's fixed cost
        rows = max((int(n) for n in problem.data.client_sizes), default=0)
        return "newton" if 2 * d * rows * d * lacking <= FULL_PASS_WORK else "lbfgs"
    return value


def _eval_budget(value, batch_size, given: dict, every_client: bool):
    """eval_budget as a share in (0, 1] or None (every ``eval_every`` rounds). "auto": the
    share AUTO_EVAL_BUDGET when the batches grow (batch_size="auto") to full batches whose
    rounds are free evaluations (every client in every round) and the user left
    ``eval_every`` at its default, else None: at a fixed B, or when only some clients take
    part in a round, the scheduled evaluations are the status's only evidence (an infeasible
    problem needs 4 in a stage) and what the penalty continuation reads, and an
    ``eval_every`` given is a schedule asked for."""
    if isinstance(value, str) and value == "auto":
        if batch_size in opt.ADAPTIVE_BATCHES and every_client and "eval_every" not in given:
            return AUTO_EVAL_BUDGET
        return None
    if value is None:
        return None
    return opt.real("eval_budget", value, low=0.0, low_open=True, high=1.0)


def _tau(value):
    if isinstance(value, str) and value == "auto":
        return value
    if not opt.is_real(value):
        raise ValueError(f"tau must be a number > 0 or 'auto', got {value!r}")
    return opt.real("tau", value, low=0.0, low_open=True)
