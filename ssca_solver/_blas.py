"""One BLAS thread around the Numba kernels that call BLAS on medium-sized matrices.

Numba's ``np.dot`` and ``np.linalg`` go through SciPy's BLAS, a second copy of OpenBLAS beside
NumPy's (pip wheels ship one each). Each copy keeps its own pool of worker threads, which
spin for a while after every call: the projected Newton kernel of the closed-form dual (a few
hundred multipliers; SciPy's pool) between the round's NumPy products (NumPy's pool) then has
both pools' threads fighting over the cores. Measured on 2 cores, a round of the
constraints benchmark with 300 constraints took 86-100 ms with both pools at 2 threads and
56-58 ms with either at 1 (``benchmarks/rounds.py``'s constraints case; docs/engines.md,
"Threads").

:func:`one_blas_thread` holds every BLAS pool that threadpoolctl finds at one thread while
such a kernel runs and restores the previous counts afterwards; nested or concurrent uses
(threads) share one limit, lifted when the last one leaves.
"""

from __future__ import annotations

import contextlib
import threading

_lock = threading.Lock()
_state = {"controller": None, "depth": 0, "saved": None, "failed": False}


def _controller():
    if _state["controller"] is None and not _state["failed"]:
        try:
            from threadpoolctl import ThreadpoolController

            _state["controller"] = ThreadpoolController()
        except Exception:            # threadpoolctl missing or unable to read the libraries
            _state["failed"] = True
    return _state["controller"]


@contextlib.contextmanager
def one_blas_thread():
    """Run the body with every loaded BLAS library limited to one thread (a no-op where
    threadpoolctl cannot see them); the previous thread counts come back on exit."""
    with _lock:
        if _state["depth"] == 0:
            ctl = _controller()
            saved = None
            if ctl is not None:
                with contextlib.suppress(Exception):
                    libs = [lib for lib in ctl.lib_controllers if lib.user_api == "blas"]
                    saved = [(lib, lib.num_threads) for lib in libs]
                    for lib in libs:
                        if lib.num_threads != 1:
                            lib.set_num_threads(1)
            _state["saved"] = saved
        _state["depth"] += 1
    try:
        yield
    finally:
        with _lock:
            _state["depth"] -= 1
            if _state["depth"] == 0 and _state["saved"]:
                with contextlib.suppress(Exception):
                    for lib, n in _state["saved"]:
                        if n != 1:
                            lib.set_num_threads(n)
                _state["saved"] = None
