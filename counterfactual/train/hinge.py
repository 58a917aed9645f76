"""Sum-H and Max-H hinge losses over in-batch negatives (Akula et al., ACL 2020, section 5).

``scores`` is an ``(n, n)`` float tensor of a batch of ``n`` matched pairs: ``scores[i, j]``
is how well image ``i`` fits text ``j`` (higher is better, e.g. cosine similarity), and the
positives lie on the diagonal. Each anchor ``k`` pays in both directions, as in seed 003's
batch loss and VSE++ (Faghri et al., 2018), which it follows:

* image -> text: ``[margin - scores[k, k] + scores[k, j]]_+`` for its negative texts ``j``;
* text -> image: ``[margin - scores[k, k] + scores[i, k]]_+`` for its negative images ``i``.

Sum-H adds the hinges of all negatives of each direction, Max-H keeps the largest of each; the
two directions are added, and the anchors summed (``reduction="sum"``, VSE++'s choice; seed 003
does not say) or averaged (``"mean"``). The negatives of an anchor are the other ``n - 1``
samples of the batch, or ``negatives`` of them drawn at random per anchor and direction (seed
003's appendix samples 64 from a batch of 512 for both losses). ``exclude`` marks pairs that are
no negatives although off the diagonal, such as another caption of the same image.

Seed 003 writes its hinge over per-sample losses as ``[l(pos) - l(neg) - tau]_+``; with
``l = -score`` that only penalises a negative that beats its positive by more than ``tau``, so
the margin here has VSE++'s sign: a negative must score ``margin`` below its positive.

Torch (``pip install 'counterfactual-vl[models]'``) is imported when a function is called, not
with this module.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from counterfactual._lazy import require

if TYPE_CHECKING:
    import torch

LOSSES = ("sum-h", "max-h")
REDUCTIONS = ("sum", "mean")


def negative_mask(
    n: int,
    negatives: int | None = None,
    *,
    exclude: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Bool ``(n, n)``: row ``i`` is True at the negatives of anchor ``i``: every ``j != i``
    not in ``exclude``, or ``negatives`` of them drawn uniformly without replacement (all of
    them where there are no more). The draw comes from ``generator`` (CPU; torch's global one
    when ``None``)."""
    torch = require("torch", "models")

    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"in-batch negatives need a batch of 2 or more, got n={n!r}")
    allowed = ~torch.eye(n, dtype=torch.bool)
    if exclude is not None:
        if tuple(exclude.shape) != (n, n) or exclude.dtype != torch.bool:
            raise ValueError(
                f"exclude must be a bool tensor of shape ({n}, {n}), got "
                f"{exclude.dtype} {tuple(exclude.shape)}"
            )
        allowed &= ~exclude.cpu()
    if negatives is not None:
        if isinstance(negatives, bool) or not isinstance(negatives, int) or negatives < 1:
            raise ValueError(f"negatives must be a whole number >= 1 or None, got {negatives!r}")
        if negatives < n - 1:
            keys = torch.rand((n, n), generator=generator)
            keys[~allowed] = 2.0  # after every allowed one
            drawn = torch.zeros((n, n), dtype=torch.bool)
            drawn.scatter_(1, keys.argsort(dim=1)[:, :negatives], True)
            allowed &= drawn
    return allowed.to(device) if device is not None else allowed


def _hinges(
    scores: torch.Tensor,
    margin: float,
    negatives: int | None,
    generator: torch.Generator | None,
    exclude: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The hinge matrices of both directions, 0 where a pair is not a negative:
    ``image_text[k, j]`` (anchor image ``k``) and ``text_image[i, k]`` (anchor text ``k``)."""
    torch = require("torch", "models")

    if not isinstance(scores, torch.Tensor) or scores.ndim != 2:
        raise ValueError(f"scores must be a 2-D torch tensor, got {type(scores).__name__}")
    n = scores.shape[0]
    if scores.shape[1] != n:
        raise ValueError(f"scores must be square (n, n), got shape {tuple(scores.shape)}")
    if not scores.is_floating_point():
        raise ValueError(f"scores must be floating point, got {scores.dtype}")
    if (
        isinstance(margin, bool)
        or not isinstance(margin, int | float)
        or not math.isfinite(margin)
        or margin < 0
    ):
        raise ValueError(f"margin must be a finite number >= 0, got {margin!r}")
    rows = negative_mask(n, negatives, exclude=exclude, generator=generator, device=scores.device)
    exclude_t = None if exclude is None else exclude.T
    cols = negative_mask(
        n, negatives, exclude=exclude_t, generator=generator, device=scores.device
    ).T
    positive = scores.diagonal()
    zero = scores.new_zeros(())
    image_text = torch.where(rows, (margin - positive[:, None] + scores).clamp(min=0), zero)
    text_image = torch.where(cols, (margin - positive[None, :] + scores).clamp(min=0), zero)
    return image_text, text_image


def _reduce(per_anchor: torch.Tensor, reduction: str) -> torch.Tensor:
    if reduction == "sum":
        return per_anchor.sum()
    if reduction == "mean":
        return per_anchor.mean()
    raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")


def sum_hinge_loss(
    scores: torch.Tensor,
    margin: float,
    negatives: int | None = None,
    generator: torch.Generator | None = None,
    *,
    exclude: torch.Tensor | None = None,
    reduction: str = "sum",
) -> torch.Tensor:
    """Sum-H: for each anchor, the hinges of all its negatives (or ``negatives`` drawn ones)
    in both directions, summed; then summed or averaged over anchors. A 0-d tensor that
    carries gradients to ``scores``."""
    image_text, text_image = _hinges(scores, margin, negatives, generator, exclude)
    return _reduce(image_text.sum(dim=1) + text_image.sum(dim=0), reduction)


def max_hinge_loss(
    scores: torch.Tensor,
    margin: float,
    negatives: int | None = None,
    generator: torch.Generator | None = None,
    *,
    exclude: torch.Tensor | None = None,
    reduction: str = "sum",
) -> torch.Tensor:
    """Max-H: for each anchor, the largest hinge over its negatives (the hardest one; or over
    ``negatives`` drawn ones) in each direction, the two added; then summed or averaged over
    anchors. An anchor without negatives (all excluded) adds 0."""
    image_text, text_image = _hinges(scores, margin, negatives, generator, exclude)
    return _reduce(image_text.amax(dim=1) + text_image.amax(dim=0), reduction)


def hinge_loss(
    loss: str,
    scores: torch.Tensor,
    margin: float,
    negatives: int | None = None,
    generator: torch.Generator | None = None,
    *,
    exclude: torch.Tensor | None = None,
    reduction: str = "sum",
) -> torch.Tensor:
    """:func:`sum_hinge_loss` (``loss="sum-h"``) or :func:`max_hinge_loss` (``"max-h"``)."""
    if loss == "sum-h":
        fn = sum_hinge_loss
    elif loss == "max-h":
        fn = max_hinge_loss
    else:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    return fn(scores, margin, negatives, generator, exclude=exclude, reduction=reduction)
