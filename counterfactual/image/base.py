"""What every eraser shares: the request, the editor protocol and how a backend declares itself.

Images are ``uint8`` RGB arrays of shape ``(H, W, 3)``; masks are ``uint8`` arrays of shape
``(H, W)`` with 255 = repaint and 0 = keep. A backend is one module that defines its config (a
frozen dataclass whose fields declare their options as every config does,
:func:`counterfactual.options.declare`, and how runs record them, :func:`recorded`), its editor
class and an :class:`Eraser` naming both and the model it loads; :mod:`counterfactual.image`
registers it, and ``ImageConfig``, the flat layout, ``make_editor`` and the command line follow
from the declarations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, field, fields, is_dataclass
from typing import Any, Protocol

import numpy as np

from counterfactual.imageio import SampleError
from counterfactual.options import Declared, declared


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


_RECORD = "counterfactual.image.record"


@dataclass(frozen=True, slots=True)
class Recorded:
    """How runs record one field of an eraser's config, beyond its command-line option.

    ``flat`` is its key in the flat layout (``manifest.json``, the fingerprint,
    ``ImageConfig.from_flat``; ``""``: the field's name); a key two backends declare
    (``model``, ``crop_padding``) is shared and goes to the chosen backend's part. ``sparse``
    (options added after format 2): recorded only when not at its default, so a run at the
    defaults records what format 2 did. ``runtime``: how the model runs, not what it makes
    (never recorded, never in the fingerprint)."""

    flat: str = ""
    sparse: bool = False
    runtime: bool = False


def recorded(flat: str = "", *, sparse: bool = False, runtime: bool = False) -> dict[str, Any]:
    """The field metadata of :class:`Recorded`: ``declare(..., metadata=recorded(...))`` for a
    field with a command-line option, ``field(default=..., metadata=recorded(...))`` for one
    without."""
    return {_RECORD: Recorded(flat, sparse, runtime)}


@dataclass(frozen=True, slots=True)
class Option:
    """One field of a backend's config as the registry reads it, from the field's declarations:
    its option (:func:`counterfactual.options.declare`; ``None``: not on the command line) and
    how runs record it (:class:`Recorded`; absent: under the field's name, always)."""

    field: str
    flat: str
    declared: Declared | None = None
    sparse: bool = False
    runtime: bool = False

    @property
    def cli(self) -> str:
        """Its command-line flag (``""``: none)."""
        return self.declared.flags[0] if self.declared is not None else ""


def field_options(config: type, sparse: bool = False) -> tuple[Option, ...]:
    """One :class:`Option` per field of ``config``, in field order; ``sparse``: every one
    recorded only when set (a plugin's)."""
    declared_of = {d.field: d for d in declared(config)}
    out = []
    for f in fields(config):
        record = f.metadata.get(_RECORD, Recorded())
        out.append(
            Option(
                f.name,
                record.flat or f.name,
                declared_of.get(f.name),
                sparse=record.sparse or sparse,
                runtime=record.runtime,
            )
        )
    return tuple(out)


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
    inpainter; the fills serve ``zero``, ``mean``, ``blur``); ``config`` its frozen dataclass,
    whose fields declare their options (:func:`counterfactual.options.declare`) and how runs
    record them (:func:`recorded`): ``options`` (one :class:`Option` per field) follows;
    ``sparse``: every option recorded only when set (a plugin's, so installing one changes no
    other run's record). ``model`` the field naming the model it
    loads (``""``: none, a CPU backend); ``seeded``: its output depends on the request's seed
    (best-of-n draws candidates from it); ``build`` makes the editor; ``summary`` is the
    command line's one phrase about it; ``region`` (:data:`Region`, optional) lets a runner send
    the model only the crop it edits. ``model_file``: its model is one local file (LaMa's
    TorchScript), not a hub id or folder; ``candidates`` the field holding best-of-n's count
    (``""``: no best-of-n)."""

    name: str
    config: type
    build: Build
    summary: str
    methods: tuple[str, ...] = ("inpaint",)
    model: str = ""
    seeded: bool = False
    region: Region | None = None
    model_file: bool = False
    candidates: str = ""
    sparse: bool = False
    options: tuple[Option, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not is_dataclass(self.config):
            raise ValueError(f"eraser {self.name!r}: its config must be a dataclass")
        options = field_options(self.config, self.sparse)
        flat = [o.flat for o in options]
        twice = sorted({k for k in flat if flat.count(k) > 1})
        if twice:
            raise ValueError(f"eraser {self.name!r}: two fields are recorded as {twice}")
        object.__setattr__(self, "options", options)
        names = [o.field for o in options]
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
