"""The method protocol: what the one front door and the one round loop need from a method.

A method is a small object of settings (like a jaxopt solver or an optax transformation) with
pure functions over an immutable state (a NamedTuple with at least ``t``, rounds done, and
``w``, the current point). The front door (:func:`ssca_solver.engine.solve.solve`) runs every
method by the same sequence::

    opts   = Method.parse(problem, options)           options parsed and checked once
    method = Method.build(problem, opts, options)
    Session(problem, method, opts)                     clients, transport, fresh start or resume
    state  = method.prepare(state, session)            before round 1 (fresh starts only)
    for j in stages: state = method.next_stage(...)    then Runner.run for the stage's rounds
    state  = method.returned_state(state)              (runs that did not converge)
    report = session.final_report(state)               full-data values and the KKT report
    reason = certificate.promote(reason, report, ...)  (methods that declare ``certifies``)
    status, message = method.status(outcome)
    Result(common fields, **method.result_fields(outcome))

The round loop (:class:`ssca_solver.engine.runner.Runner`) uses the members of
:class:`Algorithm`; the front door uses the hooks of :class:`Method`, each with a default, so a
new method declares only what it has (probes, stages, the certificate, secure aggregation),
and gets checkpoints, dropouts, partial participation and progress from the shared
machinery. Capabilities are declared as class attributes (``certifies``,
``supports_secure_aggregation``), never probed. Shared machinery never imports a method
(``tests/test_layers.py``).

Replies reach ``step`` with a server-side factor ``reply.weight`` (partial participation, the
renormalisation after dropouts; 1 by default): a method combines reply i's arrays as
``aggregation_weight(reply, N) x_i = weight_i N_i / (B_i N) x_i``
(:func:`ssca_solver.federated.aggregation_weight`; a reply that is not a sum over rows, such
as a model, sets ``batch_size=1``). A method whose server reads replies only through that
weighted sum declares ``supports_secure_aggregation = True``: under ``secure_aggregation`` it
then receives one reply (``client == AGGREGATE``) holding the sum.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, NamedTuple, Optional, Protocol, runtime_checkable

import numpy as np

from ..diagnostics.certificate import Certificate
from ..federated import Reply, Request, TaskHandler
from . import options as opt


@runtime_checkable
class Algorithm(Protocol):
    """What the round loop calls (every :class:`Method` has these members)."""

    name: str
    columns: Mapping[str, tuple]
    supports_secure_aggregation: bool

    def tasks(self) -> Mapping[str, TaskHandler]:
        """{task name: handler(client, request) -> Reply}: the client side."""

    def init(self, x0: np.ndarray) -> Any:
        """The state before round 1."""

    def request(self, state) -> Request:
        """The request of round ``state.t + 1``."""

    def step(self, state, replies: Iterable[Reply]) -> tuple[Any, Any]:
        """(new state, info) from the replies (an iterable consumed once, in client order)."""

    def record(self, info) -> Mapping[str, Any]:
        """The round's history row {column: value} (shapes in ``columns``)."""

    def describe(self, info) -> str:
        """A fragment of the progress line."""

    def settle(self, state, info) -> tuple[Any, bool]:
        """(state, settled): the state after the round's end-of-round bookkeeping, and whether
        the iterates stopped moving (more rounds would not change them): the stage then ends
        with reason ``"settled"``. Asked once per round that did not converge, after its
        stop test and before the callback and the checkpoint."""

    def remember_report(self, state, report) -> Any:
        """The state with what the method keeps from the full-data KKT report of the round's
        stop test (``report``)."""

    def tentative(self, state) -> bool:
        """Whether ``state.w`` is a trial point the method may still reject."""

    def state_arrays(self, state) -> Mapping[str, np.ndarray]:
        """The state as named arrays (checkpoints)."""

    def state_from_arrays(self, arrays: Mapping[str, np.ndarray]) -> Any:
        """The state from :meth:`state_arrays` (resume)."""


class Outcome(NamedTuple):
    """What a method's :meth:`Method.status` and :meth:`Method.result_fields` see at the end.

    Attributes:
      reason: why the last :meth:`~ssca_solver.engine.runner.Runner.run` returned
        (:data:`ssca_solver.status.REASONS`).
      state: the returned state. kkt: the full-data :class:`~ssca_solver.KKTReport` there.
      history: the run's :class:`~ssca_solver.History`.
      session: the :class:`~ssca_solver.engine.session.Session` (still open: a method may
        evaluate more points for its evidence, e.g. SSCA's infeasibility test).
    """

    reason: str
    state: Any
    kkt: Any
    history: Any
    session: Any


class Method:
    """Base class of a method: the hooks of the front door, each with its default.

    A subclass sets ``name`` and ``Options`` (a frozen dataclass deriving from
    :class:`~ssca_solver.engine.options.RunOptions`) and implements the :class:`Algorithm`
    members ``columns``, ``tasks``, ``init``, ``request``, ``step``, ``record``, ``describe``,
    ``state_arrays`` and ``state_from_arrays``; everything below is optional.
    """

    name: str = ""
    Options: type = opt.RunOptions
    #: the server reads replies only through their weighted sum (secure aggregation allowed)
    supports_secure_aggregation: bool = False
    #: the method can report "converged": the full-data KKT test of
    #: :mod:`ssca_solver.diagnostics.certificate` runs at every evaluation, at the tolerances
    #: ``feas_tol`` and ``kkt_tol`` of its options (which it must then have)
    certifies: bool = False
    #: the run ends with a full-data evaluation and KKT report at the returned point (False
    #: under differential privacy, where nothing reads the data without noise: ``fun``,
    #: ``constraints`` and the report are then NaN)
    evaluates_result: bool = True

    def client_seed(self, seed):
        """The seed of the clients' batch draws (:meth:`ssca_solver.federated.Client.rng`):
        the run's ``seed`` by default; a secret of the method's own where the server must
        not know which rows a batch holds (differential privacy's amplification by
        sampling)."""
        return seed

    #: rows of d floats its state arrays may fill in during a run (the checkpoints' size limit)
    state_rows: int = 16
    #: the parsed options (an instance of ``Options``), set by :meth:`build`
    opts: Any = None
    #: the CVXPY solver of the final KKT report (the domain's multipliers)
    kkt_solver: str = "CLARABEL"

    # -- building ------------------------------------------------------------------------------
    @classmethod
    def parse(cls, problem, options: dict):
        """The options as ``cls.Options``, every value checked (unknown names: TypeError with
        a suggestion; bad values: ValueError naming the option). Override to add the method's
        own checks (call this first)."""
        return opt.parse(cls.Options, options, cls.name)

    @classmethod
    def build(cls, problem, opts, given: dict) -> "Method":
        """The method object for ``problem`` with parsed options ``opts`` (``given``: the
        options as the user passed them, for rules that depend on what was set explicitly)."""
        raise NotImplementedError(f"{cls.__name__}.build")

    def fingerprint(self) -> dict:
        """The settings a checkpoint must agree on to be resumed (JSON-able values); the
        session adds the problem's shape and the runner's options."""
        return {}

    # -- before round 1 and between stages ------------------------------------------------------
    def prepare(self, state, session):
        """The state to start round 1 from, on a fresh start (not on resume): e.g. probes
        through ``session.runner.exchange``. Default: ``state``."""
        return state

    def certificate(self) -> Optional[Certificate]:
        """The certificate's rules at the method's tolerances, or None for a method that does
        not declare ``certifies`` (it then never reports "converged"). A certifying method
        gets the scale of the relative stationarity measured at the start and the test run at
        every evaluation."""
        return Certificate.of(self.opts) if self.certifies else None

    def remember_report(self, state, report):
        """See :class:`Algorithm`; default: ``state`` (nothing kept)."""
        return state

    def kkt_metric(self, state) -> Optional[np.ndarray]:
        """A diagonal metric in whose units the KKT report also measures stationarity (SSCA's
        diagonal metric), or None."""
        return None

    def kkt_hessian(self, state) -> Optional[np.ndarray]:
        """The Lagrangian's Hessian at ``state.w`` (SSCA's Newton model), with which the KKT
        report also measures Newton's step to the KKT point, or None."""
        return None

    def kkt_model_hessian(self, state):
        """A function of no arguments forming a model of the Hessian of Problem 3's Lagrangian
        at ``state.w`` (SSCA's quasi-Newton matrix), with which the KKT report measures
        Newton's step where the floor, not the gradient, sets its scale; or None."""
        return None

    @property
    def num_stages(self) -> int:
        """Stages of the run (Algorithm 2: one per penalty c_j); each runs up to
        ``max_iter`` rounds."""
        return 1

    def next_stage(self, state, stage: int, recorder):
        """The state to start ``stage`` (> 0) from, after the previous stage ended with
        reason "max_iter" or "settled" (``recorder``: the history so far)."""
        return state

    def penalty_of(self, state) -> Optional[float]:
        """The penalty c in force (None for methods without one)."""
        return None

    def settle(self, state, info):
        """See :class:`Algorithm`; default: ``(state, False)`` (never settled)."""
        return state, False

    def divergence_cause(self, state=None) -> Optional[str]:
        """What made the iterates diverge, when the method knows (e.g. a fixed step it warned
        about before round 1, or from ``state``, the last state), for the DivergenceError's
        message; default None."""
        return None

    def tentative(self, state) -> bool:
        """Whether ``state.w`` is a trial point the method may still reject (SSCA's
        backtracking): a scheduled evaluation where a function is not finite is then skipped
        instead of ending the run. Default: never."""
        return False

    #: the largest share of the clients' work the scheduled full-data evaluations may take
    #: (None: every ``eval_every`` rounds whatever they cost); see :meth:`round_work`
    eval_budget = None

    def round_work(self, request) -> float:
        """Rows the clients read for ``request`` (for the evaluations' budget). Default: 0
        (no budget applies)."""
        return 0.0

    def round_evaluation(self, before, after, info):
        """A full-data evaluation that the round from ``before`` to ``after`` already holds, or
        None: ``(state, evaluation)`` with ``state`` the method's state at the evaluated point
        (what the run returns if the stop test passes there) and ``evaluation`` an
        :class:`~ssca_solver.diagnostics.evaluation.Evaluation` (values and gradients on every
        row) at ``state.w``. The runner then runs the stop test on it at no cost in
        communication, and skips the paid evaluations while such ones come (SSCA's full-batch
        rounds). Called only for rounds in which every client answered. Default: None."""
        return None

    # -- the end ---------------------------------------------------------------------------------
    def returned_state(self, state):
        """The state whose point a run that did not converge returns and reports on (SSCA:
        the last accepted point in place of an unjudged trial step). Default: ``state``."""
        return state

    def status(self, outcome: Outcome) -> tuple[str, str]:
        """(status, message). Default: :meth:`Certificate.decide
        <ssca_solver.diagnostics.certificate.Certificate.decide>` at the method's tolerances
        (``feas_tol``, ``kkt_tol`` of its options) with :meth:`advice`."""
        o = self.opts
        return Certificate.of(o).decide(outcome.reason, outcome.state.t, outcome.kkt,
                                        bool(o.eval_every), self.advice(outcome))

    def advice(self, outcome: Outcome) -> str:
        """What to try when the KKT test did not pass in the rounds allowed."""
        return "more rounds (max_iter)"

    def result_fields(self, outcome: Outcome) -> dict:
        """The Result fields only this method fills: ``slack``, ``penalty``, ``stages``,
        ``subproblem``, ``extras``, ``solver_info`` (defaults: none)."""
        return {}
