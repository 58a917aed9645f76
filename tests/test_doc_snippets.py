"""The README's and docs/'s snippets run as written, so the documentation cannot drift.

Marking a snippet (put the comment on the line right before the opening fence):

* ``<!-- run -->``: run this block. ``console`` blocks are transcripts: each ``$ COMMAND``
  line (continued by a trailing ``\\``) runs in bash and must exit 0, and the lines up to the
  next ``$`` are its expected stdout. ``sh``/``bash`` blocks run as one script (``set -e``).
  ``python`` blocks run as a script in a subprocess.
* ``<!-- output -->`` before a ``text`` block: the expected stdout of the ``run`` block
  before it.
* Options after ``run``: ``loose`` (decimal numbers such as timings are not compared),
  ``demo`` (the working folder holds ``out/demo``, what the quick start's demo writes),
  ``toloka`` (it holds ``toloka/``, the test files of the Toloka VQA benchmark; skipped when
  they are not on this machine).
* ``<!-- no-run: WHY -->``: a shell or Python block that cannot run here (network, GPUs, a
  cluster, data a user must download); every such block must carry one of the three
  comments, so a new snippet is a decision.

How output is compared: whitespace is ignored (so pretty-printed JSON may be shown compacted),
``…`` (or ``...``) stands for any text, a decimal number matches to the digits shown
(``0.4217`` accepts 0.42171...), whole numbers must be equal. ``$ cat FILE`` of a file that is
not there yet writes the lines shown into it: that is how a document shows its input files.

Every marked snippet of one document runs in order in one temporary folder (a later snippet
sees the files an earlier one wrote; selecting one with ``-k`` runs the earlier ones too), with the repository's Python environment first on
``PATH`` and the offline settings of the test suite (``HF_HUB_OFFLINE=1``, no telemetry, no
Ray usage stats).
"""

from __future__ import annotations

import atexit
import functools
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
TOLOKA = Path(os.environ.get("COUNTERFACTUAL_TOLOKA", REPO.parent / "shared" / "data" / "toloka"))
TOLOKA_FILES = ("test_private.csv", "test_private_crowd_baseline.csv", "test_public.csv")
SHELL_LANGS = {"console", "sh", "bash", "shell"}
RUNNABLE_LANGS = SHELL_LANGS | {"python"}
OPTIONS = {"loose", "demo", "toloka"}
TIMEOUT_S = 300

_FENCE = re.compile(r"^(\s*)(```+)\s*([\w+-]*)")
_RUN = re.compile(r"^\s*<!--\s*run((?:\s+[\w-]+)*)\s*-->\s*$")
_OUTPUT = re.compile(r"^\s*<!--\s*output\s*-->\s*$")
_NO_RUN = re.compile(r"^\s*<!--\s*no-run:\s*\S.*-->\s*$")


@dataclass
class Snippet:
    doc: Path
    line: int  # of the opening fence, 1-based
    lang: str
    body: str
    options: frozenset[str]
    output: str | None = None  # a following <!-- output --> block

    @property
    def id(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}"


@dataclass(frozen=True)
class Block:
    line: int
    lang: str
    body: str
    marker: str  # the line before the fence
    section: str  # the heading above it


def blocks(doc: Path) -> list[Block]:
    """Every fenced block of a Markdown file, its indentation removed."""
    lines = doc.read_text(encoding="utf-8").splitlines()
    found, i, section = [], 0, ""
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            if lines[i].startswith("#"):
                section = lines[i].lstrip("#").strip()
            i += 1
            continue
        indent, fence, lang = m.groups()
        end = i + 1
        while end < len(lines) and lines[end].strip() != fence:
            end += 1
        body = "\n".join(
            line[len(indent) :] if line.startswith(indent) else line.lstrip()
            for line in lines[i + 1 : end]
        )
        found.append(Block(i + 1, lang, body, lines[i - 1] if i else "", section))
        i = end + 1
    return found


def snippets(doc: Path) -> list[Snippet]:
    found: list[Snippet] = []
    for block in blocks(doc):
        run = _RUN.match(block.marker)
        if run:
            options = frozenset(run.group(1).split())
            unknown = options - OPTIONS
            assert not unknown, f"{doc.name}:{block.line}: unknown run option(s) {unknown}"
            assert block.lang in RUNNABLE_LANGS, (
                f"{doc.name}:{block.line}: cannot run {block.lang!r}"
            )
            found.append(Snippet(doc, block.line, block.lang, block.body, options))
        elif _OUTPUT.match(block.marker):
            assert found and found[-1].output is None, f"{doc.name}:{block.line}: output of what?"
            found[-1].output = block.body
    return found


ALL = [s for doc in DOCS for s in snippets(doc)]


# --- comparing output -------------------------------------------------------------------------

_TOKEN = re.compile(r"(…|\.\.\.)|(-?\d+\.\d+(?:[eE][-+]?\d+)?)")
_NUMBER = r"(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|nan|-?inf)"


def output_matches(expected: str, actual: str, loose: bool = False) -> bool:
    """Whether ``actual`` is the output ``expected`` shows (see the module docstring)."""
    parts, shown, pos = [], [], 0
    for m in _TOKEN.finditer(expected):
        parts += [re.escape(c) for c in expected[pos : m.start()] if not c.isspace()]
        if m.group(1):
            parts.append(".*?")
        else:
            parts.append(_NUMBER)
            shown.append(m.group(2))
        pos = m.end()
    parts += [re.escape(c) for c in expected[pos:] if not c.isspace()]
    # whitespace is free between any two characters shown, never inside a number of the output
    found = re.fullmatch(r"\s*" + r"\s*".join(parts) + r"\s*", actual, re.DOTALL)
    if not found:
        return False
    if loose:
        return True
    for text, value in zip(shown, found.groups(), strict=True):
        decimals = len(re.split("[eE]", text)[0].split(".")[1])
        if abs(float(value) - float(text)) > 0.5 * 10.0**-decimals * (1 + 1e-9) + 1e-12:
            return False
    return True


def test_output_matches() -> None:
    assert output_matches('{"a": 1,\n  "b": 0.4217}', '{\n"a": 1, "b": 0.42171234}')
    assert not output_matches('{"b": 0.4217}', '{"b": 0.4219}')
    assert not output_matches("n: 8", "n: 9")
    assert output_matches("x …\ny", "x 1 2 3\n y")
    assert output_matches("took 1.9 s", "took 12.4 s", loose=True)
    assert not output_matches("took 1.9 s", "took 12.4 s")
    assert not output_matches("6 samples", "7 samples", loose=True)
    assert output_matches("decode 0.05 111.0", "decode   0.07    88.6", loose=True)
    assert not output_matches("0.05 111.0", "0.0511 1.0")


# --- running ----------------------------------------------------------------------------------


@functools.cache
def ray_temp_root() -> str:
    """A short temp root of this process's own for the Ray a snippet starts (``RAY_TMPDIR``):
    a bare ``ray.init()`` in a snippet (Ray Data's, say) joins the latest Ray named in the
    temp root's ``ray_current_cluster``, which under pytest-xdist may be another test file's
    Ray, started beside it and stopped under it."""
    root = tempfile.mkdtemp(prefix="snip-ray-", dir="/tmp")
    atexit.register(shutil.rmtree, root, True)
    return root


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env["RAY_TMPDIR"] = ray_temp_root()
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    env.update(
        HF_HUB_OFFLINE="1",
        HF_HUB_DISABLE_TELEMETRY="1",
        TRANSFORMERS_OFFLINE="1",
        RAY_USAGE_STATS_ENABLED="0",
        RAY_AUTH_MODE="disabled",
        COLUMNS="100",
    )
    return env


def run(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, cwd=cwd, env=environment(), capture_output=True, text=True, timeout=TIMEOUT_S
    )


def explain(what: str, result: subprocess.CompletedProcess[str], expected: str | None) -> str:
    text = f"{what}\nexit status {result.returncode}\n--- stdout ---\n{result.stdout}"
    text += f"\n--- stderr (end) ---\n{result.stderr[-3000:]}"
    if expected is not None:
        text += f"\n--- the document shows ---\n{expected}"
    return text


def transcript(body: str) -> list[tuple[str, str]]:
    """A console block as (command, expected output) pairs."""
    steps: list[tuple[str, list[str]]] = []
    lines = body.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("$ "):
            command = line[2:]
            while command.endswith("\\") and i + 1 < len(lines):
                i += 1
                command = command[:-1] + "\n" + lines[i]
            steps.append((command, []))
        else:
            assert steps, f"output before any command: {line!r}"
            steps[-1][1].append(line)
        i += 1
    return [(command, "\n".join(out)) for command, out in steps]


def cat_target(command: str) -> str | None:
    """The file of a plain ``cat FILE`` command, else None."""
    words = shlex.split(command, comments=True)
    return words[1] if len(words) == 2 and words[0] == "cat" else None


def run_console(snippet: Snippet, folder: Path) -> None:
    steps = transcript(snippet.body)
    assert steps, f"{snippet.id}: a console block marked run needs $ commands"
    for command, expected in steps:
        target = cat_target(command)
        if target is not None and not (folder / target).exists():
            (folder / target).write_text(expected + "\n", encoding="utf-8")
            continue
        result = run(["bash", "-c", command], folder)
        what = f"{snippet.id}: $ {command}"
        assert result.returncode == 0, explain(what, result, expected)
        assert output_matches(expected, result.stdout, "loose" in snippet.options), explain(
            what, result, expected
        )


def run_script(snippet: Snippet, folder: Path) -> None:
    if snippet.lang == "python":
        script = folder / f"snippet_{snippet.doc.stem}_{snippet.line}.py"
        script.write_text(snippet.body + "\n", encoding="utf-8")
        result = run([sys.executable, script.name], folder)
    else:
        result = run(["bash", "-e", "-c", snippet.body], folder)
    assert result.returncode == 0, explain(snippet.id, result, snippet.output)
    if snippet.output is not None:
        assert output_matches(snippet.output, result.stdout, "loose" in snippet.options), explain(
            snippet.id, result, snippet.output
        )


@dataclass
class Demo:
    """What the quick start's demo writes (``out/demo``), run once in ``folder`` when a snippet
    first needs it and copied into each document's working folder: the same files as a run of
    its own there (nothing in them names the folder they were made in)."""

    folder: Path

    def copy_to(self, folder: Path) -> None:
        made = self.folder / "out" / "demo"
        if not (made / "manifest.json").exists():
            config = (
                REPO / "counterfactual" / "pipelines" / "configs" / "demo.yaml"
            )  # or the bundled config's name
            name = str(config) if config.is_file() else "demo"
            command = [sys.executable, "-m", "counterfactual", "synth", "--config", name]
            result = run([*command, "--runner", "local", "--out", "out/demo"], self.folder)
            assert result.returncode == 0, explain("the demo", result, None)
        shutil.copytree(made, folder / "out" / "demo", dirs_exist_ok=True)


@dataclass
class Workspace:
    """A document's working folder and the lines of the snippets tried in it."""

    folder: Path
    demo: Demo
    tried: set[int] = field(default_factory=set)


@pytest.fixture(scope="module")
def workspaces(tmp_path_factory: pytest.TempPathFactory) -> dict[Path, Workspace]:
    """One working folder per document, shared by its snippets in order."""
    demo = Demo(tmp_path_factory.mktemp("demo"))
    return {doc: Workspace(tmp_path_factory.mktemp(doc.stem), demo) for doc in DOCS}


def prepare(snippet: Snippet, space: Workspace) -> None:
    folder = space.folder
    if "demo" in snippet.options and not (folder / "out" / "demo" / "manifest.json").exists():
        space.demo.copy_to(folder)
    if "toloka" in snippet.options:
        if not all((TOLOKA / name).is_file() for name in TOLOKA_FILES):
            pytest.skip(f"the Toloka VQA test files are not in {TOLOKA} (COUNTERFACTUAL_TOLOKA)")
        (folder / "toloka").mkdir(exist_ok=True)
        for name in TOLOKA_FILES:
            shutil.copyfile(TOLOKA / name, folder / "toloka" / name)


def execute(snippet: Snippet, space: Workspace) -> None:
    space.tried.add(snippet.line)
    prepare(snippet, space)
    if snippet.lang == "console" and any(
        line.startswith("$ ") for line in snippet.body.splitlines()
    ):
        run_console(snippet, space.folder)
    else:
        run_script(snippet, space.folder)


@pytest.mark.slow
@pytest.mark.parametrize("snippet", ALL, ids=[s.id for s in ALL])
def test_snippet_runs(snippet: Snippet, workspaces: dict[Path, Workspace]) -> None:
    space = workspaces[snippet.doc]
    for earlier in ALL:  # a snippet may read what earlier ones wrote: run those -k left out
        if earlier.doc == snippet.doc and earlier.line < snippet.line:
            if earlier.line not in space.tried:
                try:
                    execute(earlier, space)
                except pytest.skip.Exception:
                    pass
    execute(snippet, space)


# Sections whose commands set up the machine (they install packages over the network); how a
# fresh clone installs is tested apart from the documentation.
SETUP_SECTIONS = {("README.md", "Quick start")}


def test_every_runnable_block_is_marked() -> None:
    """A shell or Python block is marked run, or says why it cannot run."""
    unmarked = [
        f"{doc.relative_to(REPO)}:{block.line} ({block.lang})"
        for doc in DOCS
        for block in blocks(doc)
        if block.lang in RUNNABLE_LANGS
        and (doc.name, block.section) not in SETUP_SECTIONS
        and not (_RUN.match(block.marker) or _NO_RUN.match(block.marker))
    ]
    assert not unmarked, (
        "put <!-- run --> (see tests/test_doc_snippets.py) or <!-- no-run: WHY --> on the line "
        f"before each of these blocks: {unmarked}"
    )


def test_docs_have_runnable_snippets() -> None:
    assert len(ALL) >= 10, [s.id for s in ALL]


_INTERNAL = [  # the project's own notes: its seed papers by number, its spec, its shared folder
    re.compile(r"\bseeds? 0\d\d\b", re.IGNORECASE),
    re.compile(r"\bSPEC(?:\.md|\s+(?:\d|section))"),
    re.compile(r"\.\./shared\b"),
    re.compile(r"\bissue \d+", re.IGNORECASE),  # the project's tracker, not a public one
]


def test_no_internal_references() -> None:
    """User documentation cites papers, not the project's internal notes and folders."""
    hits = [
        f"{doc.relative_to(REPO)}:{n}: {line.strip()}"
        for doc in DOCS
        for n, line in enumerate(doc.read_text(encoding="utf-8").splitlines(), 1)
        if any(p.search(line) for p in _INTERNAL)
    ]
    assert not hits, "\n".join(hits)
