"""Moved: the contact sheet is the report's sheet (:mod:`counterfactual.report.sheets`). This
name stays only until ``cli/synth.py`` imports ``contact_sheet`` and ``sheet_rows`` from
:mod:`counterfactual.report`; then delete this file."""

from counterfactual.report.sheets import contact_sheet, sheet_rows

__all__ = ["contact_sheet", "sheet_rows"]
