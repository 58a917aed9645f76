"""The ``fill`` section of ``make bench``."""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import cv2
import numpy as np
from common import Section

from counterfactual.image import (
    EditRequest,
    ImageConfig,
    OpenCVConfig,
    make_editor,
)
from counterfactual.imageio import load_rgb
from counterfactual.method.masks import box_mask


def held_out_boxes(
    width: int, height: int, objects: list[tuple[float, float, float, float]], n: int, seed: int
) -> list[tuple[int, int, int, int]]:
    """``n`` boxes (``xywh``, 12-25% of each side) that touch no annotated object: where the
    true pixels behind a fill are known."""
    rng = np.random.default_rng(seed)
    boxes: list[tuple[int, int, int, int]] = []
    for _ in range(2000):
        if len(boxes) == n:
            break
        w = int(rng.integers(width * 12 // 100, width // 4))
        h = int(rng.integers(height * 12 // 100, height // 4))
        x, y = int(rng.integers(0, width - w)), int(rng.integers(0, height - h))
        if not any(
            x < ox + ow and ox < x + w and y < oy + oh and oy < y + h for ox, oy, ow, oh in objects
        ):
            boxes.append((x, y, w, h))
    return boxes


def _ssim(a: np.ndarray, b: np.ndarray) -> float:
    """Mean SSIM of two grey float images (Wang et al.: Gaussian window, sigma 1.5)."""
    c1, c2 = (0.01 * 255) ** 2, (0.03 * 255) ** 2

    def g(x: np.ndarray) -> np.ndarray:
        return cv2.GaussianBlur(x, (11, 11), 1.5)

    ma, mb = g(a), g(b)
    va, vb, cov = g(a * a) - ma * ma, g(b * b) - mb * mb, g(a * b) - ma * mb
    ssim = ((2 * ma * mb + c1) * (2 * cov + c2)) / ((ma * ma + mb * mb + c1) * (va + vb + c2))
    return float(ssim.mean())


def fill_scores(truth: np.ndarray, filled: np.ndarray) -> dict[str, float]:
    """A fill against the true pixels of its box (``uint8`` RGB crops of the box): PSNR (dB),
    SSIM (grey), ``grad_hist``: L1 distance (0-2) of the gradient-magnitude histograms (32 bins
    over 0-255; a smear has too many small gradients), ``hf_ratio``: the fill's high-frequency
    energy (Laplacian) over the truth's (1 = the same texture; a smear is near 0)."""
    t, f = truth.astype(np.float64), filled.astype(np.float64)
    mse = float(np.mean((t - f) ** 2))
    psnr = 10 * math.log10(255**2 / max(mse, 1e-10))
    gt = cv2.cvtColor(truth, cv2.COLOR_RGB2GRAY).astype(np.float32)
    gf = cv2.cvtColor(filled, cv2.COLOR_RGB2GRAY).astype(np.float32)

    def magnitude(x: np.ndarray) -> np.ndarray:
        return np.hypot(cv2.Sobel(x, cv2.CV_32F, 1, 0), cv2.Sobel(x, cv2.CV_32F, 0, 1)) / 4

    def histogram(x: np.ndarray) -> np.ndarray:
        counts, _ = np.histogram(np.clip(magnitude(x), 0, 255), bins=32, range=(0, 256))
        return counts / counts.sum()

    def energy(x: np.ndarray) -> float:
        return float(np.mean(cv2.Laplacian(x, cv2.CV_32F) ** 2))

    return {
        "psnr": psnr,
        "ssim": _ssim(gt, gf),
        "grad_hist": float(np.abs(histogram(gt) - histogram(gf)).sum()),
        "hf_ratio": energy(gf) / max(energy(gt), 1e-6),
    }


def bench_fill(work: Path, boxes_per_picture: int = 4) -> dict[str, float]:
    """The CPU erasers on held-out regions of the demo's real photos (see ``NOTES["fill"]``)."""
    from counterfactual.readers.demo import read_demo

    editors = {
        "telea": make_editor(ImageConfig(opencv=OpenCVConfig(algorithm="telea"))),
        "ns": make_editor(ImageConfig(opencv=OpenCVConfig(algorithm="ns"))),
        "exemplar": make_editor(ImageConfig(backend="exemplar")),
    }
    scores: dict[str, list[dict[str, float]]] = {name: [] for name in editors}
    seconds = dict.fromkeys(editors, 0.0)
    count = 0
    for i, record in enumerate(read_demo(work / "fill-demo").records):
        image = load_rgb(str(Path(str(record.root)) / record.file))
        objects = [o.bbox for o in record.objects]
        for x, y, w, h in held_out_boxes(
            record.width, record.height, objects, boxes_per_picture, i
        ):
            mask = box_mask(record.height, record.width, [(x, y, w, h)])
            truth = image[y : y + h, x : x + w]
            count += 1
            for name, editor in editors.items():
                start = time.perf_counter()
                (filled,) = editor([EditRequest(image, mask, (), (), 0)])
                seconds[name] += time.perf_counter() - start
                scores[name].append(fill_scores(truth, filled[y : y + h, x : x + w]))
    figures = {"fill_regions": float(count)}
    for name, rows in scores.items():
        for key in rows[0]:
            figures[f"fill_{name}_{key}"] = round(float(np.mean([r[key] for r in rows])), 3)
        figures[f"fill_{name}_seconds_per_region"] = round(seconds[name] / max(count, 1), 3)
    return figures


def run(work: Path, args: argparse.Namespace) -> dict[str, float]:
    return bench_fill(work)


SECTION = Section(
    "fill",
    run,
    args=(),
    note="The CPU erasers on held-out regions of the demo's 8 real pictures: 4 boxes each "
    "(12-25% of each side) that touch no annotated object, filled and compared with the "
    "true pixels there. psnr (dB) and ssim (grey, Gaussian window): closeness; grad_hist: "
    "L1 distance (0-2) of the gradient-magnitude histograms, hf_ratio: the fill's "
    "Laplacian energy over the truth's (1 = as much texture, a smear is near 0): whether "
    "it looks like the surroundings. seconds_per_region: the eraser's call, one region. "
    "LaMa needs its weights and is not measured here; blur is left out, as it reads the "
    "pixels it hides.",
)
