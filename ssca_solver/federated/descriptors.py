"""File descriptors of the process transport: how many the clients need, and the error that
says how to raise the limit when they do not fit under it."""

from __future__ import annotations

import contextlib
import errno
import os
from typing import Optional

from ..errors import ResourceLimitError

#: File descriptors the server process holds per client of the process transport
#: (:mod:`.processes`): its end of the client's pipe, and the two ends multiprocessing keeps
#: of its process handle (the sentinel that tells the process's exit, and the pipe whose
#: closing tells the client that the server died). Forking one more client needs 3 more for
#: a moment.
FDS_PER_CLIENT = 3


def _open_descriptors() -> Optional[int]:
    """Descriptors this process has open now (None where /proc or /dev/fd cannot tell)."""
    for d in ("/proc/self/fd", "/dev/fd"):
        with contextlib.suppress(OSError):
            return len(os.listdir(d)) - 1          # less the one listdir opened
    return None


def _nofile_limits() -> tuple:
    """(soft, hard) RLIMIT_NOFILE, each None when unlimited or unknown."""
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return None, None
    inf = getattr(resource, "RLIM_INFINITY", -1)
    return (None if soft == inf else int(soft)), (None if hard == inf else int(hard))


def _descriptor_message(num_clients: int, started: int, others: Optional[int],
                        soft: Optional[int], hard: Optional[int]) -> str:
    """What to raise, for ``num_clients`` clients of which ``started`` had been forked;
    ``others``: the descriptors open that are not the transport's (None: unknown)."""
    need = FDS_PER_CLIENT * num_clients + FDS_PER_CLIENT      # and one fork's moment
    have = "" if others is None else f" and {others} are open for other things"
    target = need + (others or 0) + 64
    target = 1 << (target - 1).bit_length()                   # the next power of two
    text = (f"transport='process' cannot open the descriptors for {num_clients} clients: it "
            f"needs {FDS_PER_CLIENT} file descriptors per client in the server process "
            f"(about {need} for {num_clients} clients), but the limit of open files "
            f"(ulimit -n) is {soft if soft is not None else 'unknown'}{have}")
    if started:
        text += f" (the limit was hit after {started} client processes had started)"
    text += (f". Raise the limit to at least {target}: `ulimit -n {target}` in the shell "
             f"that starts Python, or in the program before solving, "
             f"`resource.setrlimit(resource.RLIMIT_NOFILE, ({target}, hard))`")
    if hard is not None:
        text += f" (the hard limit here is {hard}"
        text += ("; above it only root or the system's limits configuration can raise it)"
                 if hard < target else ")")
    text += "; or use fewer clients, or transport='inprocess'"
    return text


def _check_descriptors(num_clients: int) -> None:
    """Refuse before forking when the clients' descriptors cannot fit under the soft limit."""
    soft, hard = _nofile_limits()
    open_now = _open_descriptors()
    if soft is None or open_now is None:
        return
    if open_now + FDS_PER_CLIENT * (num_clients + 1) > soft:
        raise ResourceLimitError(errno.EMFILE, _descriptor_message(
            num_clients, 0, open_now, soft, hard))


def _descriptor_error(num_clients: int, started: int, exc: OSError) -> ResourceLimitError:
    """The error for an EMFILE/ENFILE met while forking client ``started``."""
    soft, hard = _nofile_limits()
    open_now = _open_descriptors()
    others = None if open_now is None else max(0, open_now - FDS_PER_CLIENT * started)
    text = _descriptor_message(num_clients, started, others, soft, hard)
    if exc.errno == errno.ENFILE:
        text += (" (the error was ENFILE: the whole system's table of open files is full, "
                 "not only this process's limit)")
    return ResourceLimitError(exc.errno, text)


@contextlib.contextmanager
def _fork_errors(num_clients: int, started: int):
    """Around forking client ``started``: an EMFILE/ENFILE raised inside becomes the
    :class:`~ssca_solver.errors.ResourceLimitError` of :func:`_descriptor_error`."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in (errno.EMFILE, errno.ENFILE):
            raise
        raise _descriptor_error(num_clients, started, exc) from exc
