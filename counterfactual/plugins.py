"""Backends from other packages: erasers, corpus formats and rewriters a package of a user's
adds through entry points, as pytest plugins and fsspec's ``fsspec.specs`` do.

A package declares them in its ``pyproject.toml``::

    [project.entry-points."counterfactual.erasers"]
    pixelate = "myplugin:ERASER"

The entry point's name is the backend's name (an eraser's ``name``, a format's ``kind``, one of
a rewriter's ``names``); its object is the declaration the built-ins make
(:class:`counterfactual.image.Eraser`, a
:class:`~counterfactual.readers.corpus.common.CorpusFormat`,
:class:`counterfactual.text.Rewriter`). The built-ins are declared in code and come first; the
registry of each kind (:data:`counterfactual.image.ERASERS`,
:data:`counterfactual.readers.corpus.formats.FORMATS`, :data:`counterfactual.text.REWRITERS`)
adds the plugins after them. A plugin whose name a built-in (or an earlier plugin) has, whose
module fails to load or whose object is not a declaration of its kind is skipped with one
:class:`PluginWarning` line naming its distribution and entry point; the built-ins always work.

The installed entry points are read once per process (:func:`entry_points_of`, names only, no
plugin imported); :func:`clear` forgets them (a test that installs a plugin).
"""

from __future__ import annotations

import functools
import sys
import warnings
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from counterfactual.messages import one_line

ERASERS = "counterfactual.erasers"
FORMATS = "counterfactual.formats"
REWRITERS = "counterfactual.rewriters"
GROUPS = (ERASERS, FORMATS, REWRITERS)
"""The entry-point groups a plugin registers in."""

LOAD_ERRORS: tuple[type[BaseException], ...] = (
    ImportError,
    AttributeError,
    SyntaxError,
    NameError,
    TypeError,
    ValueError,
    OSError,
    RuntimeError,
)
"""What loading a plugin's module may raise: the plugin is skipped with a warning."""


class PluginWarning(UserWarning):
    """A plugin skipped: its name is taken, it fails to load, or it declares nothing usable."""


@dataclass(frozen=True, slots=True)
class Plugin:
    """One installed entry point: ``name`` (the backend's name), ``value`` (``module:attr``),
    ``dist`` (the distribution that declares it; ``"?"`` when unknown)."""

    group: str
    name: str
    value: str
    dist: str

    def label(self) -> str:
        return f"{self.dist}'s entry point {self.name} = {self.value} ({self.group})"


@functools.cache
def _installed() -> dict[str, tuple[metadata.EntryPoint, ...]]:
    found = metadata.entry_points()
    return {group: tuple(found.select(group=group)) for group in GROUPS}


def entry_points_of(group: str) -> tuple[Plugin, ...]:
    """The installed entry points of ``group`` (one of :data:`GROUPS`), read without importing
    any plugin; the metadata is scanned once per process (:func:`clear`)."""
    if group not in GROUPS:
        raise ValueError(f"plugin group {group!r} is not one of {GROUPS}")
    out = []
    for ep in _installed()[group]:
        dist = ep.dist.name if ep.dist is not None else "?"
        out.append(Plugin(group, ep.name, ep.value, dist))
    return tuple(out)


def names(group: str) -> tuple[str, ...]:
    """The names ``group``'s plugins declare, in the order they are found (none loaded)."""
    return tuple(dict.fromkeys(p.name for p in entry_points_of(group)))


def clear() -> None:
    """Forget the entry points read so far (the next look reads the installed metadata)."""
    _installed.cache_clear()


def skip(plugin: Plugin, reason: str) -> None:
    """Warn, in one line, that ``plugin`` is skipped and why."""
    warnings.warn(one_line(f"plugin {plugin.label()} skipped: {reason}"), PluginWarning, 3)


def _load_failure(plugin: Plugin, err: BaseException) -> str:
    module = sys.modules.get(plugin.value.partition(":")[0].strip())
    spec = getattr(module, "__spec__", None)
    if isinstance(err, AttributeError) and getattr(spec, "_initializing", False):
        # the plugin's module imported the registry it joins before declaring its object
        return "its module was still being imported (import counterfactual before the plugin)"
    return f"it fails to load: {type(err).__name__}: {err}"


Check = Callable[[Plugin, Any], str | None]
"""``check(plugin, loaded)``: why the loaded object cannot be registered (``None``: it can)."""


def load(group: str, taken: Collection[str], check: Check) -> Iterator[tuple[Plugin, Any]]:
    """Each plugin of ``group`` whose name is not in ``taken`` (the built-ins' names) nor an
    earlier plugin's, loaded and accepted by ``check``, with its object; every other one is
    skipped with a :class:`PluginWarning`."""
    seen = set(taken)
    for plugin in entry_points_of(group):
        if plugin.name in seen:
            skip(plugin, f"the name {plugin.name!r} is taken")
            continue
        try:
            loaded = metadata.EntryPoint(plugin.name, plugin.value, plugin.group).load()
        except LOAD_ERRORS as err:
            skip(plugin, _load_failure(plugin, err))
            continue
        reason = check(plugin, loaded)
        if reason is not None:
            skip(plugin, reason)
            continue
        seen.add(plugin.name)
        yield plugin, loaded
