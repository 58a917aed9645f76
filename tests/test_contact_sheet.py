"""synth's ``contact_sheet.png`` is the report's sheet (one renderer), and the verifier's
verdict is worded once for the sheet and the page."""

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from counterfactual.cli import main
from counterfactual.method.verify import VerifyMeta
from counterfactual.readers.demo import read_demo
from counterfactual.report import (
    ROWS_PER_SHEET,
    contact_sheet,
    draw_sheet,
    sheet_rows,
    verdict_lines,
    write_report,
)
from counterfactual.report.lines import CheckLine
from counterfactual.shards.samples import iter_samples


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "run"
    args = ["synth", "--dataset", "demo", "--out", str(out), "--image-method", "blur"]
    assert main([*args, "--contact-sheet", "3"]) == 0
    return out


def records(out: Path) -> dict:
    return {r.image_id: r for r in read_demo(out / "demo-data").records}


def test_contact_sheet_is_the_report_sheet(demo, tmp_path):
    keys = [s.key for s in iter_samples(demo, images=False)]
    rows = sheet_rows(demo, records(demo), 3)
    assert [r.sample.key for r in rows] == keys[:3]  # the run's first samples, in order
    assert [r.index for r in rows] == [0, 1, 2]
    written = Image.open(demo / "contact_sheet.png")
    assert np.array_equal(np.asarray(written.convert("RGB")), np.asarray(draw_sheet(rows)))
    # the same renderer as the report's sheets: same columns, same width
    report = write_report(demo, tmp_path / "report", n=ROWS_PER_SHEET)
    assert written.width == Image.open(report.sheets[0]).width
    again = contact_sheet(rows, tmp_path / "again" / "sheet.png")
    assert np.array_equal(np.asarray(Image.open(again)), np.asarray(written))


def test_contact_sheet_rows_need_their_original(demo):
    by_id = records(demo)
    first = next(iter_samples(demo, images=False)).meta.image_id
    only = sheet_rows(demo, {first: by_id[first]}, 8)
    assert only and {r.meta.image_id for r in only} == {first}
    assert all(r.original.image is not None for r in only)
    assert sheet_rows(demo, {}, 8) == []  # no record and no corpus source: nothing to show
    with pytest.raises(ValueError, match="at least one row"):
        contact_sheet([], demo / "none.png")


VERDICT = {
    "passed": False,
    "failed": ["verify-removal", "verify-retention"],
    "removal": [
        {
            "class": "flag",
            "rank_before": 1,
            "rank_after": 2,
            "prob_before": 0.91234,
            "prob_after": 0.7,
            "removed": False,
        },
        {
            "class": "dog",
            "rank_before": 3,
            "rank_after": 40,
            "prob_before": 0.2,
            "prob_after": 0.001,
            "removed": True,
        },
    ],
    "retention": [{"class": "person", "rank": 9, "prob": 0.01, "kept": False}],
    "text": {"names_removed": ["flag"], "names_kept": True},
    "model": "tiny-clip",
    "k": 5,
    "retention_k": 10,
}


def test_verdict_lines():
    v = verdict_lines(VerifyMeta.from_dict(VERDICT))
    assert (v.passed, v.settings, v.failed) == (
        False,
        "model=tiny-clip, k=5",
        ("verify-removal", "verify-retention"),
    )
    assert v.checks == (
        CheckLine("removed flag", ("1", "2"), ("0.912", "0.7"), False, "still seen"),
        CheckLine("removed dog", ("3", "40"), ("0.2", "0.001"), True, "still seen"),
        CheckLine("kept person", ("9",), ("0.01",), False, "lost"),
    )
    assert v.text_summary(160) == 'names_removed=["flag"], names_kept=True'
    assert v.text_summary(10) == "names_rem…"
    none = verdict_lines(VerifyMeta.from_dict({**VERDICT, "text": None, "removal": []}))
    assert none.text is None and none.text_summary(160) is None
