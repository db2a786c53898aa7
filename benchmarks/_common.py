"""Shared helpers for the benchmark programs: machine description, timing, JSON output."""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict:
    import clarabel
    import cvxpy
    import numba
    import scipy

    cpu = platform.processor() or ""
    info = {}
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
                if not line.strip():        # the first processor's block is enough
                    break
        cpu = info.get("model name", cpu)
    except OSError:  # no /proc (not Linux): keep platform.processor()
        cpu = cpu or "unknown"
    # "AMD EPYC" alone does not tell the generation, which moves the timings (OpenBLAS picks
    # another kernel on a CPU with AVX-512): family/model and the vector extensions say it
    flags = set(info.get("flags", "").split())
    cpu_detail = {"family": info.get("cpu family"), "model": info.get("model"),
                  "mhz": info.get("cpu MHz"),
                  "vector_flags": sorted(f for f in flags if f in ("avx2", "avx512f", "fma"))}
    try:
        from threadpoolctl import threadpool_info
        blas = [{k: i.get(k) for k in ("internal_api", "version", "num_threads",
                                        "architecture")} for i in threadpool_info()]
    except Exception:  # threadpoolctl is optional
        blas = []
    return {"cpu": cpu, "cpu_detail": cpu_detail, "cores": os.cpu_count(),
            "python": sys.version.split()[0],
            "platform": platform.platform(), "numpy": np.__version__,
            "scipy": scipy.__version__, "cvxpy": cvxpy.__version__,
            "clarabel": clarabel.__version__, "numba": numba.__version__, "blas": blas,
            "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE")}


def median_time(fn, repeats: int, warmup: int = 1) -> tuple[float, object]:
    out = None
    for _ in range(warmup):
        out = fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def write_json(name: str, payload: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps(payload, indent=2, default=float))
    return path


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def machine_title(machine: dict) -> str:
    """One line naming the machine, for a figure's title."""
    cd = machine.get("cpu_detail", {})
    return (f"{machine['cpu']} (family {cd.get('family')}, model {cd.get('model')}; "
            f"{machine['cores']} cores), numpy {machine['numpy']}")
