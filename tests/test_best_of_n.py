"""Best-of-n inpainting: seeded candidates, the scorer's pick, the removal scorer on controlled
embeddings, and a run with a tiny diffusers pipeline and a tiny CLIP saved to disk."""

import io
import json

import numpy as np
import pytest
from bad_coco import make_bad_coco, synth_args
from PIL import Image
from shard_files import shard_members

from counterfactual.cli import main
from counterfactual.image import DiffusersConfig, EditRequest, ImageConfig
from counterfactual.image.best_of_n import BestOfN, candidate_seed
from counterfactual.method.verify import RemovalScorer, Verifier, VerifyConfig
from counterfactual.vocab import ClassVocabulary


class SeedPainter:
    """An editor whose output shows the seed it was given: every masked pixel = seed % 251."""

    def __init__(self):
        self.calls = []

    def describe(self):
        return {"method": "inpaint", "backend": "seed-painter"}

    def __call__(self, batch):
        self.calls.append([r.seed for r in batch])
        out = []
        for r in batch:
            image = r.image.copy()
            image[r.mask > 0] = r.seed % 251
            out.append(image)
        return out


def _request(seed=7):
    mask = np.zeros((8, 8), np.uint8)
    mask[2:6, 2:6] = 255
    return EditRequest(np.zeros((8, 8, 3), np.uint8), mask, ("dog",), ("cat",), seed)


def test_the_lowest_score_wins_and_all_candidates_are_made_in_one_call():
    painter = SeedPainter()
    # score: distance of the painted value from 100, so the pick is predictable
    editor = BestOfN(painter, 4, lambda r, cands: [abs(int(c[3, 3, 0]) - 100) for c in cands])
    out = editor([_request(7), _request(8)])
    assert len(painter.calls) == 1 and len(painter.calls[0]) == 8
    seeds = [candidate_seed(7, i) for i in range(4)]
    assert painter.calls[0][:4] == seeds and seeds[0] == 7  # candidate 0 is the plain seed
    values = [s % 251 for s in seeds]
    best = int(np.argmin([abs(v - 100) for v in values]))
    assert editor.choices[0]["picked"] == best and editor.choices[0]["seed"] == seeds[best]
    assert out[0][3, 3, 0] == values[best] and out[0][0, 0, 0] == 0
    assert editor.describe()["candidates"] == 4


def test_ties_keep_the_earlier_candidate_and_one_candidate_is_the_plain_editor():
    editor = BestOfN(SeedPainter(), 3, lambda r, cands: [1.0] * len(cands))
    editor([_request(5)])
    assert editor.choices[0]["picked"] == 0
    plain = BestOfN(SeedPainter(), 1, lambda r, cands: [0.0])
    assert plain([_request(5)])[0][3, 3, 0] == 5
    with pytest.raises(ValueError, match="candidates"):
        BestOfN(SeedPainter(), 0, lambda r, c: [])


def test_seeds_are_stable_and_distinct():
    seeds = [candidate_seed(123, i) for i in range(50)]
    assert len(set(seeds)) == 50 and seeds == [candidate_seed(123, i) for i in range(50)]
    assert all(0 <= s < 2**31 for s in seeds)


def test_best_of_n_needs_a_diffusion_backend():
    with pytest.raises(ValueError, match="best-of-n"):
        ImageConfig(method="blur", diffusers=DiffusersConfig(candidates=3))
    with pytest.raises(ValueError, match="best-of-n"):
        ImageConfig(method="inpaint", backend="opencv", diffusers=DiffusersConfig(candidates=3))
    ImageConfig(method="inpaint", backend="diffusers", diffusers=DiffusersConfig(candidates=3))


class RedMeansDog:
    """Controlled embeddings: class prompts are the unit axes in vocabulary order; an image's
    embedding leans to "dog" (axis 0) by its mean red and to "cat" (axis 1) by its green."""

    def embed_texts(self, texts):
        return np.eye(len(texts), dtype=np.float32)

    def embed_images(self, images):
        rows = []
        for im in images:
            r, g, _ = np.asarray(im, np.float32).reshape(-1, 3).mean(0) / 255
            v = np.zeros(4, np.float32)
            v[0], v[1], v[3] = r, g, 0.1
            rows.append(v / np.linalg.norm(v))
        return np.asarray(rows)


def test_removal_scorer_prefers_the_candidate_without_the_removed_class():
    vocab = ClassVocabulary({"dog": ["dog"], "cat": ["cat"], "car": ["car"], "tree": ["tree"]})
    config = VerifyConfig(mode="record", k=1, retention_k=1, min_box=1, crop_padding=0.0)
    scorer = RemovalScorer(Verifier(config, vocab, embedder=RedMeansDog()))
    request = _request()
    red, green = request.image.copy(), request.image.copy()
    red[request.mask > 0] = (255, 0, 0)
    green[request.mask > 0] = (0, 255, 0)
    scores = scorer(request, [red, green])
    assert scores[0] > 0.9 and scores[1] < 0.1  # red shows the dog, green does not

    class TwoPictures(SeedPainter):
        def __call__(self, batch):
            return [red, green] * (len(batch) // 2)  # two candidates per request

    editor = BestOfN(TwoPictures(), 2, scorer)
    assert editor([request])[0] is green and editor.choices[0]["picked"] == 1
    assert editor.describe()["picked_by"]["model"]


@pytest.mark.slow
def test_a_run_with_candidates_records_the_pick(tmp_path):
    from tiny_clip import build_tiny_clip

    from counterfactual.testing import build_tiny_inpaint_pipeline

    sd = build_tiny_inpaint_pipeline(tmp_path / "sd")
    clip = build_tiny_clip(tmp_path / "clip")
    files = make_bad_coco(tmp_path / "coco", n=14)
    common = ["--limit", "6", "--image-method", "inpaint", "--inpaint-backend", "diffusers"]
    common += ["--inpaint-model", str(sd), "--steps", "2", "--resolution", "64"]
    common += ["--contact-sheet", "0", "--max-pixels", "1000000"]
    best = tmp_path / "best"
    argv = [*common, "--candidates", "3", "--verify-model", f"hf-clip:{clip}"]
    assert main(synth_args(files, best, *argv)) == 0
    assert main(synth_args(files, tmp_path / "plain", *common)) == 0
    ours, plain = _samples(best), _samples(tmp_path / "plain")
    assert ours and ours.keys() == plain.keys()
    picks = []
    for key, (meta, pixels) in ours.items():
        choice = meta["best_of_n"]
        assert len(choice["scores"]) == 3 and 0 <= choice["picked"] < 3
        assert choice["scores"][choice["picked"]] == min(choice["scores"])
        assert meta["image_method"]["candidates"] == 3
        picks.append(choice["picked"])
        if choice["picked"] == 0:  # candidate 0 is the plain run's seed: the same picture
            assert np.abs(pixels.astype(int) - plain[key][1].astype(int)).max() <= 2
    manifest = json.loads((best / "run.json").read_text())
    assert "candidates" in json.dumps(manifest)


def _samples(out):
    found = {}
    members = shard_members(out)
    for name, data in members.items():
        if name.endswith(".json"):
            key = name[: -len(".json")]
            pixels = np.asarray(Image.open(io.BytesIO(members[f"{key}.jpg"])))
            found[key] = (json.loads(data), pixels)
    return found
