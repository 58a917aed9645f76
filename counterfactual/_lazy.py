"""Import optional heavy dependencies with an install hint when they are missing."""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, extra: str) -> ModuleType:
    """Import ``module`` or raise ``ImportError`` saying which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as err:
        raise ImportError(
            f"{module!r} is needed here but not installed: pip install 'counterfactual[{extra}]'"
        ) from err
