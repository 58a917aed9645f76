"""Writing the world to disk as a COCO-format dataset, and reading it back.

``ROOT/`` after :func:`write_world`:

- ``annotations/instances_world.json``, ``annotations/captions_world.json``: COCO's files (boxes
  ``[x, y, w, h]`` in pixels, one category per class), read by ``--dataset coco --coco-set
  world``;
- ``world/<id:06d>.png``: the pictures (lossless; shards re-encode them as JPEG);
- ``dataset_coco.json``: Karpathy's split file format (train / val / test), what ``--split-file``
  and ``counterfactual eval`` read;
- ``vocabulary.txt``: one line per class (``name, plural``), for ``--vocabulary``;
- ``scenes.jsonl``: every scene (background and boxes), so :func:`clean_render` can draw any
  picture again without some of its classes; ``world.json``: the config.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from counterfactual.imageio import encode_jpeg
from counterfactual.world.captions import caption, sentence
from counterfactual.world.draw import render
from counterfactual.world.scene import Scene, WorldConfig, sample_scene

COCO_SET = "world"
JPEG_QUALITY = 95


@dataclass(frozen=True)
class World:
    """A world on disk: its root, config and scenes (by image id)."""

    root: Path
    config: WorldConfig
    scenes: dict[int, Scene]

    @property
    def split_file(self) -> Path:
        return self.root / "dataset_coco.json"

    @property
    def vocabulary(self) -> Path:
        return self.root / "vocabulary.txt"

    def captions(self, split: str | None = None) -> list[str]:
        """Every caption of the split (all splits: ``None``), in image order."""
        entries = json.loads(self.split_file.read_text("utf-8"))["images"]
        return [s["raw"] for e in entries if split in (None, e["split"]) for s in e["sentences"]]

    def split(self, name: str) -> list[Scene]:
        return [s for s in self.scenes.values() if s.split == name]

    def picture(self, image_id: int, without: Collection[str] = ()) -> np.ndarray:
        """Scene ``image_id`` drawn again, without the objects of the classes ``without``."""
        scene = self.scenes[int(image_id)]
        return render(scene, self.config.class_map, without)


def write_world(config: WorldConfig, root: str | Path) -> World:
    """Draw every scene of ``config`` and write the dataset into ``root`` (module docstring).
    The same config writes the same files."""
    root = Path(root)
    images_dir = root / COCO_SET
    images_dir.mkdir(parents=True, exist_ok=True)
    (root / "annotations").mkdir(exist_ok=True)
    classes = config.class_map
    category = {c.name: k + 1 for k, c in enumerate(config.classes)}
    images, boxes, captions, karpathy, scenes = [], [], [], [], {}
    for index in range(config.images):
        scene = sample_scene(config, index)
        scenes[scene.image_id] = scene
        file_name = f"{scene.image_id:06d}.png"
        pixels = render(scene, classes)
        cv2.imwrite(str(images_dir / file_name), cv2.cvtColor(pixels, cv2.COLOR_RGB2BGR))
        images.append(
            {
                "id": scene.image_id,
                "file_name": file_name,
                "width": scene.size,
                "height": scene.size,
            }
        )
        for obj in scene.objects:
            boxes.append(
                {
                    "id": len(boxes) + 1,
                    "image_id": scene.image_id,
                    "category_id": category[obj.cls],
                    "bbox": [obj.x, obj.y, obj.w, obj.h],
                    "area": round(obj.w * obj.h, 2),
                    "iscrowd": 0,
                }
            )
        rng = np.random.default_rng([config.seed, index, 1])
        write = sentence if config.caption_style == "sentences" else caption
        texts = [write(scene, classes, rng) for _ in range(config.captions)]
        for text in texts:
            captions.append({"id": len(captions) + 1, "image_id": scene.image_id, "caption": text})
        karpathy.append(
            {
                "filepath": COCO_SET,
                "filename": file_name,
                "cocoid": scene.image_id,
                "split": scene.split,
                "sentences": [{"raw": t, "tokens": t.lower().rstrip(".").split()} for t in texts],
            }
        )
    categories = [
        {"id": category[c.name], "name": c.name, "supercategory": ""} for c in config.classes
    ]
    _write_json(
        root / "annotations" / f"instances_{COCO_SET}.json",
        {"images": images, "annotations": boxes, "categories": categories},
    )
    _write_json(
        root / "annotations" / f"captions_{COCO_SET}.json",
        {"images": images, "annotations": captions},
    )
    _write_json(root / "dataset_coco.json", {"dataset": "coco", "images": karpathy})
    (root / "vocabulary.txt").write_text(
        "".join(f"{c.name}, {c.plural}\n" for c in config.classes), encoding="utf-8"
    )
    with (root / "scenes.jsonl").open("w", encoding="utf-8") as f:
        for scene in scenes.values():
            f.write(json.dumps(scene.to_dict()) + "\n")
    _write_json(root / "world.json", config.to_dict())
    return World(root, config, scenes)


def read_world(root: str | Path) -> World:
    """The world :func:`write_world` wrote into ``root``; ``ValueError`` when it is not one."""
    root = Path(root)
    try:
        config = WorldConfig.from_dict(json.loads((root / "world.json").read_text("utf-8")))
        lines = (root / "scenes.jsonl").read_text("utf-8").splitlines()
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"{root} is not a world written by `counterfactual world`: {err}") from err
    scenes = {s.image_id: s for s in (Scene.from_dict(json.loads(line)) for line in lines)}
    return World(root, config, scenes)


def write_pairs_shard(path: str | Path, samples: Iterable[tuple[str, np.ndarray, str]]) -> int:
    """A WebDataset tar of ``(key, RGB picture, caption)`` samples as ``KEY.jpg`` + ``KEY.txt``
    (what img2dataset writes for an image-text dataset); returns how many."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    n = 0
    with tarfile.open(tmp, "w") as tar:
        for key, pixels, text in samples:
            for ext, data in (("jpg", encode_jpeg(pixels, JPEG_QUALITY)), ("txt", text.encode())):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
            n += 1
    tmp.replace(path)
    return n


def write_original_shards(
    world: World, split: str, out: str | Path, per_shard: int = 1000, seed: int = 0
) -> list[Path]:
    """The split's image-caption pairs (every caption of every picture, one sample each) in a
    seeded random order as WebDataset shards ``out/original-XXXXX.tar``: the D a user trains
    on (shuffled, so that a shuffle buffer seldom holds two captions of one picture)."""
    out = Path(out)
    ids = {s.image_id for s in world.split(split)}
    entries = json.loads(world.split_file.read_text("utf-8"))["images"]
    pairs: list[tuple[str, Path, str]] = []
    for entry in entries:
        if entry["cocoid"] in ids:
            file = world.root / entry["filepath"] / entry["filename"]
            for k, sentence in enumerate(entry["sentences"]):
                pairs.append((f"{entry['cocoid']:06d}_{k}", file, sentence["raw"]))
    order = np.random.default_rng(seed).permutation(len(pairs))
    pairs = [pairs[i] for i in order]
    paths = []
    for start in range(0, len(pairs), per_shard):
        chunk = pairs[start : start + per_shard]
        path = out / f"original-{start // per_shard:05d}.tar"
        write_pairs_shard(path, ((k, _load(f), t) for k, f, t in chunk))
        paths.append(path)
    return paths


def _load(path: Path) -> np.ndarray:
    return cv2.cvtColor(cv2.imread(str(path), cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)


def _write_json(path: Path, data: object) -> None:
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(json.dumps(data), encoding="utf-8")
    tmp.replace(path)
