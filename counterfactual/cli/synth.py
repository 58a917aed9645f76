"""``counterfactual synth``: make counterfactual shards from a dataset (in-process runner)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from counterfactual.cli.common import add_selection_args, selection_config
from counterfactual.image import IMAGE_METHODS, INPAINT_BACKENDS, ImageConfig
from counterfactual.masks import MASK_SOURCES, MaskConfig
from counterfactual.readers import DATASETS
from counterfactual.records import Dataset
from counterfactual.synth import CAPTION_CHOICES, SynthConfig, run_local
from counterfactual.text import TEXT_METHODS, TextConfig

_IMAGE, _TEXT, _SYNTH = ImageConfig(), TextConfig(), SynthConfig()


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "synth",
        help="erase objects, rewrite captions, write WebDataset shards",
        description="Select removable classes, erase them from the images, rewrite the captions "
        "and write WebDataset shards (jpg, txt, json per sample) plus status.jsonl (one row per "
        "input image or sample, with the reason for anything not written) and summary.json.",
    )
    d = p.add_argument_group("data")
    d.add_argument("--dataset", choices=DATASETS, default="demo")
    d.add_argument(
        "--root",
        type=Path,
        default=None,
        help="dataset folder (demo: where the demo pictures are written, default OUT/demo-data)",
    )
    d.add_argument("--instances", type=Path, help="COCO instances_*.json")
    d.add_argument("--captions", type=Path, help="COCO captions_*.json")
    d.add_argument("--images", type=Path, help="folder the file names are relative to")
    d.add_argument("--coco-set", default="train2017", help="COCO file set under ROOT")
    d.add_argument("--split-file", type=Path, help="Karpathy dataset_coco.json")
    d.add_argument("--split", default=None, help="train, val or test (Karpathy / Flickr30k)")
    d.add_argument("--limit", type=int, default=None, help="only the first N images")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    add_selection_args(p)
    i = p.add_argument_group("image")
    i.add_argument("--image-method", choices=IMAGE_METHODS, default="inpaint")
    i.add_argument("--inpaint-backend", choices=INPAINT_BACKENDS, default="opencv")
    i.add_argument("--inpaint-model", default=_IMAGE.model, help="diffusers id or path")
    i.add_argument("--device", default="cpu", help="torch device for learned models")
    i.add_argument("--dtype", default="float32", choices=("float32", "float16", "bfloat16"))
    i.add_argument("--steps", type=int, default=_IMAGE.steps, help="diffusion steps")
    i.add_argument(
        "--resolution", type=int, default=_IMAGE.resolution, help="diffusion working size (px)"
    )
    i.add_argument("--inpaint-batch-size", type=int, default=_IMAGE.batch_size)
    i.add_argument("--prompt", default=_IMAGE.prompt, help="{background}, {kept}, {removed}")
    i.add_argument("--negative-prompt", default=_IMAGE.negative_prompt)
    i.add_argument("--mask-source", choices=MASK_SOURCES, default="box")
    i.add_argument("--dilate", type=int, default=0, help="grow masks by N pixels")
    i.add_argument("--blur-sigma", type=float, default=_IMAGE.blur_sigma)
    t = p.add_argument_group("text")
    t.add_argument("--text-method", choices=TEXT_METHODS, default="np-removal")
    t.add_argument("--captioner-model", default=_TEXT.model, help="HF id or path")
    t.add_argument("--spacy-model", default=None, help="spaCy pipeline name or path")
    t.add_argument("--vocabulary", default=None, help="class word-list file (default: COCO)")
    t.add_argument("--captions-per-image", choices=CAPTION_CHOICES, default="one")
    o = p.add_argument_group("output")
    o.add_argument("--samples-per-shard", type=int, default=1000)
    o.add_argument(
        "--max-pixels", type=int, default=_SYNTH.max_pixels, help="refuse larger pictures"
    )
    o.add_argument(
        "--contact-sheet", type=int, default=8, help="rows in contact_sheet.png (0: none)"
    )
    p.set_defaults(func=run)


def load_dataset(args: argparse.Namespace) -> Dataset:
    if args.dataset == "demo":
        from counterfactual.readers.demo import read_demo

        return read_demo(args.root or args.out / "demo-data")
    if args.root is None and args.instances is None:
        raise ValueError(f"--dataset {args.dataset} needs --root (or --instances for COCO)")
    if args.dataset == "flickr30k":
        from counterfactual.readers.flickr30k import read_flickr30k

        return read_flickr30k(args.root, split=args.split)
    from counterfactual.readers.coco import read_coco

    root = args.root or args.instances.parent
    instances = args.instances or root / "annotations" / f"instances_{args.coco_set}.json"
    captions = args.captions or root / "annotations" / f"captions_{args.coco_set}.json"
    images = args.images or root / args.coco_set
    return read_coco(instances, captions, images, args.split_file, args.split)


def default_vocabulary(args: argparse.Namespace) -> str | None:
    if args.vocabulary or args.dataset != "demo":
        return args.vocabulary
    from counterfactual.readers.demo import demo_vocabulary_path

    return str(demo_vocabulary_path())


def build_config(args: argparse.Namespace) -> SynthConfig:
    return SynthConfig(
        selection=selection_config(args),
        mask=MaskConfig(source=args.mask_source, dilate=args.dilate),
        image=ImageConfig(
            method=args.image_method,
            backend=args.inpaint_backend,
            model=args.inpaint_model,
            device=args.device,
            dtype=args.dtype,
            steps=args.steps,
            resolution=args.resolution,
            batch_size=args.inpaint_batch_size,
            prompt=args.prompt,
            negative_prompt=args.negative_prompt,
            blur_sigma=args.blur_sigma,
        ),
        text=TextConfig(
            method=args.text_method,
            spacy_model=args.spacy_model,
            vocabulary=default_vocabulary(args),
            model=args.captioner_model,
            device=args.device,
            dtype=args.dtype,
        ),
        captions=args.captions_per_image,
        seed=args.seed,
        samples_per_shard=args.samples_per_shard,
        max_pixels=args.max_pixels,
    )


def run(args: argparse.Namespace) -> int:
    config = build_config(args)
    dataset = load_dataset(args)
    records = dataset.records[: args.limit] if args.limit else dataset.records
    print(f"{dataset.name}: {len(records)} images -> {args.out}", file=sys.stderr)
    result = run_local(
        records, args.out, config, keep_examples=args.contact_sheet, failures=dataset.failures
    )
    if result.examples:
        from counterfactual.contact_sheet import contact_sheet

        sheet = contact_sheet(result.examples, args.out / "contact_sheet.png")
        print(f"contact sheet: {sheet}", file=sys.stderr)
    print(f"{result.written} samples in {len(result.shards)} shards, {result.seconds:.1f} s")
    for name, n in result.counts().items():
        print(f"  {name:<40} {n}")
    return 0
