"""Issue 33: how much D' and which kind. The ratio sweep's D'_sub (seeded, nested, whole
samples), the grid's options, sentence captions, and a tiny sweep + grid run as a user types it
(``python -m counterfactual experiment``), hubness in every arm."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from collections import Counter
from pathlib import Path

import pytest

from counterfactual.vocab import ClassVocabulary
from counterfactual.world import WorldConfig, read_world, write_world
from counterfactual.world.experiment import (
    HUBNESS,
    METRICS,
    ExperimentConfig,
    subset_size,
    write_subsets,
)

ROOT = Path(__file__).resolve().parents[1]


def _cli(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "counterfactual", *argv],
        capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT,
    )  # fmt: skip


def _pool(folder: Path, n: int) -> Path:
    """A D'-like folder: ``n`` samples of three files each in two shards."""
    folder.mkdir()
    for shard, keys in enumerate((range(0, n // 2), range(n // 2, n))):
        with tarfile.open(folder / f"{shard:06d}.tar", "w") as tar:
            for k in keys:
                for ext in ("jpg", "txt", "json"):
                    data = f"{k}.{ext}".encode()
                    info = tarfile.TarInfo(f"s{k:04d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return folder


def _keys(folder: Path) -> list[str]:
    names: list[str] = []
    for shard in sorted(folder.glob("*.tar")):
        with tarfile.open(shard) as tar:
            names += tar.getnames()
    counts = Counter(name.split(".")[0] for name in names)
    assert set(counts.values()) == {3}  # whole samples: every file of a key
    for name in names:  # each file is its own sample's
        assert name.split(".")[0] == f"s{int(name[1:5]):04d}"
    return list(counts)


def test_subsets_are_seeded_nested_and_whole(tmp_path: Path) -> None:
    pool = _pool(tmp_path / "pool", 2500)
    sizes = {0.1: subset_size(0.1, 10_000), 0.2: subset_size(0.2, 10_000)}
    assert sizes == {0.1: 1000, 0.2: 2000} and subset_size(0, 10) == 0
    assert subset_size(0.001, 10) == 1  # a ratio > 0 draws at least one sample
    folders = write_subsets(pool, sizes, 7, tmp_path / "a")
    small, large = _keys(folders[0.1]), _keys(folders[0.2])
    assert len(small) == 1000 and len(large) == 2000 and len(set(large)) == 2000
    assert set(small) <= set(large)  # nested: the smaller subset is a prefix of one draw
    assert len(list(folders[0.2].glob("sub-*.tar"))) == 2  # 1000 samples a shard
    again = write_subsets(pool, sizes, 7, tmp_path / "b")
    assert _keys(again[0.2]) == large  # the same seed draws the same samples
    other = write_subsets(pool, sizes, 8, tmp_path / "c")
    assert _keys(other[0.2]) != large
    with pytest.raises(ValueError, match="ratio 0.3 needs 3000 samples of D' but .* holds 2500"):
        write_subsets(pool, {0.3: 3000}, 7, tmp_path / "d")


def test_study_options_are_checked() -> None:
    config = ExperimentConfig(image_methods=("blur", "mean"), text_methods=("prompt",))
    assert config.grid == [("blur", "prompt"), ("mean", "prompt")]
    assert ExperimentConfig(text_methods=("prompt",)).grid == [("inpaint", "prompt")]
    assert ExperimentConfig().grid == []
    with pytest.raises(ValueError, match="captioner text method needs a trained captioning model"):
        ExperimentConfig(text_methods=("captioner",))
    with pytest.raises(ValueError, match="'fill' is not one of"):
        ExperimentConfig(image_methods=("fill",))
    with pytest.raises(ValueError, match="ratios must be finite numbers >= 0, got -0.1"):
        ExperimentConfig(ratios=(0, -0.1))
    with pytest.raises(ValueError, match="ratios repeat"):
        ExperimentConfig(ratios=(0.1, 0.1))
    with pytest.raises(ValueError, match="caption_style"):
        ExperimentConfig(caption_style="prose")


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["--text-methods", "np-removal,captioner"],
            "counterfactual experiment: error: text_methods: the captioner text method needs a "
            "trained captioning model",
        ),
        (["--ratios", "0,-1"], "argument --ratios: ratios must be finite numbers >= 0, got -1"),
        (["--ratios", "0,a"], "argument --ratios: '0,a' is not a comma-separated list"),
        (["--image-methods", "blur,fill"], "image_methods: 'fill' is not one of"),
    ],
)
def test_bad_study_options_are_one_line_and_exit_2(
    tmp_path: Path, argv: list[str], line: str
) -> None:
    done = _cli("experiment", "--out", str(tmp_path / "exp"), *argv, timeout=120)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert line in lines[0] and lines[0].startswith("counterfactual experiment: error:")
    assert not (tmp_path / "exp" / "world").exists()  # nothing started


def test_sentence_captions_name_every_class_once_with_a_verb(tmp_path: Path) -> None:
    config = WorldConfig(images=60, val=0, test=10, caption_style="sentences")
    world = write_world(config, tmp_path / "w")
    assert read_world(tmp_path / "w").config == config
    vocabulary = ClassVocabulary.from_file(world.vocabulary)
    verbs = ("sit", "lie", "rest", "float", "hang", "fl", "stand")
    entries = json.loads(world.split_file.read_text())["images"]
    for entry in entries:  # every caption names exactly the classes drawn
        scene = world.scenes[int(entry["cocoid"])]
        for sentence in entry["sentences"]:
            assert vocabulary.mentioned(sentence["raw"]) == set(scene.classes), sentence["raw"]
    captions = world.captions("train")
    assert captions and all(any(v in c for v in verbs) for c in captions)
    # the list captions stay as they were: the default world.json has no caption_style
    plain = write_world(WorldConfig(images=60, val=0, test=10), tmp_path / "p")
    assert "caption_style" not in (tmp_path / "p" / "world.json").read_text()
    assert plain.captions("train") != captions
    assert '"caption_style": "sentences"' in (tmp_path / "w" / "world.json").read_text()


@pytest.mark.slow
def test_a_tiny_sweep_and_grid_as_a_user_runs_them(tmp_path: Path) -> None:
    out = tmp_path / "exp"
    done = _cli(
        "experiment", "--out", str(out), "--seeds", "1", "--images", "150", "--test", "50",
        "--steps", "4", "--batch-size", "32", "--caption-style", "sentences",
        "--ratios", "0,0.05,0.2", "--image-methods", "inpaint,blur", "--text-methods",
        "np-removal,prompt",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads((out / "results.json").read_text())
    assert set(results) == {"config", "arms", "by_role", "sweep", "grid"}
    assert [row["ratio"] for row in results["sweep"]] == [0, 0.05, 0.2]
    n_original = results["config"]["original"]
    assert [row["samples"] for row in results["sweep"]] == [
        0, round(0.05 * n_original), round(0.2 * n_original)
    ]  # fmt: skip
    assert results["sweep"][0]["arm"] == results["arms"]["D"]  # R = 0 is arm D itself
    cells = [(row["image_method"], row["text_method"]) for row in results["grid"]]
    assert cells == [
        ("inpaint", "np-removal"), ("inpaint", "prompt"), ("blur", "np-removal"),
        ("blur", "prompt"),
    ]  # fmt: skip
    assert results["grid"][0]["arm"] == results["arms"]["D+D'"]  # the base cell is D+D'
    arms = [*results["arms"].values(), *(r["arm"] for r in results["sweep"] + results["grid"])]
    for arm in arms:
        assert set(arm) == {"mean", "std", "seeds"} and set(arm["mean"]) == set(METRICS)
        assert 0 < arm["mean"]["hub_top1"] <= 1  # at least one query's share
        assert all(isinstance(arm["mean"][m], float) for m in HUBNESS)
    # each sweep arm is its own training: not D's numbers
    assert results["sweep"][2]["arm"]["seeds"] != results["arms"]["D"]["seeds"]
    summary = (out / "results.md").read_text()
    assert "| R | D'_sub | ODmAP@1 |" in summary and "| image | text | D' | ODmAP@1 |" in summary
    assert "| blur | prompt |" in summary and "top-1 hub" in summary
    assert (out / "sweep.png").stat().st_size > 0
    world = json.loads((out / "world" / "world.json").read_text())
    assert world["caption_style"] == "sentences"
