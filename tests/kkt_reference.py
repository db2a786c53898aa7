"""A high-accuracy reference for Problem 5 with scalar curvatures, built on Clarabel's answer."""

import numpy as np


def polished_reference(inst, w, nu):
    """Clarabel's answer refined to machine precision, starting from Clarabel's active set.

    Clarabel stops up to ~1e-4 relative away from the optimum in w on about a quarter of these
    instances (measured over 2,100 random ones; w is only as accurate as the square root of the
    objective's accuracy over the curvature a_0). Its multipliers still tell the active set:
    nu_m ~ 0 inactive (I), nu_m ~ c violated with a positive slack (V), otherwise active (E).
    On a set the KKT conditions of Problem 5 are d + |E| smooth equations,

        2 A(nu) w + b_0 + sum_m nu_m b_m = 0,   a_m |w|^2 + b_m.w + c_m - U_m = 0 (m in E),

    with nu_m = 0 on I and c on V, solved by SciPy's ``root`` (MINPACK hybrd) from Clarabel's
    point. The solution must satisfy the inequalities the set implies (nu_E in [0, c],
    p_m <= U_m on I, >= on V); a constraint that breaks its inequality changes set and the
    system is solved again (a constraint whose multiplier Clarabel left within 1e-4 c of a
    bound can need this). Nothing here uses the dual Gram-matrix formulas of the closed form.
    """
    from scipy.optimize import root

    a0, b0, _, a, bs, cs, U, c = inst
    M, d = len(bs), b0.size
    tol = 1e-4 * c
    where = np.where(nu <= tol, "I", np.where(nu >= c - tol, "V", "E"))

    def residual(z, E, V):
        v, n = z[:d], np.zeros(M)
        n[V], n[E] = c, z[d:]
        A = a0 + n @ a
        g = 2 * A * v + b0 + sum(n[m] * bs[m] for m in range(M))
        h = [a[m] * v @ v + bs[m] @ v + cs[m] - U[m] for m in E]
        J = np.zeros((d + len(E), d + len(E)))
        J[:d, :d] = 2 * A * np.eye(d)
        for j, m in enumerate(E):
            J[:d, d + j] = J[d + j, :d] = 2 * a[m] * v + bs[m]
        return np.concatenate([g, h]), J

    v = w
    for _ in range(2 * M + 1):
        E, V = list(np.flatnonzero(where == "E")), list(np.flatnonzero(where == "V"))
        n0 = np.clip(nu[E], 0.0, c)
        sol = root(residual, np.concatenate([v, n0]), args=(E, V), jac=True, method="hybr",
                   options={"xtol": 1e-15})
        v, n = sol.x[:d], np.zeros(M)
        n[V], n[E] = c, sol.x[d:]
        h = np.array([a[m] * v @ v + bs[m] @ v + cs[m] - U[m] for m in range(M)])
        eps = 1e-10 * (1.0 + np.abs(cs - U) + a * (v @ v))
        moves = {m: "E" for m in range(M) if (where[m] == "I" and h[m] > eps[m])
                 or (where[m] == "V" and h[m] < -eps[m])}
        moves.update({m: ("I" if n[m] < 0 else "V") for m in E
                      if not -1e-9 * c <= n[m] <= c * (1 + 1e-9)})
        if not moves:
            break
        for m, kind in moves.items():
            where[m] = kind
    else:
        raise AssertionError(f"no active set polishes Clarabel's answer into a KKT point "
                             f"(last: {''.join(where)})")
    assert np.linalg.norm(residual(sol.x, E, V)[0]) <= 1e-11 * (1.0 + np.linalg.norm(b0) + c)
    return v, np.maximum(h, 0.0), n
