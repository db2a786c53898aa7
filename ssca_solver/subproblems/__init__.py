"""Solvers of the server's convex subproblem (Problem 2 / Problem 5).

Every solver takes the averaged statistics of each stochastic function and the penalty c, and
returns a :class:`SubproblemSolution` (primal w-bar, slacks s, multipliers), so backends are
interchangeable and testable against each other.
"""

from .base import SubproblemSolution
from .closed_form import ClosedFormSubproblem, solve_closed_form
from .cvxpy_backend import CvxpySubproblem

__all__ = ["SubproblemSolution", "CvxpySubproblem", "ClosedFormSubproblem", "solve_closed_form"]
