"""Speed figures for `make bench`: a table on stdout and `benchmarks/latest.json`.

Every figure runs on one core (BLAS and OpenMP threads pinned to 1) and is compared with a
baseline measured in the same run, because the machine is shared and absolute times drift.

Each section is one module of ``benchmarks/sections/`` declaring a
:class:`~common.Section` (its options, note, targets and ``run``) beside its code; this file
collects them (:data:`SECTIONS`, in the order they run), builds the command line from what
they declare, runs the ones ``--only`` names (all by default), prints the table and merges the
figures into the JSON. Sections with a note also write it under ``_notes`` in the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
from pathlib import Path

from common import Section
from sections import (
    captions,
    corpus,
    detect,
    diffusion,
    erasers,
    experiment,
    fill,
    gpu,
    gpu_node,
    images,
    lama_batches,
    mentions,
    np_removal,
    pipeline,
    retrieval,
    run_layer,
    select,
    select_cli,
    selection,
    verify,
    verify_cost,
)

SECTIONS: tuple[Section, ...] = tuple(
    module.SECTION
    for module in (
        selection,
        select,
        select_cli,
        np_removal,
        captions,
        images,
        pipeline,
        diffusion,
        retrieval,
        mentions,
        verify,
        detect,
        corpus,
        erasers,
        fill,
        experiment,
        gpu_node,
        lama_batches,
        verify_cost,
        gpu,
        run_layer,
    )
)
"""Every section, in the order they run (and their figures print)."""


def parser(sections: tuple[Section, ...] = SECTIONS) -> argparse.ArgumentParser:
    """``--out``, ``--only`` and every section's declared options (a flag two sections declare,
    such as ``--photos``, once: they must declare it alike)."""
    out = argparse.ArgumentParser(description=__doc__)
    out.add_argument("--out", type=Path, default=Path("benchmarks/latest.json"))
    out.add_argument("--only", nargs="+", choices=[s.name for s in sections], default=None)
    declared: dict[str, dict] = {}
    for section in sections:
        for arg in section.args:
            if arg.flag in declared:
                if declared[arg.flag] != arg.options:
                    raise ValueError(f"{arg.flag} is declared twice, differently ({section.name})")
                continue
            declared[arg.flag] = arg.options
            out.add_argument(arg.flag, **arg.options)
    out.add_argument("--topk-child", type=int, nargs=4, default=None, help=argparse.SUPPRESS)
    return out


def table(figures: dict[str, float], sections: tuple[Section, ...]) -> None:
    """Print each figure with its target, if it has one, and whether it was reached."""
    targets = {k: v for s in sections for k, v in s.targets.items()}
    max_targets = {k: v for s in sections for k, v in s.max_targets.items()}
    print(f"{'figure':<48} {'value':>12}  target")
    for name, value in figures.items():
        if (target := targets.get(name)) is not None:
            mark = f">= {target}  {'ok' if value >= target else 'MISSED'}"
        elif (target := max_targets.get(name)) is not None:
            mark = f"<= {target}  {'ok' if value <= target else 'MISSED'}"
        else:
            mark = ""
        print(f"{name:<48} {value:>12.3f}  {mark}")


def write(path: Path, figures: dict[str, float], ran: list[Section]) -> None:
    """Merge ``figures`` into the JSON at ``path`` (``a.b.c`` nests as ``["a"]["b"]["c"]``),
    with the machine and the notes of the sections that ran."""
    previous = json.loads(path.read_text()) if path.exists() else {}
    for name, value in figures.items():
        *groups, key = name.split(".")
        place = previous
        for group in groups:
            place = place.setdefault(group, {})
        place[key] = round(value, 4)
    previous["_machine"] = (
        f"{platform.machine()}, {os.cpu_count()} cores; one used, except by the Ray pipeline and top-k"
    )
    notes = previous.get("_notes", {})
    previous["_notes"] = notes | {s.name: s.note for s in ran if s.note is not None}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(previous, indent=1, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.topk_child:
        retrieval.topk_child(*args.topk_child)
        return 0
    ran = [s for s in SECTIONS if args.only is None or s.name in args.only]
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for section in ran:
            figures |= section.run(Path(tmp), args)
    table(figures, SECTIONS)
    write(args.out, figures, ran)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
