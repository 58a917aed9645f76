"""Captions of a scene from varied templates: every class present is named once, with its
count ("two frisbees"), sometimes an attribute (its colour, or "small"/"big" for its size
within its class's range), in a list, a relation ("a dog to the left of a frisbee") or a
sentence about the place (the background); or, :func:`sentence`, sentences where each class is
the subject or object of a verb ("A brown dog sits to the left of two frisbees on the grass.")."""

from __future__ import annotations

import numpy as np

from counterfactual.world.classes import ObjectClass
from counterfactual.world.scene import Scene, SceneObject

PLACES = {
    "grass": ("on the grass", "in a field", "on a lawn"),
    "sand": ("on the sand", "at the beach", "on a sandy ground"),
    "sky": ("against the sky", "in the air", "under a blue sky"),
    "floor": ("on a tiled floor", "in a room", "on the floor"),
    "wall": ("by a wall", "in front of a wall", "indoors"),
}
_NUMBERS = {1: "a", 2: "two", 3: "three", 4: "four"}


def phrase(
    cls: ObjectClass, objects: list[SceneObject], rng: np.random.Generator, size: int
) -> str:
    """``a brown dog``, ``two frisbees``, ``a small cup``: a noun phrase for one class."""
    count = len(objects)
    noun = cls.name if count == 1 else cls.plural
    roll = rng.random()
    if roll < 0.3:
        adjective = cls.color_word
    elif roll < 0.5:
        side = np.mean([max(o.w, o.h) for o in objects])
        low, high = cls.size
        adjective = "small" if side < (low + high) / 2 * size else "big"
    else:
        adjective = ""
    number = _NUMBERS.get(count, str(count))
    if number == "a" and (adjective or noun)[0] in "aeiou":
        number = "an"
    return " ".join(w for w in (number, adjective, noun) if w)


def relation(a: list[SceneObject], b: list[SceneObject]) -> str:
    """Where the first group lies relative to the second, from their mean centres."""
    ax = np.mean([o.x + o.w / 2 for o in a])
    ay = np.mean([o.y + o.h / 2 for o in a])
    bx = np.mean([o.x + o.w / 2 for o in b])
    by = np.mean([o.y + o.h / 2 for o in b])
    dx, dy = ax - bx, ay - by
    if abs(dx) < 4 and abs(dy) < 4:
        return "next to"
    if abs(dx) >= abs(dy):
        return "to the left of" if dx < 0 else "to the right of"
    return "above" if dy < 0 else "below"


def _join(items: list[str]) -> str:
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " and " + items[-1]


def _phrases(
    scene: Scene, classes: dict[str, ObjectClass], rng: np.random.Generator
) -> tuple[dict[str, list[SceneObject]], list[str], list[str]]:
    """The scene's objects by class, the classes in a drawn order, and each class's noun
    phrase (:func:`phrase`) in that order: what :func:`caption` and :func:`sentence` name."""
    groups: dict[str, list[SceneObject]] = {}
    for obj in scene.objects:
        groups.setdefault(obj.cls, []).append(obj)
    names = list(groups)
    order = [names[i] for i in rng.permutation(len(names))]
    return groups, order, [phrase(classes[n], groups[n], rng, scene.size) for n in order]


def caption(scene: Scene, classes: dict[str, ObjectClass], rng: np.random.Generator) -> str:
    """One caption naming every class in ``scene`` once."""
    groups, order, phrases = _phrases(scene, classes, rng)
    place = str(rng.choice(PLACES[scene.background]))
    template = int(rng.integers(6 if len(order) > 1 else 4))
    if template == 0:
        text = f"{_join(phrases)} {place}"
    elif template == 1:
        text = f"a picture of {_join(phrases)}"
    elif template == 2:
        plural = len(scene.objects) > 1
        text = f"there {'are' if plural else 'is'} {_join(phrases)} {place}"
    elif template == 3:
        text = _join(phrases)
    else:
        first, second = order[0], order[1]
        text = f"{phrases[0]} {relation(groups[first], groups[second])} {phrases[1]}"
        if len(phrases) > 2:
            text += f", with {_join(phrases[2:])}"
        if template == 5:
            text += f" {place}"
    return text[0].upper() + text[1:] + "."


VERBS = {
    "grass": ("sits", "sit", "lies", "lie", "rests", "rest"),
    "sand": ("lies", "lie", "sits", "sit", "rests", "rest"),
    "sky": ("floats", "float", "hangs", "hang", "flies", "fly"),
    "floor": ("stands", "stand", "lies", "lie", "sits", "sit"),
    "wall": ("stands", "stand", "sits", "sit", "rests", "rest"),
}
"""Per background: (singular, plural) verb pairs, flattened."""
_GERUNDS = {"sit": "sitting", "lie": "lying", "rest": "resting", "float": "floating",
            "hang": "hanging", "fly": "flying", "stand": "standing"}  # fmt: skip
_BASE = {"sits": "sit", "lies": "lie", "rests": "rest", "floats": "float", "hangs": "hang",
         "flies": "fly", "stands": "stand"}  # fmt: skip


def _verb(background: str, plural: bool, rng: np.random.Generator) -> str:
    pair = 2 * int(rng.integers(len(VERBS[background]) // 2))
    return VERBS[background][pair + int(plural)]


def sentence(scene: Scene, classes: dict[str, ObjectClass], rng: np.random.Generator) -> str:
    """One caption naming every class in ``scene`` once, as a sentence with verbs: "A brown
    dog sits to the left of two frisbees on the grass.", "Two frisbees lie on the grass while a
    cat sits next to them." Each class is one noun phrase of :func:`phrase` (what np-removal
    cuts); the place and relations are as in :func:`caption`."""
    groups, order, phrases = _phrases(scene, classes, rng)
    plural = [len(groups[n]) > 1 for n in order]
    place = str(rng.choice(PLACES[scene.background]))
    verb = _verb(scene.background, plural[0], rng)
    if len(order) == 1:
        template = int(rng.integers(3))
        if template == 0:
            text = f"{phrases[0]} {verb} {place}"
        elif template == 1:
            text = f"there {'are' if plural[0] else 'is'} {phrases[0]} {_gerund(verb)} {place}"
        else:
            text = f"{place} {verb} {phrases[0]}"
        return text[0].upper() + text[1:] + "."
    where = relation(groups[order[0]], groups[order[1]])
    template = int(rng.integers(4))
    if template == 0:
        text = f"{phrases[0]} {verb} {where} {phrases[1]} {place}"
    elif template == 1:
        other = _verb(scene.background, plural[1], rng)
        text = f"{phrases[0]} {verb} {place} while {phrases[1]} {other} nearby"
    elif template == 2:
        text = f"{place}, {phrases[0]} {verb} {where} {phrases[1]}"
    else:
        text = f"{phrases[0]} {_gerund(verb)} {where} {phrases[1]} {place}"
    if len(phrases) > 2:
        many = len(phrases) > 3 or plural[2]
        text += f", and {_join(phrases[2:])} {_verb(scene.background, many, rng)} close by"
    return text[0].upper() + text[1:] + "."


def _gerund(verb: str) -> str:
    """``sits``/``sit`` -> ``sitting``."""
    return _GERUNDS[_BASE.get(verb, verb)]
