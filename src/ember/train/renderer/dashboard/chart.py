"""A line chart drawn with braille characters: a textual widget and the pure drawing function.

A braille character is a 2 x 4 grid of dots, so a chart of ``w x h`` cells has
``2w x 4h`` dots: enough resolution for a loss curve in a terminal. Every series is a
list of ``(x, y)`` points joined by straight segments; where two series share a cell,
the one drawn last gives the cell its color.

Example:
    >>> rows = braille_lines([Series("flat", ((0.0, 1.0), (1.0, 1.0)), "white")], 4, 2,
    ...                      (0.0, 1.0), (0.0, 2.0))
    >>> [row.plain for row in rows]
    ['⠀⠀⠀⠀', '⠉⠉⠉⠉']
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from rich.text import Text
from textual.widget import Widget

_BRAILLE = 0x2800
# the bit of each dot of a braille cell, indexed [row][column]
_DOT_BITS = ((0x01, 0x08), (0x02, 0x10), (0x04, 0x20), (0x40, 0x80))


@dataclass(frozen=True)
class Series:
    """One line of a chart: its legend label, its ``(x, y)`` points and its color."""

    label: str
    points: tuple[tuple[float, float], ...]
    color: str


def data_range(values: Sequence[float]) -> tuple[float, float]:
    """The ``(low, high)`` of finite values, widened when they are all equal."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return 0.0, 1.0
    low, high = min(finite), max(finite)
    if low == high:
        pad = abs(low) * 0.05 or 0.5
        return low - pad, high + pad
    return low, high


def braille_lines(series: Sequence[Series], width: int, height: int,
                  x_range: tuple[float, float], y_range: tuple[float, float]) -> list[Text]:  # fmt: skip
    """Draws the series into ``height`` rows of ``width`` braille cells.

    Points outside the ranges are clipped; non-finite values break a line.
    """
    cols, rows = 2 * width, 4 * height
    bits = [[0] * width for _ in range(height)]
    colors: list[list[str | None]] = [[None] * width for _ in range(height)]
    (x0, x1), (y0, y1) = x_range, y_range

    def to_dot(x: float, y: float) -> tuple[int, int]:
        fx = (x - x0) / (x1 - x0) if x1 > x0 else 0.5
        fy = (y - y0) / (y1 - y0) if y1 > y0 else 0.5
        column = round(min(max(fx, 0.0), 1.0) * (cols - 1))
        row = round((1.0 - min(max(fy, 0.0), 1.0)) * (rows - 1))
        return column, row

    def plot(column: int, row: int, color: str) -> None:
        cell_row, cell_column = row // 4, column // 2
        bits[cell_row][cell_column] |= _DOT_BITS[row % 4][column % 2]
        colors[cell_row][cell_column] = color

    for line in series:
        previous: tuple[int, int] | None = None
        for x, y in line.points:
            if not (math.isfinite(x) and math.isfinite(y)):
                previous = None
                continue
            dot = to_dot(x, y)
            for column, row in _segment(previous or dot, dot):
                plot(column, row, line.color)
            previous = dot

    lines = []
    for cell_bits, cell_colors in zip(bits, colors):
        text = Text()
        for bit, color in zip(cell_bits, cell_colors):
            text.append(chr(_BRAILLE + bit), style=color or "")
        lines.append(text)
    return lines


def _segment(start: tuple[int, int], end: tuple[int, int]) -> list[tuple[int, int]]:
    """The dots of a straight segment (Bresenham's algorithm), both ends included."""
    (column, row), (end_column, end_row) = start, end
    d_column, d_row = abs(end_column - column), -abs(end_row - row)
    step_column = 1 if end_column >= column else -1
    step_row = 1 if end_row >= row else -1
    error = d_column + d_row
    dots = [(column, row)]
    while (column, row) != (end_column, end_row):
        double = 2 * error
        if double >= d_row:
            error += d_row
            column += step_column
        if double <= d_column:
            error += d_column
            row += step_row
        dots.append((column, row))
    return dots


def _number(value: float) -> str:
    return f"{value:.4g}"


class LineChart(Widget):
    """A braille line chart with a y axis on the left and the x range below.

    Call :meth:`plot` with the series to show; the chart redraws at its current size.
    """

    DEFAULT_CSS = """
    LineChart {
        width: 1fr;
        height: 1fr;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.series: tuple[Series, ...] = ()
        self.x_format = _number
        self.empty_message = "no data yet"

    def plot(self, series: Sequence[Series], x_format=_number, empty_message: str = "") -> None:
        """Shows these series; ``x_format`` writes the x axis's bounds."""
        self.series = tuple(series)
        self.x_format = x_format
        self.empty_message = empty_message or "no data yet"
        self.refresh()

    def render(self) -> Text:
        points = [p for line in self.series for p in line.points]
        if not points:
            return Text(self.empty_message, style="dim", justify="center")
        x_range = data_range([x for x, _ in points])
        if len({x for x, _ in points}) == 1:
            x_range = (points[0][0] - 1.0, points[0][0] + 1.0)
        y_range = data_range([y for _, y in points])
        labels = [_number(y_range[1]), _number((y_range[0] + y_range[1]) / 2), _number(y_range[0])]
        axis = max(len(label) for label in labels) + 1
        width, height = max(self.size.width - axis - 1, 1), max(self.size.height - 1, 1)
        rows = braille_lines(self.series, width, height, x_range, y_range)
        marks = {0: labels[0], height // 2: labels[1], height - 1: labels[2]}
        out = Text()
        for index, row in enumerate(rows):
            out.append(marks.get(index, "").rjust(axis - 1) + " ┤" if index in marks else " " * axis + "│",
                       style="dim")  # fmt: skip
            out.append_text(row)
            out.append("\n")
        left, right = self.x_format(x_range[0]), self.x_format(x_range[1])
        gap = max(width - len(left) - len(right), 1)
        out.append(" " * (axis + 1) + left + " " * gap + right, style="dim")
        return out
