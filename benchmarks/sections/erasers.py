"""The ``erasers`` section of ``make bench``."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from common import Arg, Section

from counterfactual.image import (
    DiffusersConfig,
    EditRequest,
    ImageConfig,
    make_editor,
)
from counterfactual.imageio import load_rgb
from counterfactual.method.masks import box_mask
from counterfactual.readers.coco import read_coco
from counterfactual.readers.generate import generate_coco


def bench_erasers(work: Path, n: int, batch: int = 8) -> dict[str, float]:
    """Pipeline calls per batch before and after the one canvas, and bytes per item of a whole
    picture against its crop (see ``NOTES["erasers"]``)."""
    import pickle

    from counterfactual.image.diffusion import canvas_side, crop_box, work_size
    from counterfactual.testing import build_tiny_inpaint_pipeline

    files = generate_coco(work / "erasers-coco", n, seed=3)
    records = read_coco(files.instances, files.captions, files.images).records
    rng = np.random.default_rng(0)
    requests = []
    for i, record in enumerate(records):
        if not record.objects:
            continue
        obj = record.objects[int(rng.integers(len(record.objects)))]
        mask = box_mask(record.height, record.width, [obj.bbox])
        if not mask.any():
            continue
        image = load_rgb(str(Path(str(record.root)) / record.file))
        requests.append(EditRequest(image, mask, (obj.category,), (), i))
    sweep = []  # boxes of many sizes and places on one picture, as a user's data may have
    for i in range(len(requests)):
        w, h = int(rng.integers(16, 600)), int(rng.integers(16, 460))
        x, y = int(rng.integers(0, 640 - w)), int(rng.integers(0, 480 - h))
        mask = box_mask(480, 640, [(x, y, w, h)])
        sweep.append(EditRequest(requests[0].image, mask, ("dog",), (), i))

    def crop_of(request: EditRequest) -> tuple[int, int, int, int]:
        y, x = np.nonzero(request.mask)
        box = (int(x.min()), int(y.min()), int(x.max()) + 1, int(y.max()) + 1)
        return crop_box(box, 0.25, *request.mask.shape)

    def calls(items: list[EditRequest], resolution: int, canvas: bool) -> tuple[float, int]:
        """Mean calls per batch under a grouping rule, and the distinct groups overall."""
        per_batch, seen = [], set()
        for start in range(0, len(items) - batch + 1, batch):
            groups: dict[object, int] = {}
            for request in items[start : start + batch]:
                x0, y0, x1, y1 = crop_of(request)
                size = work_size(x1 - x0, y1 - y0, resolution)
                key = canvas_side(size, resolution) if canvas else size
                seen.add(key)
                groups[key] = groups.get(key, 0) + 1
            per_batch.append(sum(-(-count // batch) for count in groups.values()))
        return float(np.mean(per_batch)), len(seen)

    figures: dict[str, float] = {}
    for name, items in (("coco", requests), ("sweep", sweep)):
        for resolution in (512, 0):
            tag = f"erasers_{name}_{resolution or 'native'}"
            figures[f"{tag}_calls_per_batch_before"], sizes = calls(items, resolution, False)
            figures[f"{tag}_distinct_sizes_before"] = float(sizes)
            figures[f"{tag}_calls_per_batch_after_rule"], sides = calls(items, resolution, True)
            figures[f"{tag}_distinct_sizes_after"] = float(sides)
    whole, crop = [], []
    for request in requests:
        x0, y0, x1, y1 = crop_of(request)
        whole.append(
            len(pickle.dumps((request.image, request.mask))) + len(pickle.dumps(request.image))
        )
        part = np.ascontiguousarray(request.image[y0:y1, x0:x1])
        part_mask = np.ascontiguousarray(request.mask[y0:y1, x0:x1])
        crop.append(len(pickle.dumps((part, part_mask))) + len(pickle.dumps(part)))
    model = build_tiny_inpaint_pipeline(work / "erasers-sd")
    config = ImageConfig(
        backend="diffusers", diffusers=DiffusersConfig(model=str(model), steps=1, resolution=64)
    )
    editor = make_editor(config, batch_size=batch)
    calls_made: list[int] = []
    pipeline = editor._pipeline  # type: ignore[attr-defined]

    def counting(**kwargs: object) -> object:
        calls_made.append(1)
        return pipeline(**kwargs)

    editor._pipeline = counting  # type: ignore[attr-defined]
    measured = {}
    for name, items in (("coco", requests), ("sweep", sweep)):
        per_batch = []
        for start in range(0, len(items) - batch + 1, batch):
            calls_made.clear()
            editor(items[start : start + batch])
            per_batch.append(len(calls_made))
        measured[f"erasers_{name}_64_calls_per_batch_measured"] = float(np.mean(per_batch))
    return {
        **figures,
        **measured,
        "erasers_bytes_per_item_whole": float(np.mean(whole)),
        "erasers_bytes_per_item_crop": float(np.mean(crop)),
        "erasers_crop_vs_whole": float(np.mean(crop) / np.mean(whole)),
    }


def run(work: Path, args: argparse.Namespace) -> dict[str, float]:
    return bench_erasers(work, args.eraser_images)


SECTION = Section(
    "erasers",
    run,
    args=(Arg("--eraser-images", {"type": int, "default": 96}),),
    note="Batches of 8 crops. coco: eraser_images generate_coco pictures (640x480), one "
    "annotated object per image as the box mask; sweep: as many boxes of random sizes "
    "(16-600 x 16-460 px) and places on one 640x480 picture. *_calls_per_batch_before and "
    "*_distinct_sizes_before: the old grouping (one pipeline call per distinct working size "
    "of crop_box + work_size in the batch), at resolution 512 and 0 (native), from the rule; "
    "*_after_rule: the same with the canvas (canvas_side); *_64_calls_per_batch_measured: "
    "pipeline calls per batch counted on the tests' tiny SD inpainting pipeline loaded from "
    "disk (resolution 64, one step). bytes_per_item_*: pickled numpy arrays a GPU actor "
    "receives and returns per item (picture + mask in, edited picture out), the whole "
    "640x480 picture against the diffusers crop (crop_padding 0.25); crop_vs_whole: their "
    "ratio. The Ray workers send Edit's actors the crop (crop_for_edit) when the backend "
    "declares its region and best-of-n is off.",
)
