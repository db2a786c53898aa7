"""Exceptions raised by ssca_solver.

Errors about data, models, user functions, schedules and the subproblem derive from
:class:`SSCAError` and from the built-in exception that fits (``ValueError`` for bad input,
``RuntimeError`` for solver failures), so code that already catches ``ValueError`` keeps
working. As in SciPy, an invalid solve-option value raises a plain ``ValueError``, an unknown
option name a ``TypeError``, and an unknown method a ``ValueError``.
"""


class SSCAError(Exception):
    """Base class of every error raised by ssca_solver."""


class DataError(SSCAError, ValueError):
    """Federated data that cannot be used: empty clients, ragged arrays, batch too large."""


class ModelError(SSCAError, ValueError):
    """A problem that cannot be modelled: a non-convex deterministic term, a bad dimension."""


class UserFunctionError(SSCAError, ValueError):
    """A user's per-sample function returned a wrong shape or a non-finite value.

    The message names the function, the client and the round.
    """


class ScheduleError(SSCAError, ValueError):
    """A step-size schedule that violates eq. (rho) or eq. (gamma) in a way that breaks SSCA."""


class SubproblemError(SSCAError, RuntimeError):
    """The server's convex subproblem (Problem 2 / Problem 5) could not be solved.

    The message names the round and the solver status.
    """


class ClientError(SSCAError, RuntimeError):
    """A client failed to answer a round: it timed out, its process died, or it raised an
    exception that could not be sent back as itself.

    Attributes:
      client: the client's index.
      round: the round (or "evaluation") of the request it did not answer.
      cause: what happened, in words.
      remote_traceback: the client's traceback text when it raised (else None).
      state: the solver's last good state (after the last completed round), set by the runner.
      checkpoint: the path of the checkpoint written with that state, when ``checkpoint=`` was
        given (else None), for ``solve(..., resume=checkpoint)``.
    """

    def __init__(self, client, round, cause: str, remote_traceback=None):
        self.client = client
        self.round = round
        self.cause = cause
        self.remote_traceback = remote_traceback
        self.state = None
        self.checkpoint = None
        at = f"round {round}" if not isinstance(round, str) else f"full-data {round}"
        text = f"client {client}, {at}: {cause}"
        if remote_traceback:
            text += "\n\nclient traceback:\n" + remote_traceback.rstrip()
        super().__init__(text)

    def __reduce__(self):
        return (type(self), (self.client, self.round, self.cause, self.remote_traceback))


class DivergenceError(SSCAError, RuntimeError):
    """The iterates diverged: they grew without bound or stopped being finite while the user's
    functions were fine at the start. The solver's failure, not the user's; the message says
    what to change. Carries ``state`` and ``checkpoint`` like :class:`ClientError`."""

    state = None
    checkpoint = None
