"""The scratch dual encoder: written, trained by ``counterfactual train --recipe scratch`` from
WebDataset shards, loaded back by ``counterfactual eval``'s embedder (``scratch:FOLDER`` or the
bare folder)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from counterfactual.cli import main
from counterfactual.models import load_embedder, parse_model_spec
from counterfactual.models.scratch import ScratchConfig, build_vocab, init_model, load_scratch
from counterfactual.world.write import write_pairs_shard

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 220)}


def _samples(n: int) -> list[tuple[str, np.ndarray, str]]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        name = list(COLOURS)[i % 3]
        pixels = np.full((48, 48, 3), 120, np.uint8)
        x, y = rng.integers(0, 28, 2)
        pixels[y : y + 20, x : x + 20] = COLOURS[name]
        out.append((f"{i:05d}", pixels, f"a {name} square"))
    return out


def test_scratch_model_trains_and_embeds(tmp_path: Path) -> None:
    samples = _samples(96)
    write_pairs_shard(tmp_path / "d" / "a.tar", samples[:48])
    write_pairs_shard(tmp_path / "d" / "b.tar", samples[48:])
    vocab = build_vocab(t for _, _, t in samples)
    init = init_model(tmp_path / "init", vocab, ScratchConfig(channels=(8, 16), embed_dim=16))
    argv = [
        "train", "--recipe", "scratch", "--model", str(init), "--original",
        str(tmp_path / "d"), "--epochs", "1", "--samples-per-epoch", "640",
        "--batch-size", "32", "--device", "cpu", "--out", str(tmp_path / "run"),
        "--seed", "3", "--log-every", "5",
    ]  # fmt: skip
    assert main(argv) == 0
    info = json.loads((tmp_path / "run" / "train.json").read_text())
    assert info["status"] == "done" and info["result"]["steps"] == 20
    assert info["result"]["last_loss"] < info["result"]["first_loss"]
    assert main(argv) == 0  # finished: resumed after its last epoch, nothing trained again
    again = json.loads((tmp_path / "run" / "train.json").read_text())
    assert again["status"] == "done" and again["result"]["steps"] == 20
    final = tmp_path / "run" / "final"
    assert parse_model_spec(str(final)).kind == "scratch"
    embedder = load_embedder(f"scratch:{final}", device="cpu")
    texts = embedder.embed_texts([f"a {c} square" for c in COLOURS])
    images = embedder.embed_images([Image.fromarray(p) for _, p, _ in samples[:3]])
    assert texts.shape == (3, 16) and np.allclose(np.linalg.norm(images, axis=1), 1, atol=1e-5)
    # each picture's best caption is its own colour: the model learned something
    assert list((images @ texts.T).argmax(axis=1)) == [0, 1, 2]
    # the same folder and seed give the same untrained weights
    a, _ = load_scratch(init)
    b, _ = load_scratch(init)
    assert all(
        np.array_equal(x.detach(), y.detach())
        for x, y in zip(a.parameters(), b.parameters(), strict=True)
    )


def test_a_clip_folder_is_not_a_scratch_model(tmp_path: Path) -> None:
    from counterfactual.train.families import FAMILIES

    (tmp_path / "config.json").write_text('{"model_type": "clip"}')
    with pytest.raises(ValueError, match="not a scratch model folder"):
        FAMILIES["scratch"].load(str(tmp_path))
