"""Evaluation (SPEC 1.5): reading the gallery and the queries, hand-computed ODmAP@k and R@K
through ``evaluate_model``, the caches, class mentions on Ray, and ``counterfactual eval`` end
to end with a tiny CLIP saved to disk and loaded by path."""

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from sample_json import sample_json

from counterfactual.cli import main
from counterfactual.eval.evalset import Corpus, CorpusImage, Query, read_karpathy, read_queries
from counterfactual.eval.evaluate import EvalConfig, embed_gallery, evaluate_model
from counterfactual.eval.mentions import MentionIndexer, cached_mentions
from counterfactual.records import Caption, ImageRecord, Phrase

WORDS = ("dog", "cat", "car")


class ColourWords:
    """A transparent stand-in model for hand-computed scores: an image's embedding is its mean
    RGB, a text's the counts of the words dog, cat, car (both L2-normalised)."""

    def __init__(self) -> None:
        self.text_calls = 0

    def embed_images(self, images):
        rows = [np.asarray(im.convert("RGB"), np.float32).reshape(-1, 3).mean(0) for im in images]
        return _unit(np.asarray(rows, np.float32).reshape(-1, 3))

    def embed_texts(self, texts):
        self.text_calls += 1
        rows = [[t.lower().split().count(w) for w in WORDS] for t in texts]
        return _unit(np.asarray(rows, np.float32).reshape(-1, 3))


def _unit(rows):
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return rows / np.where(norms == 0, 1, norms)


def _query(colour, removed, kept):
    image = Image.new("RGB", (8, 8), colour)
    return Query("k", image, "1", "test", removed, kept, "", "")


GALLERY = ("a dog and a cat", "a cat on a car", "a car", "a dog")
GALLERY_MENTIONS = [
    frozenset({"dog", "cat"}),
    frozenset({"cat", "car"}),
    frozenset({"car"}),
    frozenset({"dog"}),
]


def _test_corpus(root: Path) -> Corpus:
    root.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), (255, 0, 0)).save(root / "a.png")
    Image.new("RGB", (8, 8), (0, 0, 255)).save(root / "b.png")
    images = (CorpusImage("a", "a.png", "test"), CorpusImage("b", "b.png", "test"))
    captions = ("a dog", "a car", "a car", "a cat on a car")
    return Corpus(images, captions, np.array([0, 0, 1, 1]), root)


def test_hand_computed_odmap_and_recall(tmp_path):
    """Scores worked out by hand in the comments; ranks with ties go to the lower index."""
    queries = [
        # (0, 200, 100) -> scores c1 212 > c0 141 > c2 100 > c3 0; car removed, cat kept:
        # only c0 (dog, cat) is correct, at rank 2: AP@1 0, AP@2 1/2*1/2, AP@4 1/4*1/2.
        _query((0, 200, 100), ("car",), ("cat",)),
        # (255, 0, 0) -> c3 255 > c0 180 > c1 0 = c2 0; cat removed, dog kept: c3 correct at 1.
        _query((255, 0, 0), ("cat",), ("dog",)),
    ]
    gallery = Corpus(
        tuple(CorpusImage(str(i), f"{i}.jpg", "train") for i in range(4)),
        GALLERY,
        np.arange(4),
    )
    config = EvalConfig(odmap_ks=(1, 2, 4), curve_k=4)
    result = evaluate_model(
        ColourWords(), "colour", queries, gallery, GALLERY_MENTIONS, _test_corpus(tmp_path), config
    )
    assert result.topk.tolist() == [[1, 0, 2, 3], [3, 0, 1, 2]]
    assert result.odmap == pytest.approx({1: 0.5, 2: (0.25 + 0.5) / 2, 4: (0.125 + 0.25) / 2})
    assert result.odmap_curve[3] == pytest.approx((1 / 3 * 1 / 2 + 1 / 3) / 2)
    # per removed class: each class is one query's, its own AP
    assert result.odmap_by_removed == {
        "car": (1, pytest.approx({1: 0.0, 2: 0.25, 4: 0.125})),
        "cat": (1, pytest.approx({1: 1.0, 2: 0.5, 4: 0.25})),
    }
    assert result.to_dict()["odmap_by_removed"]["cat"] == {
        "queries": 1,
        "odmap": pytest.approx({"1": 1.0, "2": 0.5, "4": 0.25}),
    }
    # R@K: image a (red) ranks "a dog" first (own); image b (blue) ties a's "a car" (index 1)
    # and its own "a car" (index 2): the lower index wins, a miss at 1. Text->image: a's
    # "a car" ranks b first, a miss at 1; the other three hit.
    assert result.recall.image_to_text == {1: 50.0, 5: 100.0, 10: 100.0}
    assert result.recall.text_to_image == {1: 75.0, 5: 100.0, 10: 100.0}
    assert (result.test_images, result.test_captions) == (2, 4)


def test_unreadable_test_images_are_counted_and_left_out(tmp_path):
    test = _test_corpus(tmp_path)
    (tmp_path / "b.png").write_bytes(b"not a png")
    gallery = Corpus((CorpusImage("0", "0.jpg", "train"),), ("a dog",), np.arange(1))
    result = evaluate_model(
        ColourWords(), "c", [_query((9, 9, 9), ("cat",), ("dog",))], gallery, [{"dog"}], test
    )
    assert result.failures == {"decode-error": 1}
    assert (result.test_images, result.test_captions) == (1, 2)
    assert result.recall.image_to_text[1] == 100.0


def test_no_queries_is_an_error():
    gallery = Corpus((CorpusImage("0", "0.jpg", "train"),), ("a dog",), np.arange(1))
    with pytest.raises(ValueError, match="no queries"):
        evaluate_model(ColourWords(), "c", [], gallery, [frozenset()], None)


def test_gallery_embeddings_are_cached_per_model_and_captions(tmp_path):
    model = ColourWords()
    first = embed_gallery(model, GALLERY, "colour", tmp_path, batch=3)
    assert model.text_calls == 2  # 4 captions in batches of 3
    again = embed_gallery(model, GALLERY, "colour", tmp_path, batch=3)
    assert model.text_calls == 2 and np.array_equal(first, again)
    embed_gallery(model, GALLERY[:3], "colour", tmp_path)  # other captions: computed
    embed_gallery(model, GALLERY, "other-model", tmp_path)  # other model: computed
    assert model.text_calls == 4
    assert len(list(tmp_path.glob("texts-*.npy"))) == 3 and not list(tmp_path.glob("*.tmp*"))


def test_read_karpathy(tmp_path):
    data = {
        "images": [
            {
                "filepath": "val2014",
                "filename": "COCO_val2014_000000000042.jpg",
                "cocoid": 42,
                "split": "test",
                "sentences": [{"raw": " A dog. "}, {"tokens": ["a", "cat"]}],
            },
            {
                "filepath": "train2014",
                "filename": "x.jpg",
                "cocoid": 7,
                "split": "restval",
                "sentences": [{"raw": "A car."}],
            },
        ]
    }
    path = tmp_path / "dataset_coco.json"
    path.write_text(json.dumps(data))
    corpus = read_karpathy(path, tmp_path)
    assert corpus.captions == ("A dog.", "a cat", "A car.")
    assert corpus.caption_image.tolist() == [0, 0, 1]
    assert corpus.images[0].file == "val2014/COCO_val2014_000000000042.jpg"
    assert corpus.splits == {"test": 1, "train": 1}
    test = corpus.split("test")
    assert test.captions == ("A dog.", "a cat") and test.caption_image.tolist() == [0, 0]
    with pytest.raises(ValueError, match="no image of split"):
        corpus.split("val")
    path.write_text('{"nope": 1}')
    with pytest.raises(ValueError, match="Karpathy"):
        read_karpathy(path)


def test_annotated_phrases_give_mentions(tmp_path):
    from counterfactual.eval.evalset import corpus_from_records

    phrases = (Phrase(2, 5, "man", ("people",)), Phrase(15, 18, "dog", ("animals",)))
    records = [
        ImageRecord(
            "1",
            "1.jpg",
            8,
            8,
            (),
            (Caption("c1", "A man walks a dog", phrases), Caption("c2", "A man", None)),
            split="test",
        )
    ]
    corpus = corpus_from_records(records, tmp_path)
    assert corpus.annotated == (frozenset({"people", "animals"}), None)
    assert corpus.split("test").annotated == corpus.annotated


def _write_shard(path: Path, samples):
    with tarfile.open(path, "w") as tar:
        for key, files in samples:
            for ext, data in files.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def test_read_queries_keeps_one_per_plan_and_reports_bad_samples(tmp_path):
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (1, 2, 3)).save(buf, "JPEG")
    jpg = buf.getvalue()

    def meta(image_id, removed, caption):
        return json.dumps(sample_json(image_id, removed, ["person"], caption)).encode()

    _write_shard(
        tmp_path / "shard-000000.tar",
        [
            ("a1", {"jpg": jpg, "json": meta("1", ["dog"], "first"), "txt": b"first"}),
            ("a2", {"jpg": jpg, "json": meta("1", ["dog"], "second"), "txt": b"second"}),
            ("b", {"jpg": jpg, "json": meta("1", ["cat"], "other plan"), "txt": b"x"}),
            ("c", {"jpg": b"broken", "json": meta("2", ["dog"], "x"), "txt": b"x"}),
            ("d", {"jpg": jpg, "json": b"{not json", "txt": b"x"}),
        ],
    )
    queries, problems = read_queries([str(tmp_path / "shard-000000.tar")])
    assert [(q.key, q.removed, q.kept, q.caption) for q in queries] == [
        ("a1", ("dog",), ("person",), "first"),
        ("b", ("cat",), ("person",), "other plan"),
    ]
    assert [(p.key, p.reason) for p in problems] == [("c", "decode-error"), ("d", "bad-metadata")]


@pytest.fixture(scope="module")
def gallery_texts(tmp_path_factory):
    from counterfactual.readers.generate import generate_coco

    files = generate_coco(tmp_path_factory.mktemp("gen"), 120, seed=3, write_images=False)
    texts = [a["caption"] for a in json.loads(files.captions.read_text())["annotations"]]
    return texts + ["", "A hot dog next to two dogs", "Ein Hund 🐕 — naïve café with a DOG"]


@pytest.mark.slow
def test_mentions_on_ray_equal_in_process_and_are_cached(gallery_texts, tmp_path, monkeypatch):
    pytest.importorskip("ray")
    import shutil
    import tempfile

    import ray

    from counterfactual.pipelines.mentions import index_mentions_ray
    from counterfactual.pipelines.options import RayOptions

    indexer = MentionIndexer()
    local = indexer(gallery_texts)
    system_temp = Path(tempfile.mkdtemp(prefix="cfm", dir="/tmp"))  # short enough for Ray
    monkeypatch.setattr(tempfile, "tempdir", str(system_temp))
    try:
        on_ray = index_mentions_ray(
            gallery_texts, indexer, tmp_path, RayOptions(num_cpus=2, dashboard=False), block=64
        )
        stopped = not ray.is_initialized()
        left = sorted(p.name for p in system_temp.iterdir())
    finally:
        ray.shutdown()
        shutil.rmtree(system_temp, ignore_errors=True)
    # the Ray it started is stopped, its folder gone, nothing left in the work folder
    assert (stopped, left, sorted(p.name for p in tmp_path.iterdir())) == (True, [], [])
    assert on_ray == local
    assert sum(1 for m in local if m) > len(local) // 2  # the check has teeth

    calls = []

    def compute(texts):
        calls.append(len(texts))
        return indexer(texts)

    found, hit = cached_mentions(gallery_texts, indexer, tmp_path / "cache", compute)
    assert (found, hit, calls) == (local, False, [len(gallery_texts)])
    found, hit = cached_mentions(gallery_texts, indexer, tmp_path / "cache", compute)
    assert (found, hit, calls) == (local, True, [len(gallery_texts)])
    _, hit = cached_mentions(gallery_texts[:-1], indexer, tmp_path / "cache", compute)
    assert not hit  # other captions: recomputed, not a stale read


@pytest.mark.slow
def test_eval_command_end_to_end_with_a_tiny_clip(tmp_path, capsys):
    """The demo's synthetic shards as queries, its captions as gallery, a tiny random CLIP
    saved to disk and loaded by path: every report file, sane numbers, the caches reused."""
    from tiny_clip import build_tiny_clip

    clip = build_tiny_clip(tmp_path / "clip")
    queries = tmp_path / "demo"
    synth = ["synth", "--dataset", "demo", "--out", str(queries), "--image-method", "blur"]
    assert main([*synth, "--contact-sheet", "0"]) == 0
    report = tmp_path / "report"
    argv = ["eval", "--queries", str(queries), "--out", str(report), "--grid", "3"]
    argv += ["--model", f"hf-clip:{clip}", "--model", str(clip), "--curve-k", "12"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    head = "| Model | ODmAP@1 | ODmAP@5 | ODmAP@10 | S@1 | S@5 | S@10 | top-1 hub |"
    assert head in out and "i→t R@1" in out
    data = json.loads((report / "report.json").read_text())
    assert data["gallery_captions"] == 27 and data["query_splits"] == ["none"]
    assert data["mentioning_captions"] > 10
    first, second = data["models"]
    assert first["queries"] == 6 and first["test_images"] == 8 and first["test_captions"] == 27
    for k in ("1", "5", "10"):
        assert 0.0 <= first["odmap"][k] <= 1.0
    assert len(first["odmap_curve"]) == 12
    hub = first["hubness"]
    assert set(hub["skewness"]) == {"1", "5", "10"} and 1 / 6 <= hub["top1_share"] <= 1
    assert 0 <= hub["top1_caption"] < 27 and second["hubness"] == hub
    # the same weights by two specs: the same numbers
    assert first["odmap"] == second["odmap"] and first["recall"] == second["recall"]
    for name in ("odmap_at_k.png", "qualitative.png"):
        with Image.open(report / name) as im:
            assert im.width > 100 and im.height > 100
    assert "ODmAP@5" in (report / "report.md").read_text()
    assert len(list((report / "cache").glob("mentions-*.npz"))) == 1
    assert main(argv) == 0
    assert "mentions of 27 captions from the cache" in capsys.readouterr().err
