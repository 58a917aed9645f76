"""``counterfactual train``: fine-tune CLIP on original + synthetic shards (paper defaults)."""

from __future__ import annotations

import argparse
from pathlib import Path

from counterfactual.train import OPTIMIZERS, PRECISIONS, TrainConfig, TrainLog, plan_training


def register(subparsers: argparse._SubParsersAction) -> None:
    d = TrainConfig.__dataclass_fields__
    p = subparsers.add_parser(
        "train",
        help="fine-tune a Hugging Face CLIP on original + synthetic shards (D ∪ D')",
        description="Fine-tune CLIP with its contrastive loss on original shards mixed with "
        "synthetic ones at RATIO synthetic per original (drawn as `counterfactual mix` weighs "
        "them). Defaults are the paper's: 10 epochs, batch 256, Adam at lr 2e-6 halved every 2 "
        "epochs. Writes OUT/train.json, OUT/train_log.jsonl, OUT/epoch-XX/ and OUT/final/ "
        "(model + processor, loadable by path); a rerun continues after the last epoch-XX.",
    )
    p.add_argument("--model", required=True, help="hub id or folder of a CLIPModel + processor")
    p.add_argument("--original", nargs="+", required=True, metavar="SPEC", help="original shards")
    p.add_argument(
        "--synthetic",
        nargs="*",
        default=[],
        metavar="SPEC",
        help="synthetic shards (none: train on the original ones only)",
    )
    p.add_argument(
        "--ratio",
        type=float,
        default=d["ratio"].default,
        help="synthetic per original (default 0.1; the paper: 0.08-0.2)",
    )
    p.add_argument("--out", type=Path, required=True, help="output folder")
    g = p.add_argument_group("optimisation (defaults: the paper)")
    g.add_argument("--epochs", type=int, default=d["epochs"].default)
    g.add_argument("--batch-size", type=int, default=d["batch_size"].default)
    g.add_argument("--lr", type=float, default=d["lr"].default)
    g.add_argument(
        "--lr-decay", type=float, default=d["lr_decay"].default, help="lr factor (default 0.5)"
    )
    g.add_argument(
        "--lr-decay-every",
        type=int,
        default=d["lr_decay_every"].default,
        help="epochs between lr decays (default 2)",
    )
    g.add_argument("--optimizer", choices=OPTIMIZERS, default=d["optimizer"].default)
    g.add_argument("--weight-decay", type=float, default=d["weight_decay"].default)
    g.add_argument("--grad-clip", type=float, default=None, help="clip the gradient norm to this")
    g.add_argument(
        "--samples-per-epoch",
        type=int,
        default=None,
        help="default: original samples x (1 + ratio)",
    )
    g.add_argument("--seed", type=int, default=d["seed"].default)
    r = p.add_argument_group("running")
    r.add_argument("--device", default=None, help="torch device (default: cuda if available)")
    r.add_argument(
        "--precision",
        choices=PRECISIONS,
        default=d["precision"].default,
        help="auto: bf16 autocast on CUDA, fp32 on CPU",
    )
    r.add_argument(
        "--num-workers", type=int, default=d["num_workers"].default, help="DataLoader workers"
    )
    r.add_argument("--shuffle-buffer", type=int, default=d["shuffle_buffer"].default)
    r.add_argument(
        "--log-every", type=int, default=d["log_every"].default, help="steps per log row"
    )
    p.set_defaults(func=run)


def build_config(args: argparse.Namespace) -> TrainConfig:
    return TrainConfig(
        model=args.model,
        original=tuple(args.original),
        synthetic=tuple(args.synthetic),
        ratio=args.ratio,
        epochs=args.epochs,
        batch_size=args.batch_size,
        lr=args.lr,
        lr_decay=args.lr_decay,
        lr_decay_every=args.lr_decay_every,
        optimizer=args.optimizer,
        weight_decay=args.weight_decay,
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
    from counterfactual.train import train_clip

    config = build_config(args)
    plan = plan_training(config)
    mix = (
        f"{plan.synthetic_samples} synthetic in {len(plan.synthetic)} shards at {plan.ratio:g} "
        f"per original ({plan.synthetic_fraction:.1%} of draws)"
        if plan.synthetic
        else "no synthetic shards"
    )
    print(
        f"{plan.original_samples} original samples in {len(plan.original)} shards, {mix}; "
        f"{config.epochs} epochs of {plan.steps_per_epoch} steps x {config.batch_size}",
        flush=True,
    )
    result = train_clip(config, args.out, progress=_print_row)
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
