"""What every eraser shares: the request, the editor protocol and how a backend declares itself.

Images are ``uint8`` RGB arrays of shape ``(H, W, 3)``; masks are ``uint8`` arrays of shape
``(H, W)`` with 255 = repaint and 0 = keep. A backend is one module that defines its config (a
frozen dataclass), its editor class and an :class:`Eraser` naming both, the options a user sets
(:class:`Option`: the flat key runs record, the command-line flag, the help) and the model it
loads; :mod:`counterfactual.image` registers it, and ``ImageConfig``, the flat layout,
``make_editor`` and the command line follow from the declarations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, fields
from typing import Any, Protocol

import numpy as np

from counterfactual.imageio import SampleError


@dataclass(frozen=True, slots=True)
class EditRequest:
    """One image to edit: ``image`` (H, W, 3) uint8 RGB, ``mask`` (H, W) uint8, 255 = repaint."""

    image: np.ndarray
    mask: np.ndarray
    removed: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()
    seed: int = 0


Edited = np.ndarray | SampleError
"""One request's result: the edited image, or the per-sample failure of a model output that is
not a picture (``non-finite-output``, ``blank-output``: :func:`output_failure`)."""


class ImageEditor(Protocol):
    """An image backend: loads what it needs in ``__init__``, edits a batch per call."""

    def describe(self) -> dict[str, Any]:
        """What to record in each sample's metadata (method, model id, parameters)."""
        ...

    def __call__(self, batch: Sequence[EditRequest]) -> list[Edited]:
        """One result per request: an image of the input's shape and dtype, or a
        :class:`SampleError` for a request whose model output failed its check."""
        ...


@dataclass(frozen=True, slots=True)
class Option:
    """One field of a backend's config as users and runs name it.

    ``flat`` is its key in the flat layout (``manifest.json``, the fingerprint,
    ``ImageConfig.from_flat``); a key two backends declare (``model``, ``crop_padding``) is
    shared and goes to the chosen backend's part. ``cli`` is its command-line flag (``""``: not
    on the command line). ``sparse`` (options added after format 2): recorded only when not at
    its default, so a run at the defaults records what format 2 did. ``runtime``: how the
    model runs, not what it makes (never recorded, never in the fingerprint)."""

    field: str
    flat: str
    help: str
    cli: str = ""
    kind: str = "text"
    choices: tuple[str, ...] = ()
    sparse: bool = False
    runtime: bool = False


OPTION_KINDS = (
    "text",
    "flag",
    "positive_int",
    "nonnegative_int",
    "positive_float",
    "nonnegative_float",
    "positive_fraction",
)

Build = Callable[..., ImageEditor]
"""``build(part, method=, device=, dtype=, batch_size=)``: the editor of a backend's config."""
Box = tuple[int, int, int, int]
Region = Callable[[Any, np.ndarray], Box | None]
"""``region(part, mask)``: the crop ``(x0, y0, x1, y1)`` (exclusive ends) a backend reads and
writes for ``mask``; editing that crop as a picture of its own gives the same pixels there, and
every pixel outside it is the input's. ``None``: an empty mask."""


@dataclass(frozen=True, slots=True)
class Eraser:
    """A backend as it declares itself, read without loading anything.

    ``name`` is its part of ``ImageConfig`` and, for an inpainter, its ``--inpaint-backend``
    value; ``methods`` the ``--image-method`` values it serves (``("inpaint",)`` for an
    inpainter; the fills serve ``zero``, ``mean``, ``blur``); ``config`` its frozen dataclass
    and ``options`` one :class:`Option` per field; ``model`` the field naming the model it
    loads (``""``: none, a CPU backend); ``seeded``: its output depends on the request's seed
    (best-of-n draws candidates from it); ``build`` makes the editor; ``summary`` is the
    command line's one phrase about it; ``region`` (:data:`Region`, optional) lets a runner send
    the model only the crop it edits. ``model_file``: its model is one local file (LaMa's
    TorchScript), not a hub id or folder; ``candidates`` the field holding best-of-n's count
    (``""``: no best-of-n)."""

    name: str
    config: type
    options: tuple[Option, ...]
    build: Build
    summary: str
    methods: tuple[str, ...] = ("inpaint",)
    model: str = ""
    seeded: bool = False
    region: Region | None = None
    model_file: bool = False
    candidates: str = ""

    def __post_init__(self) -> None:
        names = [f.name for f in fields(self.config)]
        declared = [o.field for o in self.options]
        if sorted(names) != sorted(declared):
            raise ValueError(
                f"eraser {self.name!r}: options {declared} must name each field of "
                f"{self.config.__name__} once ({names})"
            )
        for option in self.options:
            if option.kind not in OPTION_KINDS:
                raise ValueError(
                    f"eraser {self.name!r}: option {option.flat!r} kind {option.kind!r}"
                )
        for role in ("model", "candidates"):
            named = getattr(self, role)
            if named and named not in names:
                raise ValueError(f"eraser {self.name!r}: {role} field {named!r} is not a field")
        if self.candidates and not self.seeded:
            raise ValueError(f"eraser {self.name!r}: candidates (best-of-n) needs seeded")

    def model_option(self) -> Option | None:
        """The option naming the model it loads (``None``: it loads none)."""
        return next((o for o in self.options if self.model and o.field == self.model), None)

    def default(self, field_name: str) -> Any:
        """The config's default for ``field_name``."""
        for f in fields(self.config):
            if f.name == field_name:
                if f.default is not MISSING:
                    return f.default
                if f.default_factory is not MISSING:
                    return f.default_factory()
        raise KeyError(field_name)


def at_least(name: str, value: float, low: float) -> None:
    """``ValueError`` naming ``name`` unless ``value >= low``."""
    if not value >= low:
        raise ValueError(f"{name} must be >= {low}, got {value}")


BLANK_RANGE = 1.0 / 255.0
"""A model output whose values span less than this (of the 0-1 range) is blank."""


def output_failure(output: np.ndarray, what: str) -> SampleError | None:
    """The per-sample failure of a model's output, or ``None`` when it is a picture: any NaN or
    inf is ``non-finite-output``; an output whose values all lie within :data:`BLANK_RANGE` of
    each other (all black, one colour: a safety checker's blank, an fp16 overflow) is
    ``blank-output``. ``output`` is float in [0, 1] or uint8 (scaled to [0, 1])."""
    values = np.asarray(output)
    if values.dtype == np.uint8:
        values = values.astype(np.float32) / 255.0
    finite = np.isfinite(values)
    if not finite.all():
        bad = int(values.size - finite.sum())
        return SampleError("non-finite-output", f"{what}: {bad} of {values.size} values NaN/inf")
    spread = float(values.max() - values.min()) if values.size else 0.0
    if spread < BLANK_RANGE:
        return SampleError(
            "blank-output", f"{what}: every value within {spread:.4g} of {float(values.min()):.4g}"
        )
    return None
