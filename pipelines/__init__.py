"""Ray orchestration for ``counterfactual``: the library's shard makers and model steps as Ray
actors (:mod:`counterfactual.pipelines.synth`), the gallery's class mentions on Ray Data
(:mod:`counterfactual.pipelines.mentions`). Installed as ``counterfactual.pipelines`` from the
repository's ``pipelines/`` folder, with the bundled synth configs in ``configs/``.

``ray`` is imported here and nowhere else in ``counterfactual``.
"""
