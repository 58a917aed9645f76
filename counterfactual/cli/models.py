"""``counterfactual models list|pull``: the models a synth config names, whether each is on
this machine, and fetching them on purpose (safetensors only, the fp16 variant for a float16
run, LaMa's file checked against its published checksum)."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from counterfactual.cli.model_options import pull_command
from counterfactual.cli.options import add_options
from counterfactual.models.hub import (
    DAMAGED,
    Located,
    ModelRef,
    ModelUnavailable,
    locate,
    pull,
)
from counterfactual.options import declare, declared

_HELP = (
    "CONFIG is a YAML file or the name of a bundled one (coco, flickr30k, coco-rorem, ...: "
    "`counterfactual configs` lists them); synth options after `--` override it, e.g. `-- --verify-model "
    "hf-clip:openai/clip-vit-large-patch14`."
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelsOptions:
    """The options of ``counterfactual models list`` and ``models pull``."""

    synth_config: str | None = declare(
        None,
        help="a synth YAML config, or a bundled config's name (default: synth's defaults)",
        flags=("--config",),
        dest="synth_config",
        metavar="CONFIG",
    )
    to: Path | None = declare(
        None,
        help="a folder instead of the Hugging Face cache: hub models in DIR/ORG/NAME, "
        "LaMa in DIR/big-lama.pt; prints the synth options that use them (default: the "
        "cache, HF_HOME/hub, and LaMa where the config names it)",
        kind="path",
        metavar="DIR",
    )
    json: bool = declare(False, help="one JSON object per model", kind="flag")
    synth_options: list[str] = declare(
        help="after --: synth options that change the models (e.g. --inpaint-model ID)",
        flags=("synth_options",),
        nargs="...",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "models",
        help="list or fetch the models a synth config names",
        description="The models a synth config loads (detector, inpainter, captioner, "
        "verifier): `list` says whether each is on this machine and at which revision, `pull` "
        "fetches the missing ones. " + _HELP,
    )
    sub = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, text in (
        ("list", "what the config needs and whether each is here (no network)"),
        ("pull", "fetch what the config needs: hub models into the Hugging Face cache or DIR"),
    ):
        a = sub.add_parser(name, help=text, description=f"{text}. {_HELP}")
        add_options(a, declared(ModelsOptions))
        a.set_defaults(func=run_list if name == "list" else run_pull)


def config_models(config: str | None, options: Sequence[str] = ()) -> tuple[ModelRef, ...]:
    """The models the synth run of ``config`` (plus synth ``options``) would load."""
    from counterfactual.cli import CliParser
    from counterfactual.cli import synth as synth_cli
    from counterfactual.cli.config import config_path, load_config
    from counterfactual.synth.models import needed_models

    subparsers = CliParser(prog="counterfactual").add_subparsers()
    synth_cli.register(subparsers)
    synth = subparsers.choices["synth"]
    if config is not None:
        synth.set_defaults(**load_config(config_path(config), synth))
    args = synth.parse_args([o for o in options if o != "--"])
    return needed_models(synth_cli.build_config(args), synth_cli.build_runtime(args))


def _refs(args: argparse.Namespace) -> tuple[ModelRef, ...]:
    return config_models(args.synth_config, args.synth_options or ())


def run_list(args: argparse.Namespace) -> int:
    found = [locate(_moved(ref, args.to), verify=True) for ref in _refs(args)]
    _print(found, args.json)
    missing = [f for f in found if not f.present]
    if missing and not args.json:
        fix = pull_command(args.synth_config, args.synth_options or ())
        broken = sum(1 for f in missing if _is_damaged(f))
        count = f"{len(missing)} missing" if not broken else f"{len(missing)} missing or damaged"
        print(f"{count}: {fix}", file=sys.stderr)
    return 1 if missing else 0


def run_pull(args: argparse.Namespace) -> int:
    """Pull each model; the ones that cannot be had are named together in one line (exit 2)
    after the others were fetched."""
    found: list[Located] = []
    failed: list[str] = []
    for ref in _refs(args):
        print(f"{ref.role}: {ref.name} ...", file=sys.stderr, flush=True)
        try:
            found.append(pull(ref, args.to))
        except ModelUnavailable as err:
            failed.append(str(err))
    _print(found, args.json)
    if failed:
        raise ModelUnavailable("; ".join(failed))
    if args.to is not None:
        overrides = _overrides(found)
        if overrides:
            print(f"use them: counterfactual synth ... {overrides}", file=sys.stderr)
    return 0


def _moved(ref: ModelRef, to: Path | None) -> ModelRef:
    """Where ``--to`` puts ``ref`` (the same ref without ``--to``, or for open_clip)."""
    if to is None or ref.kind == "open_clip":
        return ref
    from counterfactual.models.hub import is_local

    if ref.kind == "file":
        name = str(Path(to) / Path(ref.name).name)
    elif is_local(ref.name):
        return ref
    else:
        name = str(Path(to) / ref.name)
    return ModelRef(ref.role, ref.option, ref.kind, name, ref.variant)


def _overrides(found: Sequence[Located]) -> str:
    """The synth options that point a run at the folders ``--to`` filled."""
    words: list[str] = []
    for f in found:
        if f.path is None or f.source == "cache":
            continue
        words += [f.ref.option, f.path]  # a bare folder: its config.json names the kind
    return shlex.join(words)


def _is_damaged(found: Located) -> bool:
    """A known file whose checksum is not the published one (``locate(verify=True)``)."""
    return (found.problem or "").startswith(DAMAGED)


def _print(found: Sequence[Located], as_json: bool) -> None:
    if as_json:
        for f in found:
            print(json.dumps(f.to_dict()))
        return
    rows = [("role", "model", "status", "revision", "where")]
    for f in found:
        status = "ok" if f.present else f"missing: {f.problem}"
        if _is_damaged(f):
            status = str(f.problem)
        if f.present and f.source == "open_clip":
            status = "open_clip downloads it"
        rows.append((f.ref.role, f.ref.name, status, f.revision or "-", f.path or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r[:4], widths, strict=True)) + "  " + r[4])
