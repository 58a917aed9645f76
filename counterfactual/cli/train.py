"""``counterfactual train``: fine-tune CLIP or BLIP on original + synthetic shards, with each
paper's recipe as defaults."""

from __future__ import annotations

import argparse

from counterfactual.cli.common import OutFolder
from counterfactual.cli.options import add_options, build
from counterfactual.options import declared
from counterfactual.train.trainer import TrainConfig, TrainLog, plan_training


def register(subparsers: argparse._SubParsersAction) -> None:
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
    add_options(p, declared(TrainConfig, "recipe", "model", "original", "synthetic", "mix"))
    add_options(p, declared(TrainConfig, "ratio"))
    add_options(p, declared(OutFolder))
    g = p.add_argument_group("optimisation (defaults: the recipe's, from the paper)")
    recipe = ("epochs", "batch_size", "lr", "lr_decay", "lr_decay_every", "optimizer")
    add_options(g, declared(TrainConfig, *recipe, "weight_decay", "max_text_length"))
    add_options(g, declared(TrainConfig, "grad_clip_norm", "samples_per_epoch", "seed"))
    r = p.add_argument_group("running")
    running = ("device", "precision", "num_workers", "shuffle_buffer", "log_every")
    add_options(r, declared(TrainConfig, *running))
    p.set_defaults(func=run)


def build_config(args: argparse.Namespace) -> TrainConfig:
    """The config: the recipe's defaults where an option was not given."""
    return build(TrainConfig, args)


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
