"""The folder import order ARCHITECTURE.md states: a module imports only from the shared
modules at the top of ``counterfactual/``, its own folder and the folders before it (type
hints included: an import under ``TYPE_CHECKING`` is an import)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import counterfactual

ROOT = Path(counterfactual.__file__).parent
ORDER = (
    "readers", "models", "method", "image", "text", "synth", "report", "eval", "train", "tools",
    "world", "cli",
)  # fmt: skip


def _imported(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every ``counterfactual.*`` import in ``path``, relative ones
    resolved."""
    package = ["counterfactual", *path.relative_to(ROOT).parts[:-1]]
    found = []
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
                if not node.module:
                    found += [(node.lineno, f"{module}.{a.name}") for a in node.names]
                    continue
            else:
                module = node.module or ""
            found.append((node.lineno, module))
    return sorted((line, m) for line, m in found if m.startswith("counterfactual."))


def _violations() -> list[str]:
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT).parts
        if len(parts) == 1 or parts[0] not in ORDER:
            continue  # a shared module, or the package's own data
        here = ORDER.index(parts[0])
        for line, module in _imported(path):
            folder = module.split(".")[1]
            if folder in ORDER and ORDER.index(folder) > here:
                bad.append(f"{path.relative_to(ROOT.parent)}:{line} imports {module}")
    return bad


def test_every_folder_imports_only_earlier_folders() -> None:
    assert _violations() == []


def test_the_order_is_the_one_architecture_states() -> None:
    text = (ROOT.parent / "ARCHITECTURE.md").read_text("utf-8")
    stated = re.search(
        r"Each folder is one path through the system, in this order: (.+?)\. The", text, re.S
    )
    assert stated, "ARCHITECTURE.md no longer states the order"
    folders = re.findall(r"`(\w+)/`", stated.group(1))
    assert tuple(f for f in folders if f != "pipelines") == ORDER


def test_the_check_sees_a_violation(tmp_path: Path, monkeypatch) -> None:
    """A later folder imported from an earlier one, plainly and under TYPE_CHECKING."""
    fake = tmp_path / "counterfactual"
    (fake / "readers").mkdir(parents=True)
    (fake / "readers" / "x.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from counterfactual.synth.plan import SynthConfig\n"
        "from ..cli import main\n"
    )
    monkeypatch.setattr(__import__(__name__), "ROOT", fake)
    assert _violations() == [
        "counterfactual/readers/x.py:3 imports counterfactual.synth.plan",
        "counterfactual/readers/x.py:4 imports counterfactual.cli",
    ]


def _private_imports(root: Path) -> list[str]:
    """``path:line imports module._name`` for every underscored name (not a dunder) that a
    module of ``root`` imports from another module (``from counterfactual.x import _name``,
    ``from .x import _name``): a name used across modules is public, or lives where it is used."""
    package_root = root.parent
    bad = []
    for path in sorted(root.rglob("*.py")):
        package = [root.name, *path.relative_to(root).parts[:-1]]
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = package[: len(package) - node.level + 1]
                module = ".".join([*base, *([node.module] if node.module else [])])
            else:
                module = node.module or ""
            if module.split(".")[0] != root.name:
                continue
            for alias in node.names:
                name = alias.name
                if not name.startswith("_") or name.startswith("__"):
                    continue
                if (package_root / Path(*module.split("."), f"{name}.py")).is_file():
                    continue  # a module (``from counterfactual import _lazy``), not a name
                where = path.relative_to(package_root)
                bad.append(f"{where}:{node.lineno} imports {module}.{name}")
    return bad


def test_no_underscored_name_is_imported_across_modules() -> None:
    assert _private_imports(ROOT) == []


def test_the_private_check_sees_one(tmp_path: Path) -> None:
    """Absolute and relative imports of a private name, not a dunder, not a private module."""
    fake = tmp_path / "counterfactual"
    (fake / "readers").mkdir(parents=True)
    (fake / "_lazy.py").write_text("")
    (fake / "readers" / "a.py").write_text("_X = 1\n")
    (fake / "readers" / "b.py").write_text(
        "from counterfactual.readers.a import _X\nfrom .a import _X, Y\n"
        "from counterfactual import _lazy, __version__\nfrom os import _exit\n"
    )
    assert _private_imports(fake) == [
        "counterfactual/readers/b.py:1 imports counterfactual.readers.a._X",
        "counterfactual/readers/b.py:2 imports counterfactual.readers.a._X",
    ]
