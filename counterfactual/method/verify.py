"""Is a counterfactual really one? A per-sample check of the erased image and the new caption.

Diffusion inpainters often redraw the object they were asked to erase, and a caption can still
name what is gone. :class:`Verifier` checks each sample three ways:

* removal (CLIP@k, as Inst-Inpaint): for each removed class, the union of its boxes (padded) is
  cropped from the original and the edited image and classified zero-shot against every class of
  the vocabulary (prompt ``template.format(class)``); the class is removed when its rank on the
  edited crop is worse than ``k`` (it is not among the ``k`` most similar classes);
* retention: each kept class is still among the ``retention_k`` most similar classes on its own
  crop of the edited image;
* text: the new caption names no removed class (matched by :class:`ClassVocabulary` on its
  words, plurals and multi-word entries as ``np-removal`` matches them) and, for ``np-removal``
  and ``prompt``, names at least one kept class.

The scoring is split into pure functions on plain numbers (:func:`zero_shot_ranks`,
:func:`class_score`, :func:`judge`, :func:`text_check`, :func:`crop_box`) so the rules can be
tested with hand-made scores; :class:`Verifier` only crops, embeds and calls them. Boxes are
``xywh`` pixels of the image they are cropped from; images are ``uint8`` RGB ``HxWx3``. torch
loads with the embedder (:func:`counterfactual.models.load_embedder`), never at import time.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import msgspec
import numpy as np
from PIL import Image

from counterfactual.imageio import SampleError
from counterfactual.jsonrecord import Number, Record, convert, unique, upgrade_keyed
from counterfactual.options import declare
from counterfactual.records import ImageRecord
from counterfactual.vocab import ClassVocabulary

if TYPE_CHECKING:
    from counterfactual.models import Embedder

VERIFY_MODES = ("off", "record", "filter")
"""``off``: no check; ``record``: scores go into each sample's json; ``filter``: also fail the
samples that do not pass, with the first failed check as their status reason."""
DEFAULT_MODEL = "hf-clip:openai/clip-vit-base-patch32"
REMOVAL, RETENTION, TEXT = "verify-removal", "verify-retention", "verify-text"
"""Status reasons of a sample that fails a check, in the order the checks are reported."""
UNKNOWN_CLASS = "verify-unknown-class"
TEXT_CHECKED = ("np-removal", "prompt", "captioner")
"""The built-in text methods whose caption must name no removed class (``shuffle`` and
``nouns-adj`` perturb the original caption on purpose and are not checked): those that declare
``removes`` (:data:`counterfactual.text.REWRITERS`, a later folder this one does not import;
``tests/test_rewriters.py`` checks the two agree). The default of :class:`Verifier`'s
``text_checked``; a synthesis run passes the registry's own
(:data:`counterfactual.text.REMOVING_METHODS`, plugins included)."""
KEPT_NAMED = ("np-removal", "prompt")
"""The built-in text methods whose caption must also name a kept class: those that declare
``names_kept`` (:data:`counterfactual.text.KEEPING_METHODS`); :class:`Verifier`'s default."""
CLIP_LOGIT_SCALE = 100.0
"""CLIP's learned temperature (``exp(4.6052)``): probabilities are ``softmax(100 * cosine)``."""

Box = tuple[float, float, float, float]


@dataclass(frozen=True, slots=True)
class VerifyConfig:
    mode: str = "off"
    model: str = declare(
        DEFAULT_MODEL,
        help="zero-shot model: hf-clip:ID_OR_FOLDER, blip:..., open_clip:ARCH:TAG or a folder "
        "(default: %(default)s)",
        flags=("--verify-model",),
    )
    """A :func:`counterfactual.models.load_embedder` spec (``hf-clip:ID``, a local folder, ...)."""
    k: int = declare(
        5,
        help="a removed class passes when it is not in the top k on its edited box "
        "(default: %(default)s)",
        kind="positive_int",
        flags=("--verify-k",),
    )
    """A removed class passes when it is not in the top ``k`` on its edited crop."""
    retention_k: int = declare(
        5,
        help="a kept class passes when it is still in the top k on its box (default: %(default)s)",
        kind="positive_int",
        flags=("--verify-retention-k",),
    )
    """A kept class passes when it is in the top ``retention_k`` on its edited crop."""
    template: str = "a photo of a {}."
    text_check: bool = declare(
        True,
        help="do not check the new caption's class names",
        kind="no-flag",
        flags=("--no-verify-text",),
        dest="verify_text",
    )
    crop_padding: float = 0.1
    """Context around a box, as a fraction of its width (left and right) and height."""
    min_box: int = 32
    """Crops narrower or shorter than this (px, after padding) grow to a square of this side."""

    def __post_init__(self) -> None:
        if self.mode not in VERIFY_MODES:
            raise ValueError(f"verify mode {self.mode!r} is not one of {VERIFY_MODES}")
        if not self.model or self.model != self.model.strip():
            raise ValueError(f"verify model {self.model!r} is empty or has surrounding spaces")
        for name in ("k", "retention_k", "min_box"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"verify {name} must be an int >= 1, got {value!r}")
        if not 0.0 <= self.crop_padding <= 10.0:
            raise ValueError(f"verify crop_padding must be in [0, 10], got {self.crop_padding}")
        try:
            filled = self.template.format("CLASS")
        except (IndexError, KeyError, ValueError) as err:
            raise ValueError(f"verify template {self.template!r} is not a format string") from err
        if "CLASS" not in filled:
            raise ValueError(f"verify template {self.template!r} has no {{}} for the class name")

    @property
    def enabled(self) -> bool:
        return self.mode != "off"


@dataclass(frozen=True, slots=True)
class ClassScore:
    """A class's zero-shot result on one crop: ``rank`` 1 is the most similar class of the
    vocabulary; ``prob`` its softmax probability over the vocabulary."""

    rank: int
    prob: float


@dataclass(frozen=True, slots=True)
class Removal:
    before: ClassScore
    after: ClassScore
    removed: bool


@dataclass(frozen=True, slots=True)
class Retention:
    score: ClassScore
    kept: bool


@dataclass(frozen=True, slots=True)
class TextCheck:
    """Removed classes the new caption names (should be none) and whether it names a kept class
    (``None`` where the text method is not required to)."""

    names_removed: tuple[str, ...]
    names_kept: bool | None

    @property
    def passed(self) -> bool:
        return not self.names_removed and self.names_kept is not False


@dataclass(frozen=True, slots=True)
class VerifyRequest:
    """One sample to check. ``original`` and ``edited`` are ``uint8`` RGB ``HxWx3`` of one
    size; boxes are ``xywh`` pixels of that size, per class. ``caption`` is the new caption
    (``None``: no text check); ``text_method`` the method that wrote it."""

    original: np.ndarray
    edited: np.ndarray
    removed_boxes: Mapping[str, Sequence[Box]]
    kept_boxes: Mapping[str, Sequence[Box]]
    removed: tuple[str, ...]
    kept: tuple[str, ...]
    caption: str | None = None
    text_method: str = "np-removal"


@dataclass(frozen=True, slots=True)
class PreparedVerify:
    """A :class:`VerifyRequest` whose crops were cut and preprocessed where the pictures are (a
    shard worker, :func:`prepare_verify`), so the model actor only normalises and embeds them.
    ``pixels`` is ``uint8`` ``(N, 3, H, W)`` at the model's input size; ``removal[c]`` is the
    row of class ``c``'s original crop (its edited crop is the next row), ``retention[c]`` the
    row of kept class ``c``'s edited crop."""

    pixels: np.ndarray
    removal: Mapping[str, int]
    retention: Mapping[str, int]
    removed: tuple[str, ...]
    kept: tuple[str, ...]
    caption: str | None = None
    text_method: str = "np-removal"


# The verdict as a sample's json holds it, field order = key order.
class RemovalCheck(Record):
    """A removed class on its box before and after the edit: rank 1 = most similar class."""

    name: str = msgspec.field(name="class")
    rank_before: int
    rank_after: int
    prob_before: Number
    prob_after: Number
    removed: bool


class RetentionCheck(Record):
    """A kept class on its box after the edit."""

    name: str = msgspec.field(name="class")
    rank: int
    prob: Number
    kept: bool


class TextCheckMeta(Record):
    """Removed classes the new caption names; whether it names a kept class (``None``: the text
    method need not)."""

    names_removed: tuple[str, ...]
    names_kept: bool | None


class VerifyMeta(Record):
    """The verifier's verdict as a sample's json holds it (:meth:`VerifyResult.meta`): the
    per-class checks are lists of records ``{"class": name, ...}`` (one schema for every sample;
    :meth:`from_dict` and :meth:`counterfactual.shards.samples.SampleMeta.from_dict` also read
    the older objects keyed by class name)."""

    passed: bool
    failed: tuple[str, ...]
    removal: tuple[RemovalCheck, ...]
    retention: tuple[RetentionCheck, ...]
    text: TextCheckMeta | None
    model: str
    k: int
    retention_k: int

    def __post_init__(self) -> None:
        unique(self.removal, "removal")
        unique(self.retention, "retention")

    @classmethod
    def from_dict(cls, d: Any) -> VerifyMeta:
        """A verdict's json, in the current or the older layout (:meth:`VerifyResult.to_dict`)."""
        return convert(upgrade_keyed(d, VERIFY_KEYED), cls)


VERIFY_KEYED = (("removal",), ("retention",))
"""The verdict's per-class parts that older shards hold as objects keyed by class name, by path
(:func:`~counterfactual.jsonrecord.upgrade_keyed`)."""


@dataclass(frozen=True, slots=True)
class VerifyResult:
    passed: bool
    failed: tuple[str, ...]
    """The failed checks (:data:`REMOVAL`, :data:`RETENTION`, :data:`TEXT`), in that order."""
    removal: dict[str, Removal]
    retention: dict[str, Retention]
    text: TextCheck | None
    model: str
    k: int
    retention_k: int

    def meta(self) -> VerifyMeta:
        """The verdict as its sample json holds it, probabilities rounded (:func:`round_prob`)."""
        text = self.text
        return VerifyMeta(
            self.passed,
            tuple(self.failed),
            tuple(
                RemovalCheck(
                    c,
                    r.before.rank,
                    r.after.rank,
                    round_prob(r.before.prob),
                    round_prob(r.after.prob),
                    r.removed,
                )
                for c, r in self.removal.items()
            ),
            tuple(
                RetentionCheck(c, r.score.rank, round_prob(r.score.prob), r.kept)
                for c, r in self.retention.items()
            ),
            None if text is None else TextCheckMeta(tuple(text.names_removed), text.names_kept),
            self.model,
            self.k,
            self.retention_k,
        )

    def to_dict(self) -> dict[str, Any]:
        """The verdict as plain JSON with the per-class checks by class name (``{c: {...}}``):
        :meth:`meta`'s json, each list of records keyed by its ``class``."""
        d = self.meta().to_dict()
        for (part,) in VERIFY_KEYED:
            d[part] = {r.pop("class"): r for r in d[part]}
        return d

    def detail(self) -> str:
        """One line on what failed, for the status record."""
        parts = []
        if REMOVAL in self.failed:
            still = [
                f"{c} rank {r.before.rank}->{r.after.rank}"
                for c, r in self.removal.items()
                if not r.removed
            ]
            parts.append(f"{REMOVAL}: {', '.join(still)} (top-{self.k} after the edit)")
        if RETENTION in self.failed:
            lost = [f"{c} rank {r.score.rank}" for c, r in self.retention.items() if not r.kept]
            parts.append(f"{RETENTION}: {', '.join(lost)} (not in top-{self.retention_k})")
        if TEXT in self.failed and self.text is not None:
            why = []
            if self.text.names_removed:
                why.append(f"names {', '.join(self.text.names_removed)}")
            if self.text.names_kept is False:
                why.append("names no kept class")
            parts.append(f"{TEXT}: caption {' and '.join(why)}")
        return "; ".join(parts)


def round_prob(x: float) -> float:
    """A probability as a verdict stores it: a Python float, 6 decimals."""
    return round(float(x), 6)


def zero_shot_ranks(
    image_emb: np.ndarray, class_emb: np.ndarray, logit_scale: float = CLIP_LOGIT_SCALE
) -> tuple[np.ndarray, np.ndarray]:
    """Zero-shot classification of every image row against every class row.

    ``image_emb`` ``(N, D)`` and ``class_emb`` ``(C, D)`` are unit rows, so dot products are
    cosines. Returns ``ranks`` ``(N, C)`` int64 (1 = most similar; tied classes share the best
    rank of the tie: 1 + the number of classes scoring strictly higher) and ``probs`` ``(N, C)``
    float64, the softmax of ``logit_scale * cosine`` over the classes.
    """
    image = np.asarray(image_emb, dtype=np.float64)
    classes = np.asarray(class_emb, dtype=np.float64)
    if image.ndim != 2 or classes.ndim != 2 or image.shape[1] != classes.shape[1]:
        raise ValueError(
            f"expected (N, D) image and (C, D) class embeddings, got {image.shape} and "
            f"{classes.shape}"
        )
    if classes.shape[0] == 0:
        raise ValueError("no class embeddings to rank against")
    if not logit_scale > 0:
        raise ValueError(f"logit_scale must be > 0, got {logit_scale}")
    logits = logit_scale * (image @ classes.T)
    ranks = np.empty(logits.shape, dtype=np.int64)
    n_classes = logits.shape[1]
    for row, values in enumerate(logits):
        ordered = np.sort(values)
        ranks[row] = 1 + n_classes - np.searchsorted(ordered, values, side="right")
    shifted = logits - logits.max(axis=1, keepdims=True) if len(logits) else logits
    exp = np.exp(shifted)
    probs = exp / exp.sum(axis=1, keepdims=True) if len(exp) else exp
    return ranks, probs


def class_score(
    ranks: np.ndarray, probs: np.ndarray, classes: Sequence[str], name: str
) -> ClassScore:
    """Class ``name``'s rank and probability in one row of :func:`zero_shot_ranks`, where
    ``classes`` names the columns. Raises ``ValueError`` for a class not among them."""
    try:
        col = list(classes).index(name)
    except ValueError:
        raise ValueError(_unknown(name, classes)) from None
    return ClassScore(int(ranks[col]), float(probs[col]))


def _unknown(name: str, classes: Sequence[str]) -> str:
    preview = ", ".join(list(classes)[:5])
    return (
        f"class {name!r} is not in the verification vocabulary ({len(classes)} classes: "
        f"{preview}, ...); pass a --vocabulary that lists it"
    )


def judge(
    removal: Mapping[str, tuple[ClassScore, ClassScore]],
    retention: Mapping[str, ClassScore],
    text: TextCheck | None,
    k: int,
    retention_k: int,
    model: str = "",
) -> VerifyResult:
    """The verdict on one sample from its scores.

    ``removal[c]`` is ``(before, after)``: class ``c`` on the original and the edited crop; it is
    removed when ``after.rank > k``. ``retention[c]`` is a kept class on its edited crop; it is
    kept when ``rank <= retention_k``. ``text`` is :func:`text_check`'s result (``None``: not
    checked). A sample passes when every class passes and the text does.
    """
    for name, value in (("k", k), ("retention_k", retention_k)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    removed = {c: Removal(b, a, a.rank > k) for c, (b, a) in removal.items()}
    kept = {c: Retention(s, s.rank <= retention_k) for c, s in retention.items()}
    failed = []
    if not all(r.removed for r in removed.values()):
        failed.append(REMOVAL)
    if not all(r.kept for r in kept.values()):
        failed.append(RETENTION)
    if text is not None and not text.passed:
        failed.append(TEXT)
    return VerifyResult(not failed, tuple(failed), removed, kept, text, model, k, retention_k)


def mentioned_classes(vocabulary: ClassVocabulary, text: str) -> set[str]:
    """The classes whose words ``text`` contains, matched on its lower-cased words as
    ``np-removal`` matches them (inflections, longest entry first: "hot dogs" is a hot dog),
    as a reader sees them (:meth:`ClassVocabulary.mentioned`: fullwidth forms, format characters
    and lookalike letters folded)."""
    return vocabulary.mentioned(text)


def text_check(
    vocabulary: ClassVocabulary,
    caption: str | None,
    removed: Sequence[str],
    kept: Sequence[str],
    method: str,
    checked: Collection[str] = TEXT_CHECKED,
    kept_named: Collection[str] = KEPT_NAMED,
) -> TextCheck | None:
    """The text check of a caption written by ``method``; ``None`` when there is no caption or
    the method is not in ``checked`` (default :data:`TEXT_CHECKED`); whether it names a kept
    class is checked for the methods of ``kept_named`` (default :data:`KEPT_NAMED`)."""
    if caption is None or method not in checked:
        return None
    named = mentioned_classes(vocabulary, caption)
    names_kept = any(c in named for c in kept) if method in kept_named and kept else None
    return TextCheck(tuple(c for c in removed if c in named), names_kept)


def crop_box(
    boxes: Iterable[Box], width: int, height: int, padding: float = 0.1, min_side: int = 1
) -> tuple[int, int, int, int] | None:
    """The crop that scores a class: ``(x0, y0, x1, y1)`` integer pixels (exclusive ends).

    The union bbox of ``boxes`` (``xywh``, clipped to the ``width`` x ``height`` image; boxes
    with no area inside are dropped) grows by ``padding`` times its width on the left and right
    and its height on top and bottom; a crop narrower or shorter than ``min_side`` becomes a
    square of side ``max(min_side, its longer side)`` on the same centre. A crop that fits in the
    image is then moved inside it (so it keeps its size and still holds the boxes), one larger
    than the image is cut to it. ``None`` when no box has area on the image.
    """
    clipped = []
    for x, y, w, h in boxes:
        x0, y0 = max(0.0, float(x)), max(0.0, float(y))
        x1, y1 = min(float(width), float(x) + float(w)), min(float(height), float(y) + float(h))
        if x1 > x0 and y1 > y0:
            clipped.append((x0, y0, x1, y1))
    if not clipped:
        return None
    x0 = min(b[0] for b in clipped)
    y0 = min(b[1] for b in clipped)
    x1 = max(b[2] for b in clipped)
    y1 = max(b[3] for b in clipped)
    pw, ph = padding * (x1 - x0), padding * (y1 - y0)
    x0, x1, y0, y1 = x0 - pw, x1 + pw, y0 - ph, y1 + ph
    if x1 - x0 < min_side or y1 - y0 < min_side:
        side = max(float(min_side), x1 - x0, y1 - y0)
        cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
        x0, x1, y0, y1 = cx - side / 2, cx + side / 2, cy - side / 2, cy + side / 2
    a, b = _fit(x0, x1, width)
    c, d = _fit(y0, y1, height)
    return a, c, b, d


def _fit(lo: float, hi: float, size: int) -> tuple[int, int]:
    if hi - lo >= size:
        return 0, size
    if lo < 0:
        lo, hi = 0.0, hi - lo
    elif hi > size:
        lo, hi = lo - (hi - size), float(size)
    return max(0, math.floor(lo)), min(size, math.ceil(hi))


def class_boxes(
    record: ImageRecord, classes: Iterable[str], height: int, width: int
) -> dict[str, list[Box]]:
    """The boxes of each of ``classes`` in ``record``, as ``xywh`` pixels of a decoded image of
    ``height`` x ``width`` (scaled from the annotated size, as masks are; crowd boxes included);
    a class with no box keeps an empty list."""
    sx, sy = width / record.width, height / record.height
    out: dict[str, list[Box]] = {c: [] for c in classes}
    for obj in record.objects:
        if obj.category in out:
            x, y, w, h = obj.bbox
            out[obj.category].append((x * sx, y * sy, w * sx, h * sy))
    return out


class Verifier:
    """Checks batches of :class:`VerifyRequest` (see the module doc).

    Loads the embedder ``config.model`` once on ``device``, ``batch_size`` crops per forward
    pass (or takes ``embedder``, anything with ``embed_images``/``embed_texts`` returning unit
    rows) and embeds the prompt of every class of ``vocabulary`` once. Raises ``ValueError``
    when ``k`` or ``retention_k`` is not below the number of classes (every class would be in
    the top-k).
    """

    def __init__(
        self,
        config: VerifyConfig,
        vocabulary: ClassVocabulary,
        embedder: Embedder | None = None,
        device: str = "cpu",
        batch_size: int = 32,
        text_checked: Collection[str] = TEXT_CHECKED,
        kept_named: Collection[str] = KEPT_NAMED,
    ) -> None:
        from counterfactual.models.runtime import ModelRuntime

        runtime = ModelRuntime.of(device, None, batch_size, "verify batch_size")
        self.config = config
        self.text_rules = (tuple(text_checked), tuple(kept_named))
        self.vocabulary = vocabulary
        self.classes = vocabulary.classes
        n = len(self.classes)
        if max(config.k, config.retention_k) >= n:
            raise ValueError(
                f"verify k={config.k} and retention_k={config.retention_k} must be below the "
                f"number of vocabulary classes ({n})"
            )
        if embedder is None:
            from counterfactual.models import load_embedder

            embedder = load_embedder(
                config.model, device=runtime.device, batch_size=runtime.batch_size
            )
        self.embedder = embedder
        spec = getattr(embedder, "spec", None)
        self.model = str(spec) if spec is not None else config.model
        self.class_emb = np.asarray(
            embedder.embed_texts([config.template.format(c) for c in self.classes]), np.float32
        )
        self._column = {c: i for i, c in enumerate(self.classes)}

    def describe(self) -> dict[str, Any]:
        c = self.config
        return {"model": self.model, "k": c.k, "retention_k": c.retention_k, "mode": c.mode}

    def pixel_prep(self) -> Callable[[list[Image.Image]], np.ndarray] | None:
        """The embedder's CPU preprocessing, for :func:`prepare_verify` in a shard worker;
        ``None`` when the embedder has none (the actor then crops and preprocesses)."""
        get = getattr(self.embedder, "pixel_prep", None)
        return get() if callable(get) and hasattr(self.embedder, "embed_pixels") else None

    def __call__(self, requests: Sequence[VerifyRequest | PreparedVerify]) -> list[VerifyResult]:
        """One result per request, in order; a :class:`PreparedVerify` is embedded from its
        pixels (rescaled and normalised on the model's device). Raises :class:`SampleError`
        (``verify-unknown-class``) when a request names a class the vocabulary lacks, and
        ``ValueError`` for images that are not ``uint8`` ``HxWx3`` of one size."""
        c = self.config
        crops: list[Image.Image] = []
        prepared: list[np.ndarray] = []
        spans: list[tuple[bool, int, Mapping[str, int], Mapping[str, int]]] = []
        for r in requests:  # (prepared?, first row within its kind, removal, retention)
            for name in (*r.removed, *r.kept):
                if name not in self._column:
                    raise SampleError(UNKNOWN_CLASS, _unknown(name, self.classes))
            if isinstance(r, PreparedVerify):
                _check_prepared(r)
                spans.append((True, sum(len(p) for p in prepared), r.removal, r.retention))
                prepared.append(r.pixels)
                continue
            _check_images(r)
            cut, removal, retention = verify_crops(r, c)
            spans.append((False, len(crops), removal, retention))
            crops += cut
        rows = [self.embedder.embed_images(crops)] if crops else []
        if prepared:
            rows.append(self.embedder.embed_pixels(np.concatenate(prepared)))  # type: ignore[attr-defined]
        where = []
        for is_prepared, first, removal, retention in spans:
            offset = first + (len(crops) if is_prepared else 0)  # prepared rows come last
            where.append(
                (
                    {n: offset + i for n, i in removal.items()},
                    {n: offset + i for n, i in retention.items()},
                )
            )
        ranks = probs = np.empty((0, len(self.classes)))
        if rows:
            ranks, probs = zero_shot_ranks(np.concatenate(rows), self.class_emb)

        def score(row: int, name: str) -> ClassScore:
            col = self._column[name]
            return ClassScore(int(ranks[row, col]), float(probs[row, col]))

        out = []
        for r, (removal, retention) in zip(requests, where, strict=True):
            text = None
            if c.text_check:
                text = text_check(
                    self.vocabulary, r.caption, r.removed, r.kept, r.text_method, *self.text_rules
                )
            out.append(
                judge(
                    {n: (score(i, n), score(i + 1, n)) for n, i in removal.items()},
                    {n: score(i, n) for n, i in retention.items()},
                    text,
                    c.k,
                    c.retention_k,
                    self.model,
                )
            )
        return out


def verify_crops(
    request: VerifyRequest, config: VerifyConfig
) -> tuple[list[Image.Image], dict[str, int], dict[str, int]]:
    """The crops that score ``request`` and where each class's lie among them: per removed
    class with a box, its original crop then its edited crop (``removal[c]`` the first of the
    two); per kept class with a box, its edited crop (``retention[c]``)."""
    h, w = request.edited.shape[:2]
    crops: list[Image.Image] = []
    removal: dict[str, int] = {}
    for name in request.removed:
        boxes = request.removed_boxes.get(name, ())
        box = crop_box(boxes, w, h, config.crop_padding, config.min_box)
        if box is not None:
            removal[name] = len(crops)
            crops += [_crop(request.original, box), _crop(request.edited, box)]
    retention: dict[str, int] = {}
    for name in request.kept:
        box = crop_box(request.kept_boxes.get(name, ()), w, h, config.crop_padding, config.min_box)
        if box is not None:
            retention[name] = len(crops)
            crops.append(_crop(request.edited, box))
    return crops, removal, retention


def prepare_verify(
    request: VerifyRequest, config: VerifyConfig, prep: Callable[[list[Image.Image]], np.ndarray]
) -> PreparedVerify:
    """``request`` cropped (:func:`verify_crops`) and preprocessed by ``prep`` (the embedder's
    :meth:`~counterfactual.models.embed.HFClipEmbedder.pixel_prep`), where the pictures are.
    Raises ``ValueError`` for images that are not ``uint8`` ``HxWx3`` of one size."""
    _check_images(request)
    crops, removal, retention = verify_crops(request, config)
    return PreparedVerify(
        prep(crops),
        removal,
        retention,
        request.removed,
        request.kept,
        request.caption,
        request.text_method,
    )


def _check_prepared(r: PreparedVerify) -> None:
    rows = max([i + 2 for i in r.removal.values()] + [i + 1 for i in r.retention.values()] + [0])
    p = r.pixels
    if not isinstance(p, np.ndarray) or p.dtype != np.uint8 or p.ndim != 4 or len(p) < rows:
        raise ValueError(f"verify: prepared pixels must be uint8 (N, 3, H, W) with {rows} rows")


def _check_images(r: VerifyRequest) -> None:
    for name in ("original", "edited"):
        a = getattr(r, name)
        if not isinstance(a, np.ndarray) or a.dtype != np.uint8 or a.ndim != 3 or a.shape[2] != 3:
            raise ValueError(f"verify: {name} must be a uint8 HxWx3 array")
    if r.original.shape != r.edited.shape:
        raise ValueError(
            f"verify: original {r.original.shape} and edited {r.edited.shape} differ in size"
        )


def _records(checks: Any) -> list[Any]:
    """Per-class checks, by class (a dict) or as a list of records."""
    return list(checks.values()) if isinstance(checks, Mapping) else list(checks)


def _crop(image: np.ndarray, box: tuple[int, int, int, int]) -> Image.Image:
    x0, y0, x1, y1 = box
    return Image.fromarray(np.ascontiguousarray(image[y0:y1, x0:x1]))


@dataclass
class VerifySummary:
    """Counts over a run's samples for ``manifest.json``: written samples by verdict, samples
    dropped by ``filter`` by reason, and mean ranks of the removed classes."""

    checked: int = 0
    passed: int = 0
    failed: Counter[str] = field(default_factory=Counter)
    dropped: Counter[str] = field(default_factory=Counter)
    ranks_before: list[int] = field(default_factory=list)
    ranks_after: list[int] = field(default_factory=list)
    classes_removed: int = 0
    classes_kept: int = 0
    kept_checked: int = 0

    def add(self, verify: Mapping[str, Any]) -> None:
        """Count one sample's stored ``verify`` dict (:meth:`VerifyResult.to_dict`, or a sample
        json's, whose per-class checks are lists of records)."""
        self.checked += 1
        self.passed += bool(verify["passed"])
        self.failed.update(verify["failed"])
        for r in _records(verify["removal"]):
            self.ranks_before.append(int(r["rank_before"]))
            self.ranks_after.append(int(r["rank_after"]))
            self.classes_removed += bool(r["removed"])
        for r in _records(verify["retention"]):
            self.kept_checked += 1
            self.classes_kept += bool(r["kept"])

    def to_dict(self) -> dict[str, Any]:
        def mean(xs: list[int]) -> float | None:
            return round(sum(xs) / len(xs), 3) if xs else None

        return {
            "written_checked": self.checked,
            "written_passed": self.passed,
            "written_failed": dict(sorted(self.failed.items())),
            "dropped": dict(sorted(self.dropped.items())),
            "mean_rank_before": mean(self.ranks_before),
            "mean_rank_after": mean(self.ranks_after),
            "removed_classes": self.classes_removed,
            "removal_checked": len(self.ranks_after),
            "kept_classes": self.classes_kept,
            "retention_checked": self.kept_checked,
        }


class RemovalScorer:
    """Scores inpainting candidates for best-of-n sampling: for each candidate, the highest
    zero-shot probability of any removed class on the padded crop around the mask (lower is a
    cleaner removal). Uses a :class:`Verifier`'s model and class prompts."""

    def __init__(self, verifier: Verifier) -> None:
        self.verifier = verifier

    def describe(self) -> dict[str, Any]:
        return {"model": self.verifier.model, "score": "max removed-class probability on the mask"}

    def __call__(self, request: Any, candidates: Sequence[np.ndarray]) -> list[float]:
        """``request`` is an :class:`~counterfactual.image.EditRequest`; one score per candidate."""
        v = self.verifier
        for name in request.removed:
            if name not in v._column:
                raise SampleError(UNKNOWN_CLASS, _unknown(name, v.classes))
        ys, xs = np.nonzero(request.mask)
        if not len(xs) or not candidates:
            return [0.0] * len(candidates)
        h, w = request.mask.shape[:2]
        bbox = (
            float(xs.min()),
            float(ys.min()),
            float(xs.max() - xs.min() + 1),
            float(ys.max() - ys.min() + 1),
        )
        box = crop_box([bbox], w, h, v.config.crop_padding, v.config.min_box)
        if box is None:
            return [0.0] * len(candidates)
        _, probs = zero_shot_ranks(
            v.embedder.embed_images([_crop(c, box) for c in candidates]), v.class_emb
        )
        columns = [v._column[name] for name in request.removed]
        return [float(row[columns].max()) if columns else 0.0 for row in probs]
