"""ssca-solver: constrained stochastic optimisation in federated settings by mini-batch SSCA.

Implements Algorithms 1 and 2 of Ye & Cui, "Sample-based Federated Learning via Mini-batch SSCA"
(see docs/math-to-code.md for the map from the paper's equations to this package).
"""

from .data import ClientData, FederatedData
from .errors import (ClientError, DataError, DivergenceError, ModelError, RoundFailedError,
                     ScheduleError, SecureAggregationError, SSCAError, SubproblemError,
                     UserFunctionError)
from .functions import SampleFunction, StochasticConstraint, check_grad
from .problem import Problem, register_method
from .history import History
from .options import (AugmentedLagrangianOptions, FedAvgOptions, PrimalDualOptions,
                      RunOptions, SSCAOptions)
from .result import Communication, KKTReport, Result, SSCAResult, Stage
from .runner import Iteration
from .schedules import EpochStep, PowerStep, ScheduleWarning
from .solve import solve_ssca
from .surrogates import DiagonalCurvature, ProximalLinear, Statistic, SurrogateBuilder

from .baselines import solve_fedavg  # noqa: E402
from .lagrangian import solve_augmented_lagrangian, solve_primal_dual  # noqa: E402

register_method("ssca", solve_ssca)
register_method("fedavg", solve_fedavg)
register_method("primal_dual", solve_primal_dual)
register_method("augmented_lagrangian", solve_augmented_lagrangian)

__version__ = "0.1.0"

__all__ = [
    "ClientData", "FederatedData", "SampleFunction", "StochasticConstraint", "check_grad",
    "Problem", "register_method", "RunOptions", "FedAvgOptions", "solve_fedavg", "PrimalDualOptions",
    "solve_primal_dual", "AugmentedLagrangianOptions", "solve_augmented_lagrangian", "PowerStep",
    "EpochStep", "ScheduleWarning", "SSCAOptions", "solve_ssca", "Result", "SSCAResult", "Iteration",
    "History", "KKTReport", "Communication", "Stage", "SurrogateBuilder", "Statistic",
    "ProximalLinear", "DiagonalCurvature", "SSCAError", "DataError", "ModelError",
    "UserFunctionError", "ScheduleError", "SubproblemError", "ClientError", "DivergenceError",
    "RoundFailedError", "SecureAggregationError", "__version__",
]
