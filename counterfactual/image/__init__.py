"""Image synthesis: erase the removed objects from an image.

Every backend is a small callable behind :class:`ImageEditor`. Images are ``uint8`` RGB arrays
of shape ``(H, W, 3)``; masks are ``uint8`` arrays of shape ``(H, W)`` with 255 = repaint and
0 = keep. Pixels where the mask is 0 come back unchanged, whatever the backend (a feathered
paste changes the ``feather`` pixels next to the mask too, nothing farther).

A backend is one module that declares itself (:class:`~counterfactual.image.base.Eraser`: its
name, config and model; its config's fields declare their options) and one line in :data:`BUILT_IN`, or a package's entry point in
the group ``counterfactual.erasers`` (:mod:`counterfactual.plugins`); :class:`ImageConfig` (one
part per backend), the flat layout runs record (:data:`FLAT_KEYS`), :func:`make_editor` and the
command line's image options (:func:`cli_options`) all follow from the declarations.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, make_dataclass, replace
from typing import Any

import numpy as np

from counterfactual import plugins
from counterfactual.image import diffusion, exemplar, fills, lama, opencv_inpaint
from counterfactual.image.base import Edited, EditRequest, Eraser, ImageEditor, Option
from counterfactual.image.diffusion import RECIPES, DiffusersConfig
from counterfactual.image.exemplar import ExemplarConfig
from counterfactual.image.fills import FILL_METHODS, FillConfig
from counterfactual.image.lama import LamaConfig
from counterfactual.image.opencv_inpaint import OPENCV_ALGORITHMS, OpenCVConfig
from counterfactual.options import Declared
from counterfactual.options import option as cli_option

BUILT_IN: tuple[Eraser, ...] = (
    fills.ERASER,
    opencv_inpaint.ERASER,
    diffusion.ERASER,
    lama.ERASER,
    exemplar.ERASER,
)
"""The erasers this package ships, in registration order."""
_RESERVED = ("method", "backend", "flat", "from_flat")
"""Names an eraser's part of :class:`ImageConfig` cannot have."""


def _plugin_problem(
    erasers: Mapping[str, Eraser], plugin: plugins.Plugin, eraser: Any
) -> str | None:
    """Why a plugin's object cannot join ``erasers`` (``None``: it can)."""
    if not isinstance(eraser, Eraser):
        return f"{type(eraser).__name__} is not a counterfactual.image.Eraser"
    if eraser.name != plugin.name:
        return f"the eraser is named {eraser.name!r}, its entry point {plugin.name!r}"
    if not eraser.name.isidentifier() or eraser.name in _RESERVED:
        return f"{eraser.name!r} cannot name a part of ImageConfig"
    served = {m for e in erasers.values() for m in e.methods if m != "inpaint"}
    clash = sorted(served.intersection(eraser.methods))
    if clash:
        return f"image method(s) {clash} are served already"
    fields_of = {o.flat: o.field for e in erasers.values() for o in e.options}
    flags = {o.cli: o.flat for e in erasers.values() for o in e.options if o.cli}
    for option in eraser.options:
        if option.flat in ("method", "backend") or fields_of.get(option.flat, option.field) != (
            option.field
        ):
            return f"option {option.flat!r} is another eraser's, for another field"
        if option.cli and flags.get(option.cli, option.flat) != option.flat:
            return f"flag {option.cli} is another eraser's option"
    return None


def _registered() -> dict[str, Eraser]:
    """The built-ins, then every plugin (:mod:`counterfactual.plugins`): a plugin's options
    recorded only when set (``sparse``), so installing one changes no other run's record."""
    erasers = {e.name: e for e in BUILT_IN}
    found = plugins.load(plugins.ERASERS, erasers, lambda p, e: _plugin_problem(erasers, p, e))
    for _, eraser in found:
        erasers[eraser.name] = replace(eraser, sparse=True)
    return erasers


ERASERS: dict[str, Eraser] = _registered()
"""Every backend, by name, in registration order (:data:`BUILT_IN`, then the plugins of the
``counterfactual.erasers`` entry points): the order of :class:`ImageConfig`'s parts and of the
choices on the command line; a shared flat key the chosen backend lacks is read from the first
backend that declares it (:func:`flat_owner`)."""

INPAINT_BACKENDS = tuple(name for name, e in ERASERS.items() if "inpaint" in e.methods)
IMAGE_METHODS = ("inpaint", *(m for e in ERASERS.values() for m in e.methods if m != "inpaint"))

_FORMAT2_ORDER = (
    "method",
    "backend",
    "blur_sigma",
    "opencv_algorithm",
    "opencv_radius",
    "opencv_max_side",
    "lama_max_side",
    "model",
    "steps",
    "guidance_scale",
    "strength",
    "prompt",
    "negative_prompt",
    "resolution",
    "candidates",
    "crop_padding",
)
"""The order runs of format 2 recorded the image options in; it stays, keys added since
follow in declaration order."""


def _flat_keys() -> tuple[dict[str, tuple[str, str]], dict[str, Option]]:
    owners: dict[str, list[tuple[str, str]]] = {}
    options: dict[str, Option] = {}
    for eraser in ERASERS.values():
        for option in eraser.options:
            owners.setdefault(option.flat, []).append((eraser.name, option.field))
            options.setdefault(option.flat, option)
    keys: dict[str, tuple[str, str]] = {"method": ("", "method"), "backend": ("", "backend")}
    names = [k for k in _FORMAT2_ORDER if k in owners] + [k for k in owners if k not in keys]
    for key in dict.fromkeys(names):
        if key in keys:
            continue
        places = owners[key]
        if len(places) == 1:
            keys[key] = places[0]
        else:
            if len({f for _, f in places}) != 1:
                raise ValueError(f"shared image option {key!r} names different fields: {places}")
            keys[key] = ("*", places[0][1])
    return keys, options


FLAT_KEYS, FLAT_OPTIONS = _flat_keys()
"""The image options as one flat mapping, in the order runs record them (``manifest.json``,
the dataset card, the fingerprint) and the command line names them: each key's part of
:class:`ImageConfig` and field there (``""``: :class:`ImageConfig` itself; ``"*"``: a key
several backends declare, read from the chosen one's part, see :func:`flat_owner`).
``FLAT_OPTIONS``: each key's :class:`~counterfactual.image.base.Option`."""


def flat_owner(backend: str, key: str) -> str:
    """The part that holds a ``"*"`` key of :data:`FLAT_KEYS` for ``backend``: the backend's
    own when it declares the key, else the first registered backend's that does (OpenCV loads
    no model, so its ``model`` is the diffusers one, the one ``--inpaint-model`` always
    named)."""
    declaring = [e.name for e in ERASERS.values() if any(o.flat == key for o in e.options)]
    return backend if backend in declaring else declaring[0]


def eraser_of(method: str, backend: str) -> Eraser:
    """The backend that serves ``method`` (``inpaint``: ``backend``)."""
    if method == "inpaint":
        return ERASERS[backend]
    return next(e for e in ERASERS.values() if method in e.methods)


@dataclass(frozen=True, slots=True)
class _ImageBase:
    method: str = field(
        default="inpaint",
        metadata=cli_option(
            "how the removed area is erased: inpaint (with --inpaint-backend), or filled with "
            "zero (black), mean (the picture's mean colour) or blur (default: %(default)s)",
            choices=IMAGE_METHODS,
            flags=("--image-method",),
        ),
    )
    backend: str = field(
        default="opencv",
        metadata=cli_option(
            "inpainter of --image-method inpaint: "
            + ", ".join(e.summary for e in ERASERS.values() if "inpaint" in e.methods)
            + " (default: %(default)s)",
            choices=INPAINT_BACKENDS,
            flags=("--inpaint-backend",),
        ),
    )


def _check(self: Any) -> None:
    if self.method not in IMAGE_METHODS:
        raise ValueError(f"image method {self.method!r} is not one of {IMAGE_METHODS}")
    if self.backend not in INPAINT_BACKENDS:
        raise ValueError(f"inpaint backend {self.backend!r} is not one of {INPAINT_BACKENDS}")
    for eraser in ERASERS.values():
        if not isinstance(getattr(self, eraser.name), eraser.config):
            raise ValueError(f"ImageConfig.{eraser.name} must be a {eraser.config.__name__}")
    chosen = eraser_of(self.method, self.backend)
    for eraser in ERASERS.values():
        if _candidates(self, eraser) > 1 and eraser is not chosen:
            raise ValueError(
                f"candidates > 1 (best-of-n) needs --image-method inpaint --inpaint-backend "
                f"{eraser.name}: the other methods draw the same picture every time"
            )


def _candidates(config: Any, eraser: Eraser) -> int:
    return getattr(getattr(config, eraser.name), eraser.candidates) if eraser.candidates else 1


def _flat(self: Any) -> dict[str, Any]:
    """The options as one flat mapping (:data:`FLAT_KEYS`), the layout a run's fingerprint is
    computed from, so it stays put (a rerun of an existing OUT must match it): an option added
    after format 2 only when it is not at its default; how a model runs (``compile``,
    ``channels_last``) never."""
    out: dict[str, Any] = {}
    for key, (part, name) in FLAT_KEYS.items():
        part = flat_owner(self.backend, key) if part == "*" else part
        value = getattr(getattr(self, part) if part else self, name)
        option = FLAT_OPTIONS.get(key)
        if option is not None and (
            option.runtime or (option.sparse and value == ERASERS[part].default(name))
        ):
            continue
        out[key] = value
    return out


def _from_flat(cls: type, options: Mapping[str, Any]) -> Any:
    """The config of a flat mapping (:meth:`flat`'s keys, the command line's names; a missing
    key takes its default, or its recipe's value): a shared key (``model``, ``crop_padding``,
    ``feather``) goes to the part of the backend (:func:`flat_owner`)."""
    unknown = sorted(set(options) - set(FLAT_KEYS))
    if unknown:
        raise ValueError(f"unknown image option(s) {unknown}; known: {', '.join(FLAT_KEYS)}")
    top = {k: options[k] for k in ("method", "backend") if k in options}
    backend = top.get("backend", "opencv")
    if backend not in INPAINT_BACKENDS:
        raise ValueError(f"inpaint backend {backend!r} is not one of {INPAINT_BACKENDS}")
    parts: dict[str, dict[str, Any]] = {name: {} for name in ERASERS}
    for key, value in options.items():
        part, name = FLAT_KEYS[key]
        if part:
            parts[flat_owner(backend, key) if part == "*" else part][name] = value
    built = {}
    for name, eraser in ERASERS.items():
        given = parts[name]
        recipe = given.pop("recipe", "") if hasattr(eraser.config, "from_recipe") else ""
        if recipe:  # a part with recipes (diffusers): the recipe's values under the options
            built[name] = eraser.config.from_recipe(recipe, **given)
        else:
            built[name] = eraser.config(**given)
    return cls(**top, **built)


ImageConfig = make_dataclass(
    "ImageConfig",
    [(e.name, e.config, field(default_factory=e.config)) for e in ERASERS.values()],
    bases=(_ImageBase,),
    frozen=True,
    slots=True,
    namespace={
        "__post_init__": _check,
        "flat": _flat,
        "from_flat": classmethod(_from_flat),
        "__module__": __name__,
        "__doc__": """How to erase: ``method`` is one of :data:`IMAGE_METHODS`; ``backend``
    picks the inpainter when ``method == "inpaint"``. One part per backend (:data:`ERASERS`:
    ``fill``, ``opencv``, ``diffusers``, ``lama``, ``exemplar``), each read only by its backend; how a model
    runs (device, dtype, batch size) is passed to :func:`make_editor` (in a synthesis run:
    :class:`counterfactual.synth.plan.Runtime`).""",
    },
)


def image_model(config: ImageConfig) -> str | None:
    """The model the chosen backend loads (``None``: a CPU backend, no model)."""
    eraser = eraser_of(config.method, config.backend)
    return getattr(getattr(config, eraser.name), eraser.model) if eraser.model else None


def chosen_eraser(config: ImageConfig) -> Eraser:
    """The backend ``config`` erases with."""
    return eraser_of(config.method, config.backend)


def candidate_count(config: ImageConfig) -> int:
    """How many candidates the chosen backend draws per picture (best-of-n; 1: one, no
    scorer)."""
    return _candidates(config, chosen_eraser(config))


def make_editor(
    config: ImageConfig, *, device: str = "cpu", dtype: str = "float32", batch_size: int = 1
) -> ImageEditor:
    """The editor for ``config``, its backend given its own part; heavy libraries are imported
    only when a backend that needs them is built. ``device``, ``dtype`` and ``batch_size`` (crops
    per model call) are how a learned inpainter runs; the fills and OpenCV ignore them."""
    eraser = eraser_of(config.method, config.backend)
    return eraser.build(
        getattr(config, eraser.name),
        method=config.method,
        device=device,
        dtype=dtype,
        batch_size=batch_size,
    )


def edit_region(config: ImageConfig, mask: np.ndarray) -> tuple[int, int, int, int] | None:
    """The crop ``(x0, y0, x1, y1)`` the chosen backend reads and writes for ``mask`` (255 =
    repaint): editing that crop as a picture gives the same pixels, all others stay the
    input's. ``None``: the backend declares no region (send the whole picture), or the mask is
    empty."""
    eraser = eraser_of(config.method, config.backend)
    if eraser.region is None:
        return None
    return eraser.region(getattr(config, eraser.name), mask)


def recorded_mask(config: ImageConfig, mask: np.ndarray) -> np.ndarray:
    """The mask a sample records for ``mask`` (255 = repaint): the region the backend
    repaints. A backend whose config grows the mask (``grow`` > 0: RORem's recipe,
    ``--inpaint-grow``) repaints the grown region, so that is recorded; every other run records
    ``mask`` itself (the same array)."""
    backend = getattr(config, config.backend, None) if config.method == "inpaint" else None
    if not getattr(backend, "grow", 0):
        return mask
    from counterfactual.image.diffusion import grown_region

    return grown_region(backend, mask)


def cli_options() -> dict[str, Declared]:
    """The image options on the command line, by flat key in :data:`FLAT_KEYS` order, once per
    flag: each backend's declaration (:func:`counterfactual.options.declare`) as the command
    line adds it, unset (``None`` until given, so that a recipe's values hold where the user
    gave none) and its help ending in the default with the default backend chosen (a flag's
    help shows none)."""
    out: dict[str, Declared] = {}
    seen: set[str] = set()
    for key in FLAT_KEYS:
        option = FLAT_OPTIONS.get(key)
        if option is None or option.declared is None or option.cli in seen:
            continue
        seen.add(option.cli)
        spec = option.declared.option
        help = spec.help
        if spec.kind != "flag":
            default = flat_default(key, _ImageBase().backend)
            shown = f"'{default}'" if isinstance(default, str) else default
            if spec.choices:
                shown = "none" if default == "" else shown
            help = f"{help} (default: {shown})"
        out[key] = replace(option.declared, option=replace(spec, help=help, unset=True))
    return out


def flat_default(key: str, backend: str = "opencv") -> Any:
    """The default of flat key ``key`` with ``backend`` chosen."""
    part, name = FLAT_KEYS[key]
    if not part:
        return getattr(_ImageBase(), name)
    owner = flat_owner(backend, key) if part == "*" else part
    return ERASERS[owner].default(name)


__all__ = [
    "BUILT_IN",
    "ERASERS",
    "FILL_METHODS",
    "FLAT_KEYS",
    "FLAT_OPTIONS",
    "IMAGE_METHODS",
    "INPAINT_BACKENDS",
    "OPENCV_ALGORITHMS",
    "RECIPES",
    "DiffusersConfig",
    "EditRequest",
    "Edited",
    "Eraser",
    "ExemplarConfig",
    "FillConfig",
    "ImageConfig",
    "ImageEditor",
    "LamaConfig",
    "OpenCVConfig",
    "Option",
    "candidate_count",
    "chosen_eraser",
    "cli_options",
    "edit_region",
    "eraser_of",
    "flat_default",
    "flat_owner",
    "image_model",
    "make_editor",
    "recorded_mask",
]
