"""What lets SSCA run without tuning: adaptive sampling, curvature from the data, and
backtracking on full batches.

* **Curvature probe** (before round 1): each client evaluates every function at x0 on a batch,
  checks the gradient against a central difference of the values along the gradient (a sign
  error or a sum instead of a mean is caught here; a step that disagrees is retried at shorter
  and longer ones before the gradient is accused, :func:`retry_steps`, :func:`check_gradient`),
  and estimates the curvature along the gradient by a secant of two gradients,
  L ~ |grad f(x0 + s u) - grad f(x0)| / s. The starting proximal weight is tau = max L (twice
  the L/2 that makes a proximal-linear surrogate an upper bound along that direction).
* **Adaptive sampling** (the norm test of Byrd, Chin, Nocedal and Wu, 2012): clients compute
  their statistics on the two halves of their batch and send |g_A - g_B|^2 (one number per
  function), from which the server estimates the variance of its gradient estimate,
  Var = sum_i (N_i/N)^2 |g_A - g_B|^2 / 4 (1 - B_i/N_i). While the Lagrangian's noise exceeds
  its size (an exponential average of Var / |grad L|^2 above 1), the batch doubles, up to every
  row of every client.
* **Diagonal metric** (before round 1, closed-form path): each client sends the sum of its
  squared per-sample gradients over up to METRIC_ROWS rows, per function (an empirical-Fisher
  estimate of the Hessian's diagonal). When for some function the estimates span more than
  METRIC_SPREAD, full-batch rounds use the proximal term tau (w - w_t)' diag(D_m) (w - w_t)
  (:meth:`ClosedFormSubproblem.solve_metric`), and the KKT test also measures stationarity
  in the metric's units.
* **Full batches** (deterministic SCA): rho = gamma = 1, and the exact-penalty merit
  F_0 + R + c sum_m (F_m - U_m)_+ (known exactly at w_t from the clients' statistics) must not
  increase; a step that increases it is retried from the last accepted point with tau doubled
  (computed on the server from that point's statistics), and after an accepted step tau shrinks
  by 10 %: a majorization-minimization method with backtracking, which descends monotonically.
"""

from __future__ import annotations

from typing import Mapping, Optional

import numpy as np

from ...errors import UserFunctionError
from ...federated.messages import aggregation_weight, array, secagg_active
from ...model.functions import (DIFFERENCE_STEPS, central_difference, checked_grad,
                                checked_value_and_grad, checked_values, mean_value_or_nan,
                                step_scale, vector_groups)
from ...model.surrogates import DiagonalCurvature, Linearization, ProximalLinear

START_BATCH = 32        # rows per client in the first rounds of a growing schedule
#: batch_size="auto" reads every row from round 1 when every client's full pass reads at most
#: this many row-parameters (its rows N_i times d): such a pass costs about what a round's fixed
#: part does (the messages, the server's subproblem, the dispatch), so sampled rounds save no
#: time and only add rounds (benchmarks/batch_cost.py measures both per transport); above it
#: the batches grow from START_BATCH (batch_size="grow")
FULL_PASS_WORK = 2 ** 24
SAMPLED_TAU_FLOOR = 0.05  # least tau="auto" on sampled rounds (.probe.sampled_tau)
GROWTH = 2              # factor of each batch increase
NOISE_RATIO = 0.25      # grow while the averaged (noise / |grad L|)^2 exceeds this
NOISE_AVERAGING = 0.3   # weight of the newest round in that average
MIN_ROUNDS = 10         # rounds between two increases by the norm test
#: and an increase at least this often, so that the batch reaches the full data: the norm test
#: rarely asks for growth on well-sampled problems, while the full-batch (L-BFGS) rounds
#: converge in tens of rounds. With GROW_EVERY == MIN_ROUNDS the batch doubles exactly every
#: GROW_EVERY rounds: the norm test cannot make it grow sooner (its ratio is still computed
#: and recorded in the history). The measurements behind the value are on the benchmarks
#: page (benchmarks/defaults.py).
GROW_EVERY = 10
TAU_UP, TAU_DOWN = 2.0, 0.9
#: on the first-order surrogates a rejected step is retried at half its length along its
#: direction, tau unchanged, while tau is at least this share of the probe's curvature
#: (.acceptance._line_search); below it tau is raised by TAU_UP instead
LINE_SEARCH_TAU = 1e-3
#: tau's factor after an accepted step once the quasi-Newton model holds a pair (tau is then a
#: regularisation of the model's step, not the curvature itself)
TAU_DOWN_MODEL = 0.25
#: with the quasi-Newton model the factor follows the accepted step's agreement r (the merit's
#: decrease over the decrease the round's model predicted, .acceptance.agreement): from
#: AGREE_HIGH on tau falls by TAU_DOWN_AGREE, below AGREE_LOW (a model that predicted a
#: decrease the merit did not show) it is kept, in between it falls by TAU_DOWN_MODEL. On an
#: exact quadratic r lies between 1 (the model's curvature sets the step) and 2 (tau does: a
#: tau far above the curvature, as the probe's start can be, takes log(tau / curvature) /
#: log(1 / TAU_DOWN_MODEL) rounds to fall out of the way)
AGREE_HIGH, AGREE_LOW, TAU_DOWN_AGREE = 0.9, 0.25, 0.1
#: the same under the Newton model (the clients' exact Hessians): the model is the curvature,
#: and tau only guards the step where the model is poor, so it falls as fast as steps are
#: accepted; on an ill-conditioned quadratic a slower fall leaves the low-curvature
#: directions damped for tens of rounds (log(condition number) / log(1 / factor))
TAU_DOWN_NEWTON = 0.1
#: after a rejected quasi-Newton step tau is at least this times the model's scale delta
#: (the curvature of its initial matrix), so that the retried step is shorter
MODEL_REJECT = 0.5
#: with the Newton model, a rejected step's retry takes the tau between TAU_UP times tau and
#: that floor whose step is RADIUS_SHARE times the rejected one's (a trust radius), found by
#: RADIUS_BISECTIONS bisections on log tau, each one server-side subproblem solve
#: (.acceptance.radius_factor)
RADIUS_SHARE = 0.5
RADIUS_BISECTIONS = 8
#: with the Newton model, a rejected step whose retry at the raised tau would be about as long
#: (the linearised constraints fix it) is retried at half its length along its direction
#: instead, for at most this many rejections in a row (.acceptance._tau_cannot_shorten)
PINNED_HALVINGS = 3
#: accepted rounds in a row with the model whose subproblem keeps a slack at multiplier c that
#: end a penalty stage (.continuation.settle: c is too small for an exact penalty)
SATURATED = 2
#: with the Newton model, a rejected step's second-order correction is tried only when it
#: moves the trial point by at most SOC_MOVE times the trial step
#: (.acceptance.second_order_correction). Not with the quasi-Newton model: there a long
#: correction of a square system of equations (S2MPJ's RSNBRNE, GOTTFR) is the second Newton
#: step on the equations that the model's own step lacked; measured on S2MPJ without
#: Hessians, refusing such corrections costs rounds and certificates
SOC_MOVE = 1.0
#: a stage whose last accepted point is RUNAWAY times farther from 0 and RUNAWAY times more
#: violated than the run's anchor (its accepted point of least violation) ran away: when c
#: rises, the next stage starts from the anchor (.continuation.restart_point)
RUNAWAY = 10.0
#: with the model, STALL_ROUNDS accepted rounds in a row whose merit fell by less than
#: MERIT_PROGRESS of its size settle the point (.acceptance.track_progress)
STALL_ROUNDS, MERIT_PROGRESS = 30, 1e-12
#: with the model the merit test weighs the violation by min(c, max(MERIT_MULTIPLIERS
#: max |nu|, MERIT_FLOOR c)) (:func:`.merit.weight`)
MERIT_MULTIPLIERS, MERIT_FLOOR = 2.0, 1e-4
#: with the model tau stays at least this times the model's scale delta
MODEL_TAU_FLOOR = 1e-10
#: an accepted step of relative length <= TINY_STEP is lost in rounding: tau is then cut by
#: TAU_TINY, and TINY_ROUNDS of them settle the point (.acceptance, .continuation.settle)
TINY_STEP, TAU_TINY, TINY_ROUNDS = 1e-12, 0.1, 12
#: rejected steps in a row after which the point is settled when the last rejected trial
#: step was at most SETTLE_STEP max(1, |w|) long, and after MAX_REJECTS_LONG whatever its
#: length (.continuation.settle)
MAX_REJECTS, SETTLE_STEP, MAX_REJECTS_LONG = 8, 1e-6, 24
#: the guarded full-batch rounds (a fixed tau, a builder with its own curvature) settle after
#: this many rejections in a row however long the last trial (gamma halved 60 times: 1e-18)
GUARD_REJECTS = 60
MERIT_RTOL = {"closed_form": 1e-12, "cvxpy": 1e-10}  # merit increases below this are rounding
MERIT_ROUNDING = 1e-14  # and below this times the size of the terms the merit is made of
PROBE_TASK = "ssca.probe"
#: the probe reply's array: a row per function (:class:`ProbeTask`)
PROBE = "probe"
METRIC_TASK = "ssca.metric"
METRIC_ROWS = 64        # rows per client whose per-sample gradients give the diagonal metric
ROUND_EVAL_EPS = 64 * np.finfo(float).eps  # rounding of values read from the statistics, per
#                                          # unit of the terms that cancel in them
ROUND_EVAL_SHARE = 1e-2  # share of feas_tol / kkt_tol that rounding may take in a round's
#                        # free evaluation (.algorithm.round_evaluation_exact)
METRIC_SPREAD = 1e6     # a diagonal metric when the curvature estimates span more than this
METRIC_NO_VARIANCE = 1e-8  # per-sample gradients whose variance is below this share of their
#                          # second moment do not vary: they give no metric
#: a rejected trial step above this fraction of the rejected one before it (tau doubled in
#: between) drops the diagonal metric (.acceptance.backtracking_step): the steps are not shrinking
METRIC_SHRINK = 0.7
CHECK_RTOL = 1e-2       # relative disagreement that fails the gradient check
CHECK_ROUNDING = 1e3 * np.finfo(float).eps  # rounding allowance of a difference at step h:
#                        CHECK_ROUNDING max(1, |f|) / h (the check's rounding floor)
NOISE = "noise:"        # prefix of the per-function noise numbers in a reply


def fd_step(w: np.ndarray) -> float:
    """The probe's first step at w, 1e-6 max(1, |w|_inf): the central difference of its first
    gradient check, and the secant step of the curvature (tau "auto" depends on it)."""
    return 1e-6 * max(1.0, float(np.max(np.abs(w), initial=0.0)))


#: how many times the probe's difference step is divided by 10 while a side of it is outside
#: the function's domain (non-finite values), before a one-sided difference
FINITE_TRIES = 8
#: the gradient check's second point, this far (relative to max(1, |x0|_inf)) from x0 in a
#: fixed random direction, for the gradients that disagreed at x0 (.probe._recheck_elsewhere)
RECHECK_DISTANCE = 1e-3


def finite_steps(fn, w, u, X, y, n: int, where: str):
    """(h, mean value at w + h u, at w - h u) for the probe's step h = :func:`fd_step` (w),
    divided by 10 up to FINITE_TRIES times while a side is not finite (a start on or near the
    edge of a function's domain, e.g. x = 1e-12 of log x: the step of 1e-6 leaves it); the
    values of the last try (NaN where not finite) when no step gives both sides."""
    h0 = h = fd_step(w)
    for k in range(FINITE_TRIES + 1):
        up = mean_value_or_nan(fn, w + h * u, X, y, n, where)
        down = mean_value_or_nan(fn, w - h * u, X, y, n, where)
        if np.isfinite(up) and np.isfinite(down):
            if k == 0:
                return h, up, down
            # the domain's edge is within about h: the function changes on that scale, so
            # two decades shorter (when still finite) keeps the truncation error small
            short = (h / 100.0, mean_value_or_nan(fn, w + h / 100.0 * u, X, y, n, where),
                     mean_value_or_nan(fn, w - h / 100.0 * u, X, y, n, where))
            return short if np.isfinite(short[1]) and np.isfinite(short[2]) else (h, up, down)
        h /= 10.0
    return (h0, mean_value_or_nan(fn, w + h0 * u, X, y, n, where),
            mean_value_or_nan(fn, w - h0 * u, X, y, n, where))


class ProbeTask:
    """Client side of the probe: per function m, row m of ``"probe"`` (one row per function)
    = [d/dh of the batch mean along u = g/|g| by grad, the same by a central difference of
    value at step :func:`fd_step`, the batch mean, the secant curvature along u at that
    step].

    When the gradient check is on (``config["check"]``) and that first comparison fails
    (:func:`agrees`), the client also sends ``"recheck:m"``, the rows of :func:`retry_steps`
    (shorter and longer steps along the same u); a client whose first comparison passes sends
    what it always sent.

    Under secure aggregation (the server must learn sums only) the client checks its gradient
    itself (``config["check"]``, :func:`check_gradient`) and sends only B_i L_i / N, which the
    masked sum turns into the data-weighted mean sum_i N_i/N L_i of the secant curvatures."""

    #: the server reads each client's reply (its gradient check, its gradient norm): a shard
    #: passes the replies on one by one (:mod:`ssca_solver.federated.shards`)
    per_client = True

    def __init__(self, functions):
        self.functions = tuple(functions)
        # the components of each VectorSampleFunction: their values and gradients at w from
        # one evaluation of it
        self.groups = vector_groups(self.functions)

    def _at_point(self, w, X, y) -> dict:
        """{m: (per-sample values, gradient)} at ``w`` of the components of the vector
        functions (:attr:`groups`) whose one evaluation there is finite (the others are
        evaluated one by one, whose errors name the component): the floats
        :func:`checked_value_and_grad` gives each."""
        out = {}
        for vec, idx, ks in self.groups:
            try:
                v, J = vec.evaluate(w, X, y)
            except Exception:
                continue
            V, G = v[:, ks], J[ks]
            if not (np.all(np.isfinite(V)) and np.all(np.isfinite(G))):
                continue
            for i, k in zip(idx.tolist(), ks.tolist()):
                out[i] = (v[:, k], J[k])
        return out

    def __call__(self, client, request):
        X, y, b = client.batch(0, request.config.get("batch_size"))
        w, n = request.w, X.shape[0]
        where = f"client {client.index}, before round 1 (gradient check)"
        check = bool(request.config.get("check"))
        # coordinates the domain fixes ("i,j,..."): left out of the direction the gradient is
        # checked along (.probe._recheck_elsewhere)
        fixed = [int(i) for i in str(request.config.get("fixed") or "").split(",") if i]
        arrays, rows = {}, np.zeros((len(self.functions), 4))
        known = self._at_point(w, X, y)
        for m, fn in enumerate(self.functions):
            v, g = known[m] if m in known else checked_value_and_grad(fn, w, X, y, where)
            if fixed:
                g = g.copy()
                g[fixed] = 0.0
            norm = float(np.linalg.norm(g))
            if norm == 0.0:
                rows[m] = [0.0, 0.0, float(v.mean()), 0.0]
                continue
            u = g / norm
            h, up, down = finite_steps(fn, w, u, X, y, n, where)
            if np.isfinite(up) and np.isfinite(down):
                fd, side = (up - down) / (2 * h), h
            elif np.isfinite(up) or np.isfinite(down):
                # w on the edge of the function's domain: a one-sided difference at the
                # probe's step, on the side where the function is defined
                side = h if np.isfinite(up) else -h
                fd = ((up if side > 0 else v.mean()) - (v.mean() if side > 0 else down)) / h
            else:
                # no step along the gradient stays where the function is finite: nothing to
                # compare (NaN: the server warns instead of checking) and no secant
                rows[m] = [norm, np.nan, float(v.mean()), 0.0]
                continue
            g2 = checked_grad(fn, w + side * u, X, y, w.size, where)
            if fixed:
                g2 = g2.copy()
                g2[fixed] = 0.0
            rows[m] = [norm, fd, float(v.mean()), float(np.linalg.norm(g2 - g)) / abs(side)]
            if check:
                # a step other than fd_step(w) (shortened, or one-sided) goes first among the
                # further steps: the server judges each comparison at the step it was made at
                more = ([] if side == fd_step(w) else [[abs(side), norm, fd, float(v.mean())]])
                if not agrees(norm, fd, float(v.mean()), abs(side)):
                    more += retry_steps(fn, w, X, y, v, g, where).tolist()
                if more:
                    arrays[f"recheck:{m}"] = np.array(more, dtype=float).reshape(-1, 4)
        if secagg_active(request):
            if check:
                for m, fn in enumerate(self.functions):
                    an, fd, value, _ = rows[m]
                    check_gradient(fn, client.index, b, w, an, fd, value,
                                   arrays.get(f"recheck:{m}"))
            N = float(request.config["num_samples"])
            return client.reply(request, {PROBE: b * rows[:, 3] / N}, batch_size=b)
        arrays[PROBE] = rows
        return client.reply(request, arrays, batch_size=b)


def retry_steps(fn, w, X, y, v, g, where: str) -> np.ndarray:
    """The gradient check's further steps along u = g/|g|, after the first comparison failed:
    rows [h, derivative along the step by grad, the same by a central difference of the batch
    mean of value, mean_n |f_n(w)|], one per step tried (at most ``len(DIFFERENCE_STEPS)``).

    The steps are h = c :func:`step_scale` (w, u) for c in ``DIFFERENCE_STEPS`` (eps^(1/3)
    times 10, 1, 0.1, ..., 1e-8: at |w| = 5e7 from 3000 down to 3e-6), longest first, each over
    the displacement actually stored (:func:`central_difference`). They stop after two
    consecutive steps agree (:func:`agrees`), and before the first whose rounding allowance
    CHECK_ROUNDING max(1, mean_n |f_n|) / h exceeds CHECK_RTOL |g| (a step that short cannot
    tell a wrong gradient from rounding). Values only: 2 evaluations of ``value`` per step."""
    n = X.shape[0]
    norm = float(np.linalg.norm(g))
    u = g / norm
    size = float(np.mean(np.abs(v)))
    shortest = CHECK_ROUNDING * max(1.0, size) / (CHECK_RTOL * norm)
    s = step_scale(w, u)

    def F(p):
        return mean_value_or_nan(fn, p, X, y, n, where)

    rows, agreed = [], False
    for c in DIFFERENCE_STEPS:
        if c * s < shortest:
            break
        got = central_difference(F, g, w, c * s * u)
        if got is None or not np.isfinite(got[1]):
            continue              # lost in w's rounding, or outside the function's domain
        an, fd, h = got
        rows.append([h, an, fd, size])
        if agrees(an, fd, size, h):
            if agreed:
                break
            agreed = True
        else:
            agreed = False
    return np.array(rows, dtype=float).reshape(-1, 4)


class MetricTask:
    """Client side of the diagonal metric: per function m, the sum over up to METRIC_ROWS rows
    (the batch of round 0, draw 1) of the squared per-sample gradients, row m of
    ``"metric"`` (a row of d numbers per function), a Gauss-Newton (empirical Fisher)
    estimate of the diagonal of F_m's Hessian up to a factor, and the sum of the per-sample
    gradients, row m of ``"metric_sum"``, which tells whether they vary at all
    (:func:`diagonal_metric`)."""

    def __init__(self, functions):
        self.functions = tuple(functions)

    def __call__(self, client, request):
        X, y, b = client.batch(0, min(METRIC_ROWS, client.num_rows), draw=1)
        w = request.w
        where = f"client {client.index}, before round 1 (diagonal metric)"
        acc = [np.zeros(w.size) for _ in self.functions]
        first = [np.zeros(w.size) for _ in self.functions]
        # row by row, every function at each row: one evaluation of a VectorSampleFunction
        # then serves all its components
        for i in range(X.shape[0]):
            Xi, yi = X[i:i + 1], None if y is None else y[i:i + 1]
            for m, fn in enumerate(self.functions):
                g = checked_grad(fn, w, Xi, yi, w.size, where)
                acc[m] += g * g
                first[m] += g
        d = w.size
        arrays = {"metric": np.array(acc).reshape(-1, d),
                  "metric_sum": np.array(first).reshape(-1, d)}
        return client.reply(request, arrays, batch_size=b)


def diagonal_metric(replies, num_functions: int, num_samples: int) -> np.ndarray:
    """The diagonal metrics D_m (rows of a (K, d) array, each scaled to max 1) from the replies
    to :class:`MetricTask`, or an empty array when every function's estimates span at most
    METRIC_SPREAD (one scalar curvature then serves). Coordinates whose estimate is 0 (no
    sample moved them) get D = 1, the largest curvature: short, safe steps along them."""
    totals = means = None
    for r in replies:
        h = aggregation_weight(r, num_samples)
        v = h * np.asarray(array(r, "metric"), dtype=float)
        u = h * np.asarray(array(r, "metric_sum"), dtype=float)
        if v.shape != u.shape or v.ndim != 2 or v.shape[0] != num_functions:
            from ...errors import ReplyError

            raise ReplyError(r.client, r.round, f"its reply to task {r.task!r} has arrays "
                             f"'metric' {v.shape} and 'metric_sum' {u.shape}, not a row of "
                             f"the same length for each of the {num_functions} functions",
                             kind="shape", array="metric")
        totals = v if totals is None else totals + v
        means = u if means is None else means + u
    rows = []
    for m in range(num_functions):
        total, mean = totals[m], means[m]
        if np.all(np.isfinite(total)) and np.all(np.isfinite(mean)):
            # squared gradients that do not vary from sample to sample (one row, or rows
            # that are all alike: a deterministic function written as a SampleFunction) are
            # the squared gradient, not a curvature: no metric from this function (such a
            # "metric" spans orders of magnitude that no curvature has, and its first-order
            # steps crawl)
            spread_of_samples = float(np.sum(np.maximum(total - mean * mean, 0.0)))
            if not spread_of_samples > METRIC_NO_VARIANCE * float(np.sum(total)):
                total = np.zeros_like(total)
        rows.append(total)
    D = np.vstack(rows)
    spread = 1.0
    for m in range(num_functions):
        top = np.max(D[m])
        positive = D[m][D[m] > 0]
        if top > 0 and np.all(np.isfinite(D[m])):
            spread = max(spread, top / np.min(positive))
    if not spread > METRIC_SPREAD:
        return np.zeros((0, 0))
    for m in range(num_functions):
        top = np.max(D[m])
        D[m] = np.where(D[m] > 0, D[m] / top, 1.0) if top > 0 else 1.0
    return D


def agrees(an: float, fd: float, value: float, h: float) -> bool:
    """One comparison of the gradient check: the derivative ``an`` by grad and ``fd`` by a
    central difference at step ``h`` of values of size ``value`` agree when they differ by at
    most CHECK_RTOL of the larger, or by at most what rounding allows the difference,
    CHECK_ROUNDING max(1, |value|) / h (the rounding floor)."""
    err = abs(an - fd)
    floor = CHECK_ROUNDING * max(1.0, abs(value)) / h      # rounding in fd
    return err <= CHECK_RTOL * max(abs(an), abs(fd)) or err <= floor


def agree_all(an, fd, value, h: float) -> np.ndarray:
    """:func:`agrees` of arrays of comparisons at one step ``h``, elementwise (the same
    arithmetic; finite entries only: a NaN compares as :func:`agrees`'s Python ``max`` does
    not)."""
    an, fd, value = (np.asarray(a, dtype=float) for a in (an, fd, value))
    err = np.abs(an - fd)
    floor = CHECK_ROUNDING * np.maximum(1.0, np.abs(value)) / h
    return (err <= CHECK_RTOL * np.maximum(np.abs(an), np.abs(fd))) | (err <= floor)


def check_gradient(fn, client: int, batch_size: int, w, an, fd, value, retries=None) -> None:
    """Raise UserFunctionError unless a function's gradient agrees with its values on
    ``client``'s batch of ``batch_size`` rows, judged on the steps tried: the probe's first
    comparison at w (``an``, ``fd``, ``value``, step :func:`fd_step`) and the ``retries``
    of :func:`retry_steps` (rows [h, an, fd, size]; None or empty: none). The gradient passes
    when the first comparison :func:`agrees` (as before retries existed), or two consecutive
    further steps agree, or the last further step does (the shortest, least truncated one the
    rounding allows, where the client stopped). A single agreeing step amid disagreeing ones
    is not enough: the difference of a function curved on a shorter scale than the long steps
    passes through every value between the wrong derivative and the right one as h shrinks.
    The message names the function, the client, the two derivatives at the shortest step
    tried (with their ratio, and a hint when it is -1 or the batch size) and the difference at
    every other step tried."""
    h = fd_step(w)
    rows = [(h, an, fd, value)]
    if retries is not None:
        rows += [tuple(float(x) for x in r) for r in np.asarray(retries).reshape(-1, 4)]
        if len(rows) > 1 and rows[1][1:3] == (float(an), float(fd)):
            # the client made its first comparison at a shorter step (the probe's step left
            # the function's domain, :func:`finite_steps`): judge it at that step only
            rows = rows[1:]
    ok = [agrees(a, f, s, t) for t, a, f, s in rows]
    if ok[0] or (len(rows) > 1 and ok[-1]) or any(a and b for a, b in zip(ok[1:], ok[2:])):
        return
    h, an, fd, _ = rows[-1]          # the shortest step tried: the least truncation error
    err, size = abs(an - fd), max(abs(an), abs(fd))
    ratio = an / fd if fd != 0 else float("inf")
    hint = (" (a sign error?)" if abs(ratio + 1) < 0.1 else
            f" (a sum instead of a mean over the {batch_size} rows?)"
            if batch_size > 1 and abs(ratio - batch_size) < 0.1 * batch_size else "")
    others = ""
    if len(rows) > 1:
        others = ("; at the other steps tried, h = " + ", ".join(f"{t:.3g}" for t, *_ in rows[:-1])
                  + ", the difference gave " + ", ".join(f"{f:.6g}" for _, _, f, _ in rows[:-1]))
    raise UserFunctionError(
        f"{fn.name}: its gradient does not match its values on client {client}'s "
        f"batch: along the gradient the derivative of the batch mean is {an:.6g} by grad "
        f"and {fd:.6g} by a central difference of value at step h = {h:.3g} (relative error "
        f"{err / size:.2g}, grad/difference = {ratio:.3g}){hint}{others}. grad must return "
        "the gradient of the MEAN of the per-sample values; check it with ss.check_grad, or "
        "pass check_gradients=False to skip this check")


def split_statistics(builder, fn, w, X, y, tau: float, where: str):
    """q(w_t, batch) as the sum of q on the batch's two halves, and |m_A - m_B|^2, the squared
    difference of the halves' per-row means of ``lin`` (the gradient part; every statistic
    when there is none)."""
    n = X.shape[0]
    if n < 2:
        return builder.statistics(fn, w, X, y, tau, where), 0.0
    k = n // 2
    a = builder.statistics(fn, w, X[:k], None if y is None else y[:k], tau, where)
    b = builder.statistics(fn, w, X[k:], None if y is None else y[k:], tau, where)
    stats = {key: np.asarray(a[key]) + np.asarray(b[key]) for key in a}
    keys = ["lin"] if "lin" in a else list(a)
    noise = sum(float(np.sum((np.asarray(a[key]) / k - np.asarray(b[key]) / (n - k)) ** 2))
                for key in keys)
    return stats, noise


def variance_share(noise: float, num_rows: int, batch: int, num_samples: int) -> float:
    """Client i's share of the variance of the server's estimate:
    (N_i/N)^2 |m_A - m_B|^2 / 4 (1 - B_i/N_i) (sampling without replacement)."""
    return (num_rows / num_samples) ** 2 * noise / 4.0 * max(0.0, 1.0 - batch / num_rows)


def surrogate_gradient(stats: Mapping[str, np.ndarray], w: np.ndarray) -> Optional[np.ndarray]:
    """grad p(q, w) = 2 quad w + lin for proximal-linear-type statistics (None otherwise)."""
    if "lin" not in stats or "quad" not in stats:
        return None
    return 2.0 * np.asarray(stats["quad"]) * w + np.asarray(stats["lin"])


def rescale_tau(stats: Mapping[str, np.ndarray], w: np.ndarray, k: float,
                ww: Optional[float] = None) -> dict:
    """Proximal-linear statistics at w with tau multiplied by k: quad' = k quad,
    lin' = lin - 2 (k - 1) quad w, const' = const + (k - 1) quad |w|^2 (the same values and
    gradient at w, k times the curvature). ``quad`` may be a vector (DiagonalCurvature's
    h / 2 + tau per coordinate): then elementwise. ``ww``: |w|^2 when the caller has it."""
    quad = np.asarray(stats["quad"], dtype=float)
    q = float(quad) if quad.ndim == 0 else quad
    if quad.ndim:
        added = (k - 1.0) * float(q @ (w * w))
    else:
        added = (k - 1.0) * q * (float(w @ w) if ww is None else ww)
    return {"quad": np.asarray(k * q),
            "lin": np.asarray(stats["lin"]) - 2.0 * (k - 1.0) * q * w,
            "const": np.asarray(float(stats["const"]) + added)}


def rescale_all(stats, w: np.ndarray, k: float) -> tuple:
    """:func:`rescale_tau` of every function's statistics (eq. (fsmbar)'s proximal-linear
    surrogates with tau multiplied by k), |w|^2 computed once for all of them. Statistics that
    carry their stacked arrays (:class:`.step.Statistics`) are scaled a stacked run at a time,
    with the same arithmetic per function (the same numbers)."""
    ww = float(w @ w)
    stacked = _rescale_packed(stats, w, k, ww)
    if stacked is not None:
        return stacked
    return tuple(rescale_tau(st, w, k, ww) for st in stats)


def rescale_each(stats, w: np.ndarray, ks: np.ndarray) -> tuple:
    """:func:`rescale_tau` of function m's statistics by ``ks[m]`` (1: the same numbers),
    |w|^2 computed once; statistics that carry their stacked arrays scaled a stacked run at
    a time (:func:`rescale_all`'s arithmetic, each row with its own k)."""
    ks = np.asarray(ks, dtype=float)
    ww = float(w @ w)
    stacked = _rescale_packed(stats, w, ks, ww)
    if stacked is not None:
        return stacked
    return tuple(rescale_tau(st, w, float(k), ww) if k != 1.0 else st
                 for st, k in zip(stats, ks))


def _rescale_packed(stats, w: np.ndarray, k, ww: float):
    """:func:`rescale_all` on a :class:`.step.Statistics` in its packed layout, every stacked
    run of scalar-curvature proximal-linear statistics as three array operations (the others
    function by function); None when ``stats`` carries no packed arrays or a stacked run has
    another form. ``k``: one factor, or one per function (an array)."""
    from .step import run_key, stacked_run, stat_key, unpack_statistics

    packed, runs = getattr(stats, "packed", None), getattr(stats, "runs", None)
    if packed is None or runs is None:
        return None
    out = {}
    for run in runs:
        first, stop, sig = run
        if stacked_run(run):
            if dict(sig) != {"const": (), "lin": w.shape, "quad": ()}:
                return None
            const, lin, quad = (packed[run_key(first, stop - 1, name)]
                                for name in ("const", "lin", "quad"))
            q = np.asarray(quad, dtype=float)
            kr = k if np.ndim(k) == 0 else k[first:stop]
            # rescale_tau's operations, in its order, on the run's rows at once
            out[run_key(first, stop - 1, "quad")] = kr * q
            out[run_key(first, stop - 1, "lin")] = (np.asarray(lin)
                                                     - (2.0 * (kr - 1.0) * q)[:, None] * w)
            out[run_key(first, stop - 1, "const")] = (np.asarray(const, dtype=float)
                                                       + (kr - 1.0) * q * ww)
        else:
            for m in range(first, stop):
                km = k if np.ndim(k) == 0 else float(k[m])
                for name, v in rescale_tau(stats[m], w, km, ww).items():
                    out[stat_key(m, name)] = v
    return unpack_statistics(out, stats, runs)


def raise_curvature(stats: Mapping[str, np.ndarray], w: np.ndarray, a: float) -> dict:
    """Proximal-linear statistics (eq. (fsmbar)'s quadratic surrogate) at w with every
    coordinate's curvature at least ``a``:
    quad' = max(quad, a), and lin, const moved so that the value and gradient at w stay
    (:func:`rescale_tau` by addition, for a quad too small to be scaled up)."""
    quad = np.asarray(stats["quad"], dtype=float)
    new = np.maximum(quad, float(a))
    extra = new - quad
    added = float(extra) * float(w @ w) if quad.ndim == 0 else float(extra @ (w * w))
    return {"quad": np.asarray(new),
            "lin": np.asarray(stats["lin"]) - 2.0 * extra * w,
            "const": np.asarray(float(stats["const"]) + added)}


def curvature_factor(stats, w: np.ndarray, curvature: float) -> float:
    """kappa >= 1 with which a builder's own curvature (DiagonalCurvature: 2 quad per
    coordinate at round 1, statistics at x0) reaches ``curvature``, the probe's secant
    curvature of F along its gradient, along the surrogate's gradient at x0: a diagonal
    from the squared features is no majoriser when the features are correlated (uncentred
    features 0..249: the Hessian's top eigenvalue about d times the diagonal), and unit
    steps on such a surrogate diverged at round 31 in the sampled rounds of batch_size="auto",
    where nothing backtracks. 1 when the gradient is 0 or the curvature unknown."""
    g = surrogate_gradient(stats, w)
    if g is None or not np.isfinite(curvature) or curvature <= 0:
        return 1.0
    gn = float(np.linalg.norm(g))
    if not np.isfinite(gn) or gn == 0.0:
        return 1.0
    u = g / gn
    own = 2.0 * float(np.sum(np.asarray(stats["quad"], dtype=float) * u * u))
    return max(1.0, curvature / own) if own > 0 else 1.0


def own_curvature(builder) -> bool:
    """The builder adds a curvature of its own to the proximal term (DiagonalCurvature)."""
    return type(builder) is DiagonalCurvature


def adaptable(builders) -> bool:
    """tau can be adapted on the server: every builder is the proximal-linear one taking the
    solve's tau, or an equality's linearisation (no tau to adapt: quad stays 0)."""
    return all((type(b) is ProximalLinear and b.tau is None) or type(b) is Linearization
               for b in builders) and any(type(b) is ProximalLinear for b in builders)
