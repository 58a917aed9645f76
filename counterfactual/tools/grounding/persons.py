"""Person-centric grounding with masked names (Luo et al., 2022, debiasing *Who's Waldo*):
caption-context filters and the heuristic baselines of their Table 2.

Input: JSON Lines, one sample per non-blank line::

    {"id": "000123",
     "caption": "[NAME] shakes hands with [NAME] as [NAME] watches",
     "names": [0, 1, 0],
     "boxes": [[10, 20, 50, 120], [200, 30, 40, 100]],
     "truth": {"0": 1, "1": 0}}

* ``id``: string or integer, unique in the file.
* ``caption``: text where every masked name is the literal token ``[NAME]``.
* ``names``: the person id (integer >= 0) of each ``[NAME]`` occurrence, in caption order;
  one entry per occurrence. Occurrences with the same id refer to the same person
  (coreference), as *Who's Waldo* clusters them. Persons are ordered by first mention.
* ``boxes``: the person detections of the image, ``xywh`` pixels (top-left x, top-left y,
  width, height), indexed from 0. Their number need not equal the number of persons.
* ``truth``: the ground truth, person id (JSON object key, so a string of digits) -> box
  index. Persons without a true box are left out; no two persons share a box.

Other fields are carried along unchanged. Malformed lines raise ``ValueError`` naming the file
and line.

Filters (paper section 3.4): every masked name is replaced by a common first name, one per
person (same person -> same name, distinct persons -> distinct names), the caption is parsed
with spaCy, and the sample is dropped when (a) no token is a verb in any form (coarse POS
``VERB`` or ``AUX`` by default), or (b) some name is joined by ``conj`` to names of two or more
other persons (three or more conjunct referred names).

Heuristics (Table 2): the persons, in caption order of first mention, are assigned one-to-one
to the boxes in the order of the heuristic: Random (seeded permutation), Big->Small
(decreasing area), L->R (All) (increasing upper-left x over all boxes) and L->R (Largest)
(increasing upper-left x over the ``d`` largest boxes). Accuracy is the fraction of true
person-box pairs the assignment gets right, over all samples (as *Who's Waldo* scores it).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

import numpy as np

from counterfactual.jsonl import json_objects
from counterfactual.models.runtime import check_batch_size
from counterfactual.options import declare

NAME_TOKEN = "[NAME]"

FIRST_NAMES = (
    "James", "Mary", "John", "Linda", "Michael", "Jennifer", "David", "Susan", "Robert",
    "Sarah", "Thomas", "Karen", "Daniel", "Nancy", "Paul", "Lisa", "George", "Laura", "Kevin",
    "Emily", "Brian", "Helen", "Steven", "Anna", "Edward", "Donna", "Jason", "Carol", "Jeffrey",
    "Sandra", "Ryan", "Ruth", "Gary", "Sharon", "Eric", "Emma", "Peter", "Julia", "Andrew",
    "Rachel",
)  # fmt: skip
"""Common English first names that spaCy's English pipelines tag as proper nouns."""


# --------------------------------------------------------------------------- samples


@dataclass(frozen=True, slots=True)
class PersonBox:
    """A person detection, ``xywh`` pixels."""

    x: float
    y: float
    w: float
    h: float

    @property
    def area(self) -> float:
        return self.w * self.h


@dataclass(frozen=True, slots=True)
class PersonSample:
    """One caption with masked names, the detections and the true person -> box links.

    ``names[i]`` is the person id of the ``i``-th ``[NAME]`` in ``caption``; ``truth`` maps a
    person id to a box index. ``raw`` is the JSON object the sample was read from.
    """

    sample_id: str
    caption: str
    names: tuple[int, ...]
    boxes: tuple[PersonBox, ...]
    truth: Mapping[int, int]
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def persons(self) -> tuple[int, ...]:
        """Distinct person ids in caption order of first mention."""
        return tuple(dict.fromkeys(self.names))


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} must be an integer >= 0, got {value!r}")
    return value


def _key(value: str, what: str) -> int:
    if not (isinstance(value, str) and value.isdigit()):
        raise ValueError(f"{what} key must be a person id (digits), got {value!r}")
    return int(value)


def _box(value: Any, index: int) -> PersonBox:
    if (
        not isinstance(value, list)
        or len(value) != 4
        or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
        or not all(math.isfinite(v) for v in value)
    ):
        raise ValueError(f"'boxes'[{index}] must be 4 finite numbers [x, y, w, h], got {value!r}")
    if value[2] < 0 or value[3] < 0:
        raise ValueError(f"'boxes'[{index}] has a negative width or height: {value!r}")
    return PersonBox(*(float(v) for v in value))


def _sample_id(obj: Mapping[str, Any]) -> str:
    if "id" not in obj:
        raise ValueError("missing field 'id'")
    value = obj["id"]
    if isinstance(value, bool) or not isinstance(value, str | int) or value == "":
        raise ValueError(f"'id' must be a non-empty string or an integer, got {value!r}")
    return str(value)


def _assignment(
    value: Any, what: str, persons: set[int] | None, n_boxes: int | None
) -> dict[int, int]:
    if not isinstance(value, dict):
        raise ValueError(f"{what!r} must be an object person id -> box index, got {value!r}")
    out: dict[int, int] = {}
    for key, box in value.items():
        person = _key(key, repr(what))
        if persons is not None and person not in persons:
            raise ValueError(f"{what!r} names person {person}, who is not in 'names'")
        index = _int(box, f"{what!r}[{key!r}]")
        if n_boxes is not None and index >= n_boxes:
            raise ValueError(f"{what!r}[{key!r}] = {index} but there are {n_boxes} boxes")
        out[person] = index
    duplicates = sorted(b for b, n in Counter(out.values()).items() if n > 1)
    if duplicates:
        raise ValueError(f"{what!r} links two persons to the same box {duplicates[0]}")
    return out


def parse_sample(obj: Mapping[str, Any]) -> PersonSample:
    """The :class:`PersonSample` for one JSON object (see the module docstring)."""
    sample_id = _sample_id(obj)
    for name in ("caption", "names", "boxes", "truth"):
        if name not in obj:
            raise ValueError(f"missing field {name!r}")
    caption = obj["caption"]
    if not isinstance(caption, str):
        raise ValueError(f"'caption' must be a string, got {caption!r}")
    names = obj["names"]
    if not isinstance(names, list):
        raise ValueError(f"'names' must be a list of person ids, got {names!r}")
    names_t = tuple(_int(n, f"'names'[{i}]") for i, n in enumerate(names))
    n_masks = caption.count(NAME_TOKEN)
    if n_masks != len(names_t):
        raise ValueError(
            f"'caption' has {n_masks} {NAME_TOKEN} but 'names' has {len(names_t)} entries"
        )
    boxes = obj["boxes"]
    if not isinstance(boxes, list):
        raise ValueError(f"'boxes' must be a list of [x, y, w, h], got {boxes!r}")
    boxes_t = tuple(_box(b, i) for i, b in enumerate(boxes))
    truth = _assignment(obj["truth"], "truth", set(names_t), len(boxes_t))
    return PersonSample(sample_id, caption, names_t, boxes_t, truth, raw=obj)


def read_samples(path: str | Path) -> list[PersonSample]:
    """All samples of a JSON Lines file; a malformed line or a repeated ``id`` is a
    ``ValueError`` naming the file and line."""
    samples: list[PersonSample] = []
    seen: set[str] = set()
    for item in json_objects(path):
        where, obj = item.where, item.value
        try:
            sample = parse_sample(obj)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
        if sample.sample_id in seen:
            raise ValueError(f"{where}: repeated id {sample.sample_id!r}")
        seen.add(sample.sample_id)
        samples.append(sample)
    return samples


def read_predictions(path: str | Path) -> dict[str, dict[int, int]]:
    """Predicted links from JSON Lines ``{"id": ..., "pred": {"<person id>": box index}}``.

    Persons left out of ``pred`` get no box. Errors name the file and line.
    """
    out: dict[str, dict[int, int]] = {}
    for item in json_objects(path):
        where, obj = item.where, item.value
        try:
            sample_id = _sample_id(obj)
            if "pred" not in obj:
                raise ValueError("missing field 'pred'")
            pred = _assignment(obj["pred"], "pred", None, None)
        except ValueError as err:
            raise ValueError(f"{where}: {err}") from None
        if sample_id in out:
            raise ValueError(f"{where}: repeated id {sample_id!r}")
        out[sample_id] = pred
    return out


# --------------------------------------------------------------------------- filters


class DropReason(StrEnum):
    NO_VERB = "no_verb"
    """No token of the caption is a verb in any form."""
    CONJUNCT_NAMES = "conjunct_names"
    """A name is joined by ``conj`` to the names of two or more other persons."""
    TOO_MANY_PERSONS = "too_many_persons"
    """More distinct persons than first names to stand in for them; not parsed."""


@dataclass(frozen=True, slots=True)
class FilterConfig:
    """``first_names`` stand in for persons in order of first mention. A token is a verb when
    its coarse POS is in ``verb_pos`` (``{"VERB"}`` demands a lexical verb; the default also
    counts auxiliaries and copulas, the paper's "verbs in any form of conjugation"). A sample
    is dropped when a name is joined by ``conj`` to names of ``max_conjunct_persons`` or more
    persons in all (the name's own included)."""

    first_names: tuple[str, ...] = FIRST_NAMES
    verb_pos: frozenset[str] = frozenset({"VERB", "AUX"})
    max_conjunct_persons: int = 3
    batch_size: int = declare(
        256,
        help="captions per spaCy batch (default: %(default)s)",
        kind="positive_int",
        metavar="N",
    )

    def __post_init__(self) -> None:
        if not self.first_names or len(set(self.first_names)) != len(self.first_names):
            raise ValueError(f"first_names must be distinct and non-empty: {self.first_names!r}")
        bad = [n for n in self.first_names if not n.isalpha()]
        if bad:
            raise ValueError(f"first_names must be single words of letters, got {bad[0]!r}")
        if not self.verb_pos:
            raise ValueError("verb_pos must name at least one POS tag")
        if self.max_conjunct_persons < 2:
            raise ValueError(f"max_conjunct_persons must be >= 2, got {self.max_conjunct_persons}")
        check_batch_size(self.batch_size)


@dataclass(frozen=True, slots=True)
class NamedCaption:
    """A caption with its masks replaced; ``spans[i]`` is the ``(start, end)`` character span
    of the ``i``-th name in ``text`` and ``persons[i]`` its person id."""

    text: str
    spans: tuple[tuple[int, int], ...]
    persons: tuple[int, ...]


def substitute_names(
    caption: str, names: Sequence[int], first_names: Sequence[str] = FIRST_NAMES
) -> NamedCaption:
    """Replace each ``[NAME]`` by the first name of its person: the ``k``-th person to be
    mentioned gets ``first_names[k]``. ``ValueError`` when there are more persons than names or
    the count of masks differs from ``len(names)``."""
    order = {person: k for k, person in enumerate(dict.fromkeys(names))}
    if len(order) > len(first_names):
        raise ValueError(f"{len(order)} persons but only {len(first_names)} first names")
    pieces = caption.split(NAME_TOKEN)
    if len(pieces) - 1 != len(names):
        raise ValueError(f"caption has {len(pieces) - 1} {NAME_TOKEN} but {len(names)} names")
    text = pieces[0]
    spans = []
    for person, piece in zip(names, pieces[1:], strict=True):
        name = first_names[order[person]]
        spans.append((len(text), len(text) + len(name)))
        text += name + piece
    return NamedCaption(text=text, spans=tuple(spans), persons=tuple(names))


@dataclass(frozen=True, slots=True)
class FilterDecision:
    """Whether a sample is kept and, if not, every reason it was dropped.

    ``text`` is the caption with names substituted (``None`` when it was not parsed);
    ``verbs`` the tokens counted as verbs; ``conjunct_persons`` the largest number of distinct
    persons in one ``conj`` group of names.
    """

    sample_id: str
    kept: bool
    reasons: tuple[DropReason, ...]
    text: str | None = None
    verbs: tuple[str, ...] = ()
    conjunct_persons: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.sample_id,
            "kept": self.kept,
            "reasons": [str(r) for r in self.reasons],
            "text": self.text,
            "verbs": list(self.verbs),
            "conjunct_persons": self.conjunct_persons,
        }


@dataclass(frozen=True, slots=True)
class FilterSummary:
    """Counts over a run. ``reasons`` counts each reason once per sample it dropped; a sample
    dropped for two reasons counts under both, so the reasons may add up to more than
    ``dropped``."""

    total: int
    kept: int
    dropped: int
    reasons: Mapping[str, int]

    def as_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "kept": self.kept,
            "dropped": self.dropped,
            "reasons": dict(self.reasons),
        }


def summarize(decisions: Iterable[FilterDecision]) -> FilterSummary:
    decisions = list(decisions)
    counts = {str(reason): 0 for reason in DropReason}
    for decision in decisions:
        for reason in decision.reasons:
            counts[str(reason)] += 1
    kept = sum(d.kept for d in decisions)
    return FilterSummary(len(decisions), kept, len(decisions) - kept, counts)


def _conjunct_persons(doc: Any, named: NamedCaption) -> int:
    """Largest number of distinct persons among a name token and its ``conj`` conjuncts."""
    person_of: dict[int, int] = {}
    for (start, end), person in zip(named.spans, named.persons, strict=True):
        span = doc.char_span(start, end, alignment_mode="expand")
        if span is not None:
            for token in span:
                person_of[token.i] = person
    best = 0
    for index, person in person_of.items():
        group = {person} | {person_of[t.i] for t in doc[index].conjuncts if t.i in person_of}
        best = max(best, len(group))
    return best


class CaptionFilter:
    """The two caption-context filters with one spaCy pipeline, loaded once.

    ``nlp`` is a spaCy ``Language`` with a tagger and a dependency parser (e.g. from
    :func:`counterfactual.text.nlp.load_spacy`). Call with a batch of samples.
    """

    def __init__(self, nlp: Any, config: FilterConfig | None = None) -> None:
        self.config = config or FilterConfig()
        if "parser" not in nlp.pipe_names:
            raise ValueError(f"the spaCy pipeline has no dependency parser: {nlp.pipe_names}")
        self.nlp = nlp

    def __call__(self, samples: Sequence[PersonSample]) -> list[FilterDecision]:
        config = self.config
        decisions: list[FilterDecision | None] = [None] * len(samples)
        named: list[tuple[int, NamedCaption]] = []
        for i, sample in enumerate(samples):
            if len(set(sample.names)) > len(config.first_names):
                skip = (DropReason.TOO_MANY_PERSONS,)
                decisions[i] = FilterDecision(sample.sample_id, False, skip)
            else:
                named.append(
                    (i, substitute_names(sample.caption, sample.names, config.first_names))
                )
        docs = self.nlp.pipe([n.text for _, n in named], batch_size=config.batch_size)
        for (i, name_caption), doc in zip(named, docs, strict=True):
            verbs = tuple(t.text for t in doc if t.pos_ in config.verb_pos)
            conjunct = _conjunct_persons(doc, name_caption)
            reasons: list[DropReason] = []
            if not verbs:
                reasons.append(DropReason.NO_VERB)
            if conjunct >= config.max_conjunct_persons:
                reasons.append(DropReason.CONJUNCT_NAMES)
            decisions[i] = FilterDecision(
                samples[i].sample_id,
                kept=not reasons,
                reasons=tuple(reasons),
                text=name_caption.text,
                verbs=verbs,
                conjunct_persons=conjunct,
            )
        return [d for d in decisions if d is not None]


# --------------------------------------------------------------------------- heuristics


class Heuristic(StrEnum):
    RANDOM = "random"
    BIG_TO_SMALL = "big_to_small"
    LR_ALL = "lr_all"
    LR_LARGEST = "lr_largest"

    @property
    def label(self) -> str:
        return _LABELS[self]


_LABELS = {
    Heuristic.RANDOM: "Random",
    Heuristic.BIG_TO_SMALL: "Big->Small",
    Heuristic.LR_ALL: "L->R (All)",
    Heuristic.LR_LARGEST: "L->R (Largest)",
}


def box_order(
    boxes: Sequence[PersonBox],
    heuristic: Heuristic,
    n_persons: int,
    rng: np.random.Generator | None = None,
) -> tuple[int, ...]:
    """Box indices in the order the heuristic hands them to persons; ties keep input order.

    * ``RANDOM``: a permutation drawn from ``rng`` (required).
    * ``BIG_TO_SMALL``: decreasing area ``w * h``.
    * ``LR_ALL``: increasing upper-left ``x`` over all boxes.
    * ``LR_LARGEST``: the ``d = min(#boxes, #persons)`` largest boxes by increasing upper-left
      ``x``. The paper writes "the larger" of the two counts, but the ``max(#boxes, #names)``
      largest boxes are always all the boxes, which would make this L->R (All) again, while its
      Table 2 reports different accuracies for the two (38.4 vs 57.7); with one box per person
      to hand out, the boxes used are the ``#persons`` largest ones (all, if fewer).
    """
    indices = range(len(boxes))
    if heuristic is Heuristic.RANDOM:
        if rng is None:
            raise ValueError("the random heuristic needs an rng")
        return tuple(int(i) for i in rng.permutation(len(boxes)))
    if heuristic is Heuristic.BIG_TO_SMALL:
        return tuple(sorted(indices, key=lambda i: -boxes[i].area))
    if heuristic is Heuristic.LR_ALL:
        return tuple(sorted(indices, key=lambda i: boxes[i].x))
    if heuristic is Heuristic.LR_LARGEST:
        d = min(len(boxes), n_persons)
        largest = sorted(indices, key=lambda i: -boxes[i].area)[:d]
        return tuple(sorted(largest, key=lambda i: boxes[i].x))
    raise ValueError(f"unknown heuristic {heuristic!r}")


def assign(
    sample: PersonSample, heuristic: Heuristic, rng: np.random.Generator | None = None
) -> dict[int, int]:
    """Person id -> box index: the persons, by first mention, take the boxes in
    :func:`box_order`; persons past the last box get none."""
    persons = sample.persons
    order = box_order(sample.boxes, heuristic, len(persons), rng)
    return dict(zip(persons, order, strict=False))


def count_correct(assignment: Mapping[int, int], truth: Mapping[int, int]) -> int:
    """How many true person -> box links the assignment reproduces."""
    return sum(assignment.get(person) == box for person, box in truth.items())


def expected_random_correct(sample: PersonSample) -> float:
    """Expected :func:`count_correct` of ``RANDOM``: ``1 / #boxes`` for each true link whose
    person is among the first ``#boxes`` persons mentioned, 0 otherwise."""
    n_boxes = len(sample.boxes)
    if n_boxes == 0:
        return 0.0
    rank = {person: k for k, person in enumerate(sample.persons)}
    return sum(1.0 / n_boxes for person in sample.truth if rank[person] < n_boxes)


@dataclass(frozen=True, slots=True)
class MethodScore:
    """One row of Table 2. ``accuracy`` is ``correct / total`` (0..1; 0 when there are no true
    links); the gains are differences of accuracies: ``gain_over_random`` (Δr) against the
    Random row, ``gain_over_best_heuristic`` (Δh) against the best non-random heuristic,
    ``None`` for the Random row and the heuristics other than the best, as the paper prints."""

    method: str
    label: str
    correct: int
    total: int
    accuracy: float
    gain_over_random: float
    gain_over_best_heuristic: float | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "label": self.label,
            "correct": self.correct,
            "total": self.total,
            "accuracy": self.accuracy,
            "gain_over_random": self.gain_over_random,
            "gain_over_best_heuristic": self.gain_over_best_heuristic,
        }


@dataclass(frozen=True, slots=True)
class HeuristicReport:
    """Rows for the four heuristics and, when given, the predictions; ``expected_random`` is
    the exact expectation of the Random row's accuracy (what *Who's Waldo* reports as random
    guessing); ``missing_predictions`` counts samples the predictions leave out (scored as
    wrong)."""

    rows: tuple[MethodScore, ...]
    samples: int
    links: int
    seed: int
    expected_random: float
    best_heuristic: str
    missing_predictions: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "samples": self.samples,
            "links": self.links,
            "seed": self.seed,
            "expected_random": self.expected_random,
            "best_heuristic": self.best_heuristic,
            "missing_predictions": self.missing_predictions,
            "rows": [row.as_dict() for row in self.rows],
        }

    def table(self) -> str:
        """Plain-text table: accuracy, Δr and Δh in percent (points)."""
        lines = [f"{'Method':<16} {'Acc %':>7} {'Δr':>7} {'Δh':>7} {'correct/total':>14}"]
        for row in self.rows:
            dh_value = row.gain_over_best_heuristic
            dh = "–" if dh_value is None else f"{100 * dh_value:+.1f}"
            lines.append(
                f"{row.label:<16} {100 * row.accuracy:>7.1f} {100 * row.gain_over_random:>+7.1f} "
                f"{dh:>7} {f'{row.correct}/{row.total}':>14}"
            )
        lines.append(f"expected random accuracy: {100 * self.expected_random:.1f}%")
        return "\n".join(lines)


def _accuracy(correct: int, total: int) -> float:
    return correct / total if total else 0.0


def evaluate_heuristics(
    samples: Sequence[PersonSample],
    seed: int = 0,
    predictions: Mapping[str, Mapping[int, int]] | None = None,
    prediction_label: str = "predictions",
) -> HeuristicReport:
    """Score the four heuristics (and ``predictions``, sample id -> person -> box) on
    ``samples``. The Random row draws one permutation per sample, in order, from
    ``numpy.random.default_rng(seed)``."""
    rng = np.random.default_rng(seed)
    correct = dict.fromkeys(Heuristic, 0)
    total = sum(len(s.truth) for s in samples)
    expected = 0.0
    for sample in samples:
        for heuristic in Heuristic:
            chosen = assign(sample, heuristic, rng if heuristic is Heuristic.RANDOM else None)
            correct[heuristic] += count_correct(chosen, sample.truth)
        expected += expected_random_correct(sample)
    accuracy = {h: _accuracy(c, total) for h, c in correct.items()}
    random_acc = accuracy[Heuristic.RANDOM]
    heuristics = [h for h in Heuristic if h is not Heuristic.RANDOM]
    best = max(heuristics, key=lambda h: accuracy[h])  # first in table order on ties
    rows = [
        MethodScore(
            str(h),
            h.label,
            correct[h],
            total,
            accuracy[h],
            accuracy[h] - random_acc,
            0.0 if h is best else None,
        )
        for h in Heuristic
    ]
    missing = 0
    if predictions is not None:
        hits = 0
        for sample in samples:
            if sample.sample_id in predictions:
                hits += count_correct(predictions[sample.sample_id], sample.truth)
            else:
                missing += 1
        acc = _accuracy(hits, total)
        rows.append(
            MethodScore(
                "predictions",
                prediction_label,
                hits,
                total,
                acc,
                acc - random_acc,
                acc - accuracy[best],
            )
        )
    return HeuristicReport(
        rows=tuple(rows),
        samples=len(samples),
        links=total,
        seed=seed,
        expected_random=expected / total if total else 0.0,
        best_heuristic=str(best),
        missing_predictions=missing,
    )
