"""ssca-solver: constrained stochastic optimisation in federated settings by mini-batch SSCA.

Implements Algorithms 1 and 2 of Ye & Cui, "Sample-based Federated Learning via Mini-batch SSCA"
(see docs/math-to-code.md for the map from the paper's equations to this package).
"""

from . import status
from .diagnostics.certificate import KKTReport
from .diagnostics.result import Communication, Result, SSCAResult, Stage
from .diagnostics.history import History
from .diagnostics.result_io import ResultFileError, load as load_result
from .engine.method import Method
from .engine.options import RunOptions
from .engine.runner import Iteration
from .engine.solve import front_door, register_method
from .errors import (CheckpointError, ClientError, DataError, DivergenceError, ModelError,
                     ReplyError, ResourceLimitError, RoundFailedError, ScheduleError,
                     SecureAggregationError, SSCAError, SubproblemError, UserFunctionError)
from .methods import (BUILTIN, AugmentedLagrangian, AugmentedLagrangianOptions, FedAvg,
                      FedAvgOptions, PrimalDual, PrimalDualOptions, SSCA, SSCAOptions)
from .methods.ssca.privacy import Privacy
from .model.autodiff import JaxSampleFunction, TorchSampleFunction, from_jax, from_torch
from .model.data import ClientData, FederatedData
from .model.functions import SampleFunction, StochasticConstraint, check_grad
from .model.problem import Problem
from .model.vector import VectorSampleFunction
from .model.surrogates import (DiagonalCurvature, Linearization, ProximalLinear, Statistic,
                               SurrogateBuilder)
from .schedules import EpochStep, PowerStep, ScheduleWarning

for _name, _method in BUILTIN.items():
    register_method(_name, _method)

#: each built-in method's front door, ``solve_x(problem, **options)`` (= ``problem.solve(
#: method="x", ...)``)
solve_ssca = front_door(SSCA)
solve_fedavg = front_door(FedAvg)
solve_primal_dual = front_door(PrimalDual)
solve_augmented_lagrangian = front_door(AugmentedLagrangian)

__version__ = "0.1.0"

__all__ = [
    "ClientData", "FederatedData", "SampleFunction", "StochasticConstraint", "check_grad",
    "VectorSampleFunction", "from_jax", "JaxSampleFunction", "from_torch", "TorchSampleFunction",
    "Problem", "register_method", "Method", "SSCA", "FedAvg", "PrimalDual",
    "AugmentedLagrangian", "front_door", "status", "RunOptions", "FedAvgOptions", "solve_fedavg", "PrimalDualOptions",
    "solve_primal_dual", "AugmentedLagrangianOptions", "solve_augmented_lagrangian", "PowerStep",
    "EpochStep", "ScheduleWarning", "SSCAOptions", "solve_ssca", "Result", "SSCAResult", "Iteration",
    "History", "KKTReport", "Communication", "Stage", "SurrogateBuilder", "Statistic",
    "ProximalLinear", "DiagonalCurvature", "Linearization", "SSCAError", "DataError", "ModelError",
    "UserFunctionError", "ScheduleError", "SubproblemError", "ClientError", "ReplyError",
    "ResourceLimitError", "DivergenceError",
    "RoundFailedError", "SecureAggregationError", "CheckpointError", "load_result",
    "ResultFileError", "Privacy", "__version__",
]
