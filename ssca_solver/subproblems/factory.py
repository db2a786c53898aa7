"""Which subproblem solver applies to a problem, and building it."""

from __future__ import annotations

from typing import Optional

from ..errors import ModelError
from .closed_form import ClosedFormSubproblem
from .cvxpy_backend import CvxpySubproblem


def closed_form_obstacle(problem, builders=None) -> Optional[str]:
    """Why the closed form does not apply to ``problem`` (None when it does).

    It applies when every stochastic function's builder has scalar curvature (the
    proximal-linear builder) and the deterministic part is lambda |w|^2 (or absent) with no
    domain, and the objective has curvature (a stochastic objective, or lambda > 0).
    ``builders``: the builders to judge (default: the problem's current ones).
    """
    builders = problem.builders if builders is None else builders
    for f, b in zip(problem.functions, builders):
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


def make_subproblem(problem, builders, kind: str = "auto", solver: str = "CLARABEL",
                    solver_options: Optional[dict] = None):
    """The subproblem solver for ``kind``: "auto" (closed form when it applies, else CVXPY,
    whose rounds go to Clarabel directly where the subproblem is a QP over a box:
    :mod:`ssca_solver.subproblems.box_qp`), "closed_form" (an error when it does not apply) or
    "cvxpy" (every round on the CVXPY model)."""
    why = closed_form_obstacle(problem, builders)
    if kind in ("auto", "closed_form"):
        if why is None:
            return ClosedFormSubproblem(problem.dim, builders, problem.objective is not None,
                                        problem.bounds, problem.deterministic.norm2_coefficient(),
                                        equality=problem.equality)
        if kind == "closed_form":
            raise ModelError(f"subproblem='closed_form' does not apply: {why}")
    return CvxpySubproblem(problem.dim, builders, problem.objective is not None,
                           problem.bounds, problem.deterministic, solver, solver_options,
                           equality=problem.equality, direct=kind == "auto")
