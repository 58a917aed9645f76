"""counterfactual: object-removal counterfactuals for image-text data (Kim et al., 2023) and
the tools around them. See ARCHITECTURE.md for the map of modules.

``counterfactual.edit`` (with ``Editor``, ``EditResult``, ``EditError``) is the one-call API
of :mod:`counterfactual.api`, imported on first use so that ``import counterfactual`` stays
cheap (no NumPy, OpenCV or spaCy until then)."""

import importlib.util
import sys
from pathlib import Path
from typing import Any

from counterfactual._version import DISTRIBUTION, __version__


class _CheckoutPipelines:
    """Imports ``counterfactual.pipelines`` from a source checkout's ``pipelines/`` folder.

    An install puts that folder at ``counterfactual/pipelines`` (setup.py); a checkout run
    without one (``PYTHONPATH=.``, ``python -m counterfactual`` in the repository) keeps it
    beside this package, where this finder, first on ``sys.meta_path``, finds it. It answers
    for that one name only; its submodules come from the package's ``__path__``."""

    name = f"{__name__}.pipelines"

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        if fullname != self.name:
            return None
        return importlib.util.spec_from_file_location(
            fullname, self.folder / "__init__.py", submodule_search_locations=[str(self.folder)]
        )


def _find_checkout_pipelines() -> None:
    here = Path(__file__).resolve().parent
    folder = here.parent / "pipelines"
    if (here / "pipelines").is_dir() or not (here.parent / "setup.py").is_file():
        return  # installed: counterfactual/pipelines is a package of its own
    if (folder / "__init__.py").is_file() and not any(
        isinstance(f, _CheckoutPipelines) for f in sys.meta_path
    ):
        sys.meta_path.insert(0, _CheckoutPipelines(folder))


_find_checkout_pipelines()


_API = ("edit", "Editor", "EditResult", "EditError")
__all__ = ["__version__", "DISTRIBUTION", *_API]


def __getattr__(name: str) -> Any:
    if name in _API:
        from counterfactual import api

        return getattr(api, name)
    raise AttributeError(f"module 'counterfactual' has no attribute {name!r}")
