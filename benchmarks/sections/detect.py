"""The ``detect`` section of ``make bench``: images/s of decode -> OWLv2 detection on real photos, one thread, the tests' tiny
model and one of the base checkpoint's size (random weights), per query mode, beside a
decode-only loop.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from pathlib import Path

from common import DETECT_CAPTIONS, PHOTOS, Arg, Section, best_rate, real_photos, side_by_side

from counterfactual.imageio import load_rgb
from counterfactual.testing import (
    build_tiny_owlv2,
    write_owl_tokenizer_files,
)
from counterfactual.vocab import coco_vocabulary


def _owlv2_base(folder: Path) -> Path:
    """A random OWLv2 of ``google/owlv2-base-patch16-ensemble``'s sizes (ViT-B/16 image tower
    at 960 px: 3,600 patches; 12-layer text tower, 16 tokens) with its processor (pad to a
    square, resize to 960), saved to ``folder`` as a user's checkpoint is. ``Owlv2Config()``'s
    vision default is 768 px, so the size is set to the checkpoint's 960."""
    import torch
    from transformers import (
        CLIPTokenizer,
        Owlv2Config,
        Owlv2ForObjectDetection,
        Owlv2ImageProcessor,
        Owlv2Processor,
    )

    source = folder.parent / f"{folder.name}-tokenizer-src"
    write_owl_tokenizer_files(source)
    tokenizer = CLIPTokenizer.from_pretrained(str(source), model_max_length=16)
    config = Owlv2Config(
        text_config={
            "vocab_size": len(tokenizer),  # a lookup table: its size costs no time
            "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_id,
            "pad_token_id": tokenizer.pad_token_id,
        },
        vision_config={"image_size": 960},
    )
    torch.manual_seed(0)
    Owlv2ForObjectDetection(config).eval().save_pretrained(folder)
    Owlv2Processor(image_processor=Owlv2ImageProcessor(), tokenizer=tokenizer).save_pretrained(
        folder
    )
    return folder


def _decode_and_detect(detector: Callable, files: list[Path], captions: list[str]) -> None:
    detector([load_rgb(p) for p in files], captions)


def _detect_model(
    folder: Path, files: list[Path], captions: list[str], repeat: int
) -> tuple[dict[str, float], float]:
    """Figures of one saved OWLv2 (keys without the ``detect_MODEL_`` prefix) and the best
    decode-only rate seen beside it."""
    from transformers import AutoProcessor

    from counterfactual.method.detect import DetectConfig, Detector

    def floor() -> None:
        for p in files:
            load_rgb(p)

    out: dict[str, float] = {}
    floors = []
    for mode in ("caption", "caption+vocabulary"):
        config = DetectConfig(model=str(folder), score_threshold=0.2, queries=mode)
        detector = Detector(config, coco_vocabulary(), device="cpu", dtype="float32")
        if not floors:  # warm-up: first-call allocations, kernels picked for these shapes
            detector([load_rgb(files[0])], captions[:1])
        run = functools.partial(_decode_and_detect, detector, files, captions)
        floor_rate, rate = side_by_side(len(files), floor, run, repeat)
        floors.append(floor_rate)
        out[f"{mode.replace('+', '_')}_images_per_s"] = rate
        out[f"{mode.replace('+', '_')}_cost_in_decodes"] = floor_rate / rate
    # the image processor the detector loaded, alone on the decoded photos
    processor = AutoProcessor.from_pretrained(str(folder)).image_processor
    images = [load_rgb(p) for p in files]
    pre = best_rate(len(images), lambda: processor(images=images, return_tensors="pt"), repeat=2)
    out["preprocess_images_per_s"] = pre
    out["caption_preprocess_share"] = out["caption_images_per_s"] / pre
    return out, max(floors)


def bench_detect(work: Path, n: int, n_base: int) -> dict[str, float]:
    """Images/s of decode -> detect (``Detector`` loaded from a saved folder, as a user loads
    one) on one thread, per query mode, for the tests' tiny OWLv2 on ``n`` photos and an OWLv2
    of the base checkpoint's size on ``n_base`` of them, each beside a decode-only loop."""
    import torch

    torch.set_num_threads(1)

    (work / "detect").mkdir(exist_ok=True)
    paths, _ = real_photos(work / "detect", max(n, n_base))
    captions = [DETECT_CAPTIONS[i % len(DETECT_CAPTIONS)] for i in range(len(paths))]
    print(
        f"detect: one torch thread; the base-size OWLv2 (random weights) on {n_base} photos "
        f"only (about 20 s each on one core here), the tiny one on {n}"
    )
    models = {
        "tiny": (build_tiny_owlv2(work / "owl-tiny", grid_boxes=True), n, 3),
        "base": (_owlv2_base(work / "owl-base"), n_base, 1),
    }
    out: dict[str, float] = {}
    floors = []
    for model, (folder, count, repeat) in models.items():
        figures, floor_rate = _detect_model(folder, paths[:count], captions[:count], repeat)
        out |= {f"detect_{model}_{name}": value for name, value in figures.items()}
        floors.append(floor_rate)
    out["detect_decode_images_per_s"] = max(floors)
    out["detect_base_images_measured"] = float(n_base)
    return out


def run(work: Path, args: argparse.Namespace) -> dict[str, float]:
    return bench_detect(work, args.photos, args.detect_base_images)


SECTION = Section(
    "detect",
    run,
    args=(
        PHOTOS,
        Arg(
            "--detect-base-images",
            {"type": int, "default": 3, "help": "photos for the base-size OWLv2"},
        ),
    ),
    note="decode -> Detector (OWLv2 loaded from a saved folder, float32, threshold 0.2) on real "
    "640x480 photos, captions naming three COCO classes; 'caption' asks for those three, "
    "'caption_vocabulary' for all 80. One torch thread. Random weights: the cost does not "
    "depend on them. tiny = the tests' OWLv2 (32 px); base = google/owlv2-base-patch16-"
    "ensemble's sizes (960 px, 3,600 patches), measured on detect_base_images_measured "
    "photos only, after a one-photo warm-up, since one takes about 20 s on one core. "
    "*_cost_in_decodes: seconds per image over a decode-only loop's on the same photos, "
    "alternated with it. *_preprocess_images_per_s: the image processor the detector "
    "loads, alone on decoded photos (without torchvision transformers falls back to its "
    "PIL/scipy processor); caption_preprocess_share: its part of the caption-mode time.",
)
