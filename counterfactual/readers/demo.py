"""The bundled demo: real photos that ship inside scikit-image, annotated by hand.

Eight COCO-format images: six photos from ``skimage.data`` (``astronaut``, ``coffee``,
``camera`` (grayscale), ``chelsea``, ``rocket``, the left view of ``stereo_motorcycle``) and two
composites built from them (``cat_and_rocket``: two photos side by side;
``cameraman_and_espresso``: a crop of ``camera`` above a scaled ``coffee``). The boxes (``xywh``
pixels of the written pictures) and the 3-4 captions per image were drawn and written by hand
and live in ``data/demo_instances.json`` and ``data/demo_captions.json``; how each picture is
built (photo, crop, resize, offset) is data too, in ``data/demo_recipe.json``. The pixels are
made at run time from the scikit-image wheel (no network), so the repository ships no photos.

With the default alphas (0.4 / 0.8 / 0.7) every outcome of the selection rules occurs:

- single-class plans: ``astronaut`` flag, helmet or rocket; ``coffee`` spoon; ``camera`` camera
  or tripod; ``motorcycle`` bench; ``cat_and_rocket`` rocket.
- multi-class plans: ``cameraman_and_espresso`` person (the camera in his hands lies inside his
  box and goes too) and dining table (takes saucer, cup and spoon with it).
- ``nothing-kept``: ``coffee`` dining table (every other object lies on it).
- ``keep-overlap``: ``astronaut`` person (the flag is 79% behind her), ``camera`` person (the
  tripod, 57%), ``motorcycle`` motorcycle (the bench, 79%), ``coffee`` cup and saucer.
- ``too-large``: ``cat_and_rocket`` cat (74% of the picture).
- ``fewer-than-two-classes``: ``chelsea`` (a cat) and ``rocket``.

Classes: ``person``, ``cup``, ``spoon``, ``dining table``, ``cat``, ``motorcycle``, ``bench``
(COCO names) and ``flag``, ``rocket`` (also the space shuttle model), ``helmet``, ``saucer``,
``camera``, ``tripod``, which are not COCO classes and need word lists of their own for caption
rewriting (the captions say e.g. "flag", "rocket", "space shuttle", "helmet", "saucer",
"camera", "video camera", "tripod").

scikit-image is the optional extra ``demo``.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from counterfactual._lazy import require
from counterfactual.fs import safe_relative_path
from counterfactual.records import Dataset

INSTANCES = "demo_instances.json"
CAPTIONS = "demo_captions.json"
RECIPE = "demo_recipe.json"
JPEG_QUALITY = 95

# The photos a recipe may name, each read from the scikit-image wheel.
PHOTOS: dict[str, Callable[[Any], np.ndarray]] = {
    "astronaut": lambda data: data.astronaut(),
    "camera": lambda data: data.camera(),
    "chelsea": lambda data: data.chelsea(),
    "coffee": lambda data: data.coffee(),
    "rocket": lambda data: data.rocket(),
    "motorcycle": lambda data: data.stereo_motorcycle()[0],
}


@dataclass(frozen=True, slots=True)
class DemoFiles:
    """Where :func:`prepare_demo` put things: the COCO ``instances`` and ``captions`` JSON and
    the ``images`` folder that their ``file_name`` entries are relative to."""

    instances: Path
    captions: Path
    images: Path


def _packaged(name: str) -> bytes:
    return resources.files("counterfactual").joinpath("data", name).read_bytes()


def demo_recipe() -> dict[str, dict[str, Any]]:
    """``file name -> {"size": [w, h], "mode": "RGB" | "L", "layers": [...]}``.

    Each layer is ``{"photo": name, "crop": [left, top, right, bottom], "resize": [w, h],
    "at": [x, y]}`` (``crop`` and ``resize`` optional): the photo is cropped, resized and pasted
    with its top-left corner at ``at`` on a canvas of ``size``.
    """
    return json.loads(_packaged(RECIPE))


def _write_atomic(path: Path, write: Callable[[Path], None]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _has_picture(path: Path, size: tuple[int, int], mode: str) -> bool:
    try:
        with Image.open(path) as im:
            return im.size == size and im.mode == mode
    except (OSError, SyntaxError):
        return False


def render(spec: dict[str, Any], photos: Callable[[str], Image.Image]) -> Image.Image:
    """Build one picture from its recipe entry; ``photos(name)`` returns the source photo."""
    size = tuple(spec["size"])
    canvas = Image.new(spec["mode"], size)  # type: ignore[arg-type]
    for layer in spec["layers"]:
        photo = photos(layer["photo"]).convert(spec["mode"])
        if "crop" in layer:
            photo = photo.crop(tuple(layer["crop"]))
        if "resize" in layer:
            photo = photo.resize(tuple(layer["resize"]), Image.Resampling.LANCZOS)
        canvas.paste(photo, tuple(layer["at"]))
    return canvas


def prepare_demo(dest: Path) -> DemoFiles:
    """Write the demo pictures (JPEG, quality 95; ``camera`` as a grayscale JPEG) into
    ``dest/images/`` and the annotations into ``dest/``. Pictures already there with the right
    size and mode are kept, so a second call is cheap and reads no photo."""
    dest = Path(dest)
    images = dest / "images"
    images.mkdir(parents=True, exist_ok=True)
    files = DemoFiles(dest / INSTANCES, dest / CAPTIONS, images)
    for name, path in ((INSTANCES, files.instances), (CAPTIONS, files.captions)):
        content = _packaged(name)
        if not path.exists() or path.read_bytes() != content:
            _write_atomic(path, lambda tmp, c=content: tmp.write_bytes(c))

    cache: dict[str, Image.Image] = {}

    def photo(name: str) -> Image.Image:
        if name not in PHOTOS:
            raise ValueError(f"demo recipe names unknown photo {name!r}; known: {sorted(PHOTOS)}")
        if name not in cache:
            cache[name] = Image.fromarray(PHOTOS[name](require("skimage.data", "demo")))
        return cache[name]

    for file, spec in demo_recipe().items():
        rel = safe_relative_path(file)
        if rel is None:
            raise ValueError(f"demo recipe has an unsafe file name {file!r}")
        target = images / rel
        if _has_picture(target, tuple(spec["size"]), spec["mode"]):
            continue
        picture = render(spec, photo)
        target.parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(target, lambda tmp, p=picture: p.save(tmp, "JPEG", quality=JPEG_QUALITY))
    return files


def read_demo(dest: Path) -> Dataset:
    """:func:`prepare_demo` into ``dest``, then read it as COCO (dataset name ``"demo"``)."""
    from counterfactual.readers.coco import read_coco

    files = prepare_demo(dest)
    return read_coco(files.instances, files.captions, files.images, dataset="demo")


__all__ = [
    "PHOTOS",
    "DemoFiles",
    "demo_cache_dir",
    "demo_recipe",
    "prepare_demo",
    "read_demo",
    "render",
]


CACHE_ENV = "COUNTERFACTUAL_CACHE"


def demo_cache_dir() -> Path:
    """Where the demo's pictures are made when no ``--root`` names a folder, outside any run's
    OUT: ``$COUNTERFACTUAL_CACHE/demo``, else ``$XDG_CACHE_HOME/counterfactual/demo``, else
    ``~/.cache/counterfactual/demo``. :func:`prepare_demo` makes what is missing again, so
    the folder may be deleted at any time."""
    base = os.environ.get(CACHE_ENV)
    if not base:
        xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "counterfactual")
    return Path(base) / "demo"


def demo_vocabulary_path() -> Path:
    """The demo's class word lists (COCO's plus the demo's own classes)."""
    return Path(str(resources.files("counterfactual") / "data" / "demo_synonyms.txt"))
