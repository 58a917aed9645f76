"""Counts say what they count (issue 13, point 6): inputs, items and status rows are named as
such on the console, in the manifest and in the HTML report, and agree with each other and
with what the run's files hold. Both runners, on a dataset whose reader already fails some
images (the start line must count them too)."""

import contextlib
import html
import io
import json
import re

import pytest
import webdataset as wds
from bad_coco import make_bad_coco, synth_args

from counterfactual.cli import main

N_IMAGES = 14


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    return make_bad_coco(tmp_path_factory.mktemp("coco"), n=N_IMAGES, size=(96, 72))


def _number(pattern, text):
    found = re.search(pattern, text)
    assert found, (pattern, text)
    return int(found.group(1).replace(",", ""))


@pytest.fixture(scope="module", params=["local", "ray"])
def run(request, coco, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"out-{request.param}")
    extra = ("--runner", request.param)
    if request.param == "ray":
        extra += ("--num-cpus", "2", "--no-dashboard")
    args = synth_args(
        coco,
        out,
        "--image-method",
        "blur",
        "--images-per-shard",
        "4",
        "--contact-sheet",
        "0",
        "--max-pixels",
        "1000000",
        "--policy",
        "uniform",
        *extra,
    )
    err, stdout = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(stdout):
        assert main(args) == 0
    assert main(["report", str(out), "--out", str(out / "report")]) == 0
    return out, err.getvalue(), stdout.getvalue()


def _status(out):
    return [json.loads(line) for line in (out / "status.jsonl").read_text().splitlines()]


def test_console_manifest_and_files_agree(run):
    out, err, stdout = run
    status = _status(out)
    manifest = json.loads((out / "manifest.json").read_text())
    samples = list(wds.WebDataset(sorted(map(str, out.glob("shard-*.tar"))), shardshuffle=False))
    by_status = {k: sum(r["status"] == k for r in status) for k in ("written", "skipped", "failed")}

    # the inputs: every image named by the annotations, the reader's failures included
    assert len({r["image_id"] for r in status}) == N_IMAGES
    assert manifest["inputs"] == N_IMAGES and manifest["input_unit"] == "images"
    start = err.splitlines()[0]
    assert _number(r"coco: ([\d,]+) images", start) == N_IMAGES, start
    assert "failed already in the reader" in start  # the unsafe path and the unknown class

    # the progress line's last state and the summary count the same rows
    final = [line for line in err.splitlines() if line.startswith("synth: ")][-1]
    assert _number(r"([\d,]+)/[\d,]+ images \(100%\)", final) == N_IMAGES
    for k, n in by_status.items():
        assert _number(rf"([\d,]+) {k}", final) == n, (k, final)
        assert _number(rf"([\d,]+) {k}", stdout.splitlines()[1]) == n, (k, stdout)

    # the summary: inputs -> items -> samples, and the status rows
    head = stdout.splitlines()[0]
    assert _number(r"^([\d,]+) images ->", head) == N_IMAGES
    assert _number(r"-> ([\d,]+) items ->", head) == manifest["items"]
    assert _number(r"-> ([\d,]+) samples", head) == manifest["samples"] == len(samples)
    assert _number(r"status rows: ([\d,]+)", stdout) == manifest["status_rows"] == len(status)
    assert manifest["samples"] == by_status["written"]
    assert sum(manifest["counts"].values()) == len(status)
    # an item is a plan with a caption: each ends in exactly one row with its target
    assert manifest["items"] >= manifest["samples"]


def test_report_cards_name_what_they_count(run):
    out, _, _ = run
    page = html.unescape((out / "report" / "index.html").read_text())
    cards = dict(
        (name, int(value.replace(",", "")))
        for value, name in re.findall(r"<b>([\d,]+)</b><span>([^<]+)</span>", page)
    )
    manifest = json.loads((out / "manifest.json").read_text())
    status = _status(out)
    assert cards["input images"] == N_IMAGES
    assert cards["items"] == manifest["items"]
    assert cards["samples"] == manifest["samples"]
    rows = [name for name in cards if name.startswith("status rows")]
    assert len(rows) == 1 and cards[rows[0]] == len(status)
    written = sum(r["status"] == "written" for r in status)
    assert f"{written:,} written" in rows[0]
