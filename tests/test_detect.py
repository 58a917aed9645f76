from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from counterfactual.method.detect import (
    DetectConfig,
    Detection,
    Detector,
    nms,
    postprocess,
    query_classes,
    to_objects,
    to_pixels,
)
from counterfactual.records import ObjectAnnotation
from counterfactual.vocab import ClassVocabulary

VOCAB = ClassVocabulary({"dog": ["puppy"], "cat": ["kitten"], "hot dog": [], "bird": []})
CLASSES = ("dog", "cat")
CFG = DetectConfig(score_threshold=0.5, nms_iou=0.5, max_detections=10)


def _post(boxes, scores, labels, size=(100, 100), config=CFG, classes=CLASSES):
    return postprocess(
        np.asarray(boxes, float), np.asarray(scores), np.asarray(labels), classes, size, config
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"score_threshold": 1.5}, "score_threshold"),
        ({"nms_iou": -0.1}, "nms_iou"),
        ({"queries": "captions"}, "queries"),
        ({"template": "a photo"}, "template"),
        ({"template": "{} {}"}, "template"),
        ({"template": "{}"}, "template"),
        ({"max_detections": 0}, "max_detections"),
        ({"model": " x"}, "model"),
    ],
)
def test_config_rejects(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DetectConfig(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"), [({"batch_size": 0}, "batch_size"), ({"dtype": "float64"}, "dtype")]
)
def test_detector_rejects_a_bad_runtime(kwargs, message):
    """The device, dtype and batch size are the Detector's (a run's Runtime), not the config's."""
    with pytest.raises(ValueError, match=message):
        Detector(DetectConfig(), SMALL, **kwargs)


@pytest.mark.parametrize(
    ("caption", "mode", "expected"),
    [
        ("Two dogs and a puppy on a sofa", "caption", ("dog",)),
        ("Kittens eat hot dogs", "caption", ("cat", "hot dog")),
        ("A bird, a cat and a dog", "caption", ("dog", "cat", "bird")),
        ("An empty street at night", "caption", ()),
        ("Kittens eat hot dogs", "caption+vocabulary", ("dog", "cat", "hot dog", "bird")),
        ("An empty street at night", "caption+vocabulary", ()),
        ("An empty street at night", "vocabulary", ("dog", "cat", "hot dog", "bird")),
        ("Two birds", "vocabulary", ("dog", "cat", "hot dog", "bird")),
    ],
)
def test_query_classes(caption, mode, expected):
    assert query_classes(caption, VOCAB, mode) == expected


def test_query_classes_rejects_mode():
    with pytest.raises(ValueError, match="queries"):
        query_classes("a dog", VOCAB, "all")


def test_same_class_overlap_suppressed_other_class_and_far_box_kept():
    # IoU(a, b) = 90 / 110 > 0.5: b goes; c is far away; d is another class on a's spot.
    boxes = [[0, 0, 10, 10], [1, 0, 11, 10], [20, 20, 30, 30], [0, 0, 10, 10]]
    got = _post(boxes, [0.9, 0.8, 0.7, 0.6], [0, 0, 0, 1])
    assert got == [
        Detection("dog", (0.0, 0.0, 10.0, 10.0), 0.9),
        Detection("dog", (20.0, 20.0, 10.0, 10.0), 0.7),
        Detection("cat", (0.0, 0.0, 10.0, 10.0), 0.6),
    ]


def test_iou_exactly_at_threshold_is_kept():
    boxes = [[0, 0, 10, 10], [0, 0, 10, 5]]  # IoU = 50 / 100 = 0.5
    assert len(_post(boxes, [0.9, 0.8], [0, 0])) == 2
    tighter = DetectConfig(score_threshold=0.5, nms_iou=0.49)
    assert len(_post(boxes, [0.9, 0.8], [0, 0], config=tighter)) == 1


def test_ties_go_to_the_lower_index():
    boxes = [[20, 20, 30, 30], [0, 0, 10, 10], [0, 0, 10, 10]]
    got = _post(boxes, [0.7, 0.7, 0.7], [1, 0, 0])
    # 1 and 2 are the same box and score: 1 wins; output ties are in index order.
    assert [(d.category, d.bbox[0]) for d in got] == [("cat", 20.0), ("dog", 0.0)]
    np.testing.assert_array_equal(nms(np.asarray(boxes, float), np.full(3, 0.7), 0.5), [0, 1])


def test_threshold_boundary():
    boxes = [[0, 0, 10, 10], [20, 20, 30, 30], [40, 40, 50, 50]]
    got = _post(boxes, [0.5, np.nextafter(0.5, 0), 0.6], [0, 0, 0])
    assert [d.score for d in got] == [0.6, 0.5]


def test_clipping_and_degenerate_boxes():
    boxes = [
        [-5, -5, 10, 10],  # clipped to (0, 0, 10, 8)
        [25, 0, 30, 5],  # right of the 20-wide image: empty after clipping
        [3, 3, 3, 7],  # no width
        [5, 2, 4, 6],  # inverted
        [np.nan, 0, 5, 5],
        [15, -3, 40, 2],  # clipped to (15, 0, 20, 2)
    ]
    got = _post(boxes, [0.9, 0.9, 0.9, 0.9, 0.9, 0.8], [0, 1, 0, 0, 0, 1], size=(8, 20))
    assert got == [
        Detection("dog", (0.0, 0.0, 10.0, 8.0), 0.9),
        Detection("cat", (15.0, 0.0, 5.0, 2.0), 0.8),
    ]


def test_max_detections_keeps_the_best():
    boxes = [[0, 0, 10, 10], [20, 20, 30, 30], [40, 40, 50, 50]]
    config = DetectConfig(score_threshold=0.0, max_detections=2)
    got = _post(boxes, [0.6, 0.9, 0.7], [0, 1, 0], config=config)
    assert [d.score for d in got] == [0.9, 0.7]


def test_nms_after_clipping():
    # Apart before clipping (IoU 0.25), the same box after clipping to a 10x10 image.
    boxes = [[0, 0, 20, 10], [0, 0, 10, 10]]
    assert len(_post(boxes, [0.9, 0.8], [0, 0], size=(10, 10))) == 1


def test_empty_and_bad_inputs():
    assert _post(np.zeros((0, 4)), [], []) == []
    with pytest.raises(ValueError, match="labels"):
        _post([[0, 0, 1, 1]], [0.9], [2])
    with pytest.raises(ValueError, match="length"):
        _post([[0, 0, 1, 1]], [0.9, 0.8], [0])


def test_to_objects_keeps_score():
    detections = [Detection("dog", (1.0, 2.0, 3.0, 4.0), 0.75)]
    assert to_objects(detections) == (
        ObjectAnnotation(bbox=(1.0, 2.0, 3.0, 4.0), category="dog", score=0.75),
    )


@pytest.mark.parametrize(
    ("size", "box", "expected"),
    [
        # 20 high, 40 wide: padded to 40 x 40; the image is the top half of the square.
        ((20, 40), (0.5, 0.25, 1.0, 0.5), (0, 0, 40, 20)),
        ((20, 40), (0.25, 0.25, 0.5, 0.5), (0, 0, 20, 20)),
        # 50 high, 30 wide: padded to 50 x 50; the image is the left 3/5 of the square.
        ((50, 30), (0.3, 0.5, 0.6, 1.0), (0, 0, 30, 50)),
        ((50, 30), (0.5, 0.5, 0.2, 0.2), (20, 20, 30, 30)),
    ],
)
def test_to_pixels_scales_by_the_padded_side(size, box, expected):
    np.testing.assert_allclose(to_pixels(np.asarray([box]), size), [expected], atol=1e-9)


# --- the tiny model -----------------------------------------------------------------------

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
SMALL = ClassVocabulary({"dog": [], "cat": [], "bird": []})


@pytest.fixture(scope="module")
def tiny_owlv2(tmp_path_factory):
    from counterfactual.testing import build_tiny_owlv2

    return str(build_tiny_owlv2(tmp_path_factory.mktemp("owlv2") / "model"))


def _images():
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, size=s, dtype=np.uint8) for s in [(20, 40, 3), (50, 30, 3)]] + [
        rng.integers(0, 256, size=(32, 32, 3), dtype=np.uint8)
    ]


def _config(path, **kwargs):
    return DetectConfig(**{"model": path, "score_threshold": 0.0, **kwargs})


CPU = {"device": "cpu", "dtype": "float32"}


def test_processor_pads_bottom_right_and_matches_transformers(tiny_owlv2):
    from transformers import AutoProcessor

    processor = AutoProcessor.from_pretrained(tiny_owlv2)
    # A white 24 x 48 image: padded to 48 x 48, resized to 32 x 32, so it fills rows 0-15.
    pixels = processor(images=[np.full((24, 48, 3), 255, np.uint8)], return_tensors="np")
    values = pixels["pixel_values"][0]
    assert values.shape[-2:] == (32, 32)
    for channel in values:  # each channel is constant on the image and on the padding
        white, pad = channel[:14], channel[18:]
        assert np.ptp(white) < 1e-3 and np.ptp(pad) < 1e-3 and white.min() > pad.max() + 1
    # Our rescaling agrees with transformers' own post-processing for non-square images.
    boxes = torch.tensor([[[0.5, 0.25, 1.0, 0.5], [0.3, 0.6, 0.2, 0.4]]])
    outputs = SimpleNamespace(logits=torch.zeros(1, 2, 1), pred_boxes=boxes)
    for size in [(24, 48), (50, 30)]:
        ours = to_pixels(boxes[0].numpy(), size)
        theirs = processor.post_process_grounded_object_detection(
            outputs, threshold=-1.0, target_sizes=[size]
        )[0]["boxes"]
        np.testing.assert_allclose(ours, theirs.numpy(), rtol=1e-6)


def test_tiny_model_end_to_end(tiny_owlv2):
    detector = Detector(_config(tiny_owlv2), SMALL, batch_size=3, **CPU)
    images = _images()
    captions = ["a dog chases a cat", "three birds", "an empty street"]
    got = detector(images, captions)
    assert len(got) == 3 and got[2] == []
    assert got[0] and got[1]
    for image, detections, allowed in zip(images, got, [{"dog", "cat"}, {"bird"}], strict=False):
        height, width = image.shape[:2]
        assert len(detections) <= detector.config.max_detections
        for d in detections:
            x, y, w, h = d.bbox
            assert d.category in allowed
            assert 0 <= x and 0 <= y and w > 0 and h > 0
            assert x + w <= width + 1e-9 and y + h <= height + 1e-9
            assert 0.0 <= d.score <= 1.0
        scores = [d.score for d in detections]
        assert scores == sorted(scores, reverse=True)
    assert detector(images, captions) == got  # deterministic

    one_by_one = Detector(_config(tiny_owlv2), SMALL, batch_size=1, **CPU)(images, captions)
    for a, b in zip(got, one_by_one, strict=True):
        assert [d.category for d in a] == [d.category for d in b]
        np.testing.assert_allclose([d.bbox for d in a], [d.bbox for d in b], atol=1e-4)
        np.testing.assert_allclose([d.score for d in a], [d.score for d in b], atol=1e-5)


def test_padded_queries_are_masked(tiny_owlv2):
    # An image asked for one class, batched with one asked for three: never a padding label.
    detector = Detector(_config(tiny_owlv2, queries="caption"), SMALL, batch_size=2, **CPU)
    images = _images()[:2]
    got = detector(images, ["a bird", "a dog, a cat and a bird"])
    assert got[0] and {d.category for d in got[0]} == {"bird"}
    alone = detector(images[:1], ["a bird"])
    assert [d.category for d in alone[0]] == [d.category for d in got[0]]


def test_no_queries_does_not_run_the_model(tiny_owlv2):
    detector = Detector(_config(tiny_owlv2), SMALL, **CPU)

    def boom(**kwargs):
        raise AssertionError("the model ran")

    detector._model = boom
    assert detector(_images()[:2], ["nothing", "here either"]) == [[], []]


def test_input_checks(tiny_owlv2):
    detector = Detector(_config(tiny_owlv2), SMALL, **CPU)
    with pytest.raises(ValueError, match="captions"):
        detector(_images(), ["a dog"])
    with pytest.raises(ValueError, match="uint8"):
        detector([np.zeros((4, 4, 3), np.float32)], ["a dog"])


def test_missing_model_folder(tmp_path):
    missing = str(tmp_path / "no-such-model")
    with pytest.raises(FileNotFoundError, match="no-such-model"):
        Detector(_config(missing), SMALL, **CPU)


def test_folder_that_is_not_a_model(tmp_path):
    with pytest.raises(ValueError, match="could not load detector"):
        Detector(_config(str(tmp_path)), SMALL, **CPU)
