"""Audits of an evaluation set across groups (GD-VCR, Yin et al., 2021).

* :mod:`~counterfactual.audit.groups`: per-group accuracy and the gap to a reference group.
* :mod:`~counterfactual.audit.oov`: out-of-vocabulary rate against a training vocabulary.
* :mod:`~counterfactual.audit.templates`: question templates (content words -> POS tags)
  clustered with K-Means on sentence embeddings.
* :mod:`~counterfactual.audit.distractors`: wrong-answer candidates from a pool, relevant to
  the question and dissimilar to the right answer and to each other.
* :mod:`~counterfactual.audit.embed`: the embedder protocol and the packaged MiniLM model.
* :mod:`~counterfactual.audit.io`: JSON Lines / CSV / text readers with file-and-line errors.

Heavy libraries (scikit-learn, sentence-transformers) are imported only when used.
"""

from counterfactual.audit.distractors import (
    Distractor,
    DistractorChoice,
    DistractorConfig,
    DistractorSelector,
)
from counterfactual.audit.embed import Embedder, MiniLMEmbedder
from counterfactual.audit.groups import GroupAccuracy, GroupReport, Outcome, group_accuracy
from counterfactual.audit.oov import OOVReport, build_vocabulary, oov_by_group, oov_rate
from counterfactual.audit.templates import (
    QuestionTemplater,
    TemplateClustering,
    cluster_templates,
    question_template,
)

__all__ = [
    "Distractor",
    "DistractorChoice",
    "DistractorConfig",
    "DistractorSelector",
    "Embedder",
    "GroupAccuracy",
    "GroupReport",
    "MiniLMEmbedder",
    "OOVReport",
    "Outcome",
    "QuestionTemplater",
    "TemplateClustering",
    "build_vocabulary",
    "cluster_templates",
    "group_accuracy",
    "oov_by_group",
    "oov_rate",
    "question_template",
]
