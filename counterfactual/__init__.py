"""counterfactual: object-removal counterfactuals for image-text data (Kim et al., 2023) and
the tools around them. See ARCHITECTURE.md for the map of modules.

``counterfactual.edit`` (with ``Editor``, ``EditResult``, ``EditError``) is the one-call API
of :mod:`counterfactual.api`, imported on first use so that ``import counterfactual`` stays
cheap (no NumPy, OpenCV or spaCy until then)."""

from typing import Any

from counterfactual._version import DISTRIBUTION, __version__

_API = ("edit", "Editor", "EditResult", "EditError")
__all__ = ["__version__", "DISTRIBUTION", *_API]


def __getattr__(name: str) -> Any:
    if name in _API:
        from counterfactual import api

        return getattr(api, name)
    raise AttributeError(f"module 'counterfactual' has no attribute {name!r}")
