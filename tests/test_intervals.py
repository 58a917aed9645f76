"""Table 1 of the Toloka VQA paper (seed 001): 95% confidence intervals from the CSVs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from counterfactual import cli
from counterfactual.cli import main
from counterfactual.tools.grounding.intervals import (
    TABLE1_COLUMNS,
    Interval,
    format_table1,
    mean_interval,
    subset_intervals,
)

TOLOKA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "toloka"
needs_toloka = pytest.mark.skipif(
    not (TOLOKA / "test_private.csv").is_file(),
    reason=f"Toloka VQA files not found at {TOLOKA} (the shared data folder beside the repo)",
)

# Ustalov et al. (2023), Table 1 "Descriptive statistics of our dataset", the two test subsets
# (the train subset's CSV is not in the shared data): number of instances, then 95% confidence
# intervals of image width, image height, bounding box width, bounding box height (pixels) and
# question length (characters including spaces).
PAPER_TABLE1 = {
    "test_public": (1705, [(573, 583), (483, 493), (91, 100), (88, 97), (36, 39)]),
    "test_private": (4504, [(578, 584), (480, 487), (95, 101), (89, 94), (36, 38)]),
}

HEADER = "image,width,height,left,top,right,bottom,question\n"


@pytest.fixture
def run_cli(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(cli, "SUBCOMMANDS", ("score-boxes",))
    return main


def write_csv(path: Path, rows: list[str]) -> Path:
    path.write_text(HEADER + "".join(row + "\n" for row in rows), encoding="utf-8")
    return path


def test_interval_by_hand() -> None:
    # values 1, 2, 3, 6: mean 3, sample sd sqrt(14 / 3), half width 1.96 * sd / 2
    got = mean_interval([1, 2, 3, 6])
    half = 1.96 * math.sqrt(14 / 3) / 2
    assert got == Interval(
        n=4, mean=3.0, sd=pytest.approx(math.sqrt(14 / 3)), low=got.low, high=got.high
    )
    assert (got.low, got.high) == (pytest.approx(3 - half), pytest.approx(3 + half))
    assert got.rounded() == (0.0, 6.0)  # 0.883..., 5.116... outwards
    assert got.rounded(1) == (0.8, 5.2)


def test_rounding_is_outward_even_near_whole_numbers() -> None:
    interval = Interval(n=2, mean=5.0, sd=1.0, low=4.999, high=5.001)
    assert interval.rounded() == (4.0, 6.0)
    assert Interval(n=2, mean=5.0, sd=0.0, low=5.0, high=5.0).rounded() == (5.0, 5.0)


@pytest.mark.parametrize(
    ("values", "z", "message"),
    [
        ([1.0], 1.96, "two or more"),
        ([[1.0, 2.0]], 1.96, "1-D"),
        ([1.0, float("nan")], 1.96, "finite"),
        ([1.0, 2.0], 0.0, "z must be a finite number > 0, got 0.0"),
    ],
)
def test_bad_input_names_the_value(values, z: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        mean_interval(values, z)


def test_subset_columns_from_a_file(tmp_path: Path) -> None:
    path = write_csv(
        tmp_path / "tiny.csv",
        ["u1,640,480,0,0,10,20,Where?", "u2,500,400,5,5,25,10,What is it"],
    )
    row = subset_intervals(path)
    assert row.name == "tiny" and row.n == 2
    means = {c: row.intervals[c].mean for c in TABLE1_COLUMNS}
    # box width right - left (10, 20), height bottom - top (20, 5), lengths 6 and 10
    assert means == {
        "image_width": 570.0,
        "image_height": 440.0,
        "box_width": 15.0,
        "box_height": 12.5,
        "question_length": 8.0,
    }
    one = write_csv(tmp_path / "one.csv", ["u1,640,480,0,0,10,20,q"])
    with pytest.raises(ValueError, match="one.csv: an interval needs two or more rows, got 1"):
        subset_intervals(one)


@needs_toloka
@pytest.mark.parametrize("subset", sorted(PAPER_TABLE1))
def test_reproduces_table1(subset: str) -> None:
    row = subset_intervals(TOLOKA / f"{subset}.csv")
    n, bounds = PAPER_TABLE1[subset]
    assert row.n == n
    got = [tuple(int(b) for b in row.intervals[c].rounded()) for c in TABLE1_COLUMNS]
    assert got == bounds


@needs_toloka
def test_cli_prints_table1(run_cli, capsys: pytest.CaptureFixture[str]) -> None:
    files = [str(TOLOKA / "test_public.csv"), str(TOLOKA / "test_private.csv")]
    assert run_cli(["score-boxes", "--intervals", *files]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == (
        "| test_public | 1,705 | (573, 583) | (483, 493) | (91, 100) | (88, 97) | (36, 39) |"
    )
    assert lines[3] == (
        "| test_private | 4,504 | (578, 584) | (480, 487) | (95, 101) | (89, 94) | (36, 38) |"
    )


def test_cli_json_and_digits(run_cli, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_csv(tmp_path / "s.csv", ["u1,640,480,0,0,10,20,ab", "u2,640,480,0,0,10,20,abcd"])
    assert run_cli(["score-boxes", "--intervals", str(path), "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["subset"] == "s" and row["n"] == 2
    assert row["image_width"] == {"mean": 640.0, "sd": 0.0, "low": 640.0, "high": 640.0}
    # question lengths 2 and 4: sd sqrt(2), half width 1.96 * sqrt(2) / sqrt(2) = 1.96
    assert row["question_length"]["low"] == pytest.approx(3 - 1.96)
    assert run_cli(["score-boxes", "--intervals", str(path), "--digits", "2"]) == 0
    assert capsys.readouterr().out.splitlines()[2].endswith("| (1.04, 4.96) |")
    assert format_table1([subset_intervals(path)]).splitlines()[2].endswith("| (1, 5) |")


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--truth", "t.csv"], "--intervals takes no --truth"),
        (["--z", "0"], "argument --z: 0 is not a number > 0"),
        (["--digits", "-1"], "argument --digits: -1 is not a whole number >= 0"),
    ],
)
def test_cli_refuses_bad_options(
    run_cli, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra, message: str
) -> None:
    path = write_csv(tmp_path / "s.csv", ["u1,640,480,0,0,10,20,ab", "u2,640,480,0,0,10,20,abcd"])
    try:
        code = run_cli(["score-boxes", "--intervals", str(path), *extra])
    except SystemExit as exit_:  # argparse refuses the value itself
        code = exit_.code
    assert code == 2
    assert message in capsys.readouterr().err


def test_cli_scoring_still_needs_truth_and_pred(
    run_cli, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_csv(tmp_path / "s.csv", ["u1,640,480,0,0,10,20,ab"])
    assert run_cli(["score-boxes", "--truth", str(path)]) == 2
    assert "needs --truth and --pred" in capsys.readouterr().err
