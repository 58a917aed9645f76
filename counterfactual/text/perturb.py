"""Linguistic-structure perturbations of referring expressions (Akula et al., ACL 2020).

``shuffle`` puts the words in a random order, ``nouns_adj`` keeps only nouns, proper nouns and
adjectives (spaCy POS ``NOUN``, ``PROPN``, ``ADJ``), and ``in_batch_negatives`` builds the
contrastive negatives of section 5: for a positive ``(i, e, b)`` and another sample
``(i', e', b')`` of the same batch, ``(i', e, b')`` and ``(i, e', b)``.
``in_batch_negative_sets`` gives each positive several partners (all ``n - 1``, or a sampled
number, as Sum-H and Max-H need; the losses themselves are in :mod:`counterfactual.train.hinge`).

``read_jsonl`` and ``perturb_records`` are what ``counterfactual perturb`` runs.

As a synthesis text method (``--text-method shuffle|nouns-adj``, :class:`PerturbRewriter`) the
original caption is rewritten as a whole; no phrase is removed, so ``removed``, ``kept``,
``phrases`` and ``image`` of a request are ignored. ``shuffle`` draws its order from
``RewriteRequest.seed``, so a sample's text is reproducible from its ``sample_seed``;
``nouns-adj`` parses captions in batches with ``nlp.pipe``. A caption with nothing left (no
words, or no noun or adjective) gives ``text=None`` with reason ``empty-caption``.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from counterfactual.jsonl import JsonLine, json_objects
from counterfactual.models.runtime import check_batch_size
from counterfactual.text.base import RewriteRequest, RewriteResult, TextOptions

if TYPE_CHECKING:
    from spacy.language import Language

MODES = ("shuffle", "nouns-adj", "negatives")
KEPT_POS = frozenset({"NOUN", "PROPN", "ADJ"})


def shuffle(expression: str, seed: int) -> str:
    """The whitespace-separated words of ``expression`` in a random order drawn from ``seed``,
    joined by single spaces. Same ``expression`` and ``seed``, same result."""
    words = expression.split()
    random.Random(seed).shuffle(words)
    return " ".join(words)


def _keep_nouns_adj(doc: Any) -> str:
    return " ".join(token.text for token in doc if token.pos_ in KEPT_POS)


def nouns_adj(expression: str, nlp: Language) -> str:
    """Only the nouns, proper nouns and adjectives of ``expression`` (spaCy coarse POS), in
    their order, joined by single spaces; ``""`` when there are none."""
    return _keep_nouns_adj(nlp(expression))


def nouns_adj_many(expressions: Iterable[str], nlp: Language, batch_size: int = 256) -> list[str]:
    """:func:`nouns_adj` for many expressions through ``nlp.pipe``."""
    return [_keep_nouns_adj(doc) for doc in nlp.pipe(expressions, batch_size=batch_size)]


@dataclass(frozen=True, slots=True)
class GroundedSample:
    """An image, a referring expression and the box it refers to (``box`` as given, e.g. xyxy
    or xywh pixels; it is only carried along). ``image`` is a path, URL or id."""

    image: str | int
    expression: str
    box: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class ContrastiveNegatives:
    """The two negatives of positive ``anchor`` built with sample ``partner`` of its batch
    (indices into the batch): ``image_swapped`` = (image_partner, expression_anchor,
    box_partner) and ``expression_swapped`` = (image_anchor, expression_partner, box_anchor)."""

    anchor: int
    partner: int
    image_swapped: GroundedSample
    expression_swapped: GroundedSample


def in_batch_negatives(
    batch: Sequence[GroundedSample], seed: int
) -> tuple[ContrastiveNegatives, ...]:
    """One :class:`ContrastiveNegatives` per sample of ``batch``, in order, each with a partner
    ``j != i`` drawn uniformly, by a generator seeded with ``seed``, from the samples that are
    not the same object (same ``image`` and ``box``: another expression for the same object
    would make a "negative" that is really a positive)."""
    if len(batch) < 2:
        raise ValueError(f"in-batch negatives need a batch of 2 or more samples, got {len(batch)}")
    objects = [(sample.image, tuple(sample.box)) for sample in batch]
    copies = Counter(objects)
    rng = random.Random(seed)
    out = []
    for i, positive in enumerate(batch):
        if copies[objects[i]] == len(batch):
            raise ValueError(
                f"sample {i} of the batch has no partner: every other sample is the same "
                f"object (image {positive.image!r}, box {list(positive.box)})"
            )
        while True:  # uniform over the other objects' samples by rejection
            j = rng.randrange(len(batch) - 1)
            j += j >= i
            if objects[j] != objects[i]:
                break
        out.append(_negatives(i, j, batch))
    return tuple(out)


def _negatives(anchor: int, partner: int, batch: Sequence[GroundedSample]) -> ContrastiveNegatives:
    positive, other = batch[anchor], batch[partner]
    return ContrastiveNegatives(
        anchor=anchor,
        partner=partner,
        image_swapped=GroundedSample(other.image, positive.expression, other.box),
        expression_swapped=GroundedSample(positive.image, other.expression, positive.box),
    )


def in_batch_negative_sets(
    batch: Sequence[GroundedSample], seed: int, count: int | None = None
) -> tuple[tuple[ContrastiveNegatives, ...], ...]:
    """For each sample of ``batch``, in order, its negatives with ``count`` partners drawn
    without replacement, uniformly, by a generator seeded with ``seed``, from the samples that
    are not the same object (as in :func:`in_batch_negatives`), in batch order; all of them
    when ``count`` is ``None`` or there are no more (Sum-H over all ``n - 1``; seed 003's
    appendix samples 64 of a batch of 512)."""
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise ValueError(f"count must be a whole number >= 1 or None, got {count!r}")
    if len(batch) < 2:
        raise ValueError(f"in-batch negatives need a batch of 2 or more samples, got {len(batch)}")
    objects = [(sample.image, tuple(sample.box)) for sample in batch]
    rng = random.Random(seed)
    out = []
    for i, positive in enumerate(batch):
        others = [j for j in range(len(batch)) if objects[j] != objects[i]]
        if not others:
            raise ValueError(
                f"sample {i} of the batch has no partner: every other sample is the same "
                f"object (image {positive.image!r}, box {list(positive.box)})"
            )
        if count is not None and count < len(others):
            others = sorted(rng.sample(others, count))
        out.append(tuple(_negatives(i, j, batch) for j in others))
    return tuple(out)


def record_seed(seed: int, index: int) -> int:
    """The seed for item ``index`` of a run seeded with ``seed``, so items of equal length do
    not all get the same permutation; stable across processes and platforms."""
    return random.Random(f"{seed}:{index}").getrandbits(63)


# --- JSON Lines records ---------------------------------------------------------------------


REQUIRED_FIELDS = {
    "shuffle": ("expression",),
    "nouns-adj": ("expression",),
    "negatives": ("image", "expression", "box"),
}


def read_jsonl(path: str | Path, required: Sequence[str] = ("expression",)) -> list[JsonLine]:
    """The JSON objects of a UTF-8 JSON Lines file, one per non-blank line. Malformed JSON, a
    line that is not an object, or an object without a ``required`` field is a ``ValueError``
    naming the file and line."""
    records = []
    for item in json_objects(path):
        absent = [name for name in required if name not in item.value]
        if absent:
            raise ValueError(f"{item.where}: missing field(s) {', '.join(absent)}")
        records.append(item)
    return records


def _expression(record: JsonLine) -> str:
    value = record.value["expression"]
    if not isinstance(value, str):
        raise ValueError(f"{record.where}: 'expression' must be a string, got {value!r}")
    return value


def _sample(record: JsonLine) -> GroundedSample:
    image = record.value["image"]
    if isinstance(image, bool) or not isinstance(image, str | int):
        raise ValueError(f"{record.where}: 'image' must be a string or an integer, got {image!r}")
    box = record.value["box"]
    if (
        not isinstance(box, list)
        or len(box) != 4
        or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in box)
    ):
        raise ValueError(f"{record.where}: 'box' must be a list of 4 numbers, got {box!r}")
    return GroundedSample(image=image, expression=_expression(record), box=tuple(box))


def _batches(count: int, batch_size: int) -> list[range]:
    """Consecutive index ranges of ``batch_size`` (0 = one batch); a last batch of one joins
    the batch before it, since a lone sample has no partner."""
    if batch_size == 0 or batch_size >= count:
        return [range(count)]
    starts = list(range(0, count, batch_size))
    if count - starts[-1] == 1:
        starts.pop()
    ends = starts[1:] + [count]
    return [range(s, e) for s, e in zip(starts, ends, strict=True)]


def _sample_dict(sample: GroundedSample) -> dict[str, Any]:
    return {"image": sample.image, "expression": sample.expression, "box": list(sample.box)}


def perturb_records(
    records: Sequence[JsonLine],
    mode: str,
    *,
    seed: int = 0,
    nlp: Language | None = None,
    batch_size: int = 0,
    negatives: int | None = 1,
) -> list[dict[str, Any]]:
    """The records' objects with the perturbed field(s) of ``mode`` added, in order:

    - ``shuffle``: ``expression_shuffled``, from seed ``record_seed(seed, index)``;
    - ``nouns-adj``: ``expression_nouns_adj`` (needs ``nlp``);
    - ``negatives``: ``negative_partner`` (0-based index of the partner record),
      ``negative_image_swapped`` and ``negative_expression_swapped`` (each an object with
      ``image``, ``expression``, ``box``). Partners come from the same batch of ``batch_size``
      consecutive records (0 = all records form one batch). With ``negatives`` other than 1
      (``None``: every partner of the batch; else that many, drawn), the lists
      ``negative_partners``, ``negatives_image_swapped`` and ``negatives_expression_swapped``
      instead, in partner order.
    """
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not one of {MODES}")
    if batch_size < 0 or batch_size == 1:
        raise ValueError(f"batch_size must be 0 (one batch) or >= 2, got {batch_size}")
    if negatives is not None and (
        isinstance(negatives, bool) or not isinstance(negatives, int) or negatives < 1
    ):
        raise ValueError(f"negatives must be a whole number >= 1 or None, got {negatives!r}")
    out = [dict(record.value) for record in records]
    if mode == "shuffle":
        for index, record in enumerate(records):
            out[index]["expression_shuffled"] = shuffle(
                _expression(record), record_seed(seed, index)
            )
    elif mode == "nouns-adj":
        if nlp is None:
            raise ValueError("mode 'nouns-adj' needs a spaCy pipeline (nlp)")
        expressions = [_expression(record) for record in records]
        for fields, kept in zip(out, nouns_adj_many(expressions, nlp), strict=True):
            fields["expression_nouns_adj"] = kept
    else:
        samples = [_sample(record) for record in records]
        if len(samples) < 2:
            raise ValueError(f"negatives need 2 or more records, got {len(samples)}")
        for number, indices in enumerate(_batches(len(samples), batch_size)):
            batch = [samples[i] for i in indices]
            try:
                if negatives == 1:
                    sets = tuple((n,) for n in in_batch_negatives(batch, record_seed(seed, number)))
                else:
                    sets = in_batch_negative_sets(batch, record_seed(seed, number), negatives)
            except ValueError as err:
                first, last = records[indices[0]], records[indices[-1]]
                raise ValueError(
                    f"{first.path} lines {first.line}-{last.line} (one batch): {err}"
                ) from None
            for anchor, found in enumerate(sets):
                _add_negatives(out[indices[anchor]], found, indices, plural=negatives != 1)
    return out


def _add_negatives(
    fields: dict[str, Any],
    found: Sequence[ContrastiveNegatives],
    indices: range,
    plural: bool,
) -> None:
    if not plural:
        (one,) = found
        fields["negative_partner"] = indices[one.partner]
        fields["negative_image_swapped"] = _sample_dict(one.image_swapped)
        fields["negative_expression_swapped"] = _sample_dict(one.expression_swapped)
        return
    fields["negative_partners"] = [indices[n.partner] for n in found]
    fields["negatives_image_swapped"] = [_sample_dict(n.image_swapped) for n in found]
    fields["negatives_expression_swapped"] = [_sample_dict(n.expression_swapped) for n in found]


# ---------------------------------------------------------------- the synthesis text method

PERTURB_METHODS = ("shuffle", "nouns-adj")
EMPTY_CAPTION = "empty-caption"


def _result(text: str) -> RewriteResult:
    if not text.strip():
        return RewriteResult(text=None, reason=EMPTY_CAPTION)
    return RewriteResult(text=text)


class PerturbRewriter:
    """Rewriter for ``config.method`` in :data:`PERTURB_METHODS`; ``nouns-adj`` loads the spaCy
    pipeline ``config.spacy_model`` (default: ``en_core_web_sm`` if installed) once and parses
    ``batch_size`` captions at a time."""

    def __init__(self, config: TextOptions, batch_size: int = 256) -> None:
        if config.method not in PERTURB_METHODS:
            raise ValueError(f"text method {config.method!r} is not one of {PERTURB_METHODS}")
        self.config = config
        self.batch_size = check_batch_size(batch_size)
        self.method = config.method
        self.model_name: str | None = None
        self.nlp: Any = None
        if self.method == "nouns-adj":
            from counterfactual.text.nlp import default_model_name, load_spacy

            self.model_name = config.spacy_model or default_model_name()
            self.nlp = load_spacy(self.model_name)

    def describe(self) -> dict[str, Any]:
        if self.method == "shuffle":
            return {"method": "shuffle", "seeded_by": "sample_seed"}
        return {"method": "nouns-adj", "spacy_model": self.model_name}

    def __call__(self, batch: Sequence[RewriteRequest]) -> list[RewriteResult]:
        if self.method == "shuffle":
            return [_result(shuffle(req.caption, req.seed)) for req in batch]
        captions = [req.caption for req in batch]
        distinct = list(dict.fromkeys(captions))  # a caption often serves several plans
        kept = dict(
            zip(
                distinct,
                nouns_adj_many(distinct, self.nlp, batch_size=self.batch_size),
                strict=True,
            )
        )
        return [_result(kept[caption]) for caption in captions]
