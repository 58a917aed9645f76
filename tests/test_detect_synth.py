"""Synthesis with detected boxes: the Detect and Select steps, caption-aware selection, the
metadata of detected objects, and the accounting of every input.

The detector is scripted here (it returns the dataset's own boxes as detections, keyed by the
picture's pixels): what is tested is the pipeline around it, with outputs we control. The real
OWLv2 path (tiny random model saved to disk) runs in ``test_corpus_synth.py``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace

import numpy as np
import pytest
from shard_files import shard_members

from counterfactual.image import ImageConfig
from counterfactual.method.detect import DetectConfig, Detection
from counterfactual.method.masks import MaskConfig
from counterfactual.method.selection import (
    CAPTION_UNCHANGED,
    SelectionConfig,
    candidates,
    select_many,
)
from counterfactual.readers.coco import read_coco
from counterfactual.readers.generate import generate_coco
from counterfactual.shards.pictures import load_record_image
from counterfactual.synth.plan import Runtime, SynthConfig, fingerprint_of
from counterfactual.synth.runner import run_local
from counterfactual.synth.staging import plan_stages, step_order
from counterfactual.text import TextConfig
from counterfactual.vocab import coco_vocabulary

BLUR = ImageConfig(method="blur")
DETECT = DetectConfig(model="scripted")


def _pixels_key(image: np.ndarray) -> str:
    return hashlib.blake2b(image.tobytes(), digest_size=8).hexdigest()


class ScriptedDetector:
    """Returns the annotated boxes of the picture it is shown (score 0.9), found by pixels;
    ``fail_on`` image ids raise as a broken model would."""

    def __init__(self, records, fail_on=()):
        self.by_pixels = {}
        self.fail_pixels = set()
        for r in records:
            key = _pixels_key(load_record_image(r, 1 << 30))
            self.by_pixels[key] = [Detection(o.category, o.bbox, 0.9) for o in r.objects]
            if r.image_id in fail_on:
                self.fail_pixels.add(key)
        self.calls = 0

    def __call__(self, images, captions):
        self.calls += 1
        keys = [_pixels_key(im) for im in images]
        if any(k in self.fail_pixels for k in keys):
            raise RuntimeError("scripted model failure")
        return [list(self.by_pixels[k]) for k in keys]

    def describe(self):
        return {"model": "scripted"}


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    root = tmp_path_factory.mktemp("gen")
    files = generate_coco(root, 40, seed=3, size=(160, 120))
    return read_coco(files.instances, files.captions, files.images)


def _boxless(records):
    """The records as a corpus reader gives them: no objects, size unknown."""
    return [replace(r, objects=(), width=0, height=0) for r in records]


def _samples(out):
    members = shard_members(out)
    return {
        name[: -len(".json")]: (
            json.loads(data),
            members[name.replace(".json", ".jpg")],
            members[name.replace(".json", ".txt")],
        )
        for name, data in members.items()
        if name.endswith(".json")
    }


def _status(out):
    return [json.loads(line) for line in (out / "status.jsonl").read_text().splitlines()]


def test_detected_boxes_plan_and_erase_exactly_as_annotated_boxes(coco, tmp_path):
    """Same boxes from a detector as from the annotations: same plan, caption and pixels."""
    records = list(coco.records)
    annotated = run_local(records, tmp_path / "coco", SynthConfig(image=BLUR))
    config = SynthConfig(image=BLUR, detect=DETECT)
    detected = run_local(
        _boxless(records), tmp_path / "det", config, detector=ScriptedDetector(records)
    )
    a = {s[0]["image_id"]: s for s in _samples(tmp_path / "coco").values()}
    d = {s[0]["image_id"]: s for s in _samples(tmp_path / "det").values()}
    assert len(a) >= 10 and set(a) == set(d)
    for image_id, (meta_a, jpg_a, txt_a) in a.items():
        meta_d, jpg_d, txt_d = d[image_id]
        assert meta_d["plan"] == meta_a["plan"]
        assert (meta_d["caption"], txt_d) == (meta_a["caption"], txt_a)
        assert jpg_d == jpg_a
        assert meta_d["detector"] == {"model": "scripted"}
        assert [o["category"] for o in meta_d["objects"]] == [
            o.category for o in coco_record(coco, image_id).objects
        ]
        assert {o["score"] for o in meta_d["objects"]} == {0.9}
    # images without a plan are skipped for the same reasons, per item instead of per image
    reasons_a = {s.image_id: s.reason for s in annotated.statuses if s.status == "skipped"}
    reasons_d = {s.image_id: s.reason for s in detected.statuses if s.status == "skipped"}
    assert reasons_d == {i: r for i, r in reasons_a.items() if r != "not-drawn"}


def coco_record(coco, image_id):
    return next(r for r in coco.records if r.image_id == image_id)


def test_caption_aware_selection_draws_only_mentioned_targets(coco, tmp_path):
    records = list(coco.records)
    config = SynthConfig(image=BLUR, detect=DETECT, text=TextConfig(skip_unchanged=True))
    result = run_local(
        _boxless(records), tmp_path / "out", config, detector=ScriptedDetector(records)
    )
    vocab = coco_vocabulary()
    samples = _samples(tmp_path / "out")
    assert samples
    for meta, _, _ in samples.values():
        mentioned = vocab.mentioned(meta["original_caption"])
        assert meta["plan"]["target"] in mentioned
        assert meta["caption"] != meta["original_caption"]
        valid = {
            p.target
            for p in candidates(coco_record(coco, meta["image_id"]), config.selection).candidates
            if p.valid
        }
        assert set(meta["not_drawn"]) == (valid & mentioned) - {meta["plan"]["target"]}
    unchanged = [s for s in result.statuses if s.reason == CAPTION_UNCHANGED]
    assert unchanged  # the data has images whose valid targets the caption does not name
    for s in unchanged:
        record = coco_record(coco, s.image_id)
        valid = {p.target for p in candidates(record, config.selection).candidates if p.valid}
        caption = next(c for c in record.captions if s.key.endswith(f"_{c.caption_id}"))
        mentioned = vocab.mentioned(caption.text)
        if s.target is None:  # Select: no valid target is named by the caption
            assert valid and not valid & mentioned
            listed = s.detail.removeprefix("the caption names no valid target (")
            assert set(listed.removesuffix(")").split(", ")) == valid
        else:  # Rewrite: named, but spaCy's noun chunks do not hold it ("a fire hydrant" is
            # parsed as "a fire" + an adjective), so np-removal leaves the caption as it was
            assert s.target in mentioned
            assert s.detail == "the caption mentions no removed class"
    # every input image has exactly one row, and only written ones are in the shards
    assert sorted(s.image_id for s in result.statuses) == sorted(r.image_id for r in records)
    assert {s.key for s in result.statuses if s.status == "written"} == set(samples)


def test_every_input_is_accounted_for(coco, tmp_path):
    """A missing picture, a caption-less record and a detector that fails on one image each
    leave a row with their reason; the others are written as usual."""
    records = list(coco.records[:12])
    records[1] = replace(records[1], file="gone.jpg")
    records[2] = replace(records[2], captions=())
    detector = ScriptedDetector(records[:1] + records[3:], fail_on={records[3].image_id})
    config = SynthConfig(image=BLUR, detect=DETECT)
    result = run_local(
        _boxless(records),
        tmp_path / "out",
        config,
        detector=detector,
        runtime=Runtime(batch_size=4),
    )
    rows = {s.image_id: s for s in result.statuses}
    assert len(result.statuses) == len(records) == len(rows)
    assert (rows[records[1].image_id].status, rows[records[1].image_id].reason) == (
        "failed",
        "missing-file",
    )
    assert rows[records[2].image_id].reason == "no-caption"
    bad = rows[records[3].image_id]
    assert (bad.status, bad.reason) == ("failed", "model-error")
    assert "detect: RuntimeError('scripted model failure')" in bad.detail
    assert result.written == sum(s.status == "written" for s in rows.values()) > 0


def test_rerun_resumes_and_another_detector_config_is_refused(coco, tmp_path):
    records = list(coco.records[:10])
    config = SynthConfig(image=BLUR, detect=DETECT, images_per_shard=3)
    detector = ScriptedDetector(records)
    first = run_local(_boxless(records), tmp_path / "out", config, detector=detector)
    calls = detector.calls
    again = run_local(_boxless(records), tmp_path / "out", config, detector=detector)
    assert again.resumed == len(first.shards) and detector.calls == calls
    assert [s.key for s in again.statuses] == [s.key for s in first.statuses]
    other = replace(config, detect=replace(DETECT, score_threshold=0.5))
    with pytest.raises(ValueError, match="different config"):
        run_local(_boxless(records), tmp_path / "out", other, detector=detector)
    # the runtime does not change the output, so it may differ on a rerun
    again = run_local(
        _boxless(records),
        tmp_path / "out",
        config,
        detector=detector,
        runtime=Runtime(batch_size=2, detect_batch_size=2),
    )
    assert again.resumed == len(first.shards) and detector.calls == calls
    moved = config.record(Runtime(device="cuda:1", detect_batch_size=2))
    assert moved["detect"]["device"] == "cuda:1" and moved["detect"]["batch_size"] == 2
    assert fingerprint_of(moved) == config.fingerprint()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"selection": SelectionConfig(policy="all")}, "policy 'all'"),
        ({"selection": SelectionConfig(policy="spurious")}, "policy 'spurious'"),
        ({"mask": MaskConfig(source="segmentation")}, "no segmentation"),
    ],
)
def test_config_refuses_what_needs_boxes_upfront(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SynthConfig(detect=DETECT, **kwargs)


def test_config_without_detection_keeps_its_fingerprint():
    assert "detect" not in SynthConfig().fingerprint()
    assert SynthConfig(detect=DETECT).fingerprint()["detect"]["model"] == "scripted"


def test_step_order_and_stages():
    config = SynthConfig(image=BLUR, detect=DETECT)
    assert step_order(config) == ("decode", "detect", "select", "rewrite", "edit", "encode")
    assert [s.steps for s in plan_stages(config)] == [
        ("decode",),
        ("detect",),
        ("select", "rewrite", "edit", "encode"),
    ]
    diffusion = replace(config, image=ImageConfig(backend="diffusers"))
    assert [s.steps for s in plan_stages(diffusion)] == [
        ("decode",),
        ("detect",),
        ("select", "rewrite"),
        ("edit",),
        ("encode",),
    ]
    captioner = replace(config, text=TextConfig(method="captioner"))
    assert step_order(captioner)[:4] == ("decode", "detect", "select", "edit")


def test_select_many_limits_targets(coco):
    records = list(coco.records)
    config = SelectionConfig(policy="uniform")
    plain = select_many(records, config)
    limited = select_many(records, config, targets=[None] * len(records))
    assert [s.plans for s in limited] == [s.plans for s in plain]
    for record, sel in zip(
        records, select_many(records, config, targets=[{"person"}] * len(records)), strict=True
    ):
        valid = {p.target for p in candidates(record, config).candidates if p.valid}
        if "person" in valid:
            assert [p.target for p in sel.plans] == ["person"]
        elif valid:
            assert (sel.plans, sel.reason) == ((), CAPTION_UNCHANGED)
    with pytest.raises(ValueError, match="target limits"):
        select_many(records, config, targets=[None])


def test_vocabulary_mentioned():
    vocab = coco_vocabulary()
    assert vocab.mentioned("Two hot dogs and a Dog on a sofa.") == {"hot dog", "dog", "couch"}
    assert vocab.mentioned("An empty street.") == set()


def test_picture_sources_round_trip_through_json():
    from counterfactual.records import ParquetCell, TarMember, source_from_dict, source_to_dict

    for source in (TarMember("/d/00000.tar", 1536, 2048), ParquetCell("/d/p.parquet", 2, 7, "jpg")):
        assert source_from_dict(json.loads(json.dumps(source_to_dict(source)))) == source
    for bad in ({"kind": "zip", "path": "x"}, {"kind": "tar", "path": "x"}, {}):
        with pytest.raises(ValueError, match="not a picture source"):
            source_from_dict(bad)
