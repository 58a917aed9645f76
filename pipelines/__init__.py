"""Ray orchestration for ``counterfactual``: wires the library's steps into Ray Data stages.

``ray`` is imported here and nowhere in ``counterfactual/``. See :mod:`pipelines.synth`.
"""
