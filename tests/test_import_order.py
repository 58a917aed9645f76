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


def _module_name(path: Path, root: Path) -> str:
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph(root: Path) -> tuple[dict[str, set[str]], list[str]]:
    """The package's modules, each with the modules it imports (anywhere, deferred imports
    included; ``from pkg import sub`` is an import of ``pkg.sub``), and the names a module
    imports from the package root (``from counterfactual import __version__``: a back-up
    arrow; ``from counterfactual import fs``, a module, is not)."""
    modules = {_module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    backup = []
    for name, path in modules.items():
        package = _module_name(path.parent / "__init__.py", root).split(".")
        for node in ast.walk(ast.parse(path.read_text("utf-8"))):
            if isinstance(node, ast.Import):
                targets = [(alias.name, None) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(package[: len(package) - node.level + 1]) if node.level else ""
                module = ".".join(p for p in (base, node.module or "") if p)
                targets = [
                    (f"{module}.{a.name}", None)
                    if f"{module}.{a.name}" in modules
                    else (module, a.name)
                    for a in node.names
                ]
            else:
                continue
            for target, imported in targets:
                while target not in modules and target.count(".") > 1:  # a name's module
                    target = target.rsplit(".", 1)[0]
                if target in modules and target != name:
                    graph[name].add(target)
                    if target == root.name and imported is not None:
                        backup.append(f"{name} imports {imported} from {target}")
    return graph, backup


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while (top := stack.pop()) != node:
                component.append(top)
            if component:
                found.append(sorted([node, *component]))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


KNOWN_CIRCLES = [
    ["counterfactual.cli.common", "counterfactual.cli.options"],
    ["counterfactual.cli.models", "counterfactual.cli.synth"],
    [
        "counterfactual.text",
        "counterfactual.text.captioner",
        "counterfactual.text.np_removal",
        "counterfactual.text.perturb",
        "counterfactual.text.prompts",
    ],
]
"""The circles left (deferred imports): ``cli/``'s two, and ``text/__init__``'s rewriters,
which import the request and result types it defines. None may be added."""


def test_no_import_circle_but_the_known_ones() -> None:
    assert [c for c in _circles(_import_graph(ROOT)[0]) if c not in KNOWN_CIRCLES] == []


def test_nothing_imports_a_name_from_the_package_root() -> None:
    """``_version.py`` holds ``__version__`` and ``DISTRIBUTION``: no module climbs back up."""
    assert _import_graph(ROOT)[1] == []


def test_the_circle_check_sees_one(tmp_path: Path) -> None:
    fake = tmp_path / "counterfactual"
    (fake / "a").mkdir(parents=True)
    (fake / "__init__.py").write_text("V = 1\n")
    (fake / "a" / "__init__.py").write_text("def f():\n    from counterfactual.a import x\n")
    (fake / "a" / "x.py").write_text("from counterfactual.a import y\n")
    (fake / "a" / "y.py").write_text("from . import x\nfrom counterfactual import V\n")
    (fake / "z.py").write_text("from counterfactual.a import x\n")
    graph, backup = _import_graph(fake)
    assert _circles(graph) == [["counterfactual.a.x", "counterfactual.a.y"]]
    assert backup == ["counterfactual.a.y imports V from counterfactual"]
