"""Method "ssca": mini-batch SSCA, Algorithm 1 (no stochastic constraint) and Algorithm 2
(exact penalty with slacks) inside the penalty continuation of Theorem 2.

- :mod:`.options`: ``SSCAOptions`` and their checks;
- :mod:`.algorithm`: the method object (the runner's protocol and the front door's hooks),
  which delegates to the modules below;
- :mod:`.settings`: what a solve fixes before round 1 (sizes, options, regime);
- :mod:`.state`: ``SSCAState`` with its ``Memory``: everything carried between rounds, and
  its checkpoint form;
- :mod:`.client`: the client task of a round (statistics q_m on a mini-batch);
- :mod:`.step`: one round on the server (eqs. (Fs0bar)/(Fsmbar), Problem 2/5, eq. (updatew));
- :mod:`.probe`: the gradient check and the curvature before round 1;
- :mod:`.merit`: the exact penalty and the Lagrangian's gradient from statistics;
- :mod:`.acceptance`: full-batch step acceptance (backtracking, second-order correction);
- :mod:`.quasi_newton`: the L-BFGS model of the full-batch rounds;
- :mod:`.continuation`: the penalty stages and when a stage ends;
- :mod:`.evidence`: the status at the end (evidence record, decision, message table);
- :mod:`.adaptive`: the defaults that need no tuning (constants, client tasks, formulas).
"""

from .algorithm import SSCA
from .client import TASK, SSCARoundTask
from .options import SSCAOptions
from .state import Memory, SSCAState

__all__ = ["SSCA", "SSCAOptions", "SSCARoundTask", "SSCAState", "Memory", "TASK"]
