"""The status reasons: one list (counterfactual/reasons.py), the docs show it, and every
reason the code writes is on it."""

import ast
import re
from pathlib import Path

from counterfactual.reasons import REASONS, markdown_table

ROOT = Path(__file__).resolve().parents[1]
KEBAB = re.compile(r"^[a-z]+(-[a-z0-9]+)*$")
# the trainer's reasons (train/batches.py) are for skipped training samples, not status.jsonl rows
SOURCES = sorted(
    p for p in (ROOT / "counterfactual").rglob("*.py") if p.name not in ("reasons.py", "batches.py")
)


def _reason_literals(path: Path) -> set[str]:
    """Reasons written in ``path``: kebab-case strings (or module constants holding them) given
    as a ``Status``'s third argument, a ``SampleError``'s first, a ``fail``'s first or any
    ``reason=`` keyword."""
    tree = ast.parse(path.read_text(), str(path))
    constants: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            targets = node.targets[0]
            names = targets.elts if isinstance(targets, ast.Tuple) else [targets]
            values = node.value.elts if isinstance(node.value, ast.Tuple) else [node.value]
            for name, value in zip(names, values, strict=False):
                if isinstance(name, ast.Name) and isinstance(value, ast.Constant):
                    if isinstance(value.value, str):
                        constants[name.id] = value.value

    def value(node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.Name):
            return constants.get(node.id, _imported(node.id))
        return None

    found = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
        args = []
        if name == "Status" and len(node.args) >= 3:
            args.append(node.args[2])
        if name in ("SampleError", "fail") and node.args:
            args.append(node.args[0])
        args += [k.value for k in node.keywords if k.arg == "reason"]
        for arg in args:
            text = value(arg)
            if text is not None and KEBAB.match(text):
                found.add(text)
    return found


def _imported(name: str) -> str | None:
    """A reason constant imported from another module (``from ... import EMPTY_CAPTION``)."""
    for path in SOURCES:
        match = re.search(rf'^{name} = "([a-z0-9-]+)"$', path.read_text(), re.MULTILINE)
        if match:
            return match.group(1)
    return None


def test_the_docs_show_the_list():
    """The one table of reasons, in the generated reference page (docs/gen_options.py)."""
    text = (ROOT / "docs" / "reference-options.md").read_text()
    shown = text.split("<!-- reasons:start -->\n", 1)[1].split("\n<!-- reasons:end -->", 1)[0]
    assert shown == markdown_table(), "run `python docs/gen_options.py` and commit the page"
    others = [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    twice = [
        p.name
        for p in others
        if p.name != "reference-options.md" and "reasons:start" in p.read_text()
    ]
    assert not twice, f"the reasons table belongs in docs/reference-options.md only: {twice}"


def test_every_reason_the_code_writes_is_listed():
    written = {}
    for path in SOURCES:
        for reason in _reason_literals(path):
            written.setdefault(reason, path.relative_to(ROOT))
    assert len(written) >= 20  # the scan finds the reasons at all
    unlisted = {r: str(p) for r, p in written.items() if r not in REASONS}
    assert not unlisted, f"add to counterfactual/reasons.py: {unlisted}"


def test_every_listed_reason_is_written_somewhere():
    source = "\n".join(p.read_text() for p in SOURCES)
    dead = [r for r in REASONS if f'"{r}"' not in source]
    assert not dead, dead


def test_statuses_and_meanings():
    for name, reason in REASONS.items():
        assert KEBAB.match(name), name
        assert reason.status in ("skipped", "failed"), name
        assert reason.meaning and "|" not in reason.meaning, name
