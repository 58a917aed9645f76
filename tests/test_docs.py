"""The documentation: a short README that leads to docs/, a site whose pages are all reachable
and whose links resolve, and a generated options page that cannot drift from the parsers."""

from __future__ import annotations

import argparse
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from counterfactual.cli import build_parser

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
PAGES = sorted(DOCS.glob("*.md"))
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^\s*```")


def generator():
    spec = importlib.util.spec_from_file_location("gen_options", DOCS / "gen_options.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_options_page_is_up_to_date():
    page = (DOCS / "reference-options.md").read_text(encoding="utf-8")
    assert page == generator().render(), "run `python docs/gen_options.py` and commit the page"


def every_parser(parser: argparse.ArgumentParser):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield sub
                yield from every_parser(sub)


def test_the_options_page_shows_every_command_and_option():
    page = (DOCS / "reference-options.md").read_text(encoding="utf-8")
    missing = []
    for parser in every_parser(build_parser()):
        name = parser.prog.removeprefix("counterfactual ")
        if f"\n## {name}\n" not in page:
            missing.append(f"section {name}")
        for action in parser._actions:
            for flag in action.option_strings:
                if flag.startswith("--") and flag not in ("--help", "--debug"):
                    if f"`{flag}`" not in page:
                        missing.append(f"{name} {flag}")
    assert not missing, missing
    assert "`--image-method`" in page and "`--no-repair-captions`" in page


def test_the_readme_is_short_and_links_the_docs():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) < 300
    linked = {m.split("#")[0] for m in _LINK.findall(text)}
    for page in ("docs/runs.md", "docs/training.md", "docs/corpora.md", "docs/reference.md"):
        assert page in linked, page


def nav_pages() -> list[str]:
    text = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    return re.findall(r":\s*([\w.-]+\.md)\s*$", text, re.MULTILINE)


def test_every_page_is_in_the_site_navigation():
    nav = nav_pages()
    assert sorted(nav) == sorted(p.name for p in PAGES), "list each docs/*.md in mkdocs.yml's nav"


def slug(heading: str) -> str:
    """A heading's anchor as MkDocs (Python-Markdown's toc) and GitHub both make it, for the
    headings these pages link to (letters, digits, spaces and punctuation)."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: Path) -> set[str]:
    found, fenced = set(), False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            found.add(slug(line.lstrip("#")))
    return found


def links(path: Path) -> list[str]:
    out, fenced = [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if _FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out += [m for m in _LINK.findall(line) if not re.match(r"[a-z]+:", m)]
    return out


@pytest.mark.parametrize("doc", [REPO / "README.md", *PAGES], ids=lambda p: p.name)
def test_relative_links_resolve(doc: Path):
    """Each relative link names a file that exists (from docs/: a page of the site) and, with
    an anchor, a heading of that file."""
    broken = []
    for link in links(doc):
        target, _, anchor = link.partition("#")
        path = (doc.parent / target).resolve() if target else doc
        if not path.exists():
            broken.append(link)
        elif doc.parent == DOCS and path.parent != DOCS:
            broken.append(f"{link} (outside docs/: not part of the site)")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{link} (no such heading)")
    assert not broken, broken


@pytest.mark.slow
def test_the_site_builds_strict(tmp_path: Path):
    """`mkdocs build --strict`, as `make docs` and CI run it (skipped where the docs extra is
    not installed: `pip install -e '.[docs]'`)."""
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs and mkdocs-material are not installed (the docs extra)")
    site = tmp_path / "site"
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (site / "reference-options" / "index.html").is_file()
    shutil.rmtree(site)
