"""Grounding DINO beside OWLv2: the prompt, the token-span class mapping, the box coordinates,
a tiny random model saved to disk and loaded by path through :class:`Detector`, and
``counterfactual synth --detector-model`` with it on a WebDataset corpus."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from counterfactual.method.detect import DetectConfig, Detector
from counterfactual.method.detectors import MODEL_TYPES, ModelCall, backend_for
from counterfactual.method.detectors.grounding_dino import (
    box_pixels,
    chunks,
    class_logits,
    detect,
    phrase,
    prompt,
)
from counterfactual.vocab import ClassVocabulary


def test_prompt_text_and_name_spans():
    got = prompt(["dog", "Hot Dog"], "a photo of a {}")
    assert got.text == "a photo of a dog . a photo of a hot dog ."
    assert [got.text[s:e] for s, e in got.spans] == ["dog", "hot dog"]
    bare = prompt(["cat", "teddy bear"], "{}")
    assert bare.text == "cat . teddy bear ."
    assert bare.spans == ((0, 3), (6, 16))


def test_phrase_separators_inside_a_name_become_spaces():
    # "." and "?" split phrases for the model; inside a phrase they would split the class
    assert phrase("St. Bernard?", "{} dog") == ("st  bernard  dog", 0, 12)
    assert prompt(["St. Bernard"], "the {}.").text == "the st  bernard  ."


@pytest.mark.parametrize(
    ("lengths", "budget", "expected"),
    [
        ([3, 3, 3], 9, [[0, 1, 2]]),  # exactly at the budget: one text
        ([3, 3, 3], 8, [[0, 1], [2]]),
        ([5, 20, 2, 2], 10, [[0], [1], [2, 3]]),  # too long alone: a text of its own
        ([1], 1, [[0]]),
        ([], 5, []),
    ],
)
def test_chunks(lengths, budget, expected):
    assert chunks(lengths, budget) == expected


def test_class_logits_read_only_the_name_tokens():
    # "a photo of a dog . a photo of a hot dog ." as BERT cuts it, with [CLS] and [SEP]
    text = prompt(["dog", "hot dog"], "a photo of a {}")
    words = [(0, 1), (2, 7), (8, 10), (11, 12), (13, 16), (17, 18)]
    words += [(s + 19, e + 19) for s, e in [(0, 1), (2, 7), (8, 10), (11, 12), (13, 16)]]
    words += [(36, 39), (40, 41)]
    offsets = np.asarray([(0, 0), *words, (0, 0), (0, 0)])  # [CLS] ... [SEP] [PAD]
    assert [text.text[s:e] for s, e in words][4] == "dog"
    logits = np.full((3, len(offsets)), -5.0)
    logits[0, 5] = 4.0  # box 0: "dog" of the first phrase
    logits[1, 11] = 3.0  # box 1: "hot", which only "hot dog" has
    logits[2, 12] = 2.0  # box 2: the "dog" of "hot dog": that phrase, not the class "dog"
    logits[:, 2] = 9.0  # "photo" in the first phrase: a template word, no class's
    logits[:, 0] = logits[:, -1] = 9.0  # [CLS] and padding count for nothing either
    got = class_logits(logits, offsets, text.spans)
    np.testing.assert_array_equal(got, [[4.0, -5.0], [-5.0, 3.0], [-5.0, 2.0]])
    # a class none of whose tokens fit in the text (cut) has no score
    cut = class_logits(logits[:, :8], offsets[:8], text.spans)
    assert np.isneginf(cut[:, 1]).all()


@pytest.mark.parametrize(
    ("size", "box", "expected"),
    [
        ((300, 451), (0.5, 0.5, 0.2, 0.1), (180.4, 135.0, 270.6, 165.0)),
        ((20, 40), (0.5, 0.5, 1.0, 1.0), (0.0, 0.0, 40.0, 20.0)),  # the whole image, not padded
        ((50, 30), (0.25, 0.75, 0.5, 0.5), (0.0, 25.0, 15.0, 50.0)),
        ((10, 10), (1.0, 0.0, 0.4, 0.4), (8.0, -2.0, 12.0, 2.0)),  # not clipped here
    ],
)
def test_box_pixels_scale_each_axis_by_its_side(size, box, expected):
    np.testing.assert_allclose(box_pixels(np.asarray([box]), size), [expected], atol=1e-9)


def test_backends_by_model_type():
    assert MODEL_TYPES == ("owlv2", "grounding-dino", "mm-grounding-dino")
    assert backend_for("grounding-dino") is backend_for("mm-grounding-dino") is detect
    with pytest.raises(ValueError, match="'detr'"):
        backend_for("detr")


# --- the tiny model -----------------------------------------------------------------------

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
VOCAB = ClassVocabulary({"dog": [], "cat": [], "person": [], "hot dog": [], "cup": []})


@pytest.fixture(scope="module")
def tiny_dino(tmp_path_factory):
    from tests.tiny_grounding_dino import build_tiny_grounding_dino

    return str(build_tiny_grounding_dino(tmp_path_factory.mktemp("dino") / "model"))


def _pictures():
    """Two real photographs, made small: 64 x 64 and 60 x 90."""
    from PIL import Image
    from skimage import data

    return [
        np.asarray(Image.fromarray(data.astronaut()).resize((64, 64))),
        np.asarray(Image.fromarray(data.chelsea()).resize((90, 60))),
    ]


def _config(path, **kwargs):
    return DetectConfig(**{"model": path, "score_threshold": 0.0, **kwargs})


CPU = {"device": "cpu", "dtype": "float32"}


@pytest.mark.slow
def test_our_boxes_match_transformers_post_processing(tiny_dino):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(tiny_dino)
    boxes = torch.tensor([[[0.5, 0.25, 1.0, 0.5], [0.3, 0.6, 0.2, 0.4]]])
    ids = torch.tensor([[101, 106, 1012, 102]])
    outputs = SimpleNamespace(logits=torch.zeros(1, 2, 4), pred_boxes=boxes, input_ids=ids)
    for size in [(24, 48), (50, 30), (300, 451)]:
        theirs = processor.post_process_grounded_object_detection(
            outputs, threshold=-1.0, target_sizes=[size]
        )[0]["boxes"]
        np.testing.assert_allclose(box_pixels(boxes[0].numpy(), size), theirs.numpy(), rtol=1e-6)


@pytest.mark.slow
def test_tiny_model_loaded_by_path(tiny_dino):
    detector = Detector(_config(tiny_dino), VOCAB, batch_size=2, **CPU)
    assert detector.model_type == "grounding-dino"
    assert detector.describe()["model_type"] == "grounding-dino"
    pictures = _pictures()
    captions = ["a person and a cup", "a cat next to a dog eating a hot dog"]
    got = detector(pictures, captions)
    for picture, detections, allowed in zip(
        pictures, got, [{"person", "cup"}, {"cat", "dog", "hot dog"}], strict=True
    ):
        height, width = picture.shape[:2]
        assert detections and len(detections) <= detector.config.max_detections
        for d in detections:
            x, y, w, h = d.bbox
            assert d.category in allowed
            assert 0 <= x and 0 <= y and w > 0 and h > 0
            assert x + w <= width + 1e-9 and y + h <= height + 1e-9
            assert 0.0 <= d.score <= 1.0
        scores = [d.score for d in detections]
        assert scores == sorted(scores, reverse=True)
    assert detector(pictures, captions) == got  # deterministic
    assert detector(pictures, ["an empty street", "nothing here"]) == [[], []]


@pytest.mark.slow
def test_vocabulary_longer_than_one_text_is_asked_in_several(tiny_dino):
    from transformers import AutoModelForZeroShotObjectDetection, AutoProcessor

    from tests.tiny_grounding_dino import MAX_TEXT_LEN

    model = AutoModelForZeroShotObjectDetection.from_pretrained(tiny_dino).eval()
    processor = AutoProcessor.from_pretrained(tiny_dino)
    classes = ("dog", "cat", "person", "hot dog", "cup", "bicycle", "car", "bird", "horse")
    classes += ("sheep", "cow", "bench")
    call = ModelCall("a photo of a {}", "cpu", torch.float32, batch_size=8)
    text = prompt(classes, call.template).text
    assert len(processor.tokenizer(text)["input_ids"]) > MAX_TEXT_LEN  # too long for one
    calls = []
    model.register_forward_hook(lambda module, args, out: calls.append(out.logits.shape[0]))
    (got,) = detect(model, processor, _pictures()[:1], [classes], call)
    assert calls == [2]  # one picture, two texts, one batch
    queries = model.config.num_queries
    assert len(got.scores) == 2 * queries
    first, second = set(got.labels[:queries]), set(got.labels[queries:])
    assert first and second and max(first) < min(second) and max(second) < len(classes)
    assert ((got.scores >= 0) & (got.scores <= 1)).all()


@pytest.mark.slow
def test_a_model_that_is_no_zero_shot_detector_is_refused(tmp_path):
    from transformers import BertConfig

    BertConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=1).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="'bert' model, not one of owlv2, grounding-dino"):
        Detector(_config(str(tmp_path)), VOCAB, **CPU)


@pytest.mark.slow
def test_synth_on_a_corpus_with_grounding_dino(tmp_path_factory, tmp_path):
    from counterfactual.cli import main
    from counterfactual.testing.corpora import demo_samples, write_wds
    from tests.tiny_grounding_dino import build_tiny_grounding_dino

    model = build_tiny_grounding_dino(tmp_path_factory.mktemp("grid") / "dino", grid_boxes=True)
    samples = demo_samples(tmp_path / "demo")
    samples.insert(2, ("garbage", b"not a picture", "A dog on a bench next to a person.", {}))
    pattern = write_wds(samples, tmp_path / "corpus", per_shard=4)
    out = tmp_path / "out"
    args = ["synth", "--dataset", "wds", "--root", pattern, "--out", str(out)]
    args += ["--detector-model", str(model), "--detect-threshold", "0"]
    args += ["--detect-queries", "caption", "--image-method", "blur"]
    assert main(args) == 0
    rows = [json.loads(line) for line in (out / "status.jsonl").read_text().splitlines()]
    assert sorted(r["image_id"] for r in rows) == sorted(s[0] for s in samples)
    by_id = {r["image_id"]: r for r in rows}
    assert (by_id["garbage"]["status"], by_id["garbage"]["reason"]) == ("failed", "decode-error")
    written = [r for r in rows if r["status"] == "written"]
    assert written, "the tiny detector should make at least one plan at threshold 0"
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["detect"]["model"] == str(model)
    from shard_files import shard_members

    metas = [json.loads(v) for k, v in shard_members(out).items() if k.endswith(".json")]
    assert len(metas) == len(written)
    for meta in metas:
        assert meta["detector"]["model_type"] == "grounding-dino"
        assert meta["objects"] and all(0 <= o["score"] <= 1 for o in meta["objects"])
        for o in meta["objects"]:
            x, y, w, h = o["bbox"]
            assert 0 <= x and 0 <= y and x + w <= meta["width"] and y + h <= meta["height"]
