"""Solvers of the server's convex subproblem (Problem 2 / Problem 5).

Every solver takes the averaged statistics of each stochastic function, the penalty c and a
warm start for the multipliers, and returns a :class:`SubproblemSolution` (primal w-bar, slacks
s, multipliers, retries, whether the answer is inaccurate), so backends are interchangeable and
testable against each other. Solvers keep no state between rounds.
"""

from .base import SubproblemSolution, SubproblemSolver
from .closed_form import ClosedFormSubproblem, solve_closed_form
from .cvxpy_backend import CvxpySubproblem
from .factory import closed_form_obstacle, make_subproblem

__all__ = ["SubproblemSolution", "SubproblemSolver", "CvxpySubproblem", "ClosedFormSubproblem", "solve_closed_form",
           "closed_form_obstacle", "make_subproblem"]
