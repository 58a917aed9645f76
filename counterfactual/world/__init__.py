"""A controlled world for the whole loop: procedurally drawn scenes whose class
co-occurrence in train is a knob, written as a COCO-format dataset, and the experiment that
trains a small dual encoder on D and on D ∪ D' and measures ODmAP@k and R@K.

Modules: :mod:`~counterfactual.world.classes` (what each class looks like),
:mod:`~counterfactual.world.scene` (the knobs and random scenes), :mod:`~counterfactual.world.draw`
(pixels), :mod:`~counterfactual.world.captions`, :mod:`~counterfactual.world.write` (the dataset
on disk, clean renders, shards), :mod:`~counterfactual.world.experiment` (the loop).
"""

from counterfactual.world.classes import CLASSES, PAIRS, ObjectClass
from counterfactual.world.scene import Scene, SceneObject, WorldConfig, sample_scene
from counterfactual.world.write import World, read_world, write_original_shards, write_world

__all__ = [
    "CLASSES",
    "PAIRS",
    "ObjectClass",
    "Scene",
    "SceneObject",
    "World",
    "WorldConfig",
    "read_world",
    "sample_scene",
    "write_original_shards",
    "write_world",
]
