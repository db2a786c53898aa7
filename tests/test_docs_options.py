"""Every solve option is documented with its default (docs/solver-settings.md).

The options page has one table per options class, under a heading of its own: a row
``| `name` | `default` | meaning |`` per option. This test reads the option classes
(``ss.RunOptions``, ``ss.SSCAOptions``, ``ss.FedAvgOptions``, ``ss.PrimalDualOptions``,
``ss.AugmentedLagrangianOptions``) and the transports' own options, and checks that each
option a class defines or whose default it changes has a row in its table, and that the first
code span of the row's default cell, evaluated, equals the default. A new option without a
row, or a default changed in the code and not on the page, fails here.
"""

from __future__ import annotations

import re
from dataclasses import MISSING, fields
from pathlib import Path

import pytest

import ssca_solver as ss
from ssca_solver.methods.lagrangian.options import LagrangianOptions

PAGE = Path(__file__).resolve().parents[1] / "docs" / "solver-settings.md"
ROW = re.compile(r"^\|\s*`([A-Za-z_0-9]+)`\s*\|([^|]*)\|")

#: heading of the page -> the options classes whose table it holds
TABLES = {
    "Options every method shares": [ss.RunOptions],
    "Options of the transports": ["transports"],
    'Options of `method="ssca"`': [ss.SSCAOptions],
    "Options of the other methods": [ss.FedAvgOptions, LagrangianOptions,
                                     ss.PrimalDualOptions, ss.AugmentedLagrangianOptions],
}
#: classes whose table is the second of their section (their rows are looked up as name#2
#: where the first table has the same name)
SECOND_TABLE = {LagrangianOptions, ss.PrimalDualOptions, ss.AugmentedLagrangianOptions}


def _tables() -> dict:
    """{heading: {option: default cell}} of the page's level-2 sections (several tables of a
    section are read in order; a later row of the same name is kept apart as name#2)."""
    out, heading = {}, None
    for line in PAGE.read_text().splitlines():
        if line.startswith("## "):
            heading = line[3:].strip()
            out[heading] = {}
            continue
        m = ROW.match(line.strip())
        if m and heading is not None:
            name, cell = m.group(1), m.group(2)
            key = name if name not in out[heading] else f"{name}#2"
            out[heading][key] = cell
    return out


def _default(f):
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


def _own_options(cls) -> dict:
    """{name: default} of the options ``cls`` adds or whose default it changes."""
    base = next((b for b in cls.__mro__[1:] if hasattr(b, "__dataclass_fields__")), None)
    parent = {f.name: _default(f) for f in fields(base)} if base else {}
    out = {}
    for f in fields(cls):
        if f.metadata.get("internal"):
            continue
        d = _default(f)
        if f.name not in parent or parent[f.name] != d:
            out[f.name] = d
    return out


def _transport_options() -> dict:
    from ssca_solver.federated import registry

    out = {}
    for _, (defaults, _) in registry._OPTIONS.items():
        for name, value in defaults.items():
            out.setdefault(name, value)       # client_threads: "process"'s default first
    return out


def _evaluate(cell: str):
    spans = re.findall(r"`([^`]+)`", cell)
    assert spans, f"no code span in the default cell {cell!r}"
    return eval(spans[0], {"PowerStep": ss.PowerStep, "EpochStep": ss.EpochStep,  # noqa: S307
                           "None": None, "True": True, "False": False})


def _cases():
    for heading, classes in TABLES.items():
        for cls in classes:
            options = _transport_options() if cls == "transports" else _own_options(cls)
            label = cls if cls == "transports" else cls.__name__
            second = cls in SECOND_TABLE
            for name, default in options.items():
                yield pytest.param(heading, name, default, second, id=f"{label}.{name}")


@pytest.mark.parametrize("heading, name, default, second", list(_cases()))
def test_every_option_is_documented_with_its_default(heading, name, default, second):
    tables = _tables()
    assert heading in tables, f"{PAGE.name} has no section {heading!r}"
    rows = tables[heading]
    assert name in rows, (f"option {name!r} has no row in {PAGE.name}, section {heading!r}: "
                          f"add | `{name}` | `{default!r}` | meaning |")
    got = _evaluate(rows[f"{name}#2"] if second and f"{name}#2" in rows else rows[name])
    assert got == default or (isinstance(default, float) and got == pytest.approx(default)), (
        f"{PAGE.name}, section {heading!r}: {name} is documented with default {got!r}, the "
        f"code has {default!r}")


def test_the_option_classes_are_read():
    """The test sees the options it is meant to check (an empty list would pass vacuously)."""
    names = {c.values[1] for c in _cases()}
    assert {"max_iter", "multipliers0", "feas_tol", "solver"} <= {
        c.values[1] for c in _cases() if c.values[3]}
    for name in ("max_iter", "batch_size", "tau", "penalty", "hessian", "eval_budget",
                 "client_threads", "flower_engine", "momentum", "dual_lr", "dual_every"):
        assert name in names
