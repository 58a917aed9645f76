"""A complete, valid sample json (:class:`counterfactual.shards.samples.SampleMeta`) for tests that
write shards by hand."""

from __future__ import annotations

from typing import Any

from counterfactual.method.selection import PlanMeta
from counterfactual.shards.samples import SampleMeta


def sample_json(
    image_id: str = "1",
    removed: tuple[str, ...] | list[str] = ("dog",),
    kept: tuple[str, ...] | list[str] = ("person",),
    caption: str = "a caption",
    **fields: Any,
) -> dict[str, Any]:
    """The json of a sample of ``image_id`` whose plan removed ``removed`` and kept ``kept``;
    ``fields`` replace any other top-level value."""
    removed, kept = tuple(removed), tuple(kept)
    plan = PlanMeta(
        image_id, removed[0] if removed else "", removed, kept, "single", True, None, {},
        ((1.0, 2.0, 3.0, 4.0),),
    )  # fmt: skip
    meta = SampleMeta(
        key=f"{image_id}_0",
        dataset="test",
        split="test",
        image_id=image_id,
        file=f"{image_id}.jpg",
        width=8,
        height=8,
        caption_id="0",
        original_caption=f"{caption} with a {' and a '.join(removed)}",
        caption=caption,
        removed_phrases=tuple(f"a {c}" for c in removed),
        plan=plan,
        mask_boxes=plan.mask_boxes,
        mask_pixels=12,
        image_method={"method": "blur", "sigma": 8.0},
        text_method={"method": "np-removal"},
        seed=0,
        sample_seed=1,
        counterfactual_version="0.1.0",
    )
    return {**meta.to_dict(), **fields}
