"""Methods of the one runner: mini-batch SSCA (Algorithms 1 and 2), the SGD baselines and the
constrained Lagrangian baselines (primal-dual, augmented Lagrangian).

Each is an object implementing the protocol of :mod:`ssca_solver.algorithms.base`.
"""

from .base import Algorithm
from .fedavg import FedAvg, FedAvgState, LocalSGDTask
from .lagrangian import Lagrangian, LagrangianSGDTask, LagrangianState
from .ssca import SSCA, SSCARoundTask

__all__ = ["Algorithm", "SSCA", "SSCARoundTask", "FedAvg", "FedAvgState", "LocalSGDTask",
           "Lagrangian", "LagrangianState", "LagrangianSGDTask"]
