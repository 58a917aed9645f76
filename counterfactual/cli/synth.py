"""``counterfactual synth``: make counterfactual shards from a dataset, in this process
(``--runner local``) or on Ray (``--runner ray``), optionally from a YAML config."""

from __future__ import annotations

import argparse
import shlex
import sys
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from counterfactual import fs
from counterfactual.cli.common import add_data_args, add_selection_args, data_spec, selection_config
from counterfactual.cli.options import add_options, build
from counterfactual.image import ImageConfig, cli_options
from counterfactual.messages import one_line
from counterfactual.method.detect import DetectConfig
from counterfactual.method.masks import MaskConfig
from counterfactual.method.verify import VerifyConfig
from counterfactual.options import declare, declared
from counterfactual.outdir import OutOptions
from counterfactual.progress import Progress
from counterfactual.readers import CORPORA
from counterfactual.readers.spec import open_input
from counterfactual.records import ImageRecord
from counterfactual.synth.plan import Runtime, SynthConfig
from counterfactual.text import CUTTING_METHODS, TextConfig

if TYPE_CHECKING:
    from counterfactual.pipelines.options import RayOptions
    from counterfactual.readers.spec import DataSpec, RunInput

LEAD = (
    "--config",
    "--dataset",
    "--root",
    "--out",
    "--runner",
    "--device",
    "--image-method",
    "--inpaint-backend",
    "--verify",
    "--images-per-shard",
)
"""The options most runs need (the README's recipes), shown first by ``synth --help``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SynthOptions:
    """The options of ``counterfactual synth`` that belong to the command alone (no config
    holds them); ``--help`` shows each in its topic's group."""

    config: str | None = declare(
        None,
        help="YAML file of options (keys are the long option names, e.g. image_method: blur), "
        "or the name of a bundled one (coco, demo, ...: `counterfactual configs` lists them); "
        "options given on the command line win (default: none, the defaults shown here)",
    )
    runner: str = declare(
        "local",
        help="local: every shard in this process; ray: shard workers (and GPU model actors) on "
        "a local Ray or the cluster in RAY_ADDRESS (default: %(default)s)",
        choices=("local", "ray"),
    )
    out: str | None = declare(
        None,
        help="output folder or URL, e.g. s3://bucket/run (required): missing, empty or a "
        "synth run (a rerun resumes it); another folder is refused unless --force-out",
    )
    boxes: str | None = declare(
        None,
        help="where the objects come from (default: the dataset's boxes for coco, flickr30k "
        "and demo, the detector for wds, parquet and csv)",
        choices=("dataset", "detector"),
    )
    verify: bool | None = declare(
        None,
        help="check every sample: removed classes leave CLIP's top-k on their boxes, kept ones "
        "stay, the caption names no removed class; the scores go into its json as 'verify'. "
        "--no-verify: no verification and no --filter, whatever a config says (default: off)",
        kind="bool",
    )
    filter: bool | None = declare(
        None,
        help="--verify, and drop the samples that fail (status failed:verify-removal, "
        "verify-retention or verify-text); --no-filter: keep them (default: off)",
        kind="bool",
    )
    contact_sheet: int = declare(
        8,
        help="rows in OUT/contact_sheet.png, >= 0 (0: none; default: %(default)s)",
        kind="nonnegative_int",
    )
    dry_run: bool = declare(
        False,
        help="join or start Ray, load no model and print the layout the run would use as one "
        "JSON object (GPUs, CPUs, shard workers, actors and GPUs per actor of each model "
        "stage); exit 2 with one line when the cluster cannot hold it, exit 1 with one line "
        "naming the models that are not here (as `counterfactual models list`)",
        kind="flag",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "synth",
        usage="%(prog)s [--config FILE] [--dataset NAME] [--root DIR] --out OUT [OPTION ...]",
        help="erase objects, rewrite captions, write WebDataset shards",
        description="Select removable classes, erase them from the images, rewrite the captions "
        "and write WebDataset shards (jpg, txt, json per sample) plus status.jsonl (one row per "
        "input image or sample, with the reason for anything not written) and manifest.json. "
        "Rerunning the same command into the same --out resumes: finished shards are kept.",
    )
    add_options(p, declared(SynthOptions, "config", "runner"))
    add_data_args(p, corpora=True)
    add_options(p, declared(SynthOptions, "out"))
    add_options(p, declared(OutOptions))
    add_selection_args(p)
    _add_box_args(p)
    _add_image_args(p)
    _add_text_args(p)
    _add_verify_args(p)
    _add_output_args(p)
    _add_ray_args(p)
    _lead(p, "the options most runs need (the rest follow, by topic)", LEAD)
    p.set_defaults(func=run)


def _lead(p: argparse.ArgumentParser, title: str, flags: Sequence[str]) -> None:
    """Move the options named by ``flags`` (each one's first option string) out of their groups
    into a group ``title`` that ``--help`` shows first, in the order given. Parsing is
    unchanged: only where the help lists them."""
    lead = p.add_argument_group(title)
    p._action_groups.remove(lead)
    p._action_groups.insert(0, lead)
    for flag in flags:
        action = p._option_string_actions[flag]
        for group in p._action_groups:
            if action in group._group_actions:
                group._group_actions.remove(action)
        lead._group_actions.append(action)


def _add_box_args(p: argparse.ArgumentParser) -> None:
    b = p.add_argument_group("boxes (an open-vocabulary detector for corpora without them)")
    add_options(b, declared(SynthOptions, "boxes"))
    detect = ("model", "queries", "score_threshold", "nms_iou", "max_detections", "template")
    add_options(b, declared(DetectConfig, *detect))
    add_options(b, declared(Runtime, "detect_batch_size"))


def _add_image_args(p: argparse.ArgumentParser) -> None:
    i = p.add_argument_group("image")
    add_options(i, declared(ImageConfig, "method", "backend"))
    _add_eraser_args(i)
    add_options(i, declared(Runtime, "device", "dtype", "inpaint_batch_size"))
    add_options(i, declared(MaskConfig, "source", "dilate"))


def _add_eraser_args(group: argparse._ArgumentGroup) -> None:
    """The backends' declared options (:func:`counterfactual.image.cli_options`). Each
    defaults to ``None`` (not given), so that a recipe's values hold where the user gave none;
    the help shows the backend's default."""
    add_options(group, cli_options().values())


def _add_text_args(p: argparse.ArgumentParser) -> None:
    t = p.add_argument_group("text")
    text = declared(TextConfig)  # in the order --help shows them
    beside = [d.field for d in text].index("spacy_model") + 1  # the vocabulary after the parser
    add_options(t, [*text[:beside], *declared(SynthConfig, "vocabulary"), *text[beside:]])
    add_options(t, declared(SynthConfig, "captions"))


def _add_verify_args(p: argparse.ArgumentParser) -> None:
    v = p.add_argument_group("verification (CLIP@k on the boxes, class names in the caption)")
    add_options(v, declared(SynthOptions, "verify", "filter"))
    add_options(v, declared(VerifyConfig, "model", "k", "retention_k", "text_check"))
    add_options(v, declared(Runtime, "verify_batch_size"))


def _add_output_args(p: argparse.ArgumentParser) -> None:
    o = p.add_argument_group("output")
    add_options(
        o,
        declared(SynthConfig, "images_per_shard", "pairs", "max_pixels", "max_boxes", "exif_frame"),
    )
    add_options(o, declared(SynthOptions, "contact_sheet"))
    add_options(o, declared(Runtime, "batch_size", "verify_shards", "hash_inputs"))


def _add_ray_args(p: argparse.ArgumentParser) -> None:
    from counterfactual.pipelines.options import RayOptions  # no Ray: its options' declarations

    r = p.add_argument_group("ray (with --runner ray)")
    add_options(r, declared(RayOptions, "address", "num_cpus", "cpu_actors", "model_actors"))
    add_options(r, declared(RayOptions, "gpus_per_actor", "model_batch_size", "in_flight"))
    add_options(r, declared(RayOptions, "stage_cost"))
    add_options(r, declared(RayOptions, "place_timeout", "load_timeout", "call_timeout"))
    add_options(r, declared(RayOptions, "failure_window"))
    add_options(r, declared(SynthOptions, "dry_run"))
    add_options(r, declared(RayOptions, "verbose", "keep_ray_logs", "dashboard"))


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
    detect = build(DetectConfig, args) if detected_boxes(args) else None
    return build(
        SynthConfig,
        args,
        selection=selection_config(args),
        mask=build(MaskConfig, args),
        image=_image_config(args),
        text=_text_config(args, detect),
        verify=build(VerifyConfig, args, mode=_verify_mode(args)),
        detect=detect,
        vocabulary=default_vocabulary(args),
    )


def build_runtime(args: argparse.Namespace) -> Runtime:
    """Where and in what sizes the run computes (:class:`Runtime`): none of it changes the
    output."""
    return build(Runtime, args)


def _image_config(args: argparse.Namespace) -> ImageConfig:
    """The image options by their flat names (:meth:`ImageConfig.from_flat`), which puts each in
    its backend's part: ``--inpaint-model`` is LaMa's file with ``--inpaint-backend lama``, else
    the diffusers model. Options not given are left out: they take the recipe's value, if
    any, else the default."""
    options = {d.field: getattr(args, d.dest) for d in declared(ImageConfig)}
    for key, option in cli_options().items():
        value = getattr(args, option.dest)
        if value is not None:
            options[key] = value
    return ImageConfig.from_flat(options)


def _text_config(args: argparse.Namespace, detect: DetectConfig | None) -> TextConfig:
    skip_unchanged = args.skip_unchanged_captions
    if skip_unchanged is None:  # on for corpora, whose caption is the only text
        skip_unchanged = detect is not None and args.text_method in CUTTING_METHODS
    return build(TextConfig, args, skip_unchanged=skip_unchanged)


def _verify_mode(args: argparse.Namespace) -> str:
    """``off``, ``record`` (``--verify``) or ``filter`` (``--filter``); ``--no-verify`` wins."""
    if args.verify is False:
        return "off"
    return "filter" if args.filter else "record" if args.verify else "off"


def ray_options(args: argparse.Namespace) -> RayOptions:
    """How ``--runner ray`` spreads the work (:class:`counterfactual.pipelines.options.RayOptions`)."""
    from counterfactual.pipelines.options import RayOptions

    return build(RayOptions, args)


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


def warn_vocabulary(records: Sequence[ImageRecord], config: SynthConfig) -> None:
    """Before the run starts, one warning line naming the dataset's classes that the caption
    vocabulary lacks, for a text method that removes words (their samples fail as
    ``class-not-in-vocabulary``); captions with annotated phrases (Flickr30k) need none."""
    from counterfactual.text import REMOVING_METHODS
    from counterfactual.vocab import VocabularyWarning, lacking_line, load_vocabulary

    if config.text.method not in REMOVING_METHODS:
        return
    classes = {
        o.category for r in records if any(c.phrases is None for c in r.captions) for o in r.objects
    }
    lacking = load_vocabulary(config.vocabulary).lacking(classes)
    if lacking:
        what = f"{len(lacking)} of the dataset's classes"
        line = lacking_line(lacking, config.vocabulary, what, "--vocabulary FILE")
        line += "; their samples fail as class-not-in-vocabulary"
        warnings.warn(line, VocabularyWarning, stacklevel=2)


def run(args: argparse.Namespace) -> int:
    if args.dry_run:
        check_extras(args)
        return dry_run(args)
    if args.out is None:
        raise ValueError("--out is required (on the command line or in --config)")
    config, runtime = build_config(args), build_runtime(args)
    check_extras(args, config, runtime)
    from counterfactual.synth.run import check_entry, claim_run_out

    made = new_folders(args.out)
    claim_run_out(args.out, args.force_out)  # someone else's folder: refused, nothing written
    # before the input is read, once: every model here, the device, OUT writable
    check_entry(args.out, config, runtime, fix=_pull(args), here=args.runner == "local")
    with removed_if_empty(made):
        return _synth(args, config, runtime)


def _synth(args: argparse.Namespace, config: SynthConfig, runtime: Runtime) -> int:
    """The run into its checked OUT: read the input, make the shards, print the summary."""
    from counterfactual.synth.run import RunConfig, run_shards, summary_table

    spec = data_spec(args, demo_root(args))
    inputs = open_input(spec, config.images_per_shard)
    records = inputs.records if isinstance(inputs.records, Sequence) else ()
    if config.verify.enabled and records:
        check_vocabulary(records, config.vocabulary)
    warn_vocabulary(records, config)
    print(f"{spec.kind}: {_describe(inputs, spec)} -> {args.out} ({args.runner})", file=sys.stderr)
    progress = Progress(
        inputs.image_count(), inputs.shard_count(config.images_per_shard) or 0, unit=inputs.unit
    )
    run_config = RunConfig(inputs, args.out, config, runtime, progress=progress)
    if args.runner == "ray":
        from counterfactual.pipelines.synth import RayRunner

        options = ray_options(args)
        with RayRunner(config, args.out, options, runtime, progress, _started) as runner:
            result = run_shards(run_config, runner)
    else:
        from counterfactual.synth.runner import LocalRunner

        result = run_shards(run_config, LocalRunner(config, args.out, runtime, progress=progress))
    if args.contact_sheet:
        _write_contact_sheet(args.out, records, args.contact_sheet)
    print(summary_table(result))
    _note_few_shards(args.out)
    if result.written:
        print(next_steps(args.out), file=sys.stderr)
    return 0


def next_steps(out: str) -> str:
    """The lines printed last after a run that wrote samples: how to look at the shards
    (``report``; a local folder only), check them and load them for training."""
    quoted = shlex.quote(out)
    lines = ["next steps:"]
    if not fs.is_url(out):
        report = Path(out) / "report" / "index.html"
        lines.append(f"  counterfactual report {quoted}   # look at them: open {report}")
    lines += [
        f"  counterfactual check {quoted}    # verify every shard against its records",
        f"  counterfactual.load.webdataset({out!r})   # train on them (docs/training.md: Load the shards)",
    ]
    return "\n".join(lines)


def _note_few_shards(out: str) -> None:
    """The loaders' note (``few_shards_note``) on stderr when the run has few shards."""
    from counterfactual.load import shard_sizes
    from counterfactual.shards.indexes import few_shards_note

    try:
        note = few_shards_note(shard_sizes(out), out)
    except ValueError:  # no sizes.json to read: nothing to say about loading
        return
    if note is not None:
        print(note, file=sys.stderr)


def new_folders(out: str) -> list[Path]:
    """The local folders that creating ``out`` makes: ``out`` and each missing parent,
    innermost first (none for a URL or a folder that exists)."""
    path = fs.as_path(out)
    if not isinstance(path, Path):
        return []
    made = []
    path = path.absolute()
    while not path.exists() and path != path.parent:
        made.append(path)
        path = path.parent
    return made


@contextmanager
def removed_if_empty(folders: Sequence[Path]) -> Iterator[None]:
    """A run that fails (or is stopped) leaves no empty OUT: each of ``folders`` (those it
    made, innermost first) still empty then is removed; ``rmdir`` removes nothing else, so a
    folder that holds anything, or one the user made, stays."""
    try:
        yield
    except BaseException:
        for folder in folders:
            try:
                folder.rmdir()
            except OSError:  # not empty (or gone): it and its parents stay
                break
        raise


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
    no input (``--out`` is not needed) and loads no model. The models the run would stop on
    (:func:`~counterfactual.synth.models.missing_models`: local paths not here, hub models and
    published files neither here nor to be had, as ``counterfactual models list`` finds them)
    are one line on stderr after it, and exit code 1; 0 when every model is here."""
    import json

    from counterfactual.pipelines.synth import dry_run as layout_of
    from counterfactual.synth.models import missing_models

    config, runtime = build_config(args), build_runtime(args)
    missing = missing_models(config, runtime)
    layout = layout_of(config, ray_options(args), runtime)
    print(json.dumps(layout.to_json()), flush=True)
    if missing:
        line = one_line(missing.line(_pull(args)))
        print(f"counterfactual synth: dry run: {line}", file=sys.stderr)
        return 1
    return 0


def _pull(args: argparse.Namespace) -> str:
    """The ``counterfactual models pull`` command that fetches what this command line needs."""
    from counterfactual.cli.model_options import pull_command

    return pull_command(args.config, getattr(args, "_argv", ()))


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
    from counterfactual.report import run_contact_sheet

    sheet = run_contact_sheet(out, records, rows)
    if sheet is not None:
        print(f"contact sheet: {sheet}", file=sys.stderr)


def _started(info: dict) -> None:
    nodes, cpus, gpus = len(info.get("nodes") or {}), info.get("cpus", 0), info.get("gpus", 0)
    where = f"Ray {info.get('address')}: {nodes} node(s), {cpus:g} CPUs, {gpus:g} GPUs"
    if info.get("dashboard"):
        where += f"; dashboard {info['dashboard']}"
    layout = info.get("layout") or {}
    print(f"{where}; {layout.get('workers', '?')} shard workers", file=sys.stderr)
