"""``counterfactual data``: list, and with ``--download`` fetch, the official files of a dataset,
verified against published checksums (see :mod:`counterfactual.readers.download`)."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from counterfactual.cli.options import add_options
from counterfactual.options import declare, declared
from counterfactual.readers import download as dl

_STATE_TEXT = {
    "installed": "installed (digest verified on download, unpacked)",
    "present": "present (found under ROOT, not downloaded by this tool: not verified)",
    "downloaded": "downloaded and verified, not unpacked yet",
    "partial": "partial download: {partial_bytes:,} bytes so far (--download resumes it)",
    "missing": "missing",
}


@dataclass(frozen=True, slots=True, kw_only=True)
class DataOptions:
    """``counterfactual data``'s options."""

    dataset: str = declare(
        "coco",
        help="whose official files to list or fetch (default: %(default)s)",
        choices=tuple(dl.DATASET_FILES),
    )
    root: Path = declare(help="dataset folder (ROOT)", kind="path")
    download: bool = declare(False, help="fetch and unpack what is missing", kind="flag")
    parts: list[str] | None = declare(
        None,
        help="only these parts (coco: annotations train2017 val2017 karpathy, and the 2014 set: "
        "annotations2014 train2014 val2014; flickr30k: annotations splits); default: every "
        "part except the 2014 set",
        nargs="+",
        metavar="PART",
    )
    delete_archives: bool = declare(False, help="delete each archive once unpacked", kind="flag")
    timeout: float = declare(
        60.0,
        help="give up on a download after this many seconds without data, > 0 (default: "
        "%(default)s)",
        kind="positive_float",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "data",
        help="list (and with --download fetch) the official dataset files, checksum-verified",
        description="Without --download: print every official file of the dataset (url, size, "
        "checksum and where the checksum was published), where it goes under ROOT, whether it "
        "is there, the manual steps and the command to run next; nothing is downloaded. With "
        "--download: fetch what is missing to ROOT/downloads/, verify it, unpack it into ROOT. "
        "A rerun resumes partial downloads and skips what is done.",
    )
    add_options(p, declared(DataOptions))
    p.set_defaults(func=run)


def next_commands(dataset: str, root: Path) -> list[str]:
    r = shlex.quote(str(root))
    if dataset == "flickr30k":
        return [
            f"counterfactual synth --dataset flickr30k --root {r} --split train --out out/flickr30k",
            f'make synth DATASET=flickr30k ROOT={r} ARGS="--split train"',
        ]
    return [
        f"counterfactual synth --dataset coco --root {r} --coco-set train2017 --out out/coco",
        f"make synth DATASET=coco ROOT={r}",
        f"(Karpathy split: add --split-file {shlex.quote(str(root / 'dataset_coco.json'))} "
        "--split train)",
    ]


def print_plan(plan: dl.DatasetPlan, out: TextIO) -> None:
    root = plan.root
    recorded = dl.read_recorded(root)
    print(f"{plan.dataset} under {root} (downloads go to {root / dl.DOWNLOADS})", file=out)
    for status in plan.files:
        f = status.file
        target = root if f.extract_to == "." else root / f.extract_to
        verb = "unpacks into" if f.archive else "copied to"
        optional = "" if f.default else ", optional: only with --parts"
        print(f"\n  {f.name}  [part: {f.part}{optional}]", file=out)
        print(f"    {'url:':<10}{f.url}", file=out)
        print(f"    {'size:':<10}{dl.describe_size(f.size)}", file=out)
        for label, text in dl.checksum_lines(f, recorded):
            print(f"    {label + ':':<10}{text}", file=out)
        provides = ", ".join(f.provides)
        print(f"    {verb} {target}" + (f" ({provides})" if provides else ""), file=out)
        state = _STATE_TEXT[status.state].format(partial_bytes=status.partial_bytes)
        print(f"    {'status:':<10}{state}", file=out)
    if plan.manual:
        print("\nmanual steps (not downloaded by this tool):", file=out)
        for m in plan.manual:
            mark = "done" if m.done else "to do"
            print(f"  - [{mark}] {m.step.what}: {m.step.url}", file=out)
            print(f"    {m.step.instructions}", file=out)


class _Progress:
    """Prints a file's progress to stderr at most every ``every`` seconds, and at the end."""

    def __init__(self, name: str, every: float = 5.0) -> None:
        self.name, self.every, self.last = name, every, 0.0

    def __call__(self, done: int, total: int | None) -> None:
        now = time.monotonic()
        if now - self.last < self.every and done != total:
            return
        self.last = now
        share = f" of {dl.describe_size(total)} ({100 * done / total:.0f}%)" if total else ""
        print(f"  {self.name}: {done:,} bytes{share}", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    root: Path = args.root
    files = dl.select_parts(dl.dataset_files(args.dataset), args.parts)
    if not args.download:
        chosen = files if args.parts else dl.dataset_files(args.dataset)
        print_plan(dl.plan(args.dataset, root, chosen), sys.stdout)
        missing = [s.file.name for s in dl.plan(args.dataset, root, files).missing]
        print("\nto fetch and unpack what is missing:" if missing else "\nnothing to fetch.")
        if missing:
            parts = f" --parts {' '.join(args.parts)}" if args.parts else ""
            print(
                f"  counterfactual data --dataset {args.dataset} --root "
                f"{shlex.quote(str(root))} --download{parts}"
            )
    else:
        root.mkdir(parents=True, exist_ok=True)
        for f in files:
            print(f"{f.name}: {f.url}", file=sys.stderr)
            try:
                result = dl.install(f, root, _Progress(f.name), args.timeout, args.delete_archives)
            except OSError as err:  # disk full, permissions: one line, not a traceback
                raise dl.DownloadError(f"{f.name}: {err}") from err
            if result.fetch is None:
                print(f"  {result.state_before}, skipped", file=sys.stderr)
                continue
            if result.fetch.skipped:
                print(f"  already downloaded ({result.fetch.note})", file=sys.stderr)
            else:
                print(f"  {result.fetch.note}", file=sys.stderr)
            if result.extract is not None and not result.extract.skipped:
                print(
                    f"  unpacked {result.extract.members} members into {result.extract.target}",
                    file=sys.stderr,
                )
        todo = [m for m in dl.plan(args.dataset, root, files).manual if not m.done]
        for m in todo:
            print(f"manual step still to do: {m.step.what}: {m.step.url}", file=sys.stderr)
            print(f"  {m.step.instructions}", file=sys.stderr)
    print("\nthen:")
    for line in next_commands(args.dataset, root):
        print(f"  {line}")
    return 0
