"""The packages to install (pyproject.toml holds everything else): every package under
``counterfactual/``, and the repository's ``pipelines/`` folder (Ray orchestration and the
bundled configs) as ``counterfactual.pipelines``, so nothing generic lands at the top of
site-packages. A source checkout without an install finds it the same way
(``counterfactual/__init__.py``)."""

from setuptools import find_namespace_packages, setup

setup(
    packages=[
        *find_namespace_packages(include=["counterfactual*"], exclude=["*__pycache__*"]),
        "counterfactual.pipelines",
        "counterfactual.pipelines.configs",  # data only: the YAML files
    ],
    package_dir={"counterfactual.pipelines": "pipelines"},
)
