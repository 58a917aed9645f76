"""Ray orchestration for ``counterfactual``: the library's shard makers and model steps as Ray
actors (:mod:`pipelines.synth`), the gallery's class mentions on Ray Data
(:mod:`pipelines.mentions`).

``ray`` is imported here and nowhere in ``counterfactual/``.
"""
