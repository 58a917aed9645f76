"""The ``images`` section of ``make bench``: per method, decode -> edit -> encode on real photos at 640x480 with about 15% of
the pixels masked, as a ratio to a decode -> encode loop over the same files (the floor).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

import numpy as np
from common import PHOTOS, Section, best_rate, real_photos

from counterfactual.image import (
    EditRequest,
    ImageConfig,
    OpenCVConfig,
    make_editor,
)
from counterfactual.imageio import encode_jpeg, load_rgb


def bench_images(work: Path, n: int) -> dict[str, float]:
    paths, masks = real_photos(work, n)

    def floor() -> None:
        for p in paths:
            encode_jpeg(load_rgb(p))

    def method(config: ImageConfig) -> Callable[[], None]:
        editor = make_editor(config)

        def run() -> None:
            for p, m in zip(paths, masks, strict=True):
                encode_jpeg(editor([EditRequest(load_rgb(p), m)])[0])

        return run

    methods = {
        "zero": ImageConfig(method="zero"),
        "mean": ImageConfig(method="mean"),
        "blur": ImageConfig(method="blur"),
        "opencv_inpaint": ImageConfig(method="inpaint"),
        "opencv_inpaint_native": ImageConfig(method="inpaint", opencv=OpenCVConfig(max_side=0)),
    }
    out = {}
    floors = []
    for name, config in methods.items():
        # floor and method alternate, so both see the same machine load
        repeat = 1 if name == "opencv_inpaint_native" else 3
        run = method(config)
        floor_times, method_times = [], []
        for _ in range(repeat):
            floor_times.append(len(paths) / best_rate(len(paths), floor, repeat=1))
            method_times.append(len(paths) / best_rate(len(paths), run, repeat=1))
        floors.append(len(paths) / min(floor_times))
        out[f"image_{name}_images_per_s"] = len(paths) / min(method_times)
        out[f"image_{name}_vs_floor"] = min(floor_times) / min(method_times)
    out["image_floor_images_per_s"] = max(floors)
    out["image_masked_fraction"] = float(np.mean([np.count_nonzero(m) / m.size for m in masks]))
    return out


def run(work: Path, args: argparse.Namespace) -> dict[str, float]:
    return bench_images(work, args.photos)


SECTION = Section(
    "images",
    run,
    args=(PHOTOS,),
    targets={
        "image_zero_vs_floor": 0.7,
        "image_mean_vs_floor": 0.7,
        "image_blur_vs_floor": 0.7,
        "image_opencv_inpaint_vs_floor": 0.25,
    },
)
