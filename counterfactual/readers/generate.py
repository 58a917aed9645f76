"""A generated COCO-format dataset at COCO's statistics (about 7.3 boxes and 2.9 classes per
image, 5 captions each), for tests, benchmarks and trying the pipeline without COCO."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from counterfactual.vocab import coco_vocabulary

_VERBS = ("sitting near", "next to", "in front of", "beside", "behind", "looking at")
_PLACES = ("in a room", "on a street", "in a field", "at the park", "on a table", "outside")


@dataclass(frozen=True, slots=True)
class CocoFiles:
    instances: Path
    captions: Path
    images: Path


def _caption(rng: np.random.Generator, words: list[str]) -> str:
    a, b = rng.choice(words, 2)
    article = "An" if a[0] in "aeiou" else "A"
    return f"{article} {a} {rng.choice(_VERBS)} a {b} {rng.choice(_PLACES)}."


def generate_coco(
    dest: Path,
    n_images: int,
    seed: int = 0,
    size: tuple[int, int] = (640, 480),
    write_images: bool = True,
) -> CocoFiles:
    """Write ``dest/images/*.jpg`` and ``dest/instances.json`` + ``dest/captions.json``."""
    rng = np.random.default_rng(seed)
    # the word lists as they were when these datasets were first drawn: more words would
    # change every draw after the first caption (the tests' datasets depend on the stream)
    vocab = coco_vocabulary(more_words=False)
    classes = list(vocab.classes)
    width, height = size
    images_dir = Path(dest) / "images"
    images_dir.mkdir(parents=True, exist_ok=True)
    images, annotations, captions = [], [], []
    for i in range(n_images):
        image_id = i + 1
        n_classes = min(len(classes), 1 + int(rng.poisson(1.9)))
        chosen = list(rng.choice(len(classes), n_classes, replace=False))
        n_boxes = max(n_classes, int(rng.poisson(7.3)))
        canvas = np.empty((height, width, 3), np.uint8)
        canvas[:] = rng.integers(60, 200, 3)
        canvas = cv2.add(canvas, rng.integers(0, 40, (height, width, 3), dtype=np.uint8))
        for j in range(n_boxes):
            cls = chosen[j] if j < n_classes else chosen[int(rng.integers(n_classes))]
            w = int(rng.uniform(0.05, 0.35) * width)
            h = int(rng.uniform(0.05, 0.35) * height)
            x, y = int(rng.integers(0, width - w)), int(rng.integers(0, height - h))
            color = tuple(int(c) for c in rng.integers(0, 255, 3))
            cv2.ellipse(canvas, (x + w // 2, y + h // 2), (w // 2, h // 2), 0, 0, 360, color, -1)
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": int(cls) + 1,
                    "bbox": [x, y, w, h],
                    "area": w * h,
                    "iscrowd": 0,
                }
            )
        file_name = f"{image_id:012d}.jpg"
        if write_images:
            cv2.imwrite(str(images_dir / file_name), canvas, [cv2.IMWRITE_JPEG_QUALITY, 90])
        images.append({"id": image_id, "file_name": file_name, "width": width, "height": height})
        words = [str(rng.choice(vocab.words(classes[c]))) for c in chosen] + ["chair", "tree"]
        for _ in range(5):
            captions.append(
                {"id": len(captions) + 1, "image_id": image_id, "caption": _caption(rng, words)}
            )
    categories = [{"id": k + 1, "name": c, "supercategory": ""} for k, c in enumerate(classes)]
    dest = Path(dest)
    instances = dest / "instances.json"
    instances.write_text(
        json.dumps({"images": images, "annotations": annotations, "categories": categories})
    )
    caps = dest / "captions.json"
    caps.write_text(json.dumps({"images": images, "annotations": captions}))
    return CocoFiles(instances, caps, images_dir)
