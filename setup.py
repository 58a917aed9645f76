"""The packages to install (pyproject.toml holds everything else): every package under
``counterfactual/``, ``counterfactual.pipelines`` (Ray orchestration and the bundled configs)
included, so nothing generic lands at the top of site-packages."""

from setuptools import find_namespace_packages, setup

setup(packages=find_namespace_packages(include=["counterfactual*"], exclude=["*__pycache__*"]))
