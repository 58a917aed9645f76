"""Import optional heavy dependencies with an install hint when they are missing or broken."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import re
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType

from counterfactual._version import DISTRIBUTION

_CHECK_TORCHVISION = ("transformers", "diffusers")
"""Libraries whose vision models import torchvision when it is installed."""
_BROKEN = (RuntimeError, ImportError, OSError, AttributeError)


class BrokenDependency(ValueError):
    """An installed package that fails at import; the message says how to fix it, on one line."""


class MissingExtra(ImportError):
    """An optional dependency that is not installed; the message names the extra that installs
    it, on one line (the CLI prints it and exits 2)."""


def extra_hint(extra: str) -> str:
    """The command that installs one of the distribution's extras, one that works while no
    release is on a package index (``pip install 'counterfactual-vl[models]'`` finds nothing,
    and there is no tag or public URL for a ``git+https://...@vX.Y.Z`` line yet): from the
    clone. Run from a checkout (an editable install, ``PYTHONPATH``), the clone's own path;
    else ``pip install '.[EXTRA]'`` in the clone it was installed from."""
    root = checkout_root()
    if root is not None:
        return f"pip install -e '{root}[{extra}]'"
    return f"pip install '.[{extra}]' in your clone of {DISTRIBUTION} (not on a package index yet)"


def checkout_root() -> Path | None:
    """The source checkout this package is imported from (the folder with its
    ``pyproject.toml`` and ``setup.py``), or ``None`` for an installed copy."""
    root = Path(__file__).resolve().parent.parent
    if (root / "setup.py").is_file() and (root / "pyproject.toml").is_file():
        return root
    return None


def require(module: str, extra: str) -> ModuleType:
    """Import ``module`` or raise :class:`MissingExtra` saying which extra installs it.

    Before transformers or diffusers, :func:`check_torchvision`: a broken torchvision makes
    their vision models fail at load time with an error that does not name it.
    """
    if module in _CHECK_TORCHVISION:
        check_torchvision()
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise MissingExtra(
            f"{module.partition('.')[0]} is needed here but not installed "
            f"({' '.join(str(err).split())}): {extra_hint(extra)}"
        ) from err


def require_extras(needed: Mapping[str, str]) -> None:
    """Raise one :class:`MissingExtra` naming every extra whose module is not installed
    (``needed``: module -> extra), so a user installs them in one go; imports none of them
    (only :mod:`counterfactual.pipelines` imports ``ray``)."""
    missing: dict[str, str] = {}
    for module, extra in needed.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:
            found = False
        if not found:
            missing.setdefault(extra, module)
    if missing:
        modules = " and ".join(missing.values())
        verb = "is" if len(missing) == 1 else "are"
        raise MissingExtra(
            f"{modules} {verb} needed here but not installed: {extra_hint(','.join(missing))}"
        )


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def matching_torchvision(torch_version: str | None) -> str | None:
    """The torchvision release series built for a torch version (``"2.13.0+cpu"`` ->
    ``"0.28.*"``: torch 2.N pairs with torchvision 0.(N+15)), or ``None`` when unknown."""
    found = re.match(r"2\.(\d+)\.", torch_version or "")
    return f"0.{int(found.group(1)) + 15}.*" if found else None


def check_torchvision() -> None:
    """Raise :class:`BrokenDependency` when torchvision is installed but fails at import (e.g.
    PyPI's CUDA build beside a CPU torch: ``operator torchvision::nms does not exist``).

    An absent torchvision is fine: transformers then uses its PIL image processors.
    """
    try:
        importlib.import_module("torchvision")
    except ModuleNotFoundError as err:
        if err.name == "torchvision":
            return
        raise _broken(err) from err
    except _BROKEN as err:
        raise _broken(err) from err


def install_hint(torch_version: str | None) -> str:
    """The pip command that installs the torchvision built for this torch: from PyTorch's index
    for its CPU or CUDA build (``+cpu``, ``+cu128``), from PyPI for PyPI's own torch."""
    series = matching_torchvision(torch_version)
    pin = f"'torchvision=={series}'" if series else "torchvision"
    local = (torch_version or "").partition("+")[2]
    if re.fullmatch(r"cpu|cu\d+|rocm[\d.]+", local):
        return f"pip install {pin} --index-url https://download.pytorch.org/whl/{local}"
    return f"pip install {pin}"


def _broken(err: BaseException) -> BrokenDependency:
    vision = _version("torchvision") or "(version unknown)"
    torch = _version("torch")
    cause = " ".join(str(err).split()) or type(err).__name__
    return BrokenDependency(
        f"torchvision {vision} is installed but does not work with torch "
        f"{torch or '(not installed)'} ({cause}): install the build that matches torch "
        f"({install_hint(torch)}) or pip uninstall torchvision (transformers then uses its "
        "slower PIL image processors)"
    )
