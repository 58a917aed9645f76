"""The distribution's name and version: a leaf that imports nothing, so that any module (and
``pyproject.toml``'s dynamic version) reads them without importing the package root."""

__version__ = "0.2.0"

DISTRIBUTION = "counterfactual-vl"
"""The name to ``pip install`` (``counterfactual`` on PyPI is an unrelated project)."""
