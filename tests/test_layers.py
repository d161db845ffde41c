"""The layer arrows of docs/architecture.md hold for every import in pgflow_cli.

Reads the source with :mod:`ast` (nothing is imported), so an import inside a function or
under ``TYPE_CHECKING`` counts as much as one at the top of a module. A module's layer is its
first name under ``pgflow_cli`` (``pgflow_cli.cli.migrate`` is in ``cli``); imports inside one
layer are free, except in the installer, whose modules import only the ones before them.
"""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "pgflow_cli"

SHARED = {"pgflow_cli", "errors"}
"""Importable from everywhere: the package root (``__version__``) and the exception classes and
exit codes of ``pgflow_cli.errors`` (which import nothing of pgflow_cli themselves)."""

ALLOWED: dict[str, set[str]] = {
    # the entry point (python -m pgflow_cli) is the only importer of the command line
    "__main__": {"cli"},
    # commands: parse, open the connection, call an operation, render, map errors (db's mapping)
    "cli": {"operations", "sandbox", "render", "db", "jsoncheck"},
    "operations": {"db", "installer", "sqlfiles", "naming", "upstream", "worker", "client", "jsoncheck"},
    # the local sandbox, its private server (also the tests'), sample data and demo workers
    # (operations of `pgflow sandbox`): pgflow_cli/sandbox/
    "sandbox": {"db", "installer", "sqlfiles", "worker"},
    # recognising and adopting upstream-installed databases (used by operations)
    "upstream": {"db", "installer", "sqlfiles"},
    "worker": {"db", "sqlfiles", "naming"},
    # the run client (start, read, await runs); flow objects only as types
    "client": {"db", "sqlfiles", "worker", "jsoncheck"},
    # JSON values checked as jsonb reads them (the client, the commands' JSON options)
    "jsoncheck": set(),
    # running flows to completion from application tests, on a throwaway database (pgflow_cli/testing/)
    "testing": {"client", "db", "installer", "sandbox", "worker"},
    "installer": {"db", "sqlfiles"},
    "db": set(),
    "sqlfiles": set(),
    "naming": set(),
    "render": set(),
    "errors": set(),
}
"""Layer -> the other layers it may import (besides SHARED)."""

INSTALLER_ORDER = ["files", "catalog", "shapes", "old_levels", "ledger", "pgmq_bootstrap", "events", "locks", "engine", "steps"]
"""``pgflow_cli.installer`` modules, each importing only the ones before it (the facade imports all)."""

KNOWN_EXCEPTIONS: dict[tuple[str, str], str] = {}
"""(importing module, imported layer) -> why it is still allowed. Remove an entry once it is fixed."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(module: str, is_package: bool, tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, absolute module name)`` of every pgflow_cli import in ``tree``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor if is_package else anchor[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            # `from pgflow_cli import db` names a module; `from pgflow_cli import __version__` does not
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                found.append((node.lineno, candidate if _is_module(candidate) else base))
    return [(line, name) for line, name in found if name == "pgflow_cli" or name.startswith("pgflow_cli.")]


def _is_module(name: str) -> bool:
    path = PACKAGE.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "pgflow_cli"


def violations(module: str, source: str, is_package: bool = False) -> list[str]:
    """The wrong-way imports of one module's source, as ``module:line -> imported (why)``."""
    layer = _layer(module)
    problems: list[str] = []
    for line, imported in _imported_modules(module, is_package, ast.parse(source)):
        target = _layer(imported)
        where = f"{module}:{line} imports {imported}"
        if target == layer:
            if layer == "installer":
                problems.extend(_installer_order(module, imported, where))
            continue
        if layer not in ALLOWED:
            problems.append(f"{where}: layer {layer!r} is not in ALLOWED (add it, and to docs/architecture.md)")
        elif target not in SHARED and target not in ALLOWED[layer] and (module, target) not in KNOWN_EXCEPTIONS:
            problems.append(f"{where}: {layer} may import only {sorted(ALLOWED[layer] | SHARED)}")
    return problems


def _installer_order(module: str, imported: str, where: str) -> list[str]:
    own, other = module.split(".")[2:3], imported.split(".")[2:3]
    if not own or not other:  # the facade, or an import of the facade
        return [f"{where}: installer modules import each other, not the facade"] if own else []
    if other[0] not in INSTALLER_ORDER or own[0] not in INSTALLER_ORDER:
        return [f"{where}: add the module to INSTALLER_ORDER (and docs/architecture.md)"]
    if INSTALLER_ORDER.index(other[0]) >= INSTALLER_ORDER.index(own[0]):
        return [f"{where}: installer modules import only the ones before them ({INSTALLER_ORDER})"]
    return []


def _package_modules() -> list[tuple[str, Path]]:
    return [(_module_name(path), path) for path in sorted(PACKAGE.rglob("*.py"))]


def test_every_import_in_the_package_follows_the_layer_arrows():
    modules = _package_modules()
    assert len(modules) > 30, "the package was not found"
    problems = [
        problem
        for module, path in modules
        for problem in violations(module, path.read_text(), is_package=path.name == "__init__.py")
    ]
    assert problems == [], "imports against docs/architecture.md's layers:\n" + "\n".join(problems)


def test_the_known_exceptions_still_exist():
    """A fixed exception should leave KNOWN_EXCEPTIONS (a warning, so a merge that fixes one does not fail)."""
    used = {
        (module, _layer(imported))
        for module, path in _package_modules()
        for _line, imported in _imported_modules(module, path.name == "__init__.py", ast.parse(path.read_text()))
    }
    for stale in sorted(set(KNOWN_EXCEPTIONS) - used):
        warnings.warn(f"tests/test_layers.py: {stale} is fixed; remove it from KNOWN_EXCEPTIONS", stacklevel=1)


def test_cli_maps_database_errors_only_through_mapped_errors():
    """Commands wrap their work in ``cli.common.mapped_errors``; none catches or maps psycopg errors itself."""
    problems = []
    for module, path in _package_modules():
        if not module.startswith("pgflow_cli.cli.") or module == "pgflow_cli.cli.common":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ExceptHandler) and node.type is not None and "psycopg" in ast.unparse(node.type):
                problems.append(f"{module}:{node.lineno} catches {ast.unparse(node.type)}")
            if isinstance(node, (ast.Name, ast.Attribute, ast.alias)) and "map_database_error" in ast.dump(node):
                problems.append(f"{module}:{node.lineno} calls map_database_error")
    assert problems == [], "use `with mapped_errors(target):` (pgflow_cli/cli/common.py):\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("pgflow_cli.operations.audit", "from pgflow_cli.cli import common", "operations may import only"),
        ("pgflow_cli.worker.runner", "import pgflow_cli.cli", "worker may import only"),
        ("pgflow_cli.worker.runner", "def f():\n    from pgflow_cli import installer", "worker may import only"),
        ("pgflow_cli.naming", "from pgflow_cli.db import connect", "naming may import only"),
        ("pgflow_cli.db", "from pgflow_cli.operations.migrate import status", "db may import only"),
        ("pgflow_cli.installer.files", "from .steps import apply", "import only the ones before them"),
        ("pgflow_cli.installer.ledger", "from pgflow_cli import installer", "not the facade"),
        ("pgflow_cli.cli.audit", "from pgflow_cli.installer import make_plan", "cli may import only"),
        ("pgflow_cli.newlayer", "from pgflow_cli import db", "not in ALLOWED"),
    ],
)
def test_a_wrong_way_import_is_reported(module, source, expected):
    problems = violations(module, source)
    assert len(problems) == 1 and expected in problems[0], problems


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("pgflow_cli.cli.migrate", "from pgflow_cli.operations import migrate\nfrom pgflow_cli import render"),
        ("pgflow_cli.naming", "from pgflow_cli.errors import UsageError\nfrom pgflow_cli import __version__"),
        ("pgflow_cli.installer.steps", "from pgflow_cli.installer.ledger import make_plan"),
        ("pgflow_cli.worker.flow", "from . import protocol\nimport psycopg"),
    ],
)
def test_a_right_way_import_passes(module, source):
    assert violations(module, source) == []
