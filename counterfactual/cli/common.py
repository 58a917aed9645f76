"""Argument groups shared by subcommands, and the config built from them."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from counterfactual.cli.options import add_options, build
from counterfactual.method.selection import SelectionConfig
from counterfactual.options import CliOption, Declared, declare, declared
from counterfactual.readers import CORPORA, DATASETS

if TYPE_CHECKING:
    from counterfactual.readers.spec import DataSpec


@dataclass(frozen=True, slots=True, kw_only=True)
class OutFolder:
    """The output folder a command writes (``train``, ``world``)."""

    out: Path = declare(help="output folder", kind="path")


def add_selection_args(parser: argparse.ArgumentParser) -> None:
    """The alpha rules, the policy (:class:`SelectionConfig`) and the seed
    (:class:`~counterfactual.synth.plan.SynthConfig`)."""
    from counterfactual.synth.plan import SynthConfig

    g = parser.add_argument_group("selection (the alpha rules of Kim et al. 2023)")
    add_options(g, declared(SelectionConfig))
    add_options(g, declared(SynthConfig, "seed"))


def selection_config(args: argparse.Namespace) -> SelectionConfig:
    return build(SelectionConfig, args)


def add_data_args(
    parser: argparse.ArgumentParser,
    demo_root: str = "~/.cache/counterfactual/demo, or $COUNTERFACTUAL_CACHE/demo",
    corpora: bool = False,
) -> argparse._ArgumentGroup:
    """The dataset options of ``synth`` (read by ``counterfactual.cli.synth.load_dataset``;
    without ``--root`` the demo is written to the user's cache, named ``demo_root`` in the
    help). ``corpora``: also offer the box-less corpora (WebDataset,
    Parquet, CSV, img2dataset's files) and their column options. Defaults: :class:`DataSpec`'s.
    """
    d = parser.add_argument_group("data")
    add_options(d, data_options(demo_root, corpora))
    return d


def data_options(demo_root: str, corpora: bool) -> list[Declared]:
    """The declarations of :func:`add_data_args`' options (their help names ``demo_root`` and,
    with ``corpora``, the corpora's forms)."""
    from counterfactual.readers.spec import DataSpec

    default = DataSpec()
    root_help = f"dataset folder (demo: where the demo pictures are written, default {demo_root})"
    if corpora:
        root_help += (
            "; wds, parquet, csv: the files, with brace ranges or globs, e.g. "
            "'data/{00000..00099}.tar', or their folder (its *.tar, *.parquet or *.csv only: "
            "img2dataset's output folder as it is); files: the folder of shard folders"
        )
    root_help += "; every path may be an fsspec URL (s3://, gs://, az://, hf://)"
    dataset_help = (
        "what to read: demo (scikit-image photos with boxes, offline), coco, flickr30k"
        + (
            "; corpora without boxes: wds (WebDataset tars), parquet, csv, files "
            "(img2dataset's files output: shard folders of KEY.jpg/.txt/.json)"
            if corpora
            else ""
        )
        + " (default: %(default)s)"
    )
    choices = DATASETS + CORPORA if corpora else DATASETS
    found = [
        Declared("dataset", CliOption(dataset_help, choices=choices), default.kind),
        Declared("root", CliOption(root_help), None),
        Declared(
            "instances",
            CliOption(
                "COCO instances file (default: ROOT/annotations/instances_SET.json, SET: "
                "--coco-set)"
            ),
            None,
        ),
        Declared(
            "captions",
            CliOption(
                "COCO captions file (default: ROOT/annotations/captions_SET.json, SET: --coco-set)"
            ),
            None,
        ),
        Declared(
            "images",
            CliOption(
                "folder the file names are relative to (parquet, csv: default the table's folder)"
            ),
            None,
        ),
    ]
    if corpora:
        for name, what in (
            ("caption", "caption, txt, text or TEXT"),
            ("image", "image, jpg, path, file, filepath, file_name or image_path"),
            ("id", "key, id or image_id; else FILE-ROW"),
        ):
            column = f"parquet, csv: the {name} column (default: the first present of {what})"
            found.append(Declared(f"{name}_column", CliOption(column), None))
    coco_set = (
        "COCO: the image folder and annotation files' set under ROOT, e.g. val2014 "
        "(default: %(default)s)"
    )
    return [
        *found,
        Declared("coco_set", CliOption(coco_set), default.coco_set),
        Declared(
            "split_file", CliOption("Karpathy dataset_coco.json (default: none, no split)"), None
        ),
        Declared(
            "split",
            CliOption("train, val or test (Karpathy / Flickr30k; default: every image)"),
            None,
        ),
        Declared(
            "limit",
            CliOption("only the first N images (N >= 1; default: all)", kind="positive_int"),
            None,
        ),
    ]


def data_spec(args: argparse.Namespace, demo_root: str | None = None) -> DataSpec:
    """The :class:`DataSpec` the data options name (``demo_root``: where the demo's pictures
    go when ``--root`` is not given)."""
    from counterfactual.readers.spec import DataSpec

    root = args.root if args.root is not None else (demo_root if args.dataset == "demo" else None)
    return DataSpec(
        kind=args.dataset,
        root=None if root is None else str(root),
        images=args.images,
        instances=args.instances,
        captions=args.captions,
        coco_set=args.coco_set,
        split_file=args.split_file,
        split=args.split,
        caption_column=getattr(args, "caption_column", None),
        image_column=getattr(args, "image_column", None),
        id_column=getattr(args, "id_column", None),
        limit=args.limit,
    )
