"""Caption-context filters and heuristic baselines for person grounding with masked names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from counterfactual.cli import main
from counterfactual.text.nlp import load_spacy
from counterfactual.tools.grounding.persons import (
    CaptionFilter,
    DropReason,
    FilterConfig,
    Heuristic,
    PersonBox,
    PersonSample,
    assign,
    box_order,
    count_correct,
    evaluate_heuristics,
    expected_random_correct,
    parse_sample,
    read_predictions,
    read_samples,
    substitute_names,
    summarize,
)


@pytest.fixture(scope="module")
def nlp() -> Any:
    return load_spacy()


def _boxes(*xywh: tuple[float, float, float, float]) -> tuple[PersonBox, ...]:
    return tuple(PersonBox(*b) for b in xywh)


def _sample(
    sample_id: str,
    names: list[int],
    boxes: list[list[float]],
    truth: dict[int, int],
    caption: str | None = None,
) -> PersonSample:
    text = caption if caption is not None else " and ".join(["[NAME]"] * len(names)) + " talk"
    return PersonSample(sample_id, text, tuple(names), _boxes(*map(tuple, boxes)), truth)


def _write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# --------------------------------------------------------------------------- box orders

# x: b0=0, b1=100, b2=50, b3=200; areas: b0=100, b1=900, b2=400, b3=25
FOUR = _boxes((0, 0, 10, 10), (100, 0, 30, 30), (50, 0, 20, 20), (200, 0, 5, 5))
# equal areas: ties keep input order
TIED = _boxes((10, 0, 10, 10), (0, 0, 10, 10))


@pytest.mark.parametrize(
    ("boxes", "heuristic", "n_persons", "expected"),
    [
        (FOUR, Heuristic.BIG_TO_SMALL, 2, (1, 2, 0, 3)),
        (FOUR, Heuristic.LR_ALL, 2, (0, 2, 1, 3)),
        (FOUR, Heuristic.LR_LARGEST, 1, (1,)),
        (FOUR, Heuristic.LR_LARGEST, 2, (2, 1)),  # two largest are b1, b2; b2 is further left
        (FOUR, Heuristic.LR_LARGEST, 3, (0, 2, 1)),
        (FOUR, Heuristic.LR_LARGEST, 4, (0, 2, 1, 3)),
        (FOUR, Heuristic.LR_LARGEST, 9, (0, 2, 1, 3)),  # more persons than boxes: all boxes
        (TIED, Heuristic.BIG_TO_SMALL, 2, (0, 1)),
        (TIED, Heuristic.LR_ALL, 2, (1, 0)),
        (TIED, Heuristic.LR_LARGEST, 1, (0,)),
        ((), Heuristic.BIG_TO_SMALL, 2, ()),
        ((), Heuristic.LR_LARGEST, 2, ()),
    ],
)
def test_box_order(
    boxes: tuple[PersonBox, ...], heuristic: Heuristic, n_persons: int, expected: tuple[int, ...]
) -> None:
    assert box_order(boxes, heuristic, n_persons) == expected


def test_random_order_is_a_seeded_permutation() -> None:
    first = box_order(FOUR, Heuristic.RANDOM, 2, np.random.default_rng(7))
    again = box_order(FOUR, Heuristic.RANDOM, 2, np.random.default_rng(7))
    assert first == again
    assert sorted(first) == [0, 1, 2, 3]
    assert first == tuple(np.random.default_rng(7).permutation(4))
    with pytest.raises(ValueError, match="rng"):
        box_order(FOUR, Heuristic.RANDOM, 2)


def test_box_area() -> None:
    assert PersonBox(5, 6, 3, 4).area == 12.0


@pytest.mark.parametrize(
    ("names", "heuristic", "expected"),
    [
        ([1, 0, 1], Heuristic.BIG_TO_SMALL, {1: 1, 0: 2}),  # persons by first mention: 1, 0
        ([0, 1, 2, 3, 4], Heuristic.LR_ALL, {0: 0, 1: 2, 2: 1, 3: 3}),  # person 4 gets no box
        ([2, 5], Heuristic.LR_LARGEST, {2: 2, 5: 1}),
    ],
)
def test_assign(names: list[int], heuristic: Heuristic, expected: dict[int, int]) -> None:
    sample = PersonSample("s", "", tuple(names), FOUR, {})
    assert assign(sample, heuristic) == expected


@pytest.mark.parametrize(
    ("assignment", "truth", "expected"),
    [
        ({0: 1, 1: 0}, {0: 1, 1: 0}, 2),
        ({0: 1, 1: 0}, {0: 0, 1: 1}, 0),
        ({0: 1}, {0: 1, 1: 0}, 1),  # unassigned person is wrong
        ({0: 1, 1: 0, 2: 2}, {1: 0}, 1),  # persons without truth are not scored
        ({}, {}, 0),
    ],
)
def test_count_correct(assignment: dict[int, int], truth: dict[int, int], expected: int) -> None:
    assert count_correct(assignment, truth) == expected


# Three samples, hand-scored (see each comment): 5 true links in all.
S1 = _sample("s1", [0, 1], [[0, 0, 10, 10], [50, 0, 20, 20]], {0: 1, 1: 0})
# big: (1,0) -> 2 right; lr_all: (0,1) -> 0; lr_largest d=2: (0,1) -> 0
S2 = _sample("s2", [0, 1, 0], [[0, 0, 30, 30], [40, 0, 10, 10], [80, 0, 20, 20]], {0: 0, 1: 2})
# big: (0,2,1) -> 2; lr_all: (0,1,2) -> 1; lr_largest d=2 of {0,2}: (0,2) -> 2
S3 = _sample("s3", [0], [[10, 0, 10, 10], [0, 0, 10, 10]], {0: 1})
# big (tie, input order): (0,1) -> 0; lr_all: (1,0) -> 1; lr_largest d=1: (0,) -> 0
SAMPLES = [S1, S2, S3]


def test_expected_random_correct() -> None:
    assert expected_random_correct(S1) == pytest.approx(1.0)  # 2 links x 1/2
    assert expected_random_correct(S2) == pytest.approx(2 / 3)  # 2 links x 1/3
    assert expected_random_correct(S3) == pytest.approx(0.5)
    crowded = _sample("c", [0, 1, 2], [[0, 0, 1, 1], [5, 0, 1, 1]], {0: 0, 2: 1})
    assert expected_random_correct(crowded) == pytest.approx(0.5)  # person 2 is 3rd of 2 boxes
    assert expected_random_correct(_sample("e", [0], [], {})) == 0.0


def _random_correct(seed: int) -> int:
    rng = np.random.default_rng(seed)
    hits = 0
    for sample in SAMPLES:
        perm = rng.permutation(len(sample.boxes))
        chosen = dict(zip(sample.persons, perm, strict=False))
        hits += sum(chosen.get(p) == b for p, b in sample.truth.items())
    return hits


def test_evaluate_heuristics_exact_values() -> None:
    report = evaluate_heuristics(SAMPLES, seed=3)
    rows = {row.method: row for row in report.rows}
    assert [row.method for row in report.rows] == ["random", "big_to_small", "lr_all", "lr_largest"]
    assert report.samples == 3 and report.links == 5
    assert (rows["big_to_small"].correct, rows["lr_all"].correct, rows["lr_largest"].correct) == (
        4,
        2,
        2,
    )
    assert rows["big_to_small"].accuracy == pytest.approx(0.8)
    assert rows["lr_all"].accuracy == pytest.approx(0.4)
    assert report.best_heuristic == "big_to_small"
    random_acc = _random_correct(3) / 5
    assert rows["random"].accuracy == pytest.approx(random_acc)
    assert rows["random"].gain_over_random == 0.0
    assert rows["big_to_small"].gain_over_random == pytest.approx(0.8 - random_acc)
    assert rows["big_to_small"].gain_over_best_heuristic == 0.0
    assert rows["lr_all"].gain_over_best_heuristic is None
    assert rows["random"].gain_over_best_heuristic is None
    assert report.expected_random == pytest.approx((1 + 2 / 3 + 0.5) / 5)
    assert evaluate_heuristics(SAMPLES, seed=3) == report  # seeded: same rows again


def test_evaluate_heuristics_with_predictions() -> None:
    predictions = {"s1": {0: 1, 1: 0}, "s2": {0: 0}, "other": {0: 0}}  # s3 missing
    report = evaluate_heuristics(SAMPLES, seed=0, predictions=predictions, prediction_label="m")
    row = report.rows[-1]
    assert (row.label, row.correct, row.total) == ("m", 3, 5)
    assert row.accuracy == pytest.approx(0.6)
    assert row.gain_over_best_heuristic == pytest.approx(0.6 - 0.8)
    assert row.gain_over_random == pytest.approx(0.6 - report.rows[0].accuracy)
    assert report.missing_predictions == 1


def test_evaluate_heuristics_empty() -> None:
    report = evaluate_heuristics([])
    assert report.links == 0 and all(row.accuracy == 0.0 for row in report.rows)


# --------------------------------------------------------------------------- reading

GOOD = {
    "id": "a",
    "caption": "[NAME] signs the bill while [NAME] watches",
    "names": [0, 1],
    "boxes": [[0, 0, 10, 20], [30, 0, 10, 20]],
    "truth": {"0": 1},
    "extra": "kept along",
}


def test_parse_sample() -> None:
    sample = parse_sample(GOOD)
    assert sample.sample_id == "a"
    assert sample.names == (0, 1) and sample.persons == (0, 1)
    assert sample.boxes[1] == PersonBox(30.0, 0.0, 10.0, 20.0)
    assert sample.truth == {0: 1}
    assert sample.raw["extra"] == "kept along"
    assert parse_sample({**GOOD, "id": 7}).sample_id == "7"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"names": [0]}, "has 2 \\[NAME\\] but 'names' has 1"),
        ({"names": [0, -1]}, "'names'\\[1\\] must be an integer >= 0"),
        ({"boxes": [[0, 0, 10]]}, "'boxes'\\[0\\] must be 4 finite numbers"),
        ({"boxes": [[0, 0, -1, 5]]}, "negative width or height"),
        ({"truth": {"0": 5}}, "= 5 but there are 2 boxes"),
        ({"truth": {"3": 0}}, "person 3, who is not in 'names'"),
        ({"truth": {"0": 1, "1": 1}}, "same box 1"),
        ({"truth": {"x": 1}}, "person id \\(digits\\)"),
        ({"caption": None}, "'caption' must be a string"),
        ({"id": ""}, "'id' must be a non-empty string"),
    ],
)
def test_parse_sample_rejects(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_sample({**GOOD, **change})


def test_read_samples_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n{not json\n", encoding="utf-8")
    with pytest.raises(ValueError, match=f"{path} line 3: malformed JSON"):
        read_samples(path)
    bad = {k: v for k, v in GOOD.items() if k != "boxes"}
    _write_jsonl(path, [GOOD, bad])
    with pytest.raises(ValueError, match=f"{path} line 2: missing field 'boxes'"):
        read_samples(path)
    _write_jsonl(path, [GOOD, GOOD])
    with pytest.raises(ValueError, match=f"{path} line 2: repeated id 'a'"):
        read_samples(path)
    _write_jsonl(path, [[1, 2]])
    with pytest.raises(ValueError, match=f"{path} line 1: expected a JSON object"):
        read_samples(path)


def test_read_predictions(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "pred.jsonl", [{"id": "a", "pred": {"0": 1, "1": 0}}])
    assert read_predictions(path) == {"a": {0: 1, 1: 0}}
    _write_jsonl(path, [{"id": "a", "pred": {"0": 1}}, {"id": "b"}])
    with pytest.raises(ValueError, match=f"{path} line 2: missing field 'pred'"):
        read_predictions(path)


# --------------------------------------------------------------------------- filters


def test_substitute_names() -> None:
    named = substitute_names("[NAME] hugs [NAME]'s son [NAME].", [3, 1, 3])
    assert named.text == "James hugs Mary's son James."
    assert named.spans == ((0, 5), (11, 15), (22, 27))
    assert [named.text[a:b] for a, b in named.spans] == ["James", "Mary", "James"]
    with pytest.raises(ValueError, match="3 persons but only 2 first names"):
        substitute_names("[NAME] [NAME] [NAME]", [0, 1, 2], ("Ann", "Bob"))


@pytest.mark.parametrize(
    ("caption", "names", "reasons", "conjunct"),
    [
        ("[NAME] signs the bill while [NAME] watches", [0, 1], (), 1),
        ("[NAME] and [NAME] smile", [0, 1], (), 2),  # two conjunct names are fine
        ("[NAME] and [NAME] at the party in 2010", [0, 1], (DropReason.NO_VERB,), 2),
        ("[NAME], [NAME] and [NAME] smile", [0, 1, 2], (DropReason.CONJUNCT_NAMES,), 3),
        (
            "[NAME], [NAME], [NAME] and [NAME] perform on stage",
            [0, 1, 2, 3],
            (DropReason.CONJUNCT_NAMES,),
            4,
        ),
        (
            "[NAME], [NAME] and [NAME]",
            [0, 1, 2],
            (DropReason.NO_VERB, DropReason.CONJUNCT_NAMES),
            3,
        ),
        ("[NAME] is the president of France", [0], (), 1),  # AUX counts as a verb
    ],
)
def test_caption_filter_real_spacy(
    nlp: Any, caption: str, names: list[int], reasons: tuple[DropReason, ...], conjunct: int
) -> None:
    sample = PersonSample("x", caption, tuple(names), (), {})
    (decision,) = CaptionFilter(nlp)([sample])
    assert decision.reasons == reasons
    assert decision.kept == (not reasons)
    assert decision.conjunct_persons == conjunct


def test_same_person_twice_in_a_conjunction_is_one_person(nlp: Any) -> None:
    sample = PersonSample("x", "[NAME], [NAME] and [NAME] smile", (0, 1, 0), (), {})
    (decision,) = CaptionFilter(nlp)([sample])
    assert decision.text == "James, Mary and James smile"
    assert decision.conjunct_persons == 2
    assert DropReason.CONJUNCT_NAMES not in decision.reasons


def test_lexical_verbs_only(nlp: Any) -> None:
    sample = PersonSample("x", "[NAME] is the president of France", (0,), (), {})
    config = FilterConfig(verb_pos=frozenset({"VERB"}))
    (decision,) = CaptionFilter(nlp, config)([sample])
    assert decision.reasons == (DropReason.NO_VERB,)


def test_too_many_persons_is_a_typed_skip(nlp: Any) -> None:
    samples = [
        PersonSample("many", "[NAME] meets [NAME] and [NAME]", (0, 1, 2), (), {}),
        PersonSample("ok", "[NAME] signs the bill while [NAME] watches", (0, 1), (), {}),
    ]
    decisions = CaptionFilter(nlp, FilterConfig(first_names=("Anna", "Peter")))(samples)
    assert [d.sample_id for d in decisions] == ["many", "ok"]
    assert decisions[0].reasons == (DropReason.TOO_MANY_PERSONS,) and decisions[0].text is None
    assert decisions[1].kept and decisions[1].text == "Anna signs the bill while Peter watches"
    summary = summarize(decisions)
    assert (summary.total, summary.kept, summary.dropped) == (2, 1, 1)
    assert summary.reasons == {"no_verb": 0, "conjunct_names": 0, "too_many_persons": 1}


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"first_names": ()}, "first_names"),
        ({"first_names": ("Ann", "Ann")}, "distinct"),
        ({"first_names": ("Mary Ann",)}, "single words"),
        ({"verb_pos": frozenset()}, "verb_pos"),
        ({"max_conjunct_persons": 1}, "max_conjunct_persons must be >= 2"),
        ({"batch_size": 0}, "batch_size"),
    ],
)
def test_filter_config_rejects(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        FilterConfig(**options)


# --------------------------------------------------------------------------- CLI


def _cli_samples() -> list[dict[str, Any]]:
    boxes = [[0, 0, 10, 20], [30, 0, 10, 20], [60, 0, 10, 20]]
    return [
        {**GOOD, "id": "kept"},
        {**GOOD, "id": "noverb", "caption": "[NAME] and [NAME] at the party in 2010"},
        {
            "id": "chain",
            "caption": "[NAME], [NAME] and [NAME] smile",
            "names": [0, 1, 2],
            "boxes": boxes,
            "truth": {"0": 0, "1": 1, "2": 2},
        },
    ]


def test_cli_filter_captions(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _write_jsonl(tmp_path / "in.jsonl", _cli_samples())
    out, decisions = tmp_path / "kept.jsonl", tmp_path / "decisions.jsonl"
    argv = ["filter-captions", "--input", str(src), "--output", str(out)]
    assert main([*argv, "--decisions", str(decisions)]) == 0
    counts = json.loads(capsys.readouterr().out)
    assert counts == {
        "total": 3,
        "kept": 1,
        "dropped": 2,
        "reasons": {"no_verb": 1, "conjunct_names": 1, "too_many_persons": 0},
    }
    kept = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert kept == [{**GOOD, "id": "kept"}]  # written unchanged, extra fields included
    rows = [json.loads(line) for line in decisions.read_text(encoding="utf-8").splitlines()]
    assert [(r["id"], r["reasons"]) for r in rows] == [
        ("kept", []),
        ("noverb", ["no_verb"]),
        ("chain", ["conjunct_names"]),
    ]


def test_cli_filter_captions_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps(GOOD) + "\n" + json.dumps({**GOOD, "id": "b", "names": [0]}) + "\n")
    code = main(["filter-captions", "--input", str(src), "--output", str(tmp_path / "o.jsonl")])
    assert code == 2
    assert f"{src} line 2: 'caption' has 2 [NAME] but 'names' has 1" in capsys.readouterr().err


def _heuristic_rows() -> list[dict[str, Any]]:
    rows = []
    for sample in SAMPLES:
        rows.append(
            {
                "id": sample.sample_id,
                "caption": sample.caption,
                "names": list(sample.names),
                "boxes": [[b.x, b.y, b.w, b.h] for b in sample.boxes],
                "truth": {str(k): v for k, v in sample.truth.items()},
            }
        )
    return rows


def test_cli_heuristics_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _write_jsonl(tmp_path / "in.jsonl", _heuristic_rows())
    pred = _write_jsonl(
        tmp_path / "model.jsonl",
        [{"id": "s1", "pred": {"0": 1, "1": 0}}, {"id": "s2", "pred": {"0": 0}}],
    )
    argv = ["heuristics", "--input", str(src), "--pred", str(pred), "--seed", "3"]
    assert main([*argv, "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {row["method"]: row for row in report["rows"]}
    assert rows["big_to_small"]["accuracy"] == pytest.approx(0.8)
    assert rows["lr_largest"]["accuracy"] == pytest.approx(0.4)
    assert rows["predictions"]["label"] == "model"
    assert rows["predictions"]["gain_over_best_heuristic"] == pytest.approx(-0.2)
    assert rows["random"]["accuracy"] == pytest.approx(_random_correct(3) / 5)
    assert report["missing_predictions"] == 1 and report["links"] == 5


def test_cli_heuristics_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _write_jsonl(tmp_path / "in.jsonl", _heuristic_rows())
    assert main(["heuristics", "--input", str(src)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:2] == ["Method", "Acc"]
    big = next(line for line in lines if line.startswith("Big->Small"))
    assert big.split()[1:] == [
        "80.0",
        f"{100 * (0.8 - _random_correct(0) / 5):+.1f}",
        "+0.0",
        "4/5",
    ]
    assert any(line.startswith("L->R (Largest)") and " – " in line for line in lines)
