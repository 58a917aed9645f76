"""``counterfactual train``: fine-tune CLIP or BLIP on original + synthetic shards, with each
paper's recipe as defaults."""

from __future__ import annotations

import argparse
from pathlib import Path

from counterfactual.cli.common import (
    nonnegative_float,
    nonnegative_int,
    positive_float,
    positive_int,
)
from counterfactual.train.trainer import (
    MIXES,
    OPTIMIZERS,
    PRECISIONS,
    RECIPES,
    TrainConfig,
    TrainLog,
    plan_training,
)


def _by_recipe(field: str) -> str:
    """``clip 10, blip 2``: a field's default in each recipe, for the help text."""
    return ", ".join(f"{name} {getattr(r, field):g}" for name, r in RECIPES.items())


def register(subparsers: argparse._SubParsersAction) -> None:
    d = TrainConfig.__dataclass_fields__
    p = subparsers.add_parser(
        "train",
        help="fine-tune a Hugging Face CLIP or BLIP on original + synthetic shards (D ∪ D')",
        description="Fine-tune CLIP (CLIPModel, its contrastive loss) or BLIP "
        "(BlipForImageTextRetrieval, its image-text contrastive loss) on original shards plus "
        "synthetic ones: every sample once per epoch (--mix union, the paper), or resampled at "
        "RATIO synthetic per original (--mix ratio, as `counterfactual mix` weighs them). "
        "--recipe sets the paper's defaults: clip 10 epochs, batch 256, Adam at lr 2e-6 halved "
        "every 2 epochs; blip 2 epochs, batch 16, AdamW at lr 1e-5 halved every half epoch. "
        "Writes OUT/train.json, OUT/train_log.jsonl, OUT/epoch-XX/ and OUT/final/ (model + "
        "processor, loadable by path); a rerun continues after the last epoch-XX.",
    )
    p.add_argument(
        "--recipe",
        choices=tuple(RECIPES),
        default=d["recipe"].default,
        help="model family and the paper's defaults for it (default: %(default)s)",
    )
    p.add_argument(
        "--model",
        required=True,
        help="hub id or folder of the recipe's model + processor (CLIPModel, "
        "BlipForImageTextRetrieval such as Salesforce/blip-itm-base-coco)",
    )
    p.add_argument("--original", nargs="+", required=True, metavar="SPEC", help="original shards")
    p.add_argument(
        "--synthetic",
        nargs="*",
        default=[],
        metavar="SPEC",
        help="synthetic shards (default: none, train on the original ones only)",
    )
    p.add_argument(
        "--mix",
        choices=MIXES,
        default=d["mix"].default,
        help="union: every original and synthetic sample once per epoch, at their natural "
        "ratio (the paper); ratio: resampled at --ratio (default: %(default)s)",
    )
    p.add_argument(
        "--ratio",
        type=positive_float,
        default=d["ratio"].default,
        help="--mix ratio: synthetic per original (default %(default)s; the paper: 0.08-0.2)",
    )
    p.add_argument("--out", type=Path, required=True, help="output folder")
    g = p.add_argument_group("optimisation (defaults: the recipe's, from the paper)")
    g.add_argument("--epochs", type=positive_int, help=f"default: {_by_recipe('epochs')}")
    g.add_argument("--batch-size", type=positive_int, help=f"default: {_by_recipe('batch_size')}")
    g.add_argument("--lr", type=positive_float, help=f"default: {_by_recipe('lr')}")
    g.add_argument(
        "--lr-decay",
        type=positive_float,
        help=f"lr factor at each decay, at most 1 (default: {_by_recipe('lr_decay')})",
    )
    g.add_argument(
        "--lr-decay-every",
        type=positive_float,
        metavar="EPOCHS",
        help="epochs between lr decays, fractions allowed "
        f"(default: {_by_recipe('lr_decay_every')})",
    )
    g.add_argument(
        "--optimizer",
        choices=OPTIMIZERS,
        help="default: " + ", ".join(f"{n} {r.optimizer}" for n, r in RECIPES.items()),
    )
    g.add_argument(
        "--weight-decay", type=nonnegative_float, help=f"default: {_by_recipe('weight_decay')}"
    )
    g.add_argument(
        "--max-text-length",
        type=positive_int,
        help=f"tokens per caption (default: {_by_recipe('max_text_length')})",
    )
    g.add_argument(
        "--grad-clip",
        type=positive_float,
        default=None,
        help="clip the gradient norm to this (default: no clipping)",
    )
    g.add_argument(
        "--samples-per-epoch",
        type=positive_int,
        default=None,
        help="--mix ratio only; default: original samples x (1 + ratio)",
    )
    g.add_argument(
        "--seed",
        type=nonnegative_int,
        default=d["seed"].default,
        help="seed of the shard order, shuffle and mix draws, >= 0 (default: %(default)s)",
    )
    r = p.add_argument_group("running")
    r.add_argument("--device", default=None, help="torch device (default: cuda if available)")
    r.add_argument(
        "--precision",
        choices=PRECISIONS,
        default=d["precision"].default,
        help="auto: bf16 autocast on CUDA, fp32 on CPU; bf16, fp16: mixed precision, CUDA "
        "only (default: %(default)s)",
    )
    r.add_argument(
        "--num-workers",
        type=nonnegative_int,
        default=d["num_workers"].default,
        help="DataLoader workers (default %(default)s)",
    )
    r.add_argument(
        "--shuffle-buffer",
        type=nonnegative_int,
        default=d["shuffle_buffer"].default,
        help="samples (default %(default)s)",
    )
    r.add_argument(
        "--log-every",
        type=positive_int,
        default=d["log_every"].default,
        help="steps per log row (default %(default)s)",
    )
    p.set_defaults(func=run)


def build_config(args: argparse.Namespace) -> TrainConfig:
    """The config: the recipe's defaults where an option was not given."""
    return TrainConfig(
        model=args.model,
        original=tuple(args.original),
        synthetic=tuple(args.synthetic),
        recipe=args.recipe,
        mix=args.mix,
        ratio=args.ratio,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        lr_decay=args.lr_decay,
        lr_decay_every=args.lr_decay_every,
        optimizer=args.optimizer,
        weight_decay=args.weight_decay,
        max_text_length=args.max_text_length,
        grad_clip_norm=args.grad_clip,
        samples_per_epoch=args.samples_per_epoch,
        shuffle_buffer=args.shuffle_buffer,
        seed=args.seed,
        device=args.device,
        precision=args.precision,
        num_workers=args.num_workers,
        log_every=args.log_every,
    )


def run(args: argparse.Namespace) -> int:
    from counterfactual.train.trainer import fine_tune

    config = build_config(args)
    plan = plan_training(config)
    if not plan.synthetic:
        mix = "no synthetic shards"
    elif plan.mix == "union":
        mix = (
            f"{plan.synthetic_samples} synthetic in {len(plan.synthetic)} shards, all once per "
            f"epoch: natural ratio {plan.ratio:.4g} per original ({plan.synthetic_fraction:.1%})"
        )
    else:
        mix = (
            f"{plan.synthetic_samples} synthetic in {len(plan.synthetic)} shards at "
            f"{plan.ratio:g} per original ({plan.synthetic_fraction:.1%} of draws)"
        )
    print(
        f"{plan.original_samples} original samples in {len(plan.original)} shards, {mix}; "
        f"{config.recipe}: {config.epochs} epochs of {plan.steps_per_epoch} steps x "
        f"{config.batch_size}, {config.optimizer} lr {config.lr:g} x {config.lr_decay:g} every "
        f"{config.lr_decay_every:g} epochs",
        flush=True,
    )
    result = fine_tune(config, args.out, progress=_print_row)
    if result.resumed_from:
        print(f"resumed after epoch {result.resumed_from}")
    skipped = sum(result.skipped.values())
    reasons = ", ".join(f"{k} {v}" for k, v in sorted(result.skipped.items()))
    print(
        f"loss {result.first_loss:.4f} -> {result.last_loss:.4f} over {result.steps} steps; "
        f"{result.samples} samples, {result.synthetic} synthetic; "
        f"skipped {skipped}{f' ({reasons})' if reasons else ''}; "
        f"model: {result.final_dir}"
    )
    return 0


def _print_row(row: TrainLog) -> None:
    print(
        f"epoch {row.epoch} step {row.step} lr {row.lr:.3g} loss {row.loss:.4f} "
        f"{row.samples_per_s:.1f} samples/s",
        flush=True,
    )
