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
    "readers", "models", "method", "image", "text", "shards", "report", "eval", "train", "synth",
    "tools", "world", "pipelines", "cli",
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
    assert tuple(folders) == ORDER


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


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _arrows(path: Path, modules: set[str], in_functions: bool) -> set[str]:
    """The modules of ``modules`` that ``path`` imports: at module level (class bodies and
    ``TYPE_CHECKING`` blocks included), and with ``in_functions`` also inside functions.
    ``from package import name`` is an arrow to ``package.name`` when that is a module."""
    name = _module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                if not in_functions:
                    continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = package[: len(package) - child.level + 1] if child.level else []
                module = ".".join([*base, *([child.module] if child.module else [])])
                for a in child.names:
                    sub = f"{module}.{a.name}"
                    found.add(sub if sub in modules else module)
            visit(child)

    visit(ast.parse(path.read_text("utf-8")))
    return {m for m in found if m in modules and m != name}


REWRITER_MODULES = ("captioner", "np_removal", "perturb", "prompts")


def test_no_rewriter_imports_the_registry() -> None:
    """The rewriters take their request, result and options from ``text/base.py``; the
    registry (``text/__init__.py``) imports each when its method is chosen, and none imports it
    back, not even inside a function."""
    paths = {_module_name(p): p for p in ROOT.rglob("*.py")}
    for name in REWRITER_MODULES:
        arrows = _arrows(ROOT / "text" / f"{name}.py", set(paths), in_functions=True)
        assert "counterfactual.text" not in arrows, name
        assert "counterfactual.text.base" in arrows, name


def _circles(in_functions: bool) -> list[list[str]]:
    """Each import circle among ``counterfactual``'s modules: a strongly connected component
    of the import graph (Tarjan's search) with more than one module, sorted."""
    paths = {_module_name(p): p for p in ROOT.rglob("*.py")}
    graph = {
        m: sorted(to for to in _arrows(p, set(paths), in_functions))
        for m, p in sorted(paths.items())
    }
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def strong(v: str) -> None:
        order[v] = low[v] = len(order)
        stack.append(v)
        for w in graph[v]:
            if w not in order:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            component = stack[stack.index(v) :]
            del stack[stack.index(v) :]
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in order:
            strong(v)
    return sorted(found)


def test_no_import_circles() -> None:
    """No module imports one that imports it back, directly or around a longer circle: not at
    module level, and not through the imports inside functions either (a lazy import still
    ties the two together)."""
    at_top, anywhere = _circles(in_functions=False), _circles(in_functions=True)
    assert (len(at_top), len(anywhere)) == (0, 0), f"module level: {at_top}; anywhere: {anywhere}"


def test_the_search_sees_a_circle(tmp_path: Path, monkeypatch) -> None:
    """A circle through a function-level import, and one at module level through
    ``from package import module``, in a package of its own."""
    fake = tmp_path / "counterfactual"
    (fake / "cli").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "cli" / "__init__.py").write_text("")
    (fake / "cli" / "a.py").write_text("from counterfactual.cli import b\n")
    (fake / "cli" / "b.py").write_text("def f():\n    from .a import x\n")
    (fake / "cli" / "c.py").write_text("import counterfactual.cli.d\n")
    (fake / "cli" / "d.py").write_text("import counterfactual.cli.e\n")
    (fake / "cli" / "e.py").write_text("from counterfactual.cli.c import y\n")
    monkeypatch.setattr(__import__(__name__), "ROOT", fake)
    cde = ["counterfactual.cli.c", "counterfactual.cli.d", "counterfactual.cli.e"]
    assert _circles(in_functions=False) == [cde]
    assert _circles(in_functions=True) == [["counterfactual.cli.a", "counterfactual.cli.b"], cde]


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


def _backup_arrows(root: Path) -> list[str]:
    """``module imports NAME from counterfactual`` for every name (not a module) imported from
    the package root: ``_version.py`` holds ``__version__`` and ``DISTRIBUTION``, so nothing
    climbs back up to the package that imports everything."""
    found = []
    for path in sorted(root.rglob("*.py")):
        package = [root.name, *path.relative_to(root).parts[:-1]]
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            if module != root.name:
                continue
            for alias in node.names:
                if not (root / f"{alias.name}.py").is_file() and not (root / alias.name).is_dir():
                    found.append(
                        f"{path.relative_to(root.parent)} imports {alias.name} from {module}"
                    )
    return found


def test_nothing_imports_a_name_from_the_package_root() -> None:
    assert _backup_arrows(ROOT) == []


def test_the_backup_check_sees_one(tmp_path: Path) -> None:
    fake = tmp_path / "counterfactual"
    (fake / "a").mkdir(parents=True)
    (fake / "fs.py").write_text("")
    (fake / "a" / "y.py").write_text("from counterfactual import fs\nfrom .. import V\n")
    assert _backup_arrows(fake) == ["counterfactual/a/y.py imports V from counterfactual"]
