"""The ``verify-cost`` section of ``make bench``."""

from __future__ import annotations

import argparse
from pathlib import Path

from common import Arg, Section
from gpu_models import (
    CLIP_224_TINY,
    alternated,
    coco_requests,
    per_item,
    save_clip,
    tiny_lama,
    verify_requests,
)


def bench_verify_cost(work: Path, n: int, batch: int = 8) -> dict[str, float]:
    """Verify's cost per item on the model actor, old path against new, and its preprocessing
    alone, next to the tiny LaMa's cost per item on the same pictures (one thread)."""
    import torch

    from counterfactual.image import ImageConfig, make_editor
    from counterfactual.image.lama import LamaConfig
    from counterfactual.method.verify import Verifier, VerifyConfig, prepare_verify, verify_crops
    from counterfactual.vocab import coco_vocabulary

    torch.set_num_threads(1)
    requests = coco_requests(work, n)
    checks = verify_requests(requests)
    clip = save_clip(work / "clip-224-tiny", CLIP_224_TINY)
    verifier = Verifier(VerifyConfig(mode="record", model=clip), coco_vocabulary(), batch_size=16)
    prep = verifier.pixel_prep()
    assert prep is not None
    crops = [c for r in checks for c in verify_crops(r, verifier.config)[0]]
    processor = verifier.embedder._image_processor  # type: ignore[attr-defined]
    prepared = [prepare_verify(r, verifier.config, prep) for r in checks]
    verifier(checks[:2])
    verifier(prepared[:2])  # warm-up
    items = len(checks)
    cost = alternated(
        {
            "old": lambda: verifier(checks),
            "new": lambda: verifier(prepared),
            "old_prep": lambda: processor(images=crops, return_tensors="pt"),
            "worker_prep": lambda: [prepare_verify(r, verifier.config, prep) for r in checks],
        },
        items,
    )
    old_item, new_item = cost["old"], cost["new"]
    old_prep, worker_prep = cost["old_prep"], cost["worker_prep"]
    lama = make_editor(
        ImageConfig(method="inpaint", backend="lama", lama=LamaConfig(str(tiny_lama(work)))),
        batch_size=batch,
    )
    lama(requests[:batch])
    inpaint = per_item(lambda: lama(requests), items)
    return {
        "verify_cost_items": float(items),
        "verify_cost_crops_per_item": len(crops) / items,
        "verify_cost_actor_ms_per_item_old": 1000 * old_item,
        "verify_cost_actor_ms_per_item_new": 1000 * new_item,
        "verify_cost_actor_new_over_old": new_item / old_item,
        "verify_cost_prep_ms_per_item_old_on_actor": 1000 * old_prep,
        "verify_cost_prep_ms_per_item_in_worker": 1000 * worker_prep,
        "verify_cost_prep_share_of_old_actor": old_prep / old_item,
        "verify_cost_inpaint_tiny_lama_ms_per_item": 1000 * inpaint,
        "verify_cost_old_over_inpaint": old_item / inpaint,
        "verify_cost_new_over_inpaint": new_item / inpaint,
    }


def run(work: Path, args: argparse.Namespace) -> dict[str, float]:
    return bench_verify_cost(work, args.verify_cost_images)


SECTION = Section(
    "verify-cost",
    run,
    args=(Arg("--verify-cost-images", {"type": int, "default": 24}),),
    note="Verification on the same pictures (the removed box, two kept boxes: 4 crops an item) "
    "with a random CLIP that takes CLIP's 224 px input but is tiny inside, one thread: the "
    "model actor's seconds per item on the old path (the processor resizes, crops and "
    "normalises there) and on the new one (the shard worker resized and cropped; the actor "
    "normalises and embeds); the processor alone as the actor ran it, against the worker's "
    "prepare_verify; next to the tiny LaMa's seconds per item (batch 8). With ViT-L/14 on a "
    "GPU the model part grows; the sizing rule is steps.verify_gpu_share.",
)
