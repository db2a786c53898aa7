"""The dependency direction of docs/architecture.md, checked on the source: a module imports
only modules of its own layer or of the layers below it; shared machinery never imports a
method; a method never imports another; the library never imports the examples package
``problems`` (only the command line, the application layer on top, does); and ``problems``
uses only the library's public API."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: the layers, lowest first: a module may import its own layer and the ones before it
LAYERS = [
    ("foundation", ["ssca_solver.errors", "ssca_solver.status", "ssca_solver.schedules",
                    "ssca_solver.npzfile",
                    "ssca_solver.validation",
                    "ssca_solver._kernels", "ssca_solver._blas", "ssca_solver.datasets"]),
    ("model", ["ssca_solver.model"]),
    ("transport and subproblems", ["ssca_solver.federated", "ssca_solver.subproblems"]),
    ("diagnostics", ["ssca_solver.diagnostics"]),
    ("engine", ["ssca_solver.engine"]),
    ("methods", ["ssca_solver.methods"]),
    ("application", ["ssca_solver", "ssca_solver.cli", "ssca_solver.__main__"]),
]
#: the public API of the library, as the examples package may use it
PUBLIC = {"ssca_solver", "ssca_solver.datasets"}


def layer_of(module: str) -> int:
    """The index in LAYERS of the longest prefix that names ``module``'s layer."""
    best, rank = -1, None
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, rank = len(p), i
    if rank is None:
        raise AssertionError(f"{module} is in no layer of tests/test_layers.py")
    return rank


def module_name(path: Path) -> tuple[str, bool]:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        return ".".join(parts[:-1]), True
    return ".".join(parts), False


def imports(path: Path):
    """(line, imported module) for every import in the file, relative ones resolved; a name
    imported from a package counts as the submodule when one exists."""
    module, is_init = module_name(path)
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_init else module.split(".")[:-1]
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            for a in node.names:
                sub = f"{target}.{a.name}"
                as_path = ROOT.joinpath(*sub.split("."))
                if as_path.with_suffix(".py").exists() or (as_path / "__init__.py").exists():
                    yield node.lineno, sub
                else:
                    yield node.lineno, target


def library_files():
    return sorted((ROOT / "ssca_solver").rglob("*.py"))


def method_of(module: str):
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "methods" else None


def violations():
    out = []
    for path in library_files():
        module, _ = module_name(path)
        here = layer_of(module)
        for line, target in imports(path):
            where = f"{path.relative_to(ROOT)}:{line} imports {target}"
            if target.split(".")[0] == "problems":
                if module not in ("ssca_solver.cli",):
                    out.append(f"{where}: only the command line may use the examples")
                continue
            if not target.startswith("ssca_solver"):
                continue
            if layer_of(target) > here:
                out.append(f"{where}: layer {LAYERS[layer_of(target)][0]!r} is above "
                           f"{LAYERS[here][0]!r}")
            a, b = method_of(module), method_of(target)
            if a and b and a != b:
                out.append(f"{where}: a method imports another method")
    return out


def test_every_library_module_imports_only_its_layer_and_the_ones_below():
    assert violations() == []


def test_the_checker_sees_an_upward_import(tmp_path, monkeypatch):
    """The test bites: a model module importing the engine, and a method importing another,
    are reported."""
    bad = ROOT / "ssca_solver" / "model" / "_layer_probe.py"
    bad2 = ROOT / "ssca_solver" / "methods" / "ssca" / "_layer_probe.py"
    try:
        bad.write_text("from ..engine import runner\n")
        bad2.write_text("from ..fedavg import FedAvg\nimport problems\n")
        found = violations()
    finally:
        bad.unlink()
        bad2.unlink()
    assert any("model/_layer_probe.py:1 imports ssca_solver.engine.runner" in v for v in found)
    assert any("a method imports another method" in v for v in found)
    assert any("only the command line may use the examples" in v for v in found)


@pytest.mark.parametrize("path", sorted((ROOT / "problems").glob("*.py")), ids=lambda p: p.name)
def test_the_examples_use_only_the_public_api(path):
    used = {t for _, t in imports(path) if t.startswith("ssca_solver")}
    assert used <= PUBLIC, f"{path.name} reaches into {sorted(used - PUBLIC)}"
