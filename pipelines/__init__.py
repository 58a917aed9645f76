"""Ray orchestration for ``counterfactual``: the library's shard makers and model steps as Ray
actors (:mod:`counterfactual.pipelines.synth`), the gallery's class mentions on Ray Data
(:mod:`counterfactual.pipelines.mentions`). Installed as ``counterfactual.pipelines`` from the
repository's ``pipelines/`` folder, with the bundled synth configs in ``configs/``.

``ray`` is imported here and nowhere else in ``counterfactual``.
"""

from __future__ import annotations

from types import ModuleType


def require_ray() -> ModuleType:
    """``ray``, or :class:`~counterfactual._lazy.MissingExtra` naming the extra that installs
    it: what ``--runner ray`` checks before it starts anything."""
    from counterfactual._lazy import require

    return require("ray", "ray")
