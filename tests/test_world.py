"""The controlled world (issue 26): scenes at the co-occurrence asked for, pictures that draw
again without some classes, captions naming what is drawn, a COCO dataset the readers take,
and the scratch dual encoder trained and evaluated by the project's own train and eval."""

from __future__ import annotations

import json
import tarfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from counterfactual.readers.coco import read_coco
from counterfactual.vocab import ClassVocabulary
from counterfactual.world import WorldConfig, read_world, sample_scene, write_world
from counterfactual.world.draw import render
from counterfactual.world.scene import Scene
from counterfactual.world.write import write_original_shards


def _cooccurrence(config: WorldConfig, split: str) -> float:
    """p(partner | anchor) over a split's scenes, pooled over the pairs."""
    both = anchors = 0
    for i in range(config.images):
        if config.split_of(i) != split:
            continue
        present = set(sample_scene(config, i).classes)
        for anchor, partner in config.pairs:
            anchors += anchor in present
            both += anchor in present and partner in present
    return both / anchors


@pytest.mark.parametrize("knob", [0.5, 0.9])
def test_train_follows_the_knob_and_test_is_balanced(knob: float) -> None:
    config = WorldConfig(images=3000, val=0, test=1500, cooccurrence=knob)
    assert _cooccurrence(config, "train") == pytest.approx(knob, abs=0.04)
    assert _cooccurrence(config, "test") == pytest.approx(0.5, abs=0.04)


def test_config_is_checked() -> None:
    with pytest.raises(ValueError, match="cooccurrence"):
        WorldConfig(cooccurrence=1.0)
    with pytest.raises(ValueError, match="unknown classes"):
        WorldConfig(pairs=(("dog", "unicorn"),))
    with pytest.raises(ValueError, match="no train image"):
        WorldConfig(images=10, val=5, test=5)


def test_scenes_are_seeded() -> None:
    config = WorldConfig(images=50, val=5, test=5)
    assert sample_scene(config, 7) == sample_scene(config, 7)
    other = WorldConfig(images=50, val=5, test=5, seed=1)
    assert sample_scene(config, 7) != sample_scene(other, 7)


def test_a_clean_render_is_the_scene_without_those_objects() -> None:
    config = WorldConfig(images=40, val=0, test=10)
    classes = config.class_map
    scene = next(s for s in map(lambda i: sample_scene(config, i), range(40)) if len(s.classes) > 1)
    gone = scene.classes[0]
    without = Scene(
        scene.image_id,
        scene.split,
        scene.size,
        scene.background,
        scene.background_seed,
        tuple(o for o in scene.objects if o.cls != gone),
    )
    clean = render(scene, classes, without={gone})
    assert np.array_equal(clean, render(without, classes))
    assert not np.array_equal(clean, render(scene, classes))


def test_world_on_disk_reads_as_coco(tmp_path: Path) -> None:
    config = WorldConfig(images=30, val=3, test=7)
    world = write_world(config, tmp_path / "w")
    again = read_world(tmp_path / "w")
    assert again.config == config and again.scenes == world.scenes
    records = read_coco(
        world.root / "annotations" / "instances_world.json",
        world.root / "annotations" / "captions_world.json",
        world.root / "world",
    ).records
    assert len(records) == 30
    vocabulary = ClassVocabulary.from_file(world.vocabulary)
    for record in records:
        scene = world.scenes[int(record.image_id)]
        assert {o.category for o in record.objects} == set(scene.classes)
        assert len(record.captions) == config.captions
        for caption in record.captions:  # every caption names exactly the classes drawn
            assert vocabulary.mentioned(caption.text) == set(scene.classes), caption.text
    splits = Counter(e["split"] for e in json.loads(world.split_file.read_text())["images"])
    assert splits == {"train": 20, "val": 3, "test": 7}
    shards = write_original_shards(world, "train", tmp_path / "d", per_shard=40)
    with tarfile.open(shards[0]) as tar:
        names = tar.getnames()
    assert len(shards) == 3 and len(names) == 80 and names[0].endswith(".jpg")
