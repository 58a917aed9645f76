"""Ray orchestration for ``counterfactual``: the library's shard makers and model steps as Ray
actors (:mod:`counterfactual.pipelines.synth`), the gallery's class mentions on Ray Data
(:mod:`counterfactual.pipelines.mentions`). The bundled synth configs are in ``configs/``
(package data), the cluster-launcher config in ``cluster/``.

``ray`` is imported here and nowhere else in ``counterfactual``.
"""
