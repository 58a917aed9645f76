"""`counterfactual report`: the visual audit of a real synth run (demo, bad-input COCO, corpora),
checked by parsing the page; originals found from another working directory; a headless
Chromium screenshot when Chromium is installed (required in CI)."""

import io
import json
import os
import shutil
import subprocess
import tarfile
from collections import Counter
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlparse

import numpy as np
import pytest
from bad_coco import ODD_CAPTION, make_bad_coco, synth_args
from PIL import Image

from counterfactual.cli import main
from counterfactual.readers.spec import DataSpec
from counterfactual.report import (
    SampleRef,
    caption_segments,
    dataset_roots,
    read_run,
    stratify,
    write_report,
)

VOID = {"meta", "img", "br", "hr", "link", "input", "source", "wbr", "col"}


class Page(HTMLParser):
    """Everything the tests look at: links, text, and each table's rows (row attributes and
    cell texts), with a check that every non-void element is closed in order."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[str] = []
        self.text: list[str] = []
        self.tables: dict[str, list[tuple[dict, list[str]]]] = {}
        self.ids: set[str] = set()
        self._stack: list[str] = []
        self._tables: list[str | None] = []
        self._cell: list[str] | None = None
        self.feed(text)
        self.close()
        assert not self._stack, f"unclosed elements: {self._stack}"

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag not in VOID:
            self._stack.append(tag)
        if "id" in a:
            self.ids.add(a["id"])
        for name in ("href", "src"):
            if a.get(name):
                self.links.append(a[name])
        if tag == "table":
            self._tables.append(a.get("id"))
            if a.get("id"):
                self.tables[a["id"]] = []
        elif tag == "tr" and self._tables and self._tables[-1]:
            self.tables[self._tables[-1]].append((a, []))
        elif tag in ("td", "th") and self._tables and self._tables[-1]:
            self._cell = []

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        assert self._stack and self._stack[-1] == tag, f"</{tag}> closes {self._stack[-1:]}"
        self._stack.pop()
        if tag == "table":
            self._tables.pop()
        elif tag in ("td", "th") and self._tables and self._tables[-1]:
            rows = self.tables[self._tables[-1]]
            rows[-1][1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)

    def rows(self, table: str) -> list[tuple[dict, list[str]]]:
        """Body rows (header rows, which have no attributes, left out)."""
        return [(a, cells) for a, cells in self.tables[table] if a]


def parse(index: Path) -> Page:
    return Page(index.read_text(encoding="utf-8"))


def status_counts(out: Path) -> dict[str, int]:
    rows = [json.loads(line) for line in (out / "status.jsonl").read_text().splitlines()]
    return dict(
        Counter(f"{r['status']}:{r['reason']}" if r["reason"] else r["status"] for r in rows)
    )


def page_counts(page: Page) -> dict[str, int]:
    out = {}
    for attrs, cells in page.rows("counts"):
        key = (
            f"{attrs['data-status']}:{attrs['data-reason']}"
            if attrs["data-reason"]
            else (attrs["data-status"])
        )
        out[key] = int(cells[2])
    return out


def assert_links_exist(index: Path, page: Page) -> None:
    assert page.links
    for link in page.links:
        url = urlparse(link)
        if link.startswith("#"):
            assert link[1:] in page.ids, link
            continue
        assert not url.scheme and not url.netloc, f"not a relative link: {link}"
        assert (index.parent / unquote(url.path)).is_file(), link


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "run"
    args = ["synth", "--dataset", "demo", "--out", str(out), "--image-method", "blur"]
    assert main([*args, "--contact-sheet", "0"]) == 0
    return out


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    return make_bad_coco(tmp_path_factory.mktemp("coco"))


@pytest.fixture(scope="module")
def bad(coco, tmp_path_factory):
    out = tmp_path_factory.mktemp("bad") / "run"
    extra = ("--image-method", "blur", "--policy", "all", "--images-per-shard", "3")
    assert main(synth_args(coco, out, *extra, "--contact-sheet", "0")) == 0
    return out


def test_demo_report_through_the_cli(demo, capsys):
    assert main(["report", str(demo)]) == 0
    index = Path(capsys.readouterr().out.strip())
    assert index == demo / "report" / "index.html"
    page = parse(index)
    assert_links_exist(index, page)
    assert page_counts(page) == status_counts(demo)
    assert sorted(p.name for p in index.parent.glob("sheet-*.png")) == ["sheet-00.png"]
    # the demo's originals are found where the run made them, without --root
    assert "original not found" not in "".join(page.text)
    samples = page.rows("samples")
    written = sum(n for k, n in status_counts(demo).items() if k == "written")
    assert len(samples) == written  # fewer samples than n: all of them are shown
    assert sum(link.endswith("-original.jpg") for link in page.links) == len(samples)


def test_bad_input_report_lists_every_failure(bad, coco, tmp_path):
    report = write_report(bad, tmp_path / "rep", root=coco.images, n=12, seed=3)
    page = parse(report.index)
    assert_links_exist(report.index, page)
    counts = status_counts(bad)
    assert page_counts(page) == counts
    failed = [
        json.loads(line)
        for line in (bad / "status.jsonl").read_text().splitlines()
        if json.loads(line)["status"] == "failed"
    ]
    rows = page.rows("failures")
    assert len(rows) == len(failed) > 0
    assert Counter(a["data-reason"] for a, _ in rows) == Counter(r["reason"] for r in failed)
    assert {cells[3] for _, cells in rows} >= {"decode-error", "missing-file", "unsafe-path"}
    # per class: written and failed items as status.jsonl counts them
    classes = {a["data-class"]: cells for a, cells in page.rows("classes")}
    for row in failed:
        if row["target"]:
            assert int(classes[row["target"]][3]) >= 1
    written = Counter(
        json.loads(line)["target"]
        for line in (bad / "status.jsonl").read_text().splitlines()
        if json.loads(line)["status"] == "written"
    )
    assert {c: int(cells[1]) for c, cells in classes.items() if int(cells[1])} == written
    assert report.missing_originals == 0
    assert len(report.sheets) == -(-len(report.shown) // 8)


def test_stratified_sample_covers_every_removed_class(bad, coco, tmp_path):
    run = read_run(bad)
    removed = {c for s in run.samples for c in s.removed}
    strata = {(s.target, s.method) for s in run.samples}
    assert len(run.samples) > 12 and len(removed) > 3
    report = write_report(bad, tmp_path / "rep", root=coco.images, n=4, seed=0)
    shown = report.shown
    assert {c for s in shown for c in s.removed} == removed
    assert {(s.target, s.method) for s in shown} == strata  # one per stratum at least
    assert len({s.key for s in shown}) == len(shown)
    page = parse(report.index)
    assert {a["data-key"] for a, _ in page.rows("samples")} == {s.key for s in shown}


def ref(key, target, removed=(), method="blur", shard="s.tar"):
    meta = {
        "key": key,
        "plan": {"target": target, "removed": [target, *removed]},
        "image_method": {"method": method},
    }
    return SampleRef.from_meta(Path(shard), meta)


def test_stratify_rules():
    samples = [ref(f"a{i}", "a") for i in range(30)] + [ref(f"b{i}", "b") for i in range(3)]
    samples += [ref("c0", "c", ("z",)), ref("a-inp", "a", method="inpaint")]
    picked = stratify(samples, 10, seed=1)
    assert len(picked) == 10
    per = Counter((s.target, s.method) for s in picked)
    assert per[("b", "blur")] == 3 and per[("c", "blur")] == 1 and per[("a", "inpaint")] == 1
    assert [s.key for s in picked] == [s.key for s in stratify(samples, 10, seed=1)]
    assert [s.key for s in picked] != [s.key for s in stratify(samples, 10, seed=2)]
    assert [s.target for s in picked] == sorted(s.target for s in picked)
    # more strata than n: one of each; a class only ever co-removed is still covered
    few = stratify([ref("x", "x"), ref("y", "y"), ref("w", "w", ("q",))], 1, seed=0)
    assert {s.key for s in few} == {"x", "y", "w"}
    assert stratify([], 5) == []
    with pytest.raises(ValueError, match="n must be"):
        stratify(samples, 0)


@pytest.mark.parametrize(
    "caption, phrases, expected",
    [
        ("a dog and a cat", ["a cat"], [("a dog and ", False), ("a cat", True)]),
        ("A Dog runs", ["a dog"], [("A Dog", True), (" runs", False)]),
        ("a b a b", ["a", "a"], [("a", True), (" b ", False), ("a", True), (" b", False)]),
        ("nothing", ["missing"], [("nothing", False)]),
        ("", [], []),
        ("x <b>&", ["<b>&"], [("x ", False), ("<b>&", True)]),
    ],
)
def test_caption_segments(caption, phrases, expected):
    assert caption_segments(caption, phrases) == expected


def rewrite_shard(shard: Path, key: str, update: dict) -> None:
    """Rewrite ``shard`` with ``update`` merged into the json of sample ``key``."""
    members = []
    with tarfile.open(shard) as tar:
        for m in tar:
            data = tar.extractfile(m).read()
            if m.name == f"{key}.json":
                data = json.dumps({**json.loads(data), **update}).encode()
                m.size = len(data)
            members.append((m, data))
    with tarfile.open(shard, "w") as tar:
        for m, data in members:
            tar.addfile(m, io.BytesIO(data))


VERIFY = {
    "passed": False,
    "failed": ["removal: flag still ranked 1", "retention: person"],
    "removal": {
        "flag": {
            "rank_before": 1,
            "rank_after": 1,
            "prob_before": 0.91,
            "prob_after": 0.77,
            "removed": False,
        }
    },
    "retention": {"person": {"rank": 9, "prob": 0.01, "kept": False}},
    "text": {"names_removed": [], "names_kept": True},
    "model": "tiny-clip",
    "k": 5,
    "retention_k": 10,
}


def test_escaping_and_verify_scores(demo, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(demo, run, ignore=shutil.ignore_patterns("report"))
    samples = read_run(run).samples
    first, second = samples[0], samples[1]
    rewrite_shard(
        first.shard,
        first.key,
        {
            "original_caption": "x <b>& y " + ODD_CAPTION,
            "removed_phrases": ["<b>&"],
            "caption": "</td><script>alert(1)</script> & 🐕",
            "verify": VERIFY,
        },
    )
    rewrite_shard(second.shard, second.key, {"verify": {**VERIFY, "passed": True, "failed": []}})
    report = write_report(run, n=48)
    raw = report.index.read_text(encoding="utf-8")
    assert "<b>&" not in raw and "<script>" not in raw
    assert "<del>&lt;b&gt;&amp;</del>" in raw
    page = parse(report.index)
    text = "".join(page.text)
    assert "</td><script>alert(1)</script> & 🐕" in text
    assert "Ein Hund 🐕 neben a dog" in text
    rows = {a["data-key"]: cells for a, cells in page.rows("samples")}
    shown = rows[first.key][4]
    assert shown.startswith("fail") and "tiny-clip" in shown and "still seen" in shown
    assert "removal: flag still ranked 1" in shown and "lost" in shown
    assert rows[second.key][4].startswith("pass")
    others = [cells[4] for key, cells in rows.items() if key not in (first.key, second.key)]
    assert others and all(v == "-" for v in others)
    classes = {a["data-class"]: cells for a, cells in page.rows("classes")}
    assert classes[first.target][6].startswith("0/1") and classes[second.target][6] == "1/1 (100%)"
    assert 'data-name="verify pass"' in raw
    assert "verify (manifest)" not in raw  # the demo run was not verified
    assert_links_exist(report.index, page)


def test_missing_originals_show_the_edited_picture(bad, coco, tmp_path):
    # no --root, and a manifest that names no dataset folder
    run = tmp_path / "run"
    shutil.copytree(bad, run)
    manifest = json.loads((run / "manifest.json").read_text())
    manifest.pop("data")
    (run / "manifest.json").write_text(json.dumps(manifest))
    report = write_report(run, tmp_path / "none", n=6)
    assert report.missing_originals == len(report.shown) > 0
    page = parse(report.index)
    assert_links_exist(report.index, page)
    assert not any(link.endswith("-original.jpg") for link in page.links)
    assert "--root" in "".join(page.text)
    assert all("original not found" in cells[1] for _, cells in page.rows("samples"))
    # with a root, one deleted original: that row alone goes without
    images = tmp_path / "images"
    shutil.copytree(coco.images, images)
    gone = report.shown[0].load_meta().file
    (images / gone).unlink()
    partial = write_report(bad, tmp_path / "some", n=6, root=images)
    assert partial.missing_originals == sum(s.load_meta().file == gone for s in partial.shown) >= 1
    assert_links_exist(partial.index, parse(partial.index))
    sheet = np.asarray(Image.open(partial.sheets[0]).convert("L"), dtype=np.float64)
    assert sheet.std() > 10


def test_unfinished_run_and_not_a_run(demo, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(demo, run, ignore=shutil.ignore_patterns("report"))
    stats = read_run(run)
    (run / "status.jsonl").unlink()
    index = read_run(run)
    assert "status.jsonl is missing" in index.notes[0]
    assert index.counts()["written"] == stats.counts()["written"]
    assert index.counts() == stats.counts()  # every image's row is in its shard's stats
    page = parse(write_report(run).index)
    assert "status.jsonl is missing" in "".join(page.text)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", str(empty)]) == 2
    assert "not a synth run folder" in capsys.readouterr().err
    assert main(["report", str(tmp_path / "nowhere")]) == 2


def test_rerun_replaces_old_files(demo, tmp_path):
    out = tmp_path / "rep"
    write_report(demo, out, n=48)
    (out / "notes.txt").write_text("mine")
    small = write_report(demo, out, n=1, seed=5)
    kept = {p.name for p in (out / "samples").iterdir()}
    assert len(kept) == 4 * len(small.shown)  # original, mask, edited, full per sample
    assert (out / "notes.txt").read_text() == "mine"


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
REQUIRE_CHROMIUM = os.environ.get("COUNTERFACTUAL_REQUIRE_CHROMIUM") == "1"
"""Set by CI (``.ci/run`` installs Debian's chromium): there the test fails instead of skipping."""


def test_page_renders_in_headless_chromium(bad, coco, tmp_path):
    if CHROMIUM is None:
        why = "no chromium on PATH (Debian: apt-get install -y chromium)"
        if REQUIRE_CHROMIUM:
            pytest.fail(f"{why}, and COUNTERFACTUAL_REQUIRE_CHROMIUM=1")
        pytest.skip(why)
    report = write_report(bad, tmp_path / "rep", root=coco.images, n=8)
    shot = tmp_path / "shot.png"
    command = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}",
        f"--screenshot={shot}",
        "--window-size=1200,2000",
        report.index.resolve().as_uri(),
    ]
    subprocess.run(command, capture_output=True, timeout=60, check=False)
    assert shot.is_file(), "chromium wrote no screenshot"
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=np.float64)
    assert pixels.shape == (2000, 1200)
    assert pixels.std() > 10  # text, tables and pictures, not a blank page


def test_shards_read_in_parallel_as_in_one_process(bad):
    assert len(list(bad.glob("shard-*.tar"))) >= 4
    one, many = read_run(bad, workers=1), read_run(bad, workers=3)
    assert many.samples == one.samples and len(one.samples) > 12
    assert [s.key for s in one.samples] == [
        r["key"]
        for r in map(json.loads, (bad / "status.jsonl").read_text().splitlines())
        if r["status"] == "written"
    ]


def test_dataset_folder_from_the_runs_data_spec(tmp_path):
    root = tmp_path / "coco"
    for sub in ("val2017", "images", "pictures"):
        (root / sub).mkdir(parents=True)
    data = {"kind": "coco", "images": str(root / "pictures")}
    assert dataset_roots(tmp_path, {"data": data}) == [root / "pictures"]
    data = {"kind": "coco", "root": str(root), "coco_set": "val2017"}
    assert dataset_roots(tmp_path, {"data": data}) == [root / "val2017", root / "images"]
    assert dataset_roots(tmp_path, {"data": None}) == []
    assert dataset_roots(tmp_path, {"data": data}, root=root)[0] == root  # --root wins
    (tmp_path / "demo-data" / "images").mkdir(parents=True)
    assert dataset_roots(tmp_path, {}) == [tmp_path / "demo-data" / "images"]


# --- originals from any working directory -----------------------------------------------------


def original_links(page: Page) -> int:
    return sum(link.endswith("-original.jpg") for link in page.links)


def assert_every_original_shown(report, page: Page) -> None:
    """No placeholder tile, no banner: each sample shown links its original."""
    assert report.missing_originals == 0
    text = "".join(page.text)
    assert "originals-note" not in page.ids
    assert "original not found" not in text and "dataset folder" not in text
    assert original_links(page) == len(page.rows("samples")) == len(report.shown) > 0


def test_data_spec_records_absolute_paths(tmp_path):
    spec = DataSpec(
        kind="coco",
        root="data/coco",
        images="s3://bucket/images",
        instances=str(tmp_path / "instances.json"),
        captions="data/../ann/captions.json",
        split_file=None,
    )
    out = spec.absolute(tmp_path)
    assert out.root == str(tmp_path / "data" / "coco")
    assert out.images == "s3://bucket/images"  # a URL as it is
    assert out.instances == str(tmp_path / "instances.json")
    assert out.captions == str(tmp_path / "ann" / "captions.json")
    assert out.split_file is None and out.coco_set == spec.coco_set
    assert out.absolute(tmp_path / "elsewhere") == out  # already absolute: unchanged
    # a corpus pattern keeps its braces and globs; one that starts with a brace is kept whole
    wds = DataSpec(kind="wds", root="corpus/{00000..00002}.tar")
    assert wds.absolute(tmp_path).root == f"{tmp_path}/corpus/{{00000..00002}}.tar"
    assert DataSpec(kind="csv", root="t/*.csv").absolute(tmp_path).root == f"{tmp_path}/t/*.csv"
    odd = DataSpec(kind="wds", root="{a,/b}/x.tar")
    assert odd.absolute(tmp_path) == odd
    assert DataSpec(kind="demo", root="out/demo-data").absolute().root == str(
        Path.cwd() / "out" / "demo-data"
    )


def test_report_from_another_working_directory(coco, tmp_path, monkeypatch, capsys):
    """A run made with relative paths, reported from elsewhere: every original found."""
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    monkeypatch.chdir(project)
    files = type(coco)(*(Path(os.path.relpath(p, project)) for p in (coco.instances,
                         coco.captions, coco.images)))  # fmt: skip
    assert not files.images.is_absolute()
    assert main(synth_args(files, Path("out/run"), "--image-method", "blur")) == 0
    out = project / "out" / "run"
    data = json.loads((out / "manifest.json").read_text())["data"]
    for name in ("instances", "captions", "images", "root"):
        assert Path(data[name]).is_absolute(), (name, data[name])
    assert Path(data["images"]) == coco.images.resolve()
    monkeypatch.chdir(elsewhere)
    report = write_report(out, elsewhere / "rep", n=6)
    assert_every_original_shown(report, parse(report.index))
    # the command a user types, from there, with the run folder named relatively
    assert main(["report", os.path.relpath(out, elsewhere)]) == 0
    page = parse(out / "report" / "index.html")
    assert "originals-note" not in page.ids and original_links(page) > 0
    assert "not found" not in capsys.readouterr().err


def test_older_manifest_with_relative_paths(bad, coco, tmp_path, monkeypatch):
    """A manifest that recorded paths relative to where the run was made (the folder that
    holds OUT): found from another working directory through OUT's parents."""
    project = tmp_path / "project"
    shutil.copytree(coco.images, project / "data" / "images")
    run = project / "out" / "run"
    shutil.copytree(bad, run, ignore=shutil.ignore_patterns("report"))
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["data"] = {"kind": "coco", "images": "data/images", "root": "data"}
    (run / "manifest.json").write_text(json.dumps(manifest))
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert dataset_roots(run, manifest)[0] == project / "data" / "images"
    report = write_report(run, n=6)
    assert_every_original_shown(report, parse(report.index))
    # the working directory comes first: a folder of that name there wins
    (tmp_path / "elsewhere" / "data" / "images").mkdir(parents=True)
    assert dataset_roots(run, manifest)[:2] == [
        tmp_path / "elsewhere" / "data" / "images",
        project / "data" / "images",
    ]


def test_missing_original_banner_counts_only_the_missing(bad, coco, tmp_path):
    images = tmp_path / "images"
    shutil.copytree(coco.images, images)
    full = write_report(bad, tmp_path / "all", n=6, root=images)
    assert "originals-note" not in parse(full.index).ids
    gone = full.shown[0].load_meta().file
    (images / gone).unlink()
    partial = write_report(bad, tmp_path / "some", n=6, root=images)
    page = parse(partial.index)
    assert "originals-note" in page.ids
    note = " ".join("".join(page.text).split())
    assert f"{partial.missing_originals} of {len(partial.shown)} originals shown" in note
    assert "rerun with --root if the dataset folder moved" in note


@pytest.mark.slow
def test_corpus_reports_find_originals_from_anywhere(tmp_path, monkeypatch):
    """WebDataset originals inside their tars, CSV ones beside the table: no banner, from
    another working directory, without --root."""
    from counterfactual.testing import build_tiny_owlv2
    from counterfactual.testing.corpora import demo_samples, write_csv, write_wds

    owl = build_tiny_owlv2(tmp_path / "owl", grid_boxes=True)
    samples = demo_samples(tmp_path / "demo", shrink=4)
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    write_wds(samples, project / "corpus", per_shard=4)
    write_csv(samples, project / "table" / "rows.csv", project / "table")
    common = ["--detector-model", str(owl), "--detect-threshold", "0", "--image-method", "blur"]
    monkeypatch.chdir(project)
    for kind, root in (("wds", "corpus/{00000..00001}.tar"), ("csv", "table/*.csv")):
        out = f"out/{kind}"
        assert main(["synth", "--dataset", kind, "--root", root, "--out", out, *common]) == 0
    monkeypatch.chdir(elsewhere)
    for kind in ("wds", "csv"):
        report = write_report(project / "out" / kind, n=8)
        assert_every_original_shown(report, parse(report.index))
        if kind == "wds":
            assert all(r.load_meta().source is not None for r in report.shown)
        else:
            assert all(r.load_meta().source is None for r in report.shown)
