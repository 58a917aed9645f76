"""The corpus formats by kind: the one table the planner, the workers and
:class:`~counterfactual.readers.spec.DataSpec` look a kind up in. A new format is a module with
a :class:`~counterfactual.readers.corpus.common.CorpusFormat` named ``FORMAT`` and one line in
:data:`counterfactual.readers.FORMAT_MODULES` (the ``--dataset`` choices follow), or a package's
entry point in the group ``counterfactual.formats`` (:mod:`counterfactual.plugins`)."""

from __future__ import annotations

import importlib
from typing import Any

from counterfactual import plugins
from counterfactual.readers import CORPORA, DATASETS, FORMAT_MODULES
from counterfactual.readers.corpus.common import CorpusFormat
from counterfactual.readers.corpus.table import TableFormat

_MEMBERS = ("kind", "suffix", "root_help", "default_images", "plan", "keys", "cut", "read")
"""What a :class:`CorpusFormat` has."""


def _plugin_problem(plugin: plugins.Plugin, found: Any) -> str | None:
    """Why a plugin's object is no corpus format of its entry point's kind (``None``: it is)."""
    missing = [name for name in _MEMBERS if not hasattr(found, name)]
    if missing:
        return f"{type(found).__name__} is not a CorpusFormat: it lacks {', '.join(missing)}"
    if found.kind != plugin.name:
        return f"the format's kind is {found.kind!r}, its entry point's {plugin.name!r}"
    return None


def _registered() -> dict[str, CorpusFormat]:
    """The built-ins (:data:`~counterfactual.readers.FORMAT_MODULES`), then every plugin."""
    found: dict[str, CorpusFormat] = {}
    for kind, module in FORMAT_MODULES.items():
        found[kind] = importlib.import_module(module).FORMAT
        if found[kind].kind != kind:
            raise ValueError(f"{module}.FORMAT reads {found[kind].kind!r}, not {kind!r}")
    for _, fmt in plugins.load(plugins.FORMATS, (*DATASETS, *found), _plugin_problem):
        found[fmt.kind] = fmt
    return {kind: found[kind] for kind in CORPORA if kind in found}


FORMATS: dict[str, CorpusFormat] = _registered()
"""Each corpus kind's format, in the order of :data:`counterfactual.readers.CORPORA` (a plugin
that failed to load is not here)."""
PIECE_KINDS = tuple(FORMATS)
TABLE_KINDS = tuple(kind for kind, f in FORMATS.items() if isinstance(f, TableFormat))
KIND_SUFFIXES = {kind: f.suffix for kind, f in FORMATS.items() if f.suffix is not None}
"""The files a glob or a folder stands for, by corpus kind (``files``: folders)."""


def corpus_format(kind: str) -> CorpusFormat:
    """The format of corpus ``kind``, or ``ValueError`` naming it."""
    found = FORMATS.get(kind)
    if found is None:
        raise ValueError(f"corpus kind {kind!r} is not one of {PIECE_KINDS}")
    return found
