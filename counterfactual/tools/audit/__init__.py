"""Audits of an evaluation set across groups (GD-VCR, Yin et al., 2021).

* :mod:`~counterfactual.tools.audit.groups`: per-group accuracy and the gap to a reference group.
* :mod:`~counterfactual.tools.audit.oov`: out-of-vocabulary rate against a training vocabulary.
* :mod:`~counterfactual.tools.audit.templates`: question templates (content words -> Penn or
  universal POS tags) clustered with K-Means on sentence embeddings.
* :mod:`~counterfactual.tools.audit.distractors`: wrong-answer candidates from a pool, relevant to
  the question and dissimilar to the right answer and to each other (the authors' bucketed
  algorithm, or a greedy one).
* :mod:`~counterfactual.tools.audit.embed`: the embedder protocol, sentence-transformers models by
  name, and the packaged MiniLM model (the offline default).
* :mod:`~counterfactual.tools.audit.io`: JSON Lines / CSV / text readers with file-and-line errors.

Heavy libraries (scikit-learn, sentence-transformers) are imported only when used.
"""

from counterfactual.tools.audit.distractors import (
    METHODS,
    Distractor,
    DistractorChoice,
    DistractorConfig,
    DistractorSelector,
)
from counterfactual.tools.audit.embed import (
    DEFAULT_MODEL,
    PAPER_MODEL,
    Embedder,
    MiniLMEmbedder,
    SentenceEmbedder,
    load_sentence_embedder,
)
from counterfactual.tools.audit.groups import GroupAccuracy, GroupReport, Outcome, group_accuracy
from counterfactual.tools.audit.oov import OOVReport, build_vocabulary, oov_by_group, oov_rate
from counterfactual.tools.audit.templates import (
    TAG_MODES,
    QuestionTemplater,
    TemplateClustering,
    cluster_templates,
    question_template,
)

__all__ = [
    "DEFAULT_MODEL",
    "METHODS",
    "PAPER_MODEL",
    "TAG_MODES",
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
    "SentenceEmbedder",
    "TemplateClustering",
    "build_vocabulary",
    "cluster_templates",
    "group_accuracy",
    "load_sentence_embedder",
    "oov_by_group",
    "oov_rate",
    "question_template",
]
