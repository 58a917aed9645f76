"""What an evaluation reads (SPEC 1.5): the caption gallery, the test images, the queries.

- :class:`Corpus`: images with their captions, in a fixed order. The ODmAP gallery is every
  caption of train + val + test (616,767 for COCO's Karpathy split file, 155,070 for
  Flickr30k's); standard R@K uses the test split's images and captions (COCO 5K, Flickr 1K).
  :func:`read_karpathy` reads Karpathy's ``dataset_{coco,flickr30k}.json``;
  :func:`corpus_from_records` takes any reader's records (the demo).
- :class:`Query`: one synthetic sample from our shards (made from the test split by
  ``counterfactual synth``): its image, and the classes removed from and kept in it.
  :func:`read_queries` reads them back from the shards (:mod:`counterfactual.shards.samples`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from counterfactual.imageio import SampleError, decode_rgb, load_rgb, resolve_inside
from counterfactual.records import ImageRecord, Status
from counterfactual.shards.samples import BAD_SHARD, read_samples


@dataclass(frozen=True, slots=True)
class CorpusImage:
    image_id: str
    file: str
    """Relative to the corpus root."""
    split: str | None


@dataclass(frozen=True)
class Corpus:
    """Images and their captions; ``caption_image[c]`` is the index in ``images`` of caption
    ``c``'s image. ``root`` is where the image files are (None: captions only).
    ``annotated[c]``: the classes of caption ``c``'s annotated phrases (Flickr30k Entities), or
    None where the caption has no phrase annotation (its mentions come from parsing)."""

    images: tuple[CorpusImage, ...]
    captions: tuple[str, ...]
    caption_image: np.ndarray
    root: Path | None = None
    annotated: tuple[frozenset[str] | None, ...] | None = None

    def __post_init__(self) -> None:
        owner = np.asarray(self.caption_image, dtype=np.int64)
        if owner.shape != (len(self.captions),):
            raise ValueError(f"{len(self.captions)} captions but {owner.shape} owners")
        if owner.size and (owner.min() < 0 or owner.max() >= len(self.images)):
            raise ValueError("caption_image points outside images")
        if self.annotated is not None and len(self.annotated) != len(self.captions):
            raise ValueError(f"{len(self.annotated)} annotations for {len(self.captions)} captions")
        object.__setattr__(self, "caption_image", owner)

    @property
    def splits(self) -> dict[str, int]:
        """Images per split (``"none"`` for images without one)."""
        counts: dict[str, int] = {}
        for image in self.images:
            key = image.split or "none"
            counts[key] = counts.get(key, 0) + 1
        return counts

    def split(self, name: str | None) -> Corpus:
        """The images of split ``name`` (all when ``None``) and their captions, renumbered."""
        if name is None:
            return self
        keep = [i for i, image in enumerate(self.images) if image.split == name]
        if not keep:
            raise ValueError(f"no image of split {name!r} (splits: {self.splits})")
        return self.subset(keep)

    def subset(self, keep: Sequence[int]) -> Corpus:
        """Images ``keep`` (ascending indices) and their captions, renumbered."""
        new_index = np.full(len(self.images), -1, np.int64)
        new_index[list(keep)] = np.arange(len(keep))
        mapped = new_index[self.caption_image]
        chosen = np.flatnonzero(mapped >= 0)
        return Corpus(
            tuple(self.images[i] for i in keep),
            tuple(self.captions[c] for c in chosen),
            mapped[chosen],
            self.root,
            None if self.annotated is None else tuple(self.annotated[c] for c in chosen),
        )

    def load_image(self, index: int, max_pixels: int | None = None) -> Image.Image:
        """Image ``index`` as upright RGB; ``SampleError`` when missing, unsafe or corrupt."""
        if self.root is None:
            raise ValueError("this corpus has no image root")
        path = resolve_inside(self.root, self.images[index].file)
        pixels = load_rgb(path) if max_pixels is None else load_rgb(path, max_pixels)
        return Image.fromarray(pixels)


def corpus_from_records(records: Iterable[ImageRecord], root: Path | None = None) -> Corpus:
    """A corpus of ``records`` in order (captions in their order within each record), with the
    classes of annotated phrases where captions have them."""
    images: list[CorpusImage] = []
    captions: list[str] = []
    owner: list[int] = []
    annotated: list[frozenset[str] | None] = []
    for record in records:
        if root is None:
            root = record.root
        for caption in record.captions:
            captions.append(caption.text)
            owner.append(len(images))
            phrases = caption.phrases
            annotated.append(
                None if phrases is None else frozenset(t for p in phrases for t in p.types)
            )
        images.append(CorpusImage(record.image_id, record.file, record.split))
    has_phrases = any(a is not None for a in annotated)
    return Corpus(
        tuple(images),
        tuple(captions),
        np.asarray(owner, np.int64),
        root,
        tuple(annotated) if has_phrases else None,
    )


def read_karpathy(split_file: str | Path, root: str | Path | None = None) -> Corpus:
    """Karpathy's ``dataset_coco.json`` or ``dataset_flickr30k.json``: every image of every
    split (``restval`` counts as ``train``) with its ``raw`` sentences, in file order.

    Image files are ``root/filepath/filename`` (COCO: ``val2014/COCO_val2014_...jpg``) or
    ``root/filename`` (Flickr30k). Image ids are COCO ids, else Flickr file stems.
    """
    path = Path(split_file)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not JSON ({err})") from err
    entries = data.get("images") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise ValueError(f"{path}: no 'images' list; is this Karpathy's split file?")
    images: list[CorpusImage] = []
    captions: list[str] = []
    owner: list[int] = []
    for n, entry in enumerate(entries):
        try:
            filename = str(entry["filename"])
            sentences = entry["sentences"]
        except (KeyError, TypeError) as err:
            raise ValueError(f"{path}: image {n} lacks {err}") from err
        split = entry.get("split")
        split = "train" if split == "restval" else split
        file = f"{entry['filepath']}/{filename}" if entry.get("filepath") else filename
        image_id = str(entry.get("cocoid", Path(filename).stem))
        for sentence in sentences:
            text = sentence.get("raw", " ".join(sentence.get("tokens", [])))
            captions.append(str(text).strip())
            owner.append(len(images))
        images.append(CorpusImage(image_id, file, split))
    return Corpus(
        tuple(images), tuple(captions), np.asarray(owner, np.int64), Path(root) if root else None
    )


@dataclass(frozen=True)
class Query:
    """A synthetic query image and what was removed from it (from the sample's ``json``)."""

    key: str
    image: Image.Image
    image_id: str
    split: str | None
    removed: tuple[str, ...]
    kept: tuple[str, ...]
    caption: str
    original_caption: str


def read_queries(shards: Sequence[str | Path]) -> tuple[list[Query], list[Status]]:
    """The samples of ``shards`` (paths or URLs) as queries, in shard order, deduplicated by
    image: one query per (source image, removed classes) pair, the first caption's sample (a plan
    yields one sample per caption, all with the same image). Samples that cannot be used come
    back as ``Status`` rows (``decode-error``, ``bad-metadata``: not a
    :class:`~counterfactual.shards.samples.SampleMeta`) rather than raising; a shard that cannot be read
    raises ``ValueError``. Read with :func:`counterfactual.shards.samples.read_samples`."""
    queries: list[Query] = []
    problems: list[Status] = []
    seen: set[tuple[str, tuple[str, ...]]] = set()
    for sample in read_samples(list(shards)):
        if isinstance(sample, Status):
            if sample.reason == BAD_SHARD:
                raise ValueError(f"cannot read queries: {sample.detail}")
            problems.append(sample)
            continue
        meta, key = sample.meta, sample.key
        removed = meta.plan.removed
        if (meta.image_id, removed) in seen:
            continue
        try:
            if sample.jpg is None:
                raise SampleError("decode-error", f"{key} has no jpg member")
            image = Image.fromarray(decode_rgb(sample.jpg))
        except SampleError as err:
            problems.append(Status(meta.image_id, "failed", "decode-error", str(err), key=key))
            continue
        seen.add((meta.image_id, removed))
        queries.append(
            Query(
                key,
                image,
                meta.image_id,
                meta.split,
                removed,
                meta.plan.kept,
                meta.caption,
                meta.original_caption,
            )
        )
    return queries, problems
