"""The linearised KKT step of Problem 3 at a point, with its multipliers: the KKT test's
diagnostic where the problem has a domain or a nonsmooth deterministic term
(:meth:`DeterministicPart.linearized_step <ssca_solver.model.deterministic.DeterministicPart.
linearized_step>`).

A small convex problem in the step (an SQP step with an identity Hessian), solved by Clarabel
directly over a box (:func:`ssca_solver.model.box.linearized_step_box`), else through CVXPY,
compiled once per structure with the data as parameters (DPP) while that is cheap: the part
keeps the compiled problems (:meth:`DeterministicPart._linearized_problem
<ssca_solver.model.deterministic.DeterministicPart._linearized_problem>`), :func:`form` builds
them.
"""

from __future__ import annotations

import cvxpy as cp
import numpy as np

from ..errors import SubproblemError
from . import box as box_form

#: above this |w| the linearised KKT step is solved in the step v = u - w first
RECENTRE_FIRST = 1e4


def linearized_step(part, w, g0, G, cons, solver: str = "CLARABEL", equality=None,
                    step: float = 1.0):
    """The KKT step of Problem 3 linearised at ``w``, with its multipliers, for the
    deterministic terms and domain of ``part`` (a :class:`DeterministicPart`, which holds the
    compiled problems between calls).

    Solves the convex problem (a step of an SQP method with identity Hessian)

        minimise    g_0.(u - w) + R(u) + |u - w|^2 / (2 t) + P sum_m e_m
        subject to  F_m(w) - U_m + G_m.(u - w) <= e_m,  e_m >= 0,   u in D,
                    (an equality: |F_m(w) - U_m + G_m.(u - w)| <= e_m, free-sign mu_m)

    with g_0 the full-data gradient of F_0, G_m those of F_m and R, D the deterministic
    terms and domain (exact). At a KKT point of Problem 3, u = w and the duals are its
    multipliers: ``mu`` for the stochastic constraints and one array per domain constraint.
    |u - w| / t is the KKT residual (it reduces to |grad L| without domain and
    constraints); t is ``step`` (1: an identity Hessian).
    The elastic variables e (weight P, far above any sensible multiplier) keep the problem
    feasible where the linearised constraints are not; ``elastic`` is their sum.

    Returns (u, mu, domain duals (list of arrays), elastic).

    Attempts: Clarabel at tight tolerances, then at its defaults; if neither leaves a
    point, the same problem in the step v = u - w (u = w + v: no large constants when |w|
    is large, the cause of the "unbounded" answers met on badly scaled problems with
    bounds), at tight tolerances and at the defaults. A first-order solver is not tried:
    its answer could pass a KKT test it should fail. When every attempt fails:
    :class:`~ssca_solver.errors.SubproblemError` naming the statuses (the session then
    marks the KKT report failed instead of losing the run).
    """
    M = int(np.size(cons))
    eq = (np.zeros(M, dtype=bool) if equality is None
          else np.asarray(equality, dtype=bool).reshape(M))
    G = np.asarray(G, dtype=float).reshape(part.dim, M)
    w = np.asarray(w, dtype=float)
    cons = np.asarray(cons, dtype=float)
    t = float(step)
    if not (np.isfinite(t) and t > 0):
        raise ValueError(f"linearized_step: step = {step!r} must be positive")
    # each linearised constraint divided by its gradient's norm: the same step and the
    # same geometry, with forces mu_m |G_m| for duals (divided back below); with the rows
    # as given, large constraint gradients make the elastic weight huge, and Clarabel
    # then calls the problem unbounded
    # (a gradient that vanishes at w is not blown up: each row is divided by at least 1e-3
    # of the largest row's norm; a division by a near-zero norm makes the solver fail)
    norms = np.linalg.norm(G, axis=0) if M else np.zeros(0)
    row = np.maximum(norms, 1e-3 * float(np.max(norms, initial=0.0)))
    row = np.where(row > 0, row, 1.0)
    G = G / row
    cons = cons / row
    # and the objective divided by sigma = |g_0| (duals multiplied back below): a large
    # gradient with a proximal weight 1/(2t) of the same size leaves Clarabel "unbounded";
    # and by at least max(1, |w|) / t, the gradient scale the step length stands for: with
    # a vanishing |g_0| (an exponentially flat objective) and a long step t, the proximal
    # weight 1 / (2 t |g_0|) would be astronomically large and the solver fail; so the
    # proximal weight is at most 1 / (2 max(1, |w|))
    sigma = max(float(np.linalg.norm(g0)), max(1.0, float(np.linalg.norm(w))) / t)
    if not (np.isfinite(sigma) and sigma > 0):
        sigma = 1.0
    g0 = g0 / sigma
    t = t * sigma
    P = 1e6 * max(1.0, float(np.linalg.norm(g0)))
    # the step |u - w| is the residual the stopping test reads at 1e-4 relative: solve
    # it well below that (Clarabel's default tolerances leave ~1e-4 in u)
    tight = ({"tol_gap_abs": 1e-11, "tol_gap_rel": 1e-11, "tol_feas": 1e-11}
             if solver.upper() == "CLARABEL" else {})

    def unscaled(mu, duals):
        # the multipliers in the user's units (rows and objective scaled back; an
        # inequality's rounding below 0 clipped) and the domain's duals
        if M:
            mu = mu * sigma / row
            mu = np.where(eq, mu, np.maximum(mu, 0.0))
        return mu, [sigma * np.atleast_1d(np.asarray(x, dtype=float)) for x in duals]

    # a box domain and no terms but lambda |w|^2: the same problem handed to Clarabel
    # directly (no CVXPY compile; the CVXPY forms below when it is not "Solved")
    direct = part.box_terms() if box_form.usable(solver, part.dim) else None
    if direct is not None:
        got = box_form.linearized_step_box(direct[0], direct[1], w, g0, G, cons, eq, t,
                                           sigma, P, tight)
        if got is not None:
            u, mu, (z_lo, z_hi), elastic = got
            return (u, *unscaled(mu, part.box_duals(z_lo, z_hi)), elastic)
    statuses, found = [], False
    # far from the origin the form in the step v = u - w goes first: in u the objective
    # carries constants of |w|^2 / (2 t) whose rounding can exceed the step itself (a
    # large step where 0 is the answer). Each form is tried first as the problem
    # compiled once for this structure with the data as CVXPY parameters (DPP), then,
    # should that fail, built afresh with the data as constants
    order = (True, False) if float(np.linalg.norm(w)) > RECENTRE_FIRST else (False, True)
    data = (w, g0, G, cons, t, sigma, P)
    for recentred in order:
        for cached in (True, False):
            built = part._linearized_problem(recentred, eq, data, cached)
            if built is None:
                continue
            prob, u, cons_lin, dom, e = built
            for options in (tight, {}):
                try:
                    # warm_start=False: the defaults must be a fresh solve (see project)
                    prob.solve(solver=solver, warm_start=False, **options)
                    statuses.append(prob.status)
                except cp.error.SolverError:
                    statuses.append("solver_error")
                    continue
                if u.value is not None and (prob.status in (cp.OPTIMAL,
                                                            cp.OPTIMAL_INACCURATE)
                                            or not options):
                    found = True
                    break
            if found:
                break
        if found:
            break
    if not found or not np.all(np.isfinite(u.value)):
        raise SubproblemError(
            "the linearised KKT problem (the KKT report's diagnostic) failed at w: solver "
            f"{solver} returned {', '.join(repr(x) for x in statuses)} (tight tolerances, "
            "defaults, then the same recentred at w)")
    mu = np.asarray(cons_lin[0].dual_value, dtype=float) if M else np.zeros(0)
    if M and eq.any():
        mu = mu.copy()
        mu[np.flatnonzero(eq)] -= np.asarray(cons_lin[1].dual_value, dtype=float)
    mu, duals = unscaled(mu, [c.dual_value for c in dom])
    elastic = float(np.sum(e.value)) if M else 0.0
    return np.asarray(u.value, dtype=float), mu, duals, elastic


def form(part, recentred: bool, eq: np.ndarray, M: int, v: dict) -> tuple:
    """The problem of :func:`linearized_step` on the values ``v`` (w, g0, half_inv_t =
    1 / (2 t), inv_sigma, and with constraints G, c, P; Parameters or numbers):
    (problem, u, linearised constraints, domain constraints, e, v).

    In the step s (u = w + s): g0.s + |s|^2 / (2 t) + R(w + s) / sigma; in u, |u - w|^2
    through z = u - w (a parameter times a function of a parameter is not DPP, and
    expanding it cancels digits: far from the origin the rounding exceeds a step that
    should be nearly 0).
    A term in the form in the step holds the point inside it: not DPP (then built afresh
    each time)."""
    d = part.dim
    extra = []
    if recentred:
        step = cp.Variable(d)
        u = v["w"] + step
        expr, dom = part.instantiate(u)
        obj = v["g0"] @ step + v["half_inv_t"] * cp.sum_squares(step)
    else:
        u = cp.Variable(d)
        z = cp.Variable(d)
        expr, dom = part.instantiate(u)
        obj = v["g0"] @ u + v["half_inv_t"] * cp.sum_squares(z)
        extra = [z == u - v["w"]]
    if expr is not None:
        obj = obj + v["inv_sigma"] * expr
    cons_lin, e = [], None
    if M:
        e = cp.Variable(M, nonneg=True)
        obj = obj + v["P"] * cp.sum(e)
        lin = v["c"] + v["G"].T @ (step if recentred else u)
        cons_lin = [lin <= e]
        if eq.any():                  # an equality: |linearisation| <= e
            cons_lin.append(-lin[np.flatnonzero(eq)] <= e[np.flatnonzero(eq)])
    prob = cp.Problem(cp.Minimize(obj), cons_lin + extra + dom)
    return prob, u, cons_lin, dom, e, v
