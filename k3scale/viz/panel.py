"""`Panel`: one dashboard figure with its one-line caption (the caption states the headline number)."""

from __future__ import annotations

from dataclasses import dataclass

import plotly.graph_objects as go


@dataclass(frozen=True)
class Panel:
    key: str
    """Anchor id on the page, unique per page (letters, digits, '-', '_')."""
    figure: go.Figure
    """The plotly figure."""
    caption: str
    """One line: what the figure shows and its headline number."""
    note: str = ""
    """The sign or ratio convention, for figures that show a difference or a ratio."""

    @property
    def num_traces(self) -> int:
        return len(self.figure.data)
