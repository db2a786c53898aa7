"""The exact-penalty merit of Problem 5 and the Lagrangian's gradient, read from full-batch
statistics at the point they were taken at (no evaluation: the round's messages carry them).
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from ...diagnostics.evaluation import excess
from . import adaptive as ad
from .settings import Settings


def stacked_quadratics(cfg: Settings, stats):
    """(a, B, c): every function's surrogate a_m |w|^2 + b_m.w + c_m as arrays over the
    functions (B's rows the b_m), when every builder is proximal-linear in form (its own
    ``evaluate`` the proximal-linear one, a scalar curvature); None otherwise. What the
    per-function loops below read, as one matrix for their products; stacked once per
    statistics tuple (``cfg.forms``, when the settings have that cache)."""
    cache = getattr(cfg, "forms", None)
    if not (proximal_forms(cfg.builders) if cache is None
            else cache.stackable(lambda: proximal_forms(cfg.builders))):
        return None

    def make():
        return _packed_forms(stats) or (np.array([float(st["quad"]) for st in stats]),
                                        np.array([st["lin"] for st in stats], dtype=float),
                                        np.array([float(st["const"]) for st in stats]))

    return make() if cache is None else cache.get(stats, make)


def _packed_forms(stats):
    """:func:`stacked_quadratics`'s arrays from statistics that carry their stacked arrays
    (:meth:`.step.Statistics.stacked`: the same numbers); None for a plain tuple."""
    stacked = getattr(stats, "stacked", None)
    if stacked is None:
        return None
    forms = tuple(stacked(name) for name in ("quad", "lin", "const"))
    if any(f is None for f in forms) or forms[0].ndim != 1 or forms[2].ndim != 1:
        return None
    return forms


def proximal_forms(builders) -> bool:
    """Every builder is proximal-linear in form (its ``evaluate`` the proximal-linear one, a
    scalar curvature): what :func:`stacked_quadratics` needs."""
    from ...model.surrogates import ProximalLinear

    return all(type(b).evaluate is ProximalLinear.evaluate and b.scalar_curvature
               for b in builders)


def _values(forms, w: np.ndarray) -> np.ndarray:
    """p_m(w) = a_m |w|^2 + b_m.w + c_m of every function, from :func:`stacked_quadratics`."""
    quad, lin, const = forms
    return quad * float(w @ w) + lin @ w + const


def read_quadratics(cfg: Settings, stats, w):
    """(values, gradients) of the surrogates at w, p_m(w) and 2 a_m w + b_m, from
    :func:`stacked_quadratics` (None where it gives None: read each function on its own)."""
    forms = stacked_quadratics(cfg, stats)
    if forms is None:
        return None
    return _values(forms, w), 2.0 * forms[0][:, None] * w + forms[1]


def _function_values(cfg: Settings, stats, w: np.ndarray):
    """F_m(w) of every stochastic function from full-batch statistics taken at w."""
    forms = stacked_quadratics(cfg, stats)
    return (_values(forms, w) if forms is not None
            else [b.evaluate(st, w) for b, st in zip(cfg.builders, stats)])


def relative_excess(cfg: Settings, values) -> np.ndarray:
    """(F_m - U_m)_+ / max(1, |U_m|) (|F_m - U_m| for an equality) of every constraint, from
    the constraints' values F_m: the feasibility test's relative violations."""
    cons = np.asarray(values, dtype=float) - cfg.bounds
    return np.maximum(excess(cons, cfg.equality), 0.0) / cfg.bound_scale


def relative_violation(cfg: Settings, stats, w: np.ndarray) -> float:
    """The largest :func:`relative_excess` at w from full-batch statistics taken at w (0
    without constraints)."""
    if not cfg.M:
        return 0.0
    return float(np.max(relative_excess(cfg, _function_values(cfg, stats, w)[cfg.first:])))


def merit(cfg: Settings, stats, w: np.ndarray, penalty: float) -> float:
    """F_0 + R + c sum (F_m - U_m)_+ (c |F_m - U_m| for an equality) at w from full-batch
    statistics taken at w: the exact penalty of Problem 5."""
    values = _function_values(cfg, stats, w)
    k = cfg.first
    det = (cfg.ridge * float(w @ w) if cfg.ridge is not None
           else cfg.problem.deterministic.value(w))
    obj = (values[0] if k else 0.0) + det
    violation = excess(np.asarray(values[k:]) - cfg.bounds, cfg.equality)
    return float(obj + penalty * np.sum(np.maximum(violation, 0.0)))


def rose(cfg: Settings, value: float, reference: float, stats, w: np.ndarray) -> bool:
    """The merit ``value`` at w (from ``stats`` taken there) is above ``reference`` by more
    than rounding: an increase within the subproblem solver's accuracy (MERIT_RTOL) is
    rounding, not a bad step; and so is one within the rounding of the merit itself, which
    the statistics give as const + lin.w + quad |w|^2, terms far larger than the value when
    tau is large (MERIT_ROUNDING of their size)."""
    rtol = ad.MERIT_RTOL.get(cfg.subproblem.name, 1e-9)
    noise = ad.MERIT_ROUNDING * size(cfg, stats, w) if np.isfinite(value) else 0.0
    return value > reference + max(rtol * max(1.0, abs(reference)), noise)


def size(cfg: Settings, stats, w: np.ndarray) -> float:
    """The size of the terms the merit is computed from (its rounding is ~1e-16 of it)."""
    forms = stacked_quadratics(cfg, stats)
    if forms is not None:
        quad, lin, const = forms
        return float(np.sum(np.abs(quad) * float(w @ w) + np.abs(lin @ w) + np.abs(const)))
    total = 0.0
    for b, st in zip(cfg.builders, stats):
        form = b.quadratic_form(st)
        if form is None:
            return 0.0
        a, lin, const = form
        total += abs(a) * float(w @ w) + abs(float(lin @ w)) + abs(const)
    return total


def weight(cfg: Settings, state) -> float:
    """The exact penalty's weight in the merit test: c (Problem 5's), or with the model
    min(c, max(MERIT_MULTIPLIERS max_m |nu_m|, MERIT_FLOOR c)), nu the multipliers of the
    step's subproblem. Any weight above the multipliers makes the merit exact (Nocedal &
    Wright, Thm 17.3); the smallest safe one lets an SQP step along a curved active constraint
    through, where a c far above the multiplier rejects every second full step (a
    second-order correction each time). The floor keeps the weight from vanishing with the
    multipliers. Both points of a comparison are judged with the same weight."""
    c = state.penalty
    if not (cfg.M and cfg.model_on(state)) or not state.nu.size:
        return c
    nu = float(np.max(np.abs(state.nu)))
    return min(c, max(ad.MERIT_MULTIPLIERS * nu, ad.MERIT_FLOOR * c))


def lagrangian_gradient(cfg: Settings, stats, w: np.ndarray, weights) -> Optional[np.ndarray]:
    """sum_m weights_m grad F_m(w) + grad R(w) from statistics taken at w (None when a
    builder's statistics do not give a gradient)."""
    total = None
    for c, st in zip(weights, stats):
        gm = ad.surrogate_gradient(st, w)
        if gm is None:
            return None
        total = c * gm if total is None else total + c * gm
    det = cfg.problem.deterministic
    if cfg.ridge is not None:
        total = total + 2.0 * cfg.ridge * w
    elif det.smooth:
        total = total + det.grad(w)
    return total
