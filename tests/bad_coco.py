"""A COCO-format dataset with every kind of bad input a run must survive, shared by the
in-process and the Ray tests."""

import json
from pathlib import Path

import numpy as np
from PIL import Image

from counterfactual.readers.generate import CocoFiles, generate_coco

ODD_CAPTION = "Ein Hund 🐕 neben a dog — naïve café\u200b with a\ttab."


def make_bad_coco(root: Path, n: int = 14, size: tuple[int, int] = (640, 480)) -> CocoFiles:
    """A generated COCO-format dataset of ``n`` images (n >= 14) in which images 1-12 are the
    bad inputs the runner must survive (see the comments); 13 and up are clean."""
    files = generate_coco(root, n, seed=1, size=size)
    inst = json.loads(files.instances.read_text())
    caps = json.loads(files.captions.read_text())
    images = {im["id"]: im for im in inst["images"]}
    path = {i: files.images / im["file_name"] for i, im in images.items()}
    # two small objects in opposite corners give every image a removable class
    for i, im in images.items():
        for cat, x, y in ((1, 0, 0), (18, im["width"] - 24, im["height"] - 24)):
            inst["annotations"].append(
                {
                    "id": 10000 + 2 * i + (cat > 1),
                    "image_id": i,
                    "category_id": cat,
                    "bbox": [x, y, 24, 24],
                    "iscrowd": 0,
                }
            )
    photo = np.asarray(Image.open(path[4]).convert("RGB"))
    path[1].write_bytes(b"not a jpeg at all")  # corrupt
    path[2].unlink()  # missing
    path[3].write_bytes(b"")  # empty
    Image.fromarray(photo).convert("CMYK").save(path[4], "JPEG")  # CMYK
    Image.fromarray(photo).convert("L").save(path[5], "JPEG")  # grayscale
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated: stored sideways, upright after EXIF transpose
    Image.fromarray(photo).transpose(Image.Transpose.ROTATE_270).save(path[6], exif=exif)
    Image.fromarray(np.zeros((1000, 1200, 3), np.uint8)).save(path[7].with_suffix(".png"))
    images[7].update(file_name=path[7].with_suffix(".png").name, width=1200, height=1000)
    images[8]["file_name"] = "../../../etc/passwd"  # must never be read
    inst["annotations"].append(
        {"id": 9999, "image_id": 9, "category_id": 999, "bbox": [1, 1, 5, 5], "iscrowd": 0}
    )
    for ann in inst["annotations"]:
        if ann["image_id"] == 10:
            ann["bbox"] = [ann["bbox"][0] + 500, ann["bbox"][1] - 300, 900, 900]  # outside
    for cap in caps["annotations"]:
        if cap["image_id"] == 11:
            cap["caption"] = ODD_CAPTION
    Image.fromarray(photo[:300, :100]).save(path[12])  # size disagrees with annotation
    files.instances.write_text(json.dumps(inst))
    files.captions.write_text(json.dumps(caps))
    return files


def synth_args(files: CocoFiles, out: Path, *extra: str) -> list[str]:
    """The `counterfactual synth` argument list for a generated COCO-format dataset."""
    return [
        "synth",
        "--dataset",
        "coco",
        "--instances",
        str(files.instances),
        "--captions",
        str(files.captions),
        "--images",
        str(files.images),
        "--out",
        str(out),
        *extra,
    ]
