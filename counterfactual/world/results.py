"""How an experiment's results are shown: :func:`table` (Markdown: mean ± std per arm, and the
ODmAP@1 gain against twice the spread; :func:`role_table`, ODmAP@1 by what the query removed;
:func:`sweep_table` and :func:`grid_table`, the studies), :func:`plot` (ODmAP@k per arm, error
bars) and :func:`sweep_plot` (the metrics against |D'_sub| / |D|, error bars: one std)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROWS = (
    ("ODmAP@1", "odmap@1"),
    ("ODmAP@5", "odmap@5"),
    ("ODmAP@10", "odmap@10"),
    ("clean ODmAP@1", "clean_odmap@1"),
    ("clean ODmAP@5", "clean_odmap@5"),
    ("clean ODmAP@10", "clean_odmap@10"),
    ("i2t R@1", "i2t_r@1"),
    ("i2t R@5", "i2t_r@5"),
    ("t2i R@1", "t2i_r@1"),
    ("t2i R@5", "t2i_r@5"),
    ("hubness S@1 (k-occurrence skewness)", "hub_skew@1"),
    ("hubness S@10", "hub_skew@10"),
    ("top-1 hub (largest share of queries)", "hub_top1"),
)
STUDY_COLUMNS = (
    ("ODmAP@1", "odmap@1"),
    ("ODmAP@5", "odmap@5"),
    ("ODmAP@10", "odmap@10"),
    ("clean ODmAP@1", "clean_odmap@1"),
    ("i2t R@1", "i2t_r@1"),
    ("t2i R@1", "t2i_r@1"),
    ("S@1", "hub_skew@1"),
    ("S@10", "hub_skew@10"),
    ("top-1 hub", "hub_top1"),
)
"""The columns of the sweep and grid tables: (label, metric)."""


def spread(results: Mapping[str, Any], metric: str) -> float:
    """The larger of the two arms' std of ``metric``."""
    return max(arm["std"][metric] for arm in results["arms"].values())


def gain(results: Mapping[str, Any], metric: str) -> float:
    """Mean of arm D+D' minus mean of arm D."""
    arms = results["arms"]
    return arms["D+D'"]["mean"][metric] - arms["D"]["mean"][metric]


def table(results: Mapping[str, Any], seconds: Mapping[str, float] | None = None) -> str:
    """The Markdown summary."""
    arms = results["arms"]
    config = results["config"]
    n = len(arms["D"]["seeds"])
    lines = [
        "# Controlled world: D vs D ∪ D'",
        "",
        f"p(partner | anchor) in train = {config['cooccurrence']}, {config['steps']} steps of "
        f"{config['batch_size']}, {n} seed(s) from {config['seed']}; text "
        f"{config['text_method']}, image {config['image_method']}; D' = {config['synthetic']} "
        f"samples beside {config['original']} of D (natural ratio "
        f"{config.get('natural_ratio', config['ratio']):.3f}), drawn at {config['ratio']:.3g} "
        "per original.",
        "",
        "| metric | D | D ∪ D' | gain | 2 × spread |",
        "|---|---|---|---|---|",
    ]
    for label, key in ROWS:
        d, dd = arms["D"], arms["D+D'"]
        lines.append(
            f"| {label} | {d['mean'][key]:.3f} ± {d['std'][key]:.3f} | "
            f"{dd['mean'][key]:.3f} ± {dd['std'][key]:.3f} | {gain(results, key):+.3f} | "
            f"{2 * spread(results, key):.3f} |"
        )
    lines += role_table(results)
    lines += sweep_table(results)
    lines += grid_table(results)
    if seconds:
        lines += ["", "Seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in seconds.items()) + "."]
    return "\n".join(lines) + "\n"


ROLE_NAMES = {
    "partner": "a partner (its anchor stays: the shortcut)",
    "anchor": "an anchor",
    "unpaired": "an unpaired class",
    "several": "several classes",
}


def role_table(results: Mapping[str, Any]) -> list[str]:
    """ODmAP@1 by the removed class's role, both arms and query sets: where the gain comes
    from (the shortcut unlearned shows on ``partner`` queries; a better model on all)."""
    by_role = results.get("by_role")
    if not by_role:
        return []
    lines = [
        "",
        "ODmAP@1 by what the query removed (pipeline queries / clean renders):",
        "",
        "| removed | queries | D | D ∪ D' | gain | clean D | clean D ∪ D' | clean gain |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for role, name in ROLE_NAMES.items():
        if role not in by_role["D"] or role not in by_role["D+D'"]:
            continue
        d, dd = by_role["D"][role]["mean"], by_role["D+D'"][role]["mean"]
        cells = []
        for key in ("odmap@1", "clean_odmap@1"):
            cells += [f"{d[key]:.3f}", f"{dd[key]:.3f}", f"{dd[key] - d[key]:+.3f}"]
        lines.append(f"| {name} | {by_role['D'][role]['queries']} | " + " | ".join(cells) + " |")
    return lines


def _cells(arm: Mapping[str, Any]) -> str:
    return " | ".join(f"{arm['mean'][key]:.3f} ± {arm['std'][key]:.3f}" for _, key in STUDY_COLUMNS)


def sweep_table(results: Mapping[str, Any]) -> list[str]:
    """The ratio sweep (``results["sweep"]``): one row per |D'_sub| / |D|, mean ± std."""
    sweep = results.get("sweep")
    if not sweep:
        return []
    head = " | ".join(label for label, _ in STUDY_COLUMNS)
    lines = [
        "",
        "Ratio sweep: D ∪ D'_sub, |D'_sub| / |D| = R (R = 0: D alone), mean ± std over seeds:",
        "",
        f"| R | D'_sub | {head} |",
        "|---|---|" + "---|" * len(STUDY_COLUMNS),
    ]
    for row in sweep:
        lines.append(f"| {row['ratio']:g} | {row['samples']} | {_cells(row['arm'])} |")
    return lines


def grid_table(results: Mapping[str, Any]) -> list[str]:
    """The synthesis grid (``results["grid"]``): one row per image and text method."""
    grid = results.get("grid")
    if not grid:
        return []
    head = " | ".join(label for label, _ in STUDY_COLUMNS)
    lines = [
        "",
        "Synthesis grid: D ∪ D' per image and text method (the same queries and clean renders "
        "for every row), mean ± std over seeds; arm D above:",
        "",
        f"| image | text | D' | {head} |",
        "|---|---|---|" + "---|" * len(STUDY_COLUMNS),
    ]
    for row in grid:
        lines.append(
            f"| {row['image_method']} | {row['text_method']} | {row['synthetic']} | "
            f"{_cells(row['arm'])} |"
        )
    return lines


def sweep_plot(results: Mapping[str, Any], path: str | Path) -> Path:
    """ODmAP@1/@10, clean ODmAP@1 and i2t R@1 against |D'_sub| / |D|: mean, error bars: one std."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = results["sweep"]
    ratios = [row["ratio"] for row in sweep]
    fig, ax = plt.subplots(figsize=(5, 3.4))
    for key, label in (
        ("odmap@1", "ODmAP@1"),
        ("odmap@10", "ODmAP@10"),
        ("clean_odmap@1", "clean ODmAP@1"),
        ("i2t_r@1", "i2t R@1"),
    ):
        mean = [row["arm"]["mean"][key] for row in sweep]
        std = [row["arm"]["std"][key] for row in sweep]
        ax.errorbar(ratios, mean, yerr=std, marker="o", ms=3, capsize=3, label=label)
    ax.set_xlabel("|D'_sub| / |D|")
    ax.set_ylabel("score")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def plot(results: Mapping[str, Any], path: str | Path) -> Path:
    """ODmAP@k (pipeline and clean queries) per arm, bars with the std over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = results["arms"]
    fig, axes = plt.subplots(1, 2, figsize=(7, 3), sharey=True)
    ks = (1, 5, 10)
    for ax, prefix, title in (
        (axes[0], "odmap", "pipeline queries"),
        (axes[1], "clean_odmap", "clean renders"),
    ):
        for offset, (arm, label) in enumerate((("D", "D"), ("D+D'", "D ∪ D'"))):
            means = [arms[arm]["mean"][f"{prefix}@{k}"] for k in ks]
            stds = [arms[arm]["std"][f"{prefix}@{k}"] for k in ks]
            xs = [i + (offset - 0.5) * 0.38 for i in range(len(ks))]
            ax.bar(xs, means, 0.36, yerr=stds, capsize=3, label=label)
        ax.set_xticks(range(len(ks)), [f"@{k}" for k in ks])
        ax.set_title(title, fontsize=10)
        ax.set_ylim(0, 1)
    axes[0].set_ylabel("ODmAP")
    axes[0].legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path
