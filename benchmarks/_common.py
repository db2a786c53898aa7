"""Shared helpers for the benchmark programs: machine description, timing, JSON output, and
where the output goes.

Where every benchmark writes (its JSON, figures and tables): ``RESULTS``, chosen when this
module is imported, from options that every benchmark takes (this module takes them out of
``sys.argv`` before the program parses its own):

* ``--publish``: ``benchmarks/results/``, the committed results that the docs cite. Only
  on purpose: a run there overwrites them.
* ``--results-dir DIR``: DIR (created if needed).
* neither: ``$SSCA_BENCH_RESULTS`` if set, else ``benchmarks/results_local/`` (git ignores it:
  it holds its own ``.gitignore``).

The choice is exported as ``$SSCA_BENCH_RESULTS``, so the processes a benchmark starts write
to the same place. A benchmark that reads an earlier result (``network_defaults.py`` reads
``section_vi.json``; ``--replot``, ``--resume``, ``section_vi.py --fig3-only``) reads it from
``RESULTS`` and, when it is not there, from the published copy (saying so on stderr); it
writes only to ``RESULTS``.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

#: the committed results (the docs cite them)
PUBLISHED = Path(__file__).resolve().parent / "results"
#: the default output of a run: beside the published results, ignored by git
LOCAL = Path(__file__).resolve().parent / "results_local"
#: the environment variable that holds the chosen directory (read when no option is given)
ENV = "SSCA_BENCH_RESULTS"
#: the options every benchmark takes, with their help
OUTPUT_HELP = (
    "output (every benchmark, benchmarks/_common.py):\n"
    "  --publish             write to benchmarks/results/, the committed results the docs\n"
    "                        cite (overwrites them: only on purpose)\n"
    "  --results-dir DIR     write to DIR\n"
    f"  (default: ${ENV} if set, else benchmarks/results_local/, ignored by git; earlier\n"
    "  results a benchmark reads come from there, or else from benchmarks/results/)\n")


def _take_output_args(argv: list) -> tuple[Path, bool]:
    """Take ``--publish`` and ``--results-dir DIR`` out of ``argv`` (in place): (the output
    directory, whether it is the published one)."""
    publish, chosen, rest = False, None, [argv[0]] if argv else []
    args = iter(argv[1:])
    for a in args:
        if a == "--publish":
            publish = True
        elif a == "--results-dir" or a.startswith("--results-dir="):
            value = a.partition("=")[2] if "=" in a else next(args, None)
            if not value:
                raise SystemExit("--results-dir needs a directory")
            chosen = Path(value).expanduser().resolve()
        else:
            rest.append(a)
    if publish and chosen is not None and chosen != PUBLISHED:
        raise SystemExit("give --publish (benchmarks/results/) or --results-dir DIR, not both")
    argv[:] = rest
    if publish:
        return PUBLISHED, True
    if chosen is None:
        chosen = Path(os.environ[ENV]).resolve() if os.environ.get(ENV) else LOCAL
    return chosen, chosen == PUBLISHED


class _ResultsPath(type(Path())):
    """A path in the output directory; a read of a file that is not there falls back to the
    published file of the same name (``exists``, ``read_text``, ``read_bytes``, ``open`` for
    reading). Writes are never redirected."""

    def _published(self):
        if OUT == PUBLISHED or super().exists():
            return None
        try:
            rel = Path(self).resolve().relative_to(OUT)
        except ValueError:
            return None
        other = PUBLISHED / rel
        return other if other.exists() else None

    def _source(self):
        other = self._published()
        if other is None:
            return Path(self)
        log(f"reading {other} (the published result: {self.name} is not in {OUT})")
        return other

    def exists(self, *args, **kwargs) -> bool:
        return super().exists(*args, **kwargs) or self._published() is not None

    def read_text(self, *args, **kwargs):
        return self._source().read_text(*args, **kwargs)

    def read_bytes(self):
        return self._source().read_bytes()

    def open(self, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+"):
            return super().open(mode, *args, **kwargs)
        return self._source().open(mode, *args, **kwargs)


OUT, PUBLISHING = _take_output_args(sys.argv)
os.environ[ENV] = str(OUT)
#: where this run writes (see the module's docstring)
RESULTS = _ResultsPath(OUT)
if any(a in ("-h", "--help") for a in sys.argv[1:]):
    print(OUTPUT_HELP)


def ensure_results() -> Path:
    """Create the output directory (with a ``.gitignore`` of everything in the default local
    one) and return it."""
    OUT.mkdir(parents=True, exist_ok=True)
    if OUT == LOCAL and not (OUT / ".gitignore").exists():
        (OUT / ".gitignore").write_text("# benchmark runs without --publish (benchmarks/_common.py)\n*\n")
    return OUT


if not any(a in ("-h", "--help") for a in sys.argv[1:]):
    ensure_results()        # figures and tables may be written before the first JSON


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
    """Write ``payload`` as RESULTS/NAME.json (see the module's docstring for where that is)."""
    ensure_results()
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
