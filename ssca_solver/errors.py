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


def not_finite_at_point(exc: BaseException) -> bool:
    """Whether ``exc`` says a user's function has no finite value at the point: it returned a
    non-finite number, or its arithmetic failed there (an overflow, a division by zero, a
    floating-point error, the "math domain error" of the math module). Such a point is outside
    the function's domain: at a trial point the backtracking rejects it as a step."""
    if not isinstance(exc, UserFunctionError):
        return False
    if "non-finite" in str(exc):
        return True
    cause = exc.__cause__
    return isinstance(cause, ArithmeticError) or (isinstance(cause, ValueError)
                                                  and "math domain error" in str(cause))


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


class ReplyError(ClientError):
    """A client's reply that the server cannot use, found when it arrives: not a Reply, the
    reply of another client, task or round, row counts that are not the client's, an array
    that is not a real NumPy array, non-finite values, or an array whose shape differs from
    the other clients' replies to the same request. A :class:`ClientError`, so code that
    handles client failures handles it.

    Attributes (besides those of :class:`ClientError`):
      kind: what was wrong: "type", "identity", "counts", "dtype", "nonfinite" or "shape".
      array: the name of the array at fault (None when the fault is not in one array).
    """

    def __init__(self, client, round, cause: str, remote_traceback=None, kind: str = "",
                 array=None):
        super().__init__(client, round, cause, remote_traceback)
        self.kind = kind
        self.array = array

    def __reduce__(self):
        return (type(self), (self.client, self.round, self.cause, self.remote_traceback,
                             self.kind, self.array))


class ResourceLimitError(SSCAError, OSError):
    """A limit of the operating system is too low for the run, e.g. the number of open file
    descriptors (``ulimit -n``) for the process transport's client processes. The message says
    which limit, its value, how much the run needs and how to raise it. An ``OSError`` (errno
    EMFILE for descriptors), so code that handles ``OSError`` handles it."""


class DivergenceError(SSCAError, RuntimeError):
    """The iterates diverged: they grew without bound or stopped being finite while the user's
    functions were fine at the start. The solver's failure, not the user's; the message says
    what to change. Carries ``state`` and ``checkpoint`` like :class:`ClientError`."""

    state = None
    checkpoint = None


class RoundFailedError(SSCAError, RuntimeError):
    """With ``on_client_failure="drop"``: every client asked in a round (or an evaluation)
    failed, so there is nothing to combine.

    Attributes:
      round: the round (or "evaluation").
      dropouts: the :class:`~ssca_solver.federated.Dropout` of each client, with its error.
      state, checkpoint: as for :class:`ClientError`.
    """

    state = None
    checkpoint = None

    def __init__(self, request, dropouts):
        self.round = "evaluation" if request.task == "evaluate" else request.round
        self.dropouts = tuple(dropouts)
        at = (f"round {request.round}" if request.task != "evaluate"
              else f"the full-data evaluation after round {request.round}")
        lines = "; ".join(f"client {d.client}: {d.error}" for d in self.dropouts[:5])
        more = f" (and {len(self.dropouts) - 5} more)" if len(self.dropouts) > 5 else ""
        super().__init__(f"every client asked in {at} failed ({len(self.dropouts)} of them), "
                         f"so nothing is left to combine: {lines}{more}")

    def __reduce__(self):
        return (_rebuild_round_failed, (str(self), self.round, self.dropouts))


def _rebuild_round_failed(text, round, dropouts):
    err = RoundFailedError.__new__(RoundFailedError)
    Exception.__init__(err, text)
    err.round, err.dropouts = round, dropouts
    return err


class SecureAggregationError(SSCAError, RuntimeError):
    """Secure aggregation could not complete: a value out of the fixed-point range
    (``secure_range``), fewer surviving clients than the secret-sharing threshold, or a
    protocol message that does not fit. The message says which."""

    state = None
    checkpoint = None


class FileFieldError(SSCAError, ValueError):
    """A file of the library's (a checkpoint, a saved Result) that it refuses; the message
    names the file and the field.

    Attributes:
      path: the file's path.
      field: the member or metadata field at fault, or None.
    """

    def __init__(self, message: str, path=None, field=None):
        super().__init__(message)
        self.path = path
        self.field = field

    def __reduce__(self):
        return (type(self), (str(self), self.path, self.field))


class CheckpointError(FileFieldError):
    """A checkpoint that cannot be written or resumed from: a ``checkpoint=`` path that is not
    writable (a missing directory, a directory or a special file in its place, no space for
    one checkpoint), checked before round 1; or a ``resume=`` file that is malformed,
    truncated, empty, corrupted (a member whose CRC does not match), oversized (a member whose
    declared size exceeds what this solve's state can take: refused before decompressing),
    inconsistent (a stage, a round or an array that does not fit the method) or written for
    other data, another problem or other options. The message names the file and the field.

    Attributes:
      path: the checkpoint's path.
      field: the member or metadata field at fault (e.g. ``"state/w"``, ``"stage"``,
        ``"fingerprint.data[3]"``), or None.
    """


class ResultFileError(FileFieldError):
    """A file that ``ss.load_result`` refuses: missing members, malformed metadata, another
    format or a newer version of it, arrays of the wrong shape or kind, pickled objects, a
    truncated or corrupted archive. The message names the file and the field (e.g.
    ``"history/t"``, ``"stages[1].rounds"``, ``"format"``)."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """``resume=`` names no file (also a ``FileNotFoundError``)."""
