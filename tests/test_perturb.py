"""Linguistic-structure perturbations: shuffle, nouns+adjectives, in-batch negatives, CLI."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from counterfactual import cli
from counterfactual.cli import main
from counterfactual.text.perturb import (
    ContrastiveNegatives,
    GroundedSample,
    in_batch_negatives,
    nouns_adj,
    nouns_adj_many,
    perturb_records,
    read_jsonl,
    record_seed,
    shuffle,
)

EXPRESSIONS = {
    # RefCOCOg-style expressions from Akula et al. (2020), figure 2; outputs checked by hand.
    "The blue bike behind the red car": "blue bike red car",
    "The glass of water next to the saucer with the cup on it": "glass water saucer cup",
    "The larger of two giraffes": "larger giraffes",
    "A green couch across from a white couch": "green couch white couch",
}


@pytest.fixture(scope="module")
def nlp() -> Any:
    from counterfactual.text.nlp import load_spacy

    try:
        return load_spacy(None)  # the same cache key as the CLI's default
    except ImportError as err:
        pytest.skip(f"no spaCy English model installed: {err}")


@pytest.fixture
def run_cli(monkeypatch: pytest.MonkeyPatch):
    """``main`` with only this command registered, so other subcommands cannot break it."""
    monkeypatch.setattr(cli, "SUBCOMMANDS", ("perturb",))
    return main


def write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def records_from(tmp_path: Path, lines: list[str], required: tuple[str, ...] = ()) -> list:
    return read_jsonl(write_jsonl(tmp_path / "in.jsonl", lines), required)


# --- shuffle --------------------------------------------------------------------------------


@pytest.mark.parametrize("expression", ["the man in the red shirt on the left", "bus", "", "a  b"])
@pytest.mark.parametrize("seed", [0, 1, 12345])
def test_shuffle_keeps_the_multiset_of_words(expression: str, seed: int) -> None:
    out = shuffle(expression, seed)
    assert Counter(out.split()) == Counter(expression.split())
    assert out == shuffle(expression, seed)


def test_shuffle_depends_on_the_seed() -> None:
    expression = "the man in the red shirt on the left next to a dog"
    outputs = {shuffle(expression, seed) for seed in range(10)}
    assert len(outputs) > 1


def test_record_seed_is_stable_and_differs_per_record() -> None:
    assert record_seed(0, 0) == record_seed(0, 0)
    assert len({record_seed(0, i) for i in range(100)}) == 100
    assert record_seed(0, 1) != record_seed(1, 0)


# --- nouns + adjectives ---------------------------------------------------------------------


@pytest.mark.parametrize(("expression", "expected"), EXPRESSIONS.items())
def test_nouns_adj(nlp: Any, expression: str, expected: str) -> None:
    assert nouns_adj(expression, nlp) == expected


def test_nouns_adj_many_matches_one_by_one(nlp: Any) -> None:
    assert nouns_adj_many(list(EXPRESSIONS), nlp) == list(EXPRESSIONS.values())
    assert nouns_adj("on it", nlp) == ""


# --- in-batch negatives ---------------------------------------------------------------------

BATCH = (
    GroundedSample("img0.jpg", "the red car", (0, 0, 10, 10)),
    GroundedSample("img1.jpg", "a dog on the sofa", (5, 5, 20, 20)),
    GroundedSample("img2.jpg", "the tall giraffe", (1, 2, 3, 4)),
)


def test_negatives_on_a_batch_of_three() -> None:
    negatives = in_batch_negatives(BATCH, seed=0)
    assert [n.anchor for n in negatives] == [0, 1, 2]
    for n in negatives:
        assert n.partner != n.anchor
        i, j = BATCH[n.anchor], BATCH[n.partner]
        assert n.image_swapped == GroundedSample(j.image, i.expression, j.box)
        assert n.expression_swapped == GroundedSample(i.image, j.expression, i.box)
    assert negatives == in_batch_negatives(BATCH, seed=0)
    partners = {tuple(n.partner for n in in_batch_negatives(BATCH, seed)) for seed in range(20)}
    assert len(partners) > 1  # the seed picks the partners


def test_negatives_in_a_batch_of_two_are_the_swaps() -> None:
    assert in_batch_negatives(BATCH[:2], seed=3) == (
        ContrastiveNegatives(
            anchor=0,
            partner=1,
            image_swapped=GroundedSample("img1.jpg", "the red car", (5, 5, 20, 20)),
            expression_swapped=GroundedSample("img0.jpg", "a dog on the sofa", (0, 0, 10, 10)),
        ),
        ContrastiveNegatives(
            anchor=1,
            partner=0,
            image_swapped=GroundedSample("img0.jpg", "a dog on the sofa", (0, 0, 10, 10)),
            expression_swapped=GroundedSample("img1.jpg", "the red car", (5, 5, 20, 20)),
        ),
    )


def test_negatives_skip_other_expressions_of_the_same_object() -> None:
    same = GroundedSample(BATCH[0].image, "the car on the left", BATCH[0].box)
    batch = (BATCH[0], same, BATCH[2])
    for seed in range(10):
        partners = [n.partner for n in in_batch_negatives(batch, seed)]
        assert partners[:2] == [2, 2]
        assert partners[2] in (0, 1)
    with pytest.raises(ValueError, match="sample 0 of the batch has no partner"):
        in_batch_negatives((BATCH[0], same), seed=0)


def test_negatives_need_two_samples() -> None:
    with pytest.raises(ValueError, match="batch of 2 or more samples, got 1"):
        in_batch_negatives(BATCH[:1], seed=0)


@pytest.mark.parametrize(
    ("count", "batch_size", "batches"),
    [
        (5, 0, [range(5)]),
        (5, 2, [range(2), range(2, 5)]),  # a last batch of one joins the one before
        (6, 2, [range(2), range(2, 4), range(4, 6)]),
    ],
)
def test_negatives_stay_inside_their_batch(
    tmp_path: Path, count: int, batch_size: int, batches: list[range]
) -> None:
    lines = [
        json.dumps({"image": i, "expression": f"e{i}", "box": [i, i, i + 1, i + 1]})
        for i in range(count)
    ]
    records = records_from(tmp_path, lines)
    out = perturb_records(records, "negatives", seed=1, batch_size=batch_size)
    for batch in batches:
        for index in batch:
            assert out[index]["negative_partner"] in batch
            assert out[index]["negative_partner"] != index


# --- JSON Lines and the CLI -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("lines", "required", "message"),
    [
        pytest.param(
            ['{"expression": "a"}', '{"expression": '],
            ("expression",),
            "in.jsonl line 2: malformed JSON",
            id="malformed",
        ),
        pytest.param(
            ['{"expression": "a"}', "", '{"image": "x"}'],
            ("expression",),
            r"in.jsonl line 3: missing field\(s\) expression",
            id="missing-field",
        ),
        pytest.param(
            ['["expression"]'],
            ("expression",),
            "in.jsonl line 1: expected a JSON object",
            id="not-object",
        ),
        pytest.param(
            ['{"expression": "a", "image": "x"}'],
            ("image", "expression", "box"),
            r"in.jsonl line 1: missing field\(s\) box",
            id="missing-box",
        ),
    ],
)
def test_jsonl_errors_name_file_and_line(
    tmp_path: Path, lines: list[str], required: tuple[str, ...], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        records_from(tmp_path, lines, required)


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"expression": 3}, "line 1: 'expression' must be a string"),
        ({"expression": "a", "image": "x", "box": [1, 2, 3]}, "line 1: 'box' must be a list of 4"),
        ({"expression": "a", "image": None, "box": [1, 2, 3, 4]}, "line 1: 'image' must be"),
        ({"expression": "a", "image": "x", "box": [1, 2, 3, 4]}, "lines 1-2 .one batch.: sample 0"),
    ],
)
def test_field_type_errors_name_the_line(tmp_path: Path, record: dict, message: str) -> None:
    records = records_from(tmp_path, [json.dumps(record), json.dumps(record)])
    mode = "shuffle" if set(record) == {"expression"} else "negatives"
    with pytest.raises(ValueError, match=message):
        perturb_records(records, mode)


def test_perturb_is_registered() -> None:
    assert "perturb" in cli.SUBCOMMANDS


def test_cli_shuffle(run_cli, tmp_path: Path) -> None:
    rows = [{"id": i, "expression": text} for i, text in enumerate(EXPRESSIONS)]
    src = write_jsonl(tmp_path / "in.jsonl", [json.dumps(row) for row in rows])
    argv = ["perturb", "--input", str(src), "--mode", "shuffle", "--seed", "4"]
    assert run_cli([*argv, "--output", str(tmp_path / "a.jsonl")]) == 0
    assert run_cli([*argv, "--output", str(tmp_path / "b.jsonl")]) == 0
    first = (tmp_path / "a.jsonl").read_text(encoding="utf-8")
    assert first == (tmp_path / "b.jsonl").read_text(encoding="utf-8")
    out = [json.loads(line) for line in first.splitlines()]
    for row, new in zip(rows, out, strict=True):
        assert {k: new[k] for k in row} == row
        assert Counter(new["expression_shuffled"].split()) == Counter(row["expression"].split())


def test_cli_nouns_adj(run_cli, nlp: Any, tmp_path: Path) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", [json.dumps({"expression": e}) for e in EXPRESSIONS])
    dst = tmp_path / "out.jsonl"
    argv = ["perturb", "--input", str(src), "--output", str(dst), "--mode", "nouns-adj"]
    assert run_cli(argv) == 0
    out = [json.loads(line) for line in dst.read_text(encoding="utf-8").splitlines()]
    assert [row["expression_nouns_adj"] for row in out] == list(EXPRESSIONS.values())


def test_cli_negatives(run_cli, tmp_path: Path) -> None:
    rows = [{"image": s.image, "expression": s.expression, "box": list(s.box)} for s in BATCH]
    src = write_jsonl(tmp_path / "in.jsonl", [json.dumps(row) for row in rows])
    dst = tmp_path / "out.jsonl"
    argv = ["perturb", "--input", str(src), "--output", str(dst), "--mode", "negatives"]
    assert run_cli([*argv, "--seed", "2"]) == 0
    out = [json.loads(line) for line in dst.read_text(encoding="utf-8").splitlines()]
    for i, row in enumerate(out):
        j = row["negative_partner"]
        assert j != i
        assert row["negative_image_swapped"] == {
            "image": rows[j]["image"],
            "expression": rows[i]["expression"],
            "box": rows[j]["box"],
        }
        assert row["negative_expression_swapped"] == {
            "image": rows[i]["image"],
            "expression": rows[j]["expression"],
            "box": rows[i]["box"],
        }


def test_cli_error_names_the_line(
    run_cli, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = write_jsonl(tmp_path / "in.jsonl", ['{"expression": "a"}', "{not json"])
    dst = tmp_path / "out.jsonl"
    argv = ["perturb", "--input", str(src), "--output", str(dst), "--mode", "shuffle"]
    assert run_cli(argv) == 2
    assert "in.jsonl line 2: malformed JSON" in capsys.readouterr().err
    assert not dst.exists()


def test_cli_help_documents_the_input(run_cli, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        run_cli(["perturb", "--help"])
    text = capsys.readouterr().out
    assert '"expression"' in text and "JSON Lines" in text and "negative_image_swapped" in text
