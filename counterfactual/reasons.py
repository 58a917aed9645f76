"""Every ``reason`` a row of ``status.jsonl`` can carry, with its status and what it means.

This is the list the README shows (``python -m counterfactual.reasons`` prints its table; a
test checks that the README holds it and that every reason the code writes is listed here).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Reason:
    status: str
    """``skipped`` (nothing went wrong, there is nothing to do) or ``failed``."""
    meaning: str
    where: str
    """The part of the run that writes it: ``reader``, ``plan``, ``decode``, ``steps``."""


REASONS: dict[str, Reason] = {
    # the plan: the alpha rules and the policy (SPEC 1.1)
    "fewer-than-two-classes": Reason(
        "skipped", "the image has fewer than two object classes: nothing to keep beside", "plan"
    ),
    "no-removable-class": Reason(
        "skipped", "no class passes the alpha rules (detail: each class's rejection)", "plan"
    ),
    "not-drawn": Reason(
        "skipped", "a valid plan the uniform or spurious policy did not choose", "plan"
    ),
    "caption-unchanged": Reason(
        "skipped", "the caption names no removed class (--skip-unchanged-captions)", "steps"
    ),
    # the reader: the annotations and the files they name
    "bad-annotation": Reason(
        "failed",
        "a malformed annotation, category, caption entry or image size (detail: the entry, "
        "its field and value)",
        "reader",
    ),
    "duplicate-id": Reason(
        "failed",
        "an image id seen before in the same input (the first one is processed), or an image "
        "with a COCO annotation whose id an earlier annotation has",
        "plan",
    ),
    "duplicate-key": Reason(
        "failed",
        "a corpus key seen before in the run (in its tar, table or folder, or an earlier "
        "one: the first in piece order is processed)",
        "reader",
    ),
    "unsafe-path": Reason(
        "failed",
        "a file a dataset names (picture, caption, metadata, shard, table) that leaves its root "
        "folder (absolute, .., a symlink out)",
        "reader",
    ),
    "no-caption": Reason("failed", "the image has no caption", "plan"),
    "too-many-boxes": Reason(
        "failed", "more boxes on the image than --max-boxes, refused before selection", "plan"
    ),
    "out-of-memory": Reason(
        "failed",
        "this picture's decode, selection or edit ran out of memory; the rest go on",
        "steps",
    ),
    "missing-annotation": Reason("failed", "Flickr30k: no annotation XML for the image", "reader"),
    "missing-sentences": Reason("failed", "Flickr30k: no sentence file for the image", "reader"),
    "missing-image": Reason("failed", "a corpus row or sample names no picture", "reader"),
    "download-failed": Reason(
        "failed",
        "img2dataset could not download or resize this url (detail: its status, "
        "error_message and the url)",
        "reader",
    ),
    "bad-metadata": Reason(
        "failed",
        "a corpus sample's txt or json is not UTF-8, not JSON or too large (a table's caption "
        "cell too: over 1 MiB)",
        "reader",
    ),
    "bad-shard": Reason("failed", "a corpus file that cannot be read as a whole", "reader"),
    # the picture
    "missing-file": Reason("failed", "the picture (or corpus file) does not exist", "decode"),
    "unreadable": Reason(
        "failed", "the picture exists but cannot be read (permissions, I/O)", "decode"
    ),
    "read-error": Reason(
        "failed", "a picture inside a tar or Parquet file is not where its index says", "decode"
    ),
    "decode-error": Reason(
        "failed",
        "not a picture PIL decodes: corrupt, truncated, empty or an unknown format",
        "decode",
    ),
    "image-too-large": Reason(
        "failed",
        "more pixels than --max-pixels (decompression bombs), refused before decoding",
        "decode",
    ),
    "size-mismatch": Reason(
        "failed", "the picture's size is neither the annotated one nor its rotation", "decode"
    ),
    "exif-frame-mismatch": Reason(
        "failed",
        "the annotated size says the EXIF frame --exif-frame does not name (stored or oriented)",
        "decode",
    ),
    "exif-frame-unknown": Reason(
        "failed",
        "an EXIF-tagged picture whose size cannot tell the frame of its boxes, in a dataset "
        "annotated in both frames: give --exif-frame",
        "decode",
    ),
    # the steps
    "model-error": Reason(
        "failed", "a model step raised on this item (detail: the error)", "steps"
    ),
    "non-finite-output": Reason(
        "failed",
        "the inpainter's output has NaN or inf values (e.g. a float16 overflow); nothing pasted",
        "steps",
    ),
    "blank-output": Reason(
        "failed",
        "the inpainter's output is blank, one colour (all black: a safety checker, an "
        "overflow); nothing pasted",
        "steps",
    ),
    "empty-caption": Reason(
        "failed",
        "the rewritten caption has no words left (np-removal, captioner, perturb)",
        "steps",
    ),
    "caption-still-names": Reason(
        "failed",
        "the new caption still names a removed class (np-removal, prompt, captioner; detail: "
        "the classes and the caption): a wrong training pair, not written",
        "steps",
    ),
    "class-not-in-vocabulary": Reason(
        "failed",
        "the caption vocabulary (--vocabulary, default COCO's) has no words for a removed "
        "class: the caption can be neither cut nor checked (detail: the classes)",
        "steps",
    ),
    "nothing-kept": Reason("failed", "prompt: no kept class to name", "steps"),
    "no-image": Reason("failed", "captioner: the item has no picture", "steps"),
    "bad-image": Reason("failed", "captioner: the picture is not an RGB array", "steps"),
    "encode-error": Reason("failed", "the edited picture cannot be encoded as JPEG", "steps"),
    "verify-removal": Reason(
        "failed", "--filter: a removed class is still in the verifier's top k", "steps"
    ),
    "verify-retention": Reason(
        "failed", "--filter: a kept class fell out of the verifier's top k", "steps"
    ),
    "verify-text": Reason("failed", "--filter: the caption still names a removed class", "steps"),
    "verify-unknown-class": Reason(
        "failed", "--verify: a class the verifier's vocabulary lacks", "steps"
    ),
}


def markdown_table() -> str:
    """The README's table of reasons, in :data:`REASONS` order."""
    lines = ["| reason | status | meaning |", "|---|---|---|"]
    lines += [f"| `{name}` | {r.status} | {r.meaning} |" for name, r in REASONS.items()]
    return "\n".join(lines)


def no_samples_line(counts: Mapping[str, int], inputs: Any, unit: str = "images") -> str:
    """Why a run holds no samples, in one line: its status rows by reason, most first, each
    with what it means (:data:`REASONS`)."""
    rows = sorted(((n, key) for key, n in counts.items() if key != "written"), reverse=True)
    if not rows:
        return f"No samples: the run read {inputs} input {unit} and wrote no status row."
    why = []
    for n, key in rows:
        status, _, reason = key.partition(":")
        known = REASONS.get(reason)
        meaning = f" ({known.meaning})" if known is not None else ""
        why.append(f"{n:,} {status} {reason}{meaning}")
    return (
        f"No samples: none of the {inputs} input {unit} made one; status.jsonl says why: "
        + "; ".join(why)
    )


if __name__ == "__main__":
    sys.stdout.write(markdown_table() + "\n")
