"""Method "ssca": mini-batch SSCA, Algorithm 1 (no stochastic constraint) and Algorithm 2
(exact penalty with slacks) inside the penalty continuation of Theorem 2.

- :mod:`.options`: ``SSCAOptions`` and their checks;
- :mod:`.algorithm`: the method object: request, step, records, checkpoints (the round);
- :mod:`.front`: its side of the front door: build from the options, the probe, the KKT
  test, the penalty stages, the status and the Result's fields;
- :mod:`.client`: the client task of a round (statistics q_m on a mini-batch);
- :mod:`.step`: one round on the server (eqs. (Fs0bar)/(Fsmbar), Problem 2/5, eq. (updatew));
- :mod:`.adaptive`: the defaults that need no tuning (probe, batch growth, backtracking on
  tau, the diagonal metric);
- :mod:`.status`: the stages' slack and the evidence behind "infeasible".
"""

from .algorithm import SSCA
from .client import TASK, SSCARoundTask
from .options import SSCAOptions
from .step import SSCAState

__all__ = ["SSCA", "SSCAOptions", "SSCARoundTask", "SSCAState", "TASK"]
