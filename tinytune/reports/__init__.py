"""Reports from the results database: pandas frames for notebooks, and rich tables, CSV, Markdown, JSON and HTML for people."""
from __future__ import annotations

from tinytune.reports.frames import (
  baselines_frame,
  best_frame,
  devices_frame,
  history_frame,
  params_label,
  report_frames,
  roof_pct,
  roofline_frame,
  searches_frame,
)
from tinytune.reports.render import FORMATS, render, to_csv, to_html, to_json, to_markdown, to_rich

__all__ = ["devices_frame", "best_frame", "history_frame", "searches_frame", "baselines_frame", "report_frames", "params_label", "roof_pct",
           "roofline_frame", "FORMATS", "render", "to_csv", "to_html", "to_json", "to_markdown", "to_rich"]
