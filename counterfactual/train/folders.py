"""A training run's output folder: ``epoch-XX/`` folders written whole by an atomic rename
(``save_epoch``), the last complete one found for a resume (``last_epoch``) and its config
checked (``check_same_config``), the log cut back to it, and ``train.json`` read and written."""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from counterfactual.train.config import TrainConfig

if TYPE_CHECKING:
    from counterfactual.train.families import Step

# Config fields a resumed run may change: they do not change which samples are drawn.
_MAY_CHANGE_ON_RESUME = ("epochs", "device", "num_workers", "log_every", "precision")
# What a train.json written before a field existed meant by it.
_BEFORE_FIELD = {"recipe": "clip", "mix": "ratio"}
_EPOCH_DIR = re.compile(r"^epoch-(\d+)$")


def epoch_name(epoch: int) -> str:
    return f"epoch-{epoch:02d}"


def last_epoch(out: Path) -> int:
    """The highest complete epoch folder (an epoch folder only appears complete)."""
    found = [
        int(m.group(1)) for p in out.iterdir() if p.is_dir() and (m := _EPOCH_DIR.match(p.name))
    ]
    return max(found, default=0)


def check_same_config(path: Path, config: TrainConfig) -> None:
    if not path.is_file():
        raise ValueError(f"{path.parent} holds epoch folders but no train.json; use a new --out")
    before = read_json(path).get("config", {})
    now = config.to_dict()
    for key, meant in _BEFORE_FIELD.items():
        before.setdefault(key, meant)
    differ = sorted(k for k in now if k not in _MAY_CHANGE_ON_RESUME and before.get(k) != now[k])
    if differ:
        shown = ", ".join(f"{k}: {before.get(k)!r} -> {now[k]!r}" for k in differ)
        raise ValueError(
            f"{path.parent} was trained with another config ({shown}); use a new --out"
        )


def keep_log_rows(path: Path, epochs_done: int) -> None:
    """Drop log rows of epochs that are being redone (all rows of a fresh run)."""
    if not path.exists():
        return
    keep = []
    if epochs_done:
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a row cut off when the run stopped
                continue
            if isinstance(row, dict) and row.get("epoch", 0) <= epochs_done:
                keep.append(line + "\n")
    path.write_text("".join(keep), encoding="utf-8")


def save_folder(
    folder: Path, model: Any, processor: Any, extra: Callable[[Path], None] | None = None
) -> None:
    """Write into ``<folder>.tmp`` and rename it into place, so ``folder`` is always complete."""
    tmp = folder.with_name(folder.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(str(tmp))
    processor.save_pretrained(str(tmp))
    if extra is not None:
        extra(tmp)
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(tmp, folder)


def save_epoch(
    out: Path, epoch: int, model: Any, processor: Any, step: Step, state: dict[str, Any]
) -> None:
    """``epoch-XX/`` with the weights, the processor, the optimizer state and the counters. Only
    the newest epoch keeps its optimizer state (the one a resume needs; it doubles the size)."""
    import torch

    def extra(folder: Path) -> None:
        torch.save(step.state_dict(), folder / "optimizer.pt")
        write_json(folder / "trainer_state.json", {"epoch": epoch, **state})

    save_folder(out / epoch_name(epoch), model, processor, extra)
    previous = out / epoch_name(epoch - 1) / "optimizer.pt"
    if epoch > 1 and previous.exists():
        previous.unlink()


def read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read {path}: {err}") from err
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a JSON object")
    return data


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def library_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {"python": platform.python_version()}
    for package in ("counterfactual", "torch", "transformers", "webdataset"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            found[package] = "not installed"
    return found
