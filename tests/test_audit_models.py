"""`audit templates` and `audit distractors` with a sentence model named by folder: a tiny
random sentence-transformers model saved to disk and loaded through the user's code path."""

from __future__ import annotations

import json
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest

from counterfactual.cli import main
from counterfactual.tools.audit import SentenceEmbedder, load_sentence_embedder
from tests.tiny_sentence import build_tiny_sentence_model

# looked up, not imported: a worker that never runs this file does not pay for the import
if find_spec("sentence_transformers") is None or find_spec("sklearn") is None:
    pytest.skip("needs sentence-transformers and scikit-learn", allow_module_level=True)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_sentence_model(tmp_path_factory.mktemp("sentence") / "tiny")


def test_sentence_embedder_loads_a_saved_model(tiny_model: Path) -> None:
    embedder = load_sentence_embedder(str(tiny_model))
    assert isinstance(embedder, SentenceEmbedder) and embedder.dim == 32
    texts = ["what is NNP VBG ?", "why is NNP RB JJ ?", "what is NNP VBG ?"]
    vectors = embedder(texts)
    assert vectors.shape == (3, 32) and vectors.dtype == np.float32
    assert np.linalg.norm(vectors, axis=1) == pytest.approx(np.ones(3), abs=1e-5)
    np.testing.assert_allclose(vectors[0], vectors[2], atol=1e-6)
    assert not np.allclose(vectors[0], vectors[1], atol=1e-3)
    assert embedder([]).shape == (0, 32)
    again = SentenceEmbedder(str(tiny_model), batch_size=1)(texts)
    np.testing.assert_allclose(again, vectors, atol=1e-5)


@pytest.mark.parametrize(
    ("model", "message"),
    [
        ("no/such-model-here", "cannot load sentence model 'no/such-model-here' as a hub id"),
        ("   ", "the sentence model name is empty"),
    ],
)
def test_sentence_embedder_names_the_model_it_cannot_load(model: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SentenceEmbedder(model)


def test_sentence_embedder_rejects_a_folder_without_a_model(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=f"cannot load sentence model '{tmp_path}' as a folder"):
        SentenceEmbedder(str(tmp_path))


QUESTIONS = [
    "What is Casey doing?",
    "Why is Riley so happy?",
    "What is Jessie doing?",
    "How does Casey feel?",
    "Why is Casey acting so strangely?",
    "What will Riley do next?",
]


def test_cli_templates_with_a_model_folder(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    questions = tmp_path / "q.jsonl"
    questions.write_text("".join(json.dumps({"q": q}) + "\n" for q in QUESTIONS))
    out = tmp_path / "assign.jsonl"
    argv = ["audit", "templates", "--input", str(questions), "--field", "q", "--output", str(out)]
    assert main([*argv, "--model", str(tiny_model), "--clusters", "3", "--max-iter", "5"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["questions"], result["distinct_templates"]) == (6, 5)
    assert len(result["clusters"]) == 3
    assert sum(c["size"] for c in result["clusters"]) == 6
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["template"] for r in rows] == [
        "what is NNP VBG ?",
        "why is NNP RB JJ ?",
        "what is NNP VBG ?",
        "how does NNP VB ?",
        "why is NNP VBG RB RB ?",
        "what will NNP VB RB ?",
    ]
    assert rows[0]["cluster"] == rows[2]["cluster"]
    assert {r["cluster"] for r in rows} == {0, 1, 2}


def test_cli_distractors_with_a_model_folder(
    tiny_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    qa = tmp_path / "qa.jsonl"
    pairs = [
        ("Why is the man holding an umbrella?", "Because it is raining."),
        ("What will Casey do next?", "She will dance."),
    ]
    qa.write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in pairs))
    pool = tmp_path / "pool.txt"
    answers = [
        "Because it is raining.",
        "He wants to keep his suit dry.",
        "She will dance.",
        "He is waiting for the bus.",
        "The cake is on the table.",
        "Because he is tired.",
        "She is happy.",
    ]
    pool.write_text("\n".join(answers) + "\n")
    out = tmp_path / "out.jsonl"
    argv = ["audit", "distractors", "--input", str(qa), "--pool", str(pool), "--output", str(out)]
    # every answer relevant: each of the 3 buckets of 7 // 3 = 2 gives one pick
    assert main([*argv, "--model", str(tiny_model), "--min-relevance", "-2"]) == 0
    assert json.loads(capsys.readouterr().out) == {"questions": 2, "complete": 2, "incomplete": 0}
    for (_, answer), line in zip(pairs, out.read_text().splitlines(), strict=True):
        row = json.loads(line)
        picks = row["distractors"]
        assert [d["bucket"] for d in picks] == [0, 1, 2]
        assert [d["pool_index"] // 2 for d in picks] == [0, 1, 2]
        assert answer not in [d["text"] for d in picks]
        assert row["eligible"] == 6 - (answers.index(answer) < 6)


@pytest.mark.parametrize(
    ("mode", "options", "message"),
    [
        ("templates", ["--clusters", "0"], "argument --clusters: 0 is not a whole number > 0"),
        ("templates", ["--max-iter", "-1"], "argument --max-iter: -1 is not a whole number > 0"),
        ("templates", ["--tags", "penn"], "--tags: invalid choice: 'penn'"),
        ("distractors", ["--k", "0"], "argument --k: 0 is not a whole number > 0"),
        ("distractors", ["--method", "vcr"], "--method: invalid choice: 'vcr'"),
        ("distractors", ["--min-similarity", "1.5"], "1.5 is not a cosine in [-1, 1]"),
        ("distractors", ["--min-relevance", "nan"], "nan is not a finite number"),
    ],
)
def test_cli_rejects_bad_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: str, options: list[str], message: str
) -> None:
    files = ["--input", str(tmp_path / "in.txt")]
    if mode == "distractors":
        files += ["--pool", str(tmp_path / "pool.txt"), "--output", str(tmp_path / "out.jsonl")]
    with pytest.raises(SystemExit) as exit_info:
        main(["audit", mode, *files, *options])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_help_states_the_paper_model_and_the_offline_default(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for mode in ("templates", "distractors"):
        with pytest.raises(SystemExit):
            main(["audit", mode, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "sentence-transformers/stsb-roberta-base" in text
        assert "all-MiniLM-L6-v2" in text and "deviation" in text
