"""Sum-H and Max-H hinge losses over in-batch negatives (seed 003, section 5 and appendix)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from counterfactual import cli
from counterfactual.cli import main
from counterfactual.text.perturb import GroundedSample, in_batch_negative_sets
from counterfactual.train.hinge import hinge_loss, max_hinge_loss, negative_mask, sum_hinge_loss

try:
    import torch
except ImportError:  # the losses need the models extra; the perturb tests below do not
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")

# scores[i, j]: image i against text j, positives on the diagonal.
S2 = [[0.5, 0.6], [0.1, 0.4]]
# margin 0.2. image->text: anchor 0: [0.2 - 0.5 + 0.6]+ = 0.3, anchor 1: [0.2 - 0.4 + 0.1]+ = 0.
# text->image: text 0: [0.2 - 0.5 + 0.1]+ = 0, text 1: [0.2 - 0.4 + 0.6]+ = 0.4.
S3 = [[0.8, 0.6, 0.1], [0.7, 0.5, 0.4], [0.2, 0.9, 0.3]]
# margin 0.2, hinges per anchor (image->text row | text->image column):
#   k=0: row [0.0, 0]      column [0.1, 0]
#   k=1: row [0.4, 0.1]    column [0.3, 0.6]
#   k=2: row [0.1, 0.8]    column [0.0, 0.3]
# Sum-H = 0 + 0.1 + 0.5 + 0.9 + 0.9 + 0.3 = 2.7; Max-H = 0 + 0.1 + 0.4 + 0.6 + 0.8 + 0.3 = 2.2


def t(rows: list[list[float]], grad: bool = False) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64, requires_grad=grad)


@needs_torch
@pytest.mark.parametrize(
    ("fn", "scores", "reduction", "expected"),
    [
        (sum_hinge_loss, S2, "sum", 0.7),
        (max_hinge_loss, S2, "sum", 0.7),  # one negative each: max = sum
        (sum_hinge_loss, S2, "mean", 0.35),
        (sum_hinge_loss, S3, "sum", 2.7),
        (max_hinge_loss, S3, "sum", 2.2),
        (sum_hinge_loss, S3, "mean", 0.9),
        (max_hinge_loss, S3, "mean", 2.2 / 3),
    ],
)
def test_hand_computed_values(fn, scores, reduction: str, expected: float) -> None:
    assert fn(t(scores), 0.2, reduction=reduction).item() == pytest.approx(expected, abs=1e-12)


@needs_torch
def test_margin_zero_and_large() -> None:
    # margin 0: only negatives that beat their positive count: row 1 (0.7 - 0.5), row 2
    # (0.9 - 0.3), column 1 (0.6 - 0.5 and 0.9 - 0.5), column 2 (0.4 - 0.3)
    assert sum_hinge_loss(t(S3), 0.0).item() == pytest.approx(0.2 + 0.6 + 0.1 + 0.4 + 0.1)
    # margin 10: every hinge active: sum = 12 * 10 - 2 * 2 * trace + 2 * off-diagonal sum
    off = sum(S3[i][j] for i in range(3) for j in range(3) if i != j)
    trace = 0.8 + 0.5 + 0.3
    assert sum_hinge_loss(t(S3), 10.0).item() == pytest.approx(12 * 10 - 4 * trace + 2 * off)


@needs_torch
def test_gradients_flow_to_scores() -> None:
    scores = t(S2, grad=True)
    sum_hinge_loss(scores, 0.2).backward()
    # active hinges: image 0 vs text 1 (+1 at [0, 1], -1 at [0, 0]) and text 1 vs image 0
    # (+1 at [0, 1], -1 at [1, 1])
    assert scores.grad.tolist() == [[-1.0, 2.0], [0.0, -1.0]]
    scores = t(S3, grad=True)
    max_hinge_loss(scores, 0.2).backward()
    # hardest active negatives: text 0 <- image 1, row 1 -> text 0, column 1 <- image 2,
    # row 2 -> text 1, column 2 <- image 1 (row 0's hinge is exactly 0 only on paper: 0.2 -
    # 0.8 + 0.6 rounds below or above 0, so that entry is not checked)
    grad = scores.grad
    assert grad[1, 0].item() == 2.0  # row 1 -> text 0 and text 0 <- image 1
    assert grad[2, 1].item() == 2.0  # row 2 -> text 1 and text 1 <- image 2
    assert grad[1, 2].item() == 1.0
    assert grad[2, 0].item() == 0.0 and grad[0, 2].item() == 0.0


@needs_torch
def test_sampling_all_negatives_equals_all() -> None:
    scores = torch.randn(6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for fn in (sum_hinge_loss, max_hinge_loss):
        full = fn(scores, 0.3)
        for k in (5, 9):  # n - 1, and more than there are
            drawn = fn(scores, 0.3, negatives=k, generator=torch.Generator().manual_seed(0))
            assert drawn.item() == pytest.approx(full.item(), abs=1e-12)


@needs_torch
def test_sampled_negatives_per_anchor() -> None:
    mask = negative_mask(8, 3, generator=torch.Generator().manual_seed(0))
    assert mask.dtype == torch.bool and mask.shape == (8, 8)
    assert mask.sum(dim=1).tolist() == [3] * 8
    assert not mask.diagonal().any()
    again = negative_mask(8, 3, generator=torch.Generator().manual_seed(0))
    assert torch.equal(mask, again)
    others = {
        tuple(negative_mask(8, 3, generator=torch.Generator().manual_seed(s)).flatten().tolist())
        for s in range(5)
    }
    assert len(others) > 1


@needs_torch
def test_sampled_loss_is_bounded_by_full() -> None:
    scores = torch.randn(10, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    gen = torch.Generator().manual_seed(3)
    assert sum_hinge_loss(scores, 0.2, 4, gen) <= sum_hinge_loss(scores, 0.2)
    assert max_hinge_loss(scores, 0.2, 4, gen) <= max_hinge_loss(scores, 0.2)


@needs_torch
def test_exclude_drops_false_negatives() -> None:
    # images 0 and 1 are the same picture: text 1 is no negative of image 0 and vice versa
    exclude = torch.zeros(3, 3, dtype=torch.bool)
    exclude[0, 1] = exclude[1, 0] = True
    got = sum_hinge_loss(t(S3), 0.2, exclude=exclude).item()
    # drop row 0's [0, 1] (0.0), row 1's [1, 0] (0.4), column 1's [0, 1] (0.3), column 0's
    # [1, 0] (0.1) from 2.7
    assert got == pytest.approx(2.7 - 0.4 - 0.3 - 0.1)
    mask = negative_mask(3, 1, exclude=exclude, generator=torch.Generator().manual_seed(0))
    assert mask[:2].tolist() == [[False, False, True], [False, False, True]]  # the only ones
    assert mask[2].sum().item() == 1 and not mask[2, 2]


@needs_torch
def test_all_negatives_excluded_adds_nothing() -> None:
    exclude = torch.ones(2, 2, dtype=torch.bool)
    assert max_hinge_loss(t(S2), 0.2, exclude=exclude).item() == 0.0
    assert sum_hinge_loss(t(S2), 0.2, exclude=exclude).item() == 0.0


@needs_torch
def test_dispatch_by_name() -> None:
    assert hinge_loss("sum-h", t(S3), 0.2).item() == pytest.approx(2.7)
    assert hinge_loss("max-h", t(S3), 0.2).item() == pytest.approx(2.2)


@needs_torch
@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"scores": lambda: torch.zeros(2, 3)}, "square"),
        ({"scores": lambda: torch.zeros(4)}, "2-D"),
        ({"scores": lambda: torch.zeros(1, 1)}, "n=1"),
        ({"scores": lambda: torch.zeros(2, 2, dtype=torch.int64)}, "floating point"),
        ({"margin": -0.1}, "margin must be a finite number >= 0, got -0.1"),
        ({"margin": float("nan")}, "margin"),
        ({"negatives": 0}, "negatives must be a whole number >= 1 or None, got 0"),
        ({"reduction": "max"}, "reduction must be one of"),
        ({"loss": "triplet"}, "loss must be one of"),
        ({"exclude": lambda: torch.zeros(3, 3, dtype=torch.bool)}, "exclude must be a bool tensor"),
    ],
)
def test_bad_arguments_name_the_value(kwargs: dict, message: str) -> None:
    args = {"loss": "sum-h", "scores": torch.zeros(2, 2), "margin": 0.2} | kwargs
    args = {key: value() if callable(value) else value for key, value in args.items()}
    with pytest.raises(ValueError, match=message):
        hinge_loss(args.pop("loss"), args.pop("scores"), args.pop("margin"), **args)


# --- several partners per anchor in `counterfactual perturb` ----------------------------------

BATCH = [
    GroundedSample("a.jpg", "the red car", (0, 0, 1, 1)),
    GroundedSample("b.jpg", "a dog", (0, 0, 2, 2)),
    GroundedSample("a.jpg", "red car on the left", (0, 0, 1, 1)),  # same object as 0
    GroundedSample("c.jpg", "the man", (1, 1, 2, 2)),
    GroundedSample("c.jpg", "the tree", (0, 0, 1, 1)),
]


def test_all_partners_skip_the_same_object() -> None:
    sets = in_batch_negative_sets(BATCH, seed=0)
    assert [[n.partner for n in found] for found in sets] == [
        [1, 3, 4],
        [0, 2, 3, 4],
        [1, 3, 4],
        [0, 1, 2, 4],
        [0, 1, 2, 3],
    ]
    first = sets[1][0]
    assert first.image_swapped == GroundedSample("a.jpg", "a dog", (0, 0, 1, 1))
    assert first.expression_swapped == GroundedSample("b.jpg", "the red car", (0, 0, 2, 2))


def test_sampled_partners_are_seeded_distinct_and_valid() -> None:
    sets = in_batch_negative_sets(BATCH, seed=7, count=2)
    allowed = [p for p in in_batch_negative_sets(BATCH, seed=0)]
    for i, found in enumerate(sets):
        partners = [n.partner for n in found]
        assert len(partners) == 2 == len(set(partners)) and partners == sorted(partners)
        assert set(partners) <= {n.partner for n in allowed[i]}
        assert all(n.anchor == i for n in found)
    assert sets == in_batch_negative_sets(BATCH, seed=7, count=2)
    draws = {
        tuple(tuple(n.partner for n in f) for f in in_batch_negative_sets(BATCH, s, 2))
        for s in range(10)
    }
    assert len(draws) > 1
    with pytest.raises(ValueError, match="count must be a whole number >= 1 or None, got 0"):
        in_batch_negative_sets(BATCH, seed=0, count=0)


@pytest.fixture
def run_cli(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(cli, "SUBCOMMANDS", ("perturb",))
    return main


def _write_batch(path: Path) -> Path:
    lines = [
        json.dumps({"image": s.image, "expression": s.expression, "box": list(s.box)})
        for s in BATCH
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_cli_negatives_all_and_sampled(run_cli, tmp_path: Path) -> None:
    source, out = _write_batch(tmp_path / "in.jsonl"), tmp_path / "out.jsonl"
    base = ["perturb", "--input", str(source), "--output", str(out), "--mode", "negatives"]
    assert run_cli([*base, "--negatives", "all"]) == 0
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [row["negative_partners"] for row in rows][:2] == [[1, 3, 4], [0, 2, 3, 4]]
    assert rows[0]["negatives_image_swapped"][0] == {
        "image": "b.jpg",
        "expression": "the red car",
        "box": [0, 0, 2, 2],
    }
    assert "negative_partner" not in rows[0]
    assert run_cli([*base, "--negatives", "2", "--seed", "3"]) == 0
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert all(len(row["negative_partners"]) == 2 for row in rows)
    assert all(len(row["negatives_expression_swapped"]) == 2 for row in rows)
    assert run_cli(base) == 0  # default: one partner, the fields as before
    rows = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert all(isinstance(row["negative_partner"], int) for row in rows)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--mode", "negatives", "--negatives", "0"], "argument --negatives: 0 is not"),
        (["--mode", "negatives", "--negatives", "some"], "argument --negatives: 'some' is not"),
        (["--mode", "shuffle", "--negatives", "all"], "--negatives all needs --mode negatives"),
    ],
)
def test_cli_negatives_refused(
    run_cli, tmp_path: Path, capsys: pytest.CaptureFixture[str], extra, message: str
) -> None:
    source = _write_batch(tmp_path / "in.jsonl")
    argv = ["perturb", "--input", str(source), "--output", str(tmp_path / "o.jsonl"), *extra]
    try:
        code = run_cli(argv)
    except SystemExit as exit_:  # argparse refuses the value itself
        code = exit_.code
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists()
