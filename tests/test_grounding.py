"""Grounding metrics: IoU rules, AIoU/accuracy, Krippendorff's alpha, Toloka files and CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from counterfactual import cli
from counterfactual.cli import main
from counterfactual.tools.grounding import (
    GroundingScores,
    align_boxes,
    grounding_scores,
    iou,
    krippendorff_alpha_iou,
    pairwise_iou,
    read_toloka_csv,
    score_toloka_files,
)

TOLOKA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "toloka"
needs_toloka = pytest.mark.skipif(
    not (TOLOKA / "test_private.csv").is_file(),
    reason=f"Toloka VQA files not found at {TOLOKA} (the shared data folder beside the repo)",
)

HEADER = "image,width,height,left,top,right,bottom,question\n"
NAN4 = [np.nan] * 4


@pytest.fixture
def run_cli(monkeypatch: pytest.MonkeyPatch):
    """``main`` with only this command registered, so other subcommands cannot break it."""
    monkeypatch.setattr(cli, "SUBCOMMANDS", ("score-boxes",))
    return main


def write_csv(path: Path, rows: list[str]) -> Path:
    path.write_text(HEADER + "".join(row + "\n" for row in rows), encoding="utf-8")
    return path


# --- IoU ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pred", "truth", "expected"),
    [
        pytest.param([0, 0, 4, 4], [0, 0, 4, 4], 1.0, id="identical"),
        pytest.param([0, 0, 2, 2], [5, 5, 7, 7], 0.0, id="disjoint"),
        pytest.param([0, 0, 2, 2], [2, 0, 4, 2], 0.0, id="touching-edge"),
        pytest.param([0, 0, 2, 2], [2, 2, 4, 4], 0.0, id="touching-corner"),
        pytest.param([1, 1, 3, 3], [0, 0, 4, 4], 0.25, id="nested"),  # 4 / 16
        pytest.param([0, 0, 2, 2], [1, 1, 3, 3], 1 / 7, id="overlap"),  # 1 / (4 + 4 - 1)
        pytest.param([0, 0, 2, 1], [0, 0, 2, 2], 0.5, id="half"),
        pytest.param([0, 0, 10, 7], [0, 0, 10, 10], 0.7, id="seventy"),
        pytest.param([3, 3, 3, 3], [3, 3, 3, 3], 1.0, id="same-point"),
        pytest.param([1, 1, 1, 1], [0, 0, 2, 2], 0.0, id="point-inside-box"),
        pytest.param([1, 1, 1, 1], [2, 2, 2, 2], 0.0, id="different-points"),
    ],
)
def test_iou_rules(pred: list[float], truth: list[float], expected: float) -> None:
    assert iou([pred], [truth]) == pytest.approx([expected], abs=1e-12)
    assert iou([truth], [pred]) == pytest.approx([expected], abs=1e-12)


def test_iou_is_per_row_and_pairwise_is_all_pairs() -> None:
    a = np.array([[0, 0, 2, 2], [1, 1, 3, 3]])
    b = np.array([[0, 0, 2, 2], [0, 0, 4, 4]])
    assert iou(a, b) == pytest.approx([1.0, 0.25])
    assert pairwise_iou(a, b) == pytest.approx(np.array([[1.0, 0.25], [1 / 7, 0.25]]))


@pytest.mark.parametrize(
    ("pred", "truth", "message"),
    [
        pytest.param([[0, 0, 1]], [[0, 0, 1, 1]], "shape", id="three-coordinates"),
        pytest.param([0, 0, 1, 1], [0, 0, 1, 1], "shape", id="one-dimensional"),
        pytest.param([[2, 0, 1, 1]], [[0, 0, 1, 1]], "pred row 0 is not xyxy", id="right<left"),
        pytest.param([[0, 0, 1, 1]], [[0, 2, 1, 1]], "truth row 0 is not xyxy", id="bottom<top"),
        pytest.param([[0, 0, np.nan, 1]], [[0, 0, 1, 1]], "non-finite", id="nan"),
        pytest.param([[0, 0, 1, 1]] * 2, [[0, 0, 1, 1]], "2 boxes but truth has 1", id="lengths"),
    ],
)
def test_iou_rejects_bad_boxes(pred: object, truth: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        iou(pred, truth)


def test_grounding_scores_three_rows_with_thresholds_at_the_boundary() -> None:
    pred = [[0, 0, 4, 4], [0, 0, 2, 1], [0, 0, 10, 7]]
    truth = [[0, 0, 4, 4], [0, 0, 2, 2], [0, 0, 10, 10]]
    scores = grounding_scores(pred, truth)  # IoU 1.0, 0.5, 0.7; thresholds are strict
    assert scores.n == 3
    assert scores.aiou == pytest.approx(220 / 3)
    assert scores.acc_50 == pytest.approx(2 / 3)
    assert scores.acc_70 == pytest.approx(1 / 3)
    assert set(scores.as_dict()) == {"n", "aiou", "iou_gt_0.5", "iou_gt_0.7"}


def test_grounding_scores_rejects_empty_input() -> None:
    with pytest.raises(ValueError, match="no boxes"):
        grounding_scores(np.zeros((0, 4)), np.zeros((0, 4)))


# --- Krippendorff's alpha -------------------------------------------------------------------

P, Q, R = [0, 0, 2, 2], [0, 0, 2, 1], [10, 10, 12, 12]  # IoU(P, Q) = 0.5; R is far away


def test_alpha_perfect_agreement_is_one() -> None:
    boxes = [[P, Q, R], [P, Q, R], [P, NAN4, R]]
    assert krippendorff_alpha_iou(boxes) == 1.0


def test_alpha_hand_example() -> None:
    # Unit 1: P vs Q (d = 0.5); unit 2: R vs R (d = 0); n = 4 pairable boxes, m_u = 2.
    # D_o = (1/4) * (1/(2-1)) * 2 * 0.5 = 0.25.
    # Unordered pairs of {P, Q, R, R}: PQ 0.5, PR 1, PR 1, QR 1, QR 1, RR 0 -> 4.5, ordered 9.
    # D_e = 9 / (4 * 3) = 0.75, alpha = 1 - 0.25 / 0.75 = 2/3.
    assert krippendorff_alpha_iou([[P, R], [Q, R]]) == pytest.approx(2 / 3)
    # A unit with a single box is not pairable and changes nothing; nor does a missing annotator.
    with_lone = [[P, R, Q], [Q, R, NAN4], [NAN4, NAN4, NAN4]]
    assert krippendorff_alpha_iou(with_lone) == pytest.approx(2 / 3)


def test_alpha_matches_krippendorff_package_nominal() -> None:
    """Pairwise-disjoint boxes make 1 - IoU the nominal metric; the package's own example."""
    krippendorff = pytest.importorskip("krippendorff")
    data = np.array(
        [
            [np.nan, np.nan, np.nan, np.nan, np.nan, 3, 4, 1, 2, 1, 1, 3, 3, np.nan, 3],
            [1, np.nan, 2, 1, 3, 3, 4, 3, np.nan, np.nan, np.nan, np.nan, np.nan, np.nan, np.nan],
            [np.nan, np.nan, 2, 1, 3, 4, 4, np.nan, 2, 1, 1, 3, 3, np.nan, 4],
        ]
    )
    boxes = np.stack([10 * data, np.zeros_like(data), 10 * data + 5, 5 + np.zeros_like(data)], -1)
    boxes[np.isnan(data)] = np.nan
    expected = krippendorff.alpha(reliability_data=data, level_of_measurement="nominal")
    assert round(expected, 6) == 0.691358
    assert krippendorff_alpha_iou(boxes) == pytest.approx(expected, abs=1e-12)


def test_alpha_matches_krippendorff_package_with_iou_metric() -> None:
    """Random overlapping boxes with missing values; the package gets 1 - IoU as a callable."""
    krippendorff = pytest.importorskip("krippendorff")
    rng = np.random.default_rng(7)
    base = rng.integers(0, 50, size=(12, 2))
    size = rng.integers(5, 30, size=(12, 2))
    truth = np.concatenate([base, base + size], axis=1).astype(float)
    boxes = np.stack([truth + rng.integers(-4, 5, size=truth.shape) for _ in range(3)])
    boxes[..., 2:] = np.maximum(boxes[..., 2:], boxes[..., :2])
    boxes[rng.random(boxes.shape[:2]) < 0.25] = np.nan

    present = ~np.isnan(boxes).any(-1)
    unique, inverse = np.unique(boxes[present], axis=0, return_inverse=True)
    ids = np.full(boxes.shape[:2], np.nan)
    ids[present] = inverse.ravel()

    def one_minus_iou(v1, v2, i1, i2, n_v, dtype=np.float64):
        # the package asks for the (V, V) matrix: i1 is (V, 1), i2 is (1, V)
        return (1.0 - pairwise_iou(unique[i1[:, 0]], unique[i2[0]])).astype(dtype)

    expected = krippendorff.alpha(
        reliability_data=ids,
        level_of_measurement=one_minus_iou,
        value_domain=np.arange(len(unique)),
    )
    assert krippendorff_alpha_iou(boxes) == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize(
    ("boxes", "message"),
    [
        pytest.param([[P, NAN4], [NAN4, Q]], "no unit has boxes from two", id="not-pairable"),
        pytest.param([[P, P], [P, P]], "no variation", id="all-identical"),
        pytest.param([[P, [0, 0, np.nan, 1]], [P, Q]], "annotator 0 unit 1", id="partial-nan"),
        pytest.param([[[2, 0, 1, 1]], [P]], "annotator 0 row 0 is not xyxy", id="inverted"),
        pytest.param([P, Q], "shape", id="two-dimensional"),
    ],
)
def test_alpha_rejects_bad_input(boxes: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        krippendorff_alpha_iou(boxes)


# --- Toloka files ---------------------------------------------------------------------------


@needs_toloka
def test_reproduces_toloka_crowd_baseline_on_private_test() -> None:
    result = score_toloka_files(
        TOLOKA / "test_private.csv", TOLOKA / "test_private_crowd_baseline.csv"
    )
    # Table 2 of Ustalov et al. (2023), "Crowdsourcing" row.
    assert result.scores.n == 4504
    assert round(result.scores.aiou, 3) == 87.154
    assert round(result.scores.acc_50, 3) == 0.954
    assert round(result.scores.acc_70, 3) == 0.914
    assert result.krippendorff_alpha is None


def test_reads_and_aligns_rows_by_image_and_question(tmp_path: Path) -> None:
    truth = write_csv(
        tmp_path / "truth.csv",
        ['a.jpg,640,480,0,0,4,4,"What, exactly?"', "b.jpg,640,480,0,0,2,2,Where?"],
    )
    pred = write_csv(
        tmp_path / "pred.csv",
        ["b.jpg,640,480,1,1,3,3,Where?", 'a.jpg,640,480,1,1,3,3,"What, exactly?"'],
    )
    truth_file = read_toloka_csv(truth)
    assert truth_file.rows[0].question == "What, exactly?"
    assert truth_file.rows[0].box == (0.0, 0.0, 4.0, 4.0)
    assert [row.line for row in truth_file.rows] == [2, 3]
    aligned = align_boxes(truth_file, read_toloka_csv(pred))
    assert aligned.pred.tolist() == [[1, 1, 3, 3], [1, 1, 3, 3]]
    assert iou(aligned.pred, aligned.truth) == pytest.approx([0.25, 1 / 7])


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        pytest.param(
            ["a,640,480,0,0,4,4,q", "b,640,480,0,x,4,4,q"], "line 3: column 'top'", id="non-numeric"
        ),
        pytest.param(["a,640,480,5,0,4,4,q"], "line 2: right 4 < left 5", id="right<left"),
        pytest.param(["a,640,480,0,5,4,4,q"], "line 2: bottom 4 < top 5", id="bottom<top"),
        pytest.param(
            ["a,640,480,0,0,4,4,q", "a,640,480,1,1,4,4,q"],
            "line 3: duplicate of line 2",
            id="duplicate",
        ),
        pytest.param(["a,640,480,0,0,nan,4,q"], "line 2: column 'right' is not a finite", id="nan"),
        pytest.param(
            ["a,640,480,0,0,4,4"], "line 2: no value in column 'question'", id="short-row"
        ),
        pytest.param(["a,640,480,0,0,4,4,q,extra"], "line 2: more cells", id="long-row"),
        pytest.param(
            ["a,0,480,0,0,4,4,q"], "line 2: width must be a positive integer", id="zero-width"
        ),
    ],
)
def test_csv_errors_name_file_and_line(tmp_path: Path, rows: list[str], message: str) -> None:
    path = write_csv(tmp_path / "bad.csv", rows)
    with pytest.raises(ValueError, match=message) as info:
        read_toloka_csv(path)
    assert str(path) in str(info.value)


def test_csv_without_required_column(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("image,left,top,right,bottom,question\na,0,0,1,1,q\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad.csv line 1: header lacks column\(s\) width, height"):
        read_toloka_csv(path)


def test_missing_and_extra_prediction_rows_name_the_line(tmp_path: Path) -> None:
    truth = write_csv(tmp_path / "truth.csv", ["a,640,480,0,0,4,4,q", "b,640,480,0,0,4,4,q"])
    short = write_csv(tmp_path / "short.csv", ["a,640,480,0,0,4,4,q"])
    extra = write_csv(
        tmp_path / "extra.csv",
        ["a,640,480,0,0,4,4,q", "b,640,480,0,0,4,4,q", "c,640,480,0,0,4,4,q"],
    )
    with pytest.raises(ValueError, match=r"short.csv: no row for image 'b'.*truth.csv line 3"):
        score_toloka_files(truth, short)
    with pytest.raises(ValueError, match=r"extra.csv line 4: image 'c'.* is not in .*truth.csv"):
        score_toloka_files(truth, extra)


def test_annotator_alpha_with_missing_rows(tmp_path: Path) -> None:
    truth = write_csv(tmp_path / "truth.csv", ["u1,640,480,0,0,2,2,q", "u2,640,480,0,0,2,2,q"])
    a = write_csv(tmp_path / "a.csv", ["u1,640,480,0,0,2,2,q", "u2,640,480,10,10,12,12,q"])
    b = write_csv(tmp_path / "b.csv", ["u1,640,480,0,0,2,1,q", "u2,640,480,10,10,12,12,q"])
    c = write_csv(tmp_path / "c.csv", ["u1,640,480,0,0,2,1,q"])  # no row for u2
    result = score_toloka_files(truth, a, [a, b])
    assert result.krippendorff_alpha == pytest.approx(2 / 3)  # the hand example above
    assert result.as_dict()["annotators"] == 2
    # c adds Q to unit 1: {P, Q, Q} and {R, R}; D_o = (1/5)(2*0.5*2/2) = 0.2,
    # D_e: ordered sum 2*(2*0.5 + 6*1) = 14 over 5*4 -> 0.7; alpha = 1 - 0.2/0.7 = 5/7.
    assert score_toloka_files(truth, a, [a, b, c]).krippendorff_alpha == pytest.approx(5 / 7)
    with pytest.raises(ValueError, match="two or more annotator files"):
        score_toloka_files(truth, a, [a])


# --- CLI ------------------------------------------------------------------------------------


def test_score_boxes_is_registered() -> None:
    assert "score-boxes" in cli.SUBCOMMANDS


def test_cli_prints_json(run_cli, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    truth = write_csv(tmp_path / "truth.csv", ["u1,640,480,0,0,4,4,q", "u2,640,480,0,0,2,2,q"])
    pred = write_csv(tmp_path / "pred.csv", ["u1,640,480,1,1,3,3,q", "u2,640,480,0,0,2,2,q"])
    assert run_cli(["score-boxes", "--truth", str(truth), "--pred", str(pred)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out == {"n": 2, "aiou": 62.5, "iou_gt_0.5": 0.5, "iou_gt_0.7": 0.5}


def test_cli_error_names_line(run_cli, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    truth = write_csv(tmp_path / "truth.csv", ["u1,640,480,0,0,4,4,q"])
    pred = write_csv(tmp_path / "pred.csv", ["u1,640,480,3,0,1,4,q"])
    assert run_cli(["score-boxes", "--truth", str(truth), "--pred", str(pred)]) == 2
    assert "pred.csv line 2: right 1 < left 3" in capsys.readouterr().err


def test_cli_with_annotators(run_cli, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    truth = write_csv(tmp_path / "truth.csv", ["u1,640,480,0,0,2,2,q", "u2,640,480,0,0,2,2,q"])
    a = write_csv(tmp_path / "a.csv", ["u1,640,480,0,0,2,2,q", "u2,640,480,10,10,12,12,q"])
    b = write_csv(tmp_path / "b.csv", ["u1,640,480,0,0,2,1,q", "u2,640,480,10,10,12,12,q"])
    argv = ["score-boxes", "--truth", str(truth), "--pred", str(a), "--annotators", str(a), str(b)]
    assert run_cli(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["krippendorff_alpha"] == pytest.approx(2 / 3)
    assert out["annotators"] == 2


@needs_toloka
def test_cli_on_toloka_private_test(run_cli, capsys: pytest.CaptureFixture[str]) -> None:
    truth, pred = TOLOKA / "test_private.csv", TOLOKA / "test_private_crowd_baseline.csv"
    assert run_cli(["score-boxes", "--truth", str(truth), "--pred", str(pred)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n"] == 4504
    assert round(out["aiou"], 3) == 87.154
    assert round(out["iou_gt_0.5"], 3) == 0.954
    assert round(out["iou_gt_0.7"], 3) == 0.914


def test_scores_dataclass_is_frozen() -> None:
    scores = GroundingScores(n=1, aiou=100.0, acc_50=1.0, acc_70=1.0)
    with pytest.raises(AttributeError):
        scores.n = 2  # type: ignore[misc]
