"""Plugins: a package of a user's adds an eraser, a corpus format or a rewriter through entry
points (``counterfactual.erasers``, ``counterfactual.formats``, ``counterfactual.rewriters``)
without a fork. Each test writes a tiny distribution into a tmp folder (its module and a
``*.dist-info`` with ``entry_points.txt``), puts it on ``sys.path`` (and on ``PYTHONPATH`` for
the processes), and looks through the real registries: the registries are filled at import,
so what they hold is read in a fresh process (the CLI, or ``python -c``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

import counterfactual.image  # noqa: F401  (the registries a plugin module imports, filled first)
import counterfactual.text  # noqa: F401
from counterfactual import plugins

ROOT = Path(__file__).resolve().parents[1]

ERASER_MODULE = '''
from dataclasses import dataclass

import numpy as np

from counterfactual.image.base import Eraser, recorded
from counterfactual.options import declare

COLOUR = (0, 128, 255)


@dataclass(frozen=True, slots=True)
class PaintConfig:
    shade: int = declare(
        255,
        help="paint: blue, 0-255",
        flags=("--paint-shade",),
        kind="nonnegative_int",
        metadata=recorded("paint_shade"),
    )


class Paint:
    """Paints the mask one colour (its blue channel ``shade``)."""

    def __init__(self, config):
        self.config = config

    def describe(self):
        return {"method": "paint", "shade": self.config.shade}

    def __call__(self, batch):
        out = []
        for request in batch:
            image = request.image.copy()
            image[request.mask == 255] = (COLOUR[0], COLOUR[1], self.config.shade)
            out.append(image)
        return out


ERASER = Eraser(
    name="paint",
    config=PaintConfig,
    build=lambda part, **_: Paint(part),
    summary="paint (one colour)",
    methods=("paint",),
)

NOT_AN_ERASER = "paint"
'''

REWRITER_MODULE = """
from counterfactual.text import Rewriter, RewriteResult


class Shout:
    def describe(self):
        return {"method": "shout"}

    def __call__(self, batch):
        return [RewriteResult(r.caption.upper()) for r in batch]


REWRITER = Rewriter(("shout",), "the caption in capitals", lambda config, vocabulary, **_: Shout())
"""

FORMAT = """
from counterfactual.readers.corpus.files import Files


class MyFiles(Files):
    kind = "myfiles"


FORMAT = MyFiles()
"""


MODULES = {
    "__init__": "",
    "erasers": ERASER_MODULE,
    "rewriters": REWRITER_MODULE,
    "formats": FORMAT,
}
"""``myplugin``: one module per kind (each imports only the declarations it needs)."""


def install(folder: Path, entry_points: str, modules: dict[str, str]) -> Path:
    """A distribution ``myplugin`` 0.1 in ``folder``: its package's modules and its
    ``entry_points.txt``; ``folder`` is what goes on ``sys.path``."""
    package = folder / "myplugin"
    package.mkdir(parents=True)
    for name, code in modules.items():
        (package / f"{name}.py").write_text(code)
    info = folder / "myplugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: myplugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    return folder


ALL = """
    [counterfactual.erasers]
    paint = myplugin.erasers:ERASER

    [counterfactual.rewriters]
    shout = myplugin.rewriters:REWRITER

    [counterfactual.formats]
    myfiles = myplugin.formats:FORMAT
"""


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``myplugin`` installed for this test and its processes."""
    folder = install(tmp_path / "site", ALL, MODULES)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(folder), str(ROOT)]))
    plugins.clear()
    yield folder
    plugins.clear()


def python(code: str) -> subprocess.CompletedProcess[str]:
    """``code`` run by a fresh interpreter (the registries are filled at import)."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_entry_points_are_read_without_importing_the_plugin(plugin: Path) -> None:
    found = {p.group: p for p in plugins.entry_points_of(plugins.ERASERS)}
    assert found[plugins.ERASERS].name == "paint"
    assert found[plugins.ERASERS].dist == "myplugin"
    assert plugins.names(plugins.FORMATS) == ("myfiles",)
    assert plugins.names(plugins.REWRITERS) == ("shout",)
    assert "myplugin" not in sys.modules
    with pytest.raises(ValueError, match="not one of"):
        plugins.entry_points_of("counterfactual.nothing")


def test_clear_forgets_what_was_installed(plugin: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert plugins.names(plugins.ERASERS) == ("paint",)
    monkeypatch.syspath_prepend(str(plugin.parent))  # unchanged path, cache still holds it
    (plugin / "myplugin-0.1.dist-info" / "entry_points.txt").write_text("")
    assert plugins.names(plugins.ERASERS) == ("paint",)
    plugins.clear()
    assert plugins.names(plugins.ERASERS) == ()


def test_a_taken_name_or_a_broken_plugin_is_one_warning_and_skipped(
    plugin: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (plugin / "myplugin-0.1.dist-info" / "entry_points.txt").write_text(
        "[counterfactual.erasers]\n"
        "opencv = myplugin.erasers:ERASER\n"
        "broken = myplugin.missing:ERASER\n"
        "notone = myplugin.erasers:NOT_AN_ERASER\n"
        "paint = myplugin.erasers:ERASER\n"
    )
    plugins.clear()

    def check(p: plugins.Plugin, found: object) -> str | None:
        return None if not isinstance(found, str) else "a str is no eraser"

    with pytest.warns(plugins.PluginWarning) as caught:
        loaded = list(plugins.load(plugins.ERASERS, ("opencv",), check))
    assert [(p.name, type(o).__name__) for p, o in loaded] == [("paint", "Eraser")]
    lines = [str(w.message) for w in caught]
    assert lines == [
        "plugin myplugin's entry point opencv = myplugin.erasers:ERASER (counterfactual.erasers) "
        "skipped: the name 'opencv' is taken",
        "plugin myplugin's entry point broken = myplugin.missing:ERASER "
        "(counterfactual.erasers) skipped: it fails to load: ModuleNotFoundError: "
        "No module named 'myplugin.missing'",
        "plugin myplugin's entry point notone = myplugin.erasers:NOT_AN_ERASER "
        "(counterfactual.erasers) skipped: a str is no eraser",
    ]
    assert all("\n" not in line for line in lines)


def test_the_registries_hold_the_plugins_after_the_built_ins(plugin: Path) -> None:
    done = python(
        """
        import json
        from counterfactual.image import BUILT_IN, ERASERS, IMAGE_METHODS, ImageConfig
        from counterfactual.readers import CORPORA
        from counterfactual.readers.corpus.formats import FORMATS, corpus_format
        from counterfactual.text import REWRITERS, TEXT_METHODS, TextConfig, make_rewriter
        from counterfactual.text import RewriteRequest

        config = ImageConfig(method="paint")
        rewriter = make_rewriter(TextConfig(method="shout"))
        print(json.dumps({
            "erasers": list(ERASERS), "built_in": [e.name for e in BUILT_IN],
            "methods": list(IMAGE_METHODS), "flat": config.flat(),
            "default_flat": ImageConfig().flat(),
            "corpora": list(CORPORA), "formats": list(FORMATS),
            "myfiles": type(corpus_format("myfiles")).__name__,
            "text": list(TEXT_METHODS),
            "shout": rewriter([RewriteRequest("a dog on a sofa", ("dog",))])[0].text,
        }))
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    got = json.loads(done.stdout)
    assert got["erasers"] == [*got["built_in"], "paint"]
    assert got["methods"][-1] == "paint"
    assert got["flat"]["method"] == "paint"
    assert "paint_shade" not in got["flat"]  # at its default: recorded only when set
    assert "paint_shade" not in got["default_flat"]
    assert got["corpora"] == ["wds", "parquet", "csv", "files", "myfiles"]
    assert got["formats"] == got["corpora"]
    assert got["myfiles"] == "MyFiles"
    assert got["text"][-1] == "shout"
    assert got["shout"] == "A DOG ON A SOFA"


def test_a_plugin_that_takes_a_built_in_name_leaves_the_built_ins_working(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken = """
        [counterfactual.erasers]
        opencv = myplugin.erasers:ERASER
        [counterfactual.formats]
        wds = myplugin.formats:FORMAT
        coco = myplugin.formats:FORMAT
        [counterfactual.rewriters]
        prompt = myplugin.rewriters:REWRITER
    """
    folder = install(tmp_path / "site", taken, MODULES)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(folder), str(ROOT)]))
    done = python(
        """
        from counterfactual.image import ERASERS
        from counterfactual.readers.corpus.formats import FORMATS
        from counterfactual.text import REWRITERS
        print(ERASERS["opencv"].summary, type(FORMATS["wds"]).__name__, REWRITERS["prompt"].summary)
        print(sorted(FORMATS))
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "opencv (Telea, CPU) WebDataset a CLIP template of the kept classes",
        "['csv', 'files', 'parquet', 'wds']",
    ]
    warned = [line for line in done.stderr.splitlines() if "PluginWarning" in line]
    assert len(warned) == 4, done.stderr
    assert all("myplugin's entry point" in line and "is taken" in line for line in warned)


def synth(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "counterfactual", "synth", "--config", "demo"]
    return subprocess.run(
        [*command, "--runner", "local", "--out", str(out), *args],
        capture_output=True,
        text=True,
        timeout=300,
    )


def samples(out: Path) -> dict[str, dict]:
    found = {}
    for shard in sorted(out.glob("shard-*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar.getmembers():
                if member.name.endswith(".json"):
                    found[member.name] = json.loads(tar.extractfile(member).read())
    return found


@pytest.mark.slow
def test_synth_on_the_demo_with_the_plugins_eraser_and_rewriter(plugin: Path, tmp_path: Path):
    shown = subprocess.run(
        [sys.executable, "-m", "counterfactual", "synth", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr
    assert "paint" in shown.stdout.split("--image-method")[1].split("--")[0]
    assert "--paint-shade" in shown.stdout and "shout" in shown.stdout

    out = tmp_path / "out"
    done = synth(out, "--image-method", "paint", "--paint-shade", "7", "--text-method", "shout")
    assert done.returncode == 0, done.stderr
    found = samples(out)
    assert found
    for meta in found.values():
        assert meta["image_method"] == {"method": "paint", "shade": 7}
        assert meta["text_method"] == {"method": "shout"}
        assert meta["caption"] == meta["original_caption"].upper()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["image"]["method"] == "paint"
    assert manifest["config"]["image"]["paint_shade"] == 7
    rows = [json.loads(line) for line in (out / "status.jsonl").read_text().splitlines()]
    assert sum(r["status"] == "written" for r in rows) == len(found)


@pytest.mark.slow
def test_a_broken_plugin_warns_in_one_line_and_synth_runs(tmp_path: Path, monkeypatch):
    broken = """
        [counterfactual.erasers]
        paint = myplugin.missing:ERASER
    """
    folder = install(tmp_path / "site", broken, MODULES)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(folder), str(ROOT)]))
    done = synth(tmp_path / "out", "--image-method", "blur")
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "myplugin" in line]
    assert lines == [
        "counterfactual: warning: plugin myplugin's entry point paint = myplugin.missing:ERASER "
        "(counterfactual.erasers) skipped: it fails to load: ModuleNotFoundError: No module "
        "named 'myplugin.missing'"
    ], done.stderr
    done = synth(tmp_path / "out2", "--image-method", "paint")
    assert done.returncode == 2
    assert "invalid choice: 'paint'" in done.stderr
