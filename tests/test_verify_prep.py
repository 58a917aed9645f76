"""Verification's preprocessing off the model actor's CPU: the shard worker cuts and resizes the
crops (:func:`prepare_verify`, the model's own image processor with rescaling and normalising
off), the actor rescales, normalises and embeds them (:meth:`HFClipEmbedder.embed_pixels`).
The verdicts equal the old path's (the actor cropping and preprocessing whole pictures) on a
tiny random CLIP saved to disk, in process and through `counterfactual synth --runner ray`."""

import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import webdataset as wds
from bad_coco import synth_args
from PIL import Image

from counterfactual.cli import main
from counterfactual.image import ImageConfig
from counterfactual.method.selection import SelectionConfig
from counterfactual.method.verify import (
    PreparedVerify,
    Verifier,
    VerifyConfig,
    VerifyRequest,
    prepare_verify,
    verify_crops,
)
from counterfactual.readers.generate import generate_coco
from counterfactual.records import Caption, ImageRecord, ObjectAnnotation
from counterfactual.synth.job import PLANNED, Job
from counterfactual.synth.plan import SynthConfig, plan
from counterfactual.synth.staging import Chain, build_steps
from counterfactual.synth.steps import (
    prepare_for_verify,
    restore_after_verify,
    verify_gpu_share,
)
from counterfactual.vocab import coco_vocabulary

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def clip(tmp_path_factory):
    pytest.importorskip("transformers")
    from tiny_clip import build_tiny_clip

    return f"hf-clip:{build_tiny_clip(tmp_path_factory.mktemp('clip') / 'clip')}"


@pytest.fixture(scope="module")
def verifier(clip):
    config = VerifyConfig(mode="record", model=clip, k=40, retention_k=40, min_box=8)
    return Verifier(config, coco_vocabulary(), batch_size=4)


def picture(rng, h, w):
    return rng.integers(0, 256, (h, w, 3), dtype=np.uint8)


def requests(n=6, seed=0):
    """Pictures of COCO-like sizes with boxes from 5 px to the whole picture, edited by noise."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        h, w = [(480, 640), (427, 640), (640, 480), (61, 93), (333, 500), (240, 320)][i % 6]
        original = picture(rng, h, w)
        edited = original.copy()
        edited[h // 4 : h // 2, w // 4 : w // 2] = picture(rng, h // 2 - h // 4, w // 2 - w // 4)
        removed = {
            "dog": [(w / 4, h / 4, w / 4, h / 4)],
            "cat": [(1, 2, 5, 7), (w - 40, 0, 39, 30)],
        }
        kept = {"person": [(0, 0, w, h)], "chair": [(w / 2, h / 2, 0.3 * w, 0.4 * h)]}
        out.append(
            VerifyRequest(
                original,
                edited,
                removed,
                kept,
                ("dog", "cat"),
                ("person", "chair"),
                "a person on a chair",
                "np-removal",
            )  # fmt: skip
        )
    return out


def same_verdicts(new, old):
    """Ranks and checks equal, probabilities within TOLERANCE."""
    assert len(new) == len(old)
    for a, b in zip(new, old, strict=True):
        a, b = a.to_dict(), b.to_dict()
        for side in ("removal", "retention"):
            for name in b[side]:
                for key, value in b[side][name].items():
                    if key.startswith("prob"):
                        assert abs(a[side][name][key] - value) < TOLERANCE, (name, key)
                    else:
                        assert a[side][name][key] == value, (name, key)
        assert {k: v for k, v in a.items() if k not in ("removal", "retention")} == {
            k: v for k, v in b.items() if k not in ("removal", "retention")
        }


def test_prepared_pixels_embed_as_the_pictures_do(verifier):
    embedder = verifier.embedder
    crops, removal, retention = verify_crops(requests(1)[0], verifier.config)
    assert removal == {"dog": 0, "cat": 2} and retention == {"person": 4, "chair": 5}
    prep = verifier.pixel_prep()
    pixels = prep(crops)
    assert pixels.dtype == np.uint8 and pixels.shape == (6, 3, 32, 32)  # the model's input
    old = embedder.embed_images(crops)
    new = embedder.embed_pixels(pixels)
    assert np.abs(new - old).max() < TOLERANCE
    assert np.abs(old[0] - old[4]).max() > 0.01  # different crops, different rows
    assert prep([]).shape == (0, 3, 32, 32)
    with pytest.raises(ValueError, match="uint8"):
        embedder.embed_pixels(pixels.astype(np.float32))


def test_verdicts_of_prepared_requests_equal_the_old_path(verifier):
    plain = requests()
    prep = verifier.pixel_prep()
    prepared = [prepare_verify(r, verifier.config, prep) for r in plain]
    # what a worker ships: model-size crops, not the two whole pictures
    assert len(pickle.dumps(prepared[0])) < len(pickle.dumps(plain[0])) / 10
    old = verifier(plain)
    same_verdicts(verifier(prepared), old)
    mixed = [p if i % 2 else r for i, (r, p) in enumerate(zip(plain, prepared, strict=True))]
    same_verdicts(verifier(mixed), old)  # both kinds in one batch keep their order
    assert {r.removal["dog"].after.rank for r in old} != {1}  # the scores are not all alike


def test_prepared_request_with_too_few_rows_is_refused(verifier):
    r = prepare_verify(requests(1)[0], verifier.config, verifier.pixel_prep())
    short = PreparedVerify(r.pixels[:2], r.removal, r.retention, r.removed, r.kept)
    with pytest.raises(ValueError, match="6 rows"):
        verifier([short])
    with pytest.raises(ValueError, match="uint8 HxWx3"):
        bad = requests(1)[0]
        prepare_verify(
            VerifyRequest(bad.original[..., :2], bad.edited, {}, {}, (), ()), verifier.config,
            verifier.pixel_prep(),
        )  # fmt: skip


def records(root: Path, n: int) -> list[ImageRecord]:
    rng = np.random.default_rng(1)
    out = []
    for i in range(n):
        Image.fromarray(picture(rng, 120, 160)).save(root / f"{i}.png")
        objects = (
            ObjectAnnotation((10, 10, 50, 40), "dog"),
            ObjectAnnotation((80, 50, 60, 60), "frisbee"),
        )
        caption = Caption("c", "a dog and a man with a frisbee")
        out.append(ImageRecord(str(i), f"{i}.png", 160, 120, objects, (caption,), root))
    return out


@pytest.mark.parametrize("pairs", [False, True])
def test_the_worker_prepares_and_the_actor_verifies_shipped_jobs(tmp_path, verifier, pairs):
    """The Verify stage as the Ray runner splits it: the worker prepares (the pictures stay
    with it), the jobs travel pickled to the step, and the pictures are back afterwards."""
    config = SynthConfig(
        image=ImageConfig(method="blur"),
        selection=SelectionConfig(policy="all"),
        verify=verifier.config,
        pairs=pairs,
    )
    items = [i for p in plan(records(tmp_path, 3), config) if isinstance(p, list) for i in p]
    steps = build_steps(config, verifier=verifier)
    names = [s.name for s in steps]
    at = names.index("verify")
    before, verify, after = steps[:at], steps[at], steps[at + 1 :]

    def jobs():
        return Chain(before, PLANNED)([Job(0, k, item) for k, item in enumerate(items)])

    local = jobs()
    edited = [job.edited.copy() for job in local]
    verify.run(local)
    shipped = jobs()
    held = prepare_for_verify(shipped, config, verifier.pixel_prep())
    assert all(h is not None for h in held) and len(shipped) == 6
    assert all(j.image is None and j.edited is None and j.mask is None for j in shipped)
    assert all(isinstance(j.verify_input, PreparedVerify) for j in shipped)
    back = pickle.loads(pickle.dumps(shipped))
    verify.run(back)
    back = pickle.loads(pickle.dumps(back))
    restore_after_verify(back, held, pairs)
    same_verdicts([j.verify for j in back], [j.verify for j in local])
    for job, picture_after in zip(back, edited, strict=True):
        assert job.verify_input is None and np.array_equal(job.edited, picture_after)
        assert (job.image is not None) == pairs
    done = Chain(after, {"edited", "mask", "caption", "plan", "verify", "image"})(back)
    assert all(j.ok and j.sample is not None for j in done)


def read_meta(out):
    urls = sorted(str(p) for p in out.glob("shard-*.tar"))
    return {s["__key__"]: json.loads(s["json"]) for s in wds.WebDataset(urls, shardshuffle=False)}


@pytest.mark.slow
def test_synth_on_ray_verifies_like_the_local_runner(clip, tmp_path):
    """`counterfactual synth --runner ray` as a user runs it, with a Verify actor (its crops
    prepared in the shard workers) against the in-process runner (run here: only its samples
    are compared): the same verdicts in every sample."""
    files = generate_coco(tmp_path / "coco", 6, seed=3, size=(320, 240))
    common = (
        *("--image-method", "blur", "--policy", "all", "--contact-sheet", "0"),
        *("--verify", "--verify-model", clip, "--verify-k", "40", "--verify-retention-k", "79"),
        *("--images-per-shard", "4"),
    )
    assert main(synth_args(files, tmp_path / "local", *common, "--runner", "local")) == 0
    extra = ("--runner", "ray", "--model-actors", "1", "--num-cpus", "2", "--no-dashboard")
    args = synth_args(files, tmp_path / "ray", *common, *extra)
    done = subprocess.run(
        [sys.executable, "-m", "counterfactual", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    local, ray = read_meta(tmp_path / "local"), read_meta(tmp_path / "ray")
    assert local and set(local) == set(ray)
    for key, meta in local.items():
        a, b = ray[key]["verify"], meta["verify"]
        assert a["passed"] == b["passed"] and a["failed"] == b["failed"]
        for x, y in zip(a["removal"] + a["retention"], b["removal"] + b["retention"], strict=True):
            assert {k: v for k, v in x.items() if "prob" not in k} == {
                k: v for k, v in y.items() if "prob" not in k
            }
            assert all(abs(x[k] - y[k]) < TOLERANCE for k in x if "prob" in k)


@pytest.mark.parametrize(
    ("verify", "inpaint", "headroom", "share"),
    [(0.1, 1.0, 2.0, 0.2), (0.004, 0.004, 2.0, 1.0), (1.0, 4.0, 1.0, 0.25)],
)
def test_verify_gpu_share_follows_the_measured_costs(verify, inpaint, headroom, share):
    assert verify_gpu_share(verify, inpaint, headroom) == pytest.approx(share)


def test_verify_gpu_share_refuses_costs_that_are_not_measured():
    with pytest.raises(ValueError, match="inpaint_seconds"):
        verify_gpu_share(0.1, 0.0)
    with pytest.raises(ValueError, match="headroom"):
        verify_gpu_share(0.1, 1.0, 0.5)
