"""``counterfactual world``: write the controlled world, a COCO-format dataset of drawn scenes
whose class co-occurrence in train is a knob (test balanced)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, replace

from counterfactual.cli.common import OutFolder
from counterfactual.cli.options import add_options, build
from counterfactual.options import declare, declared
from counterfactual.world.classes import ObjectClass
from counterfactual.world.scene import WorldConfig


def _class_setting(text: str) -> tuple[str, float, float | None]:
    """``NAME=CONTRAST`` or ``NAME=CONTRAST:SCALE``."""
    name, sep, value = text.partition("=")
    try:
        parts = [float(v) for v in value.split(":")]
    except ValueError:
        parts = []
    if not sep or not name or len(parts) not in (1, 2):
        raise argparse.ArgumentTypeError(f"expected NAME=CONTRAST[:SCALE], got {text!r}")
    return name, parts[0], parts[1] if len(parts) == 2 else None


def _pair(text: str) -> tuple[str, str]:
    anchor, sep, partner = text.partition(":")
    if not sep or not anchor or not partner:
        raise argparse.ArgumentTypeError(f"expected ANCHOR:PARTNER, got {text!r}")
    return anchor, partner


@dataclass(frozen=True, slots=True, kw_only=True)
class WorldOptions:
    """The options of ``counterfactual world`` that change :class:`WorldConfig`'s classes."""

    pair: list[tuple[str, str]] | None = declare(
        None,
        help="a co-occurring pair (repeat; default: dog:frisbee cat:ball car:tree boat:bird "
        "cow:bench clock:cup kite:umbrella)",
        parse=_pair,
        repeat=True,
        metavar="ANCHOR:PARTNER",
    )
    visibility: list[tuple[str, float, float | None]] = declare(
        [],
        help="how hard a class is to see: contrast in (0, 1] against the background, and a "
        "factor on its size (repeat; default: partners at contrast 0.65 and smaller)",
        parse=_class_setting,
        repeat=True,
        metavar="NAME=CONTRAST[:SCALE]",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "world",
        help="write the controlled world: drawn scenes, captions, a co-occurrence knob",
        description="Write a COCO-format dataset of procedurally drawn scenes (16 classes of "
        "distinct shape, colour and texture on varied backgrounds, captions from templates "
        "with counts, attributes and relations) into OUT: annotations/instances_world.json, "
        "annotations/captions_world.json, world/*.png, dataset_coco.json (train/val/test), "
        "vocabulary.txt, scenes.jsonl. In train, a partner class comes with its anchor with "
        "probability --cooccurrence; val and test are balanced (0.5). Read it with "
        "`synth --dataset coco --root OUT --coco-set world --split-file OUT/dataset_coco.json "
        "--vocabulary OUT/vocabulary.txt`.",
    )
    add_options(p, declared(OutFolder))
    add_options(p, declared(WorldConfig, "images", "val", "test", "size", "cooccurrence"))
    add_options(p, declared(WorldOptions))
    add_options(p, declared(WorldConfig, "captions", "caption_style", "seed"))
    p.set_defaults(func=run)


def build_config(args: argparse.Namespace) -> WorldConfig:
    classes = {c.name: c for c in WorldConfig().classes}
    for name, contrast, scale in args.visibility:
        if name not in classes:
            raise ValueError(
                f"--visibility names unknown class {name!r} (classes: {', '.join(classes)})"
            )
        cls: ObjectClass = classes[name]
        size = cls.size if scale is None else (cls.size[0] * scale, cls.size[1] * scale)
        classes[name] = replace(cls, contrast=contrast, size=size)
    extra = {"pairs": tuple(args.pair)} if args.pair else {}
    return build(WorldConfig, args, classes=tuple(classes.values()), **extra)


def run(args: argparse.Namespace) -> int:
    from counterfactual.world.write import write_world

    world = write_world(build_config(args), args.out)
    counts = {s: len(world.split(s)) for s in ("train", "val", "test")}
    print(f"wrote {len(world.scenes)} scenes to {args.out}: {counts}")
    return 0
