"""Value checks of options: each returns the value normalised (a float, an int, ...) or raises
ValueError naming the option, as scipy and cvxpy users expect (bools and strings are refused
where a number is expected; NumPy scalars of any type are accepted). Shared by the methods'
options (:mod:`ssca_solver.engine.options`) and the transports' own options."""

from __future__ import annotations

import math
import numbers
import os
from typing import Optional

import numpy as np


def is_real(value) -> bool:
    """A real number: Python or NumPy int or float (or a 0-d such array), not a bool."""
    return (isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))) or (
        isinstance(value, np.ndarray) and value.ndim == 0 and value.dtype.kind in "iuf")


def real(name: str, value, *, low: float = -math.inf, high: float = math.inf,
         low_open: bool = False) -> float:
    """``value`` as a finite float in [low, high] (or (low, high] with ``low_open``)."""
    if not is_real(value):
        raise ValueError(f"{name} must be a number, got {value!r} ({type(value).__name__})")
    v = float(value)
    ok = math.isfinite(v) and (v > low if low_open else v >= low) and v <= high
    if not ok:
        rel = ">" if low_open else ">="
        if high == math.inf:
            want = "a finite number" + ("" if low == -math.inf else f" {rel} {low:g}")
        else:
            want = f"a number {rel} {low:g} and <= {high:g}"
        raise ValueError(f"{name} must be {want}, got {value!r}")
    return v


def integer(name: str, value, *, low: int = 1) -> int:
    """``value`` as an int >= low (bools refused)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r} "
                         f"({type(value).__name__})")
    if value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def flag(name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def choice(name: str, value, allowed: tuple) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(repr(a) for a in allowed)}, "
                         f"got {value!r}")
    return value


def path_or_none(name: str, value) -> Optional[str]:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise ValueError(f"{name} must be a file path, got {value!r}")
    return os.fspath(value)
