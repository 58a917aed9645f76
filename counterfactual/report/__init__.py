"""A visual audit of a synth run, for a person to judge it in a minute: ``report/index.html``
plus PNG sheets, all files linked relatively (no network, no scripts, copy the folder).

One module per job: :mod:`~counterfactual.report.index` reads what the run holds and draws the
samples shown, :mod:`~counterfactual.report.originals` finds their original pictures,
:mod:`~counterfactual.report.lines` words a row once, :mod:`~counterfactual.report.sheets` is the
one renderer of PNG sheets (the report's and synth's ``contact_sheet.png``),
:mod:`~counterfactual.report.page` writes the HTML and :mod:`~counterfactual.report.write` puts
them together.
"""

from counterfactual.report.index import DEFAULT_N, RunIndex, SampleRef, read_run, stratify
from counterfactual.report.lines import caption_segments, method_label, verdict_lines
from counterfactual.report.originals import Original, Originals, dataset_roots
from counterfactual.report.sheets import (
    ROWS_PER_SHEET,
    SheetRow,
    contact_sheet,
    draw_sheet,
    run_contact_sheet,
    sheet_rows,
)
from counterfactual.report.write import REPORT_DIR, Report, write_report

__all__ = [
    "DEFAULT_N",
    "REPORT_DIR",
    "ROWS_PER_SHEET",
    "Original",
    "Originals",
    "Report",
    "RunIndex",
    "SampleRef",
    "SheetRow",
    "caption_segments",
    "contact_sheet",
    "dataset_roots",
    "draw_sheet",
    "method_label",
    "read_run",
    "run_contact_sheet",
    "sheet_rows",
    "stratify",
    "verdict_lines",
    "write_report",
]
