"""Line and scatter charts as self-contained SVG, standard library only: axes with ticks
and labels, one colour per series, a legend. Renders in a browser and on GitHub."""

from __future__ import annotations

import math
from typing import List, Optional, Sequence, Tuple
from xml.sax.saxutils import escape

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")
W, H = 720, 440
LEFT, RIGHT, TOP, BOTTOM = 80, 170, 50, 60

Point = Tuple[float, float]


class Series:
    """A named series of points; ``dash`` draws it dashed, ``line`` False: markers only,
    ``ring``: open rings around other series' points (a front drawn over them)."""

    def __init__(self, name: str, points: Sequence[Point], colour: str,
                 dash: bool = False, line: bool = True, ring: bool = False) -> None:
        self.name, self.points, self.colour = name, list(points), colour
        self.dash, self.line, self.ring = dash, line, ring

    def marker(self, x: float, y: float) -> str:
        """One point's marker."""
        if self.ring:
            return (f'<circle cx="{x:.1f}" cy="{y:.1f}" r="8" fill="none" '
                    f'stroke="{self.colour}" stroke-width="2"/>')
        return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{self.colour}"/>'


def nice_ticks(low: float, high: float, count: int = 5) -> List[float]:
    """Round tick values covering [low, high]."""
    if high <= low:
        high = low + 1.0
    step = 10 ** math.floor(math.log10((high - low) / count))
    for factor in (1, 2, 5, 10):
        if (high - low) / (step * factor) <= count:
            step *= factor
            break
    first = math.floor(low / step) * step
    ticks, value = [round(first, 10)], first
    while ticks[-1] < high - step * 1e-9:  # the last tick covers high
        value += step
        ticks.append(round(value, 10))
    return ticks


def _label(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000 or abs(value) < 0.01:
        return f"{value:.2g}"
    return f"{value:g}" if value == int(value) else f"{value:.3g}"


def chart(title: str, x_label: str, y_label: str, series: Sequence[Series],
          log2_x: bool = False) -> str:
    """An SVG document of ``series`` on shared axes (``log2_x``: concurrency axes)."""
    xs = [p[0] for s in series for p in s.points] or [1.0]
    ys = [p[1] for s in series for p in s.points] or [1.0]

    def fx(x: float) -> float:
        return math.log2(x) if log2_x else x

    x_ticks: List[float]
    if log2_x:
        x_ticks = sorted(set(xs))
        x_low, x_high = fx(min(xs)), fx(max(xs))
    else:
        x_ticks = nice_ticks(min(0.0, min(xs)), max(xs))
        x_low, x_high = x_ticks[0], x_ticks[-1]
    if x_high == x_low:
        x_low, x_high = x_low - 1, x_high + 1
    y_ticks = nice_ticks(0.0, max(ys) * 1.05 if max(ys) > 0 else 1.0)
    y_low, y_high = y_ticks[0], y_ticks[-1]
    pw, ph = W - LEFT - RIGHT, H - TOP - BOTTOM

    def px(x: float) -> float:
        return LEFT + (fx(x) - x_low) / (x_high - x_low) * pw

    def py(y: float) -> float:
        return TOP + ph - (y - y_low) / (y_high - y_low) * ph

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="13">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2:.0f}" y="24" text-anchor="middle" font-size="16" '
           f'font-weight="bold">{escape(title)}</text>']
    for y in y_ticks:
        out.append(f'<line x1="{LEFT}" y1="{py(y):.1f}" x2="{LEFT + pw}" y2="{py(y):.1f}" '
                   f'stroke="#e0e0e0"/>')
        out.append(f'<text x="{LEFT - 8}" y="{py(y) + 4:.1f}" text-anchor="end">'
                   f'{_label(y)}</text>')
    for x in x_ticks:
        out.append(f'<line x1="{px(x):.1f}" y1="{TOP + ph}" x2="{px(x):.1f}" '
                   f'y2="{TOP + ph + 5}" stroke="black"/>')
        out.append(f'<text x="{px(x):.1f}" y="{TOP + ph + 20}" text-anchor="middle">'
                   f'{_label(x)}</text>')
    out.append(f'<path d="M{LEFT},{TOP} V{TOP + ph} H{LEFT + pw}" fill="none" '
               f'stroke="black"/>')
    out.append(f'<text x="{LEFT + pw / 2:.0f}" y="{H - 15}" text-anchor="middle">'
               f'{escape(x_label)}</text>')
    out.append(f'<text transform="translate(20,{TOP + ph / 2:.0f}) rotate(-90)" '
               f'text-anchor="middle">{escape(y_label)}</text>')
    for i, s in enumerate(series):
        name = escape(s.name, {'"': "&quot;"})
        out.append(f'<g class="series" data-series="{name}">')
        pts = [(px(x), py(y)) for x, y in sorted(s.points)]
        if s.line and len(pts) > 1:
            dash = ' stroke-dasharray="6,4"' if s.dash else ""
            out.append('<polyline fill="none" stroke-width="2" stroke="' + s.colour + '"'
                       + dash + ' points="'
                       + " ".join(f"{a:.1f},{b:.1f}" for a, b in pts) + '"/>')
        out.extend(s.marker(a, b) for a, b in pts)
        ly = TOP + 10 + i * 20
        lx = LEFT + pw + 15
        dash = ' stroke-dasharray="6,4"' if s.dash else ""
        out.append(f'<line x1="{lx}" y1="{ly}" x2="{lx + 24}" y2="{ly}" stroke="{s.colour}" '
                   f'stroke-width="2"{dash}/>' + s.marker(lx + 12, ly))
        out.append(f'<text x="{lx + 30}" y="{ly + 4}">{name}</text></g>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def colour(index: int) -> str:
    """The colour of the ``index``-th case."""
    return COLOURS[index % len(COLOURS)]


def optional_points(rows: Sequence[dict], x: str, y: str,
                    inner: Optional[str] = None) -> List[Point]:
    """``(row[x], row[y])`` (or ``row[y][inner]``) for rows that have both."""
    found = []
    for row in rows:
        value = row.get(y)
        if inner is not None:
            value = value.get(inner) if isinstance(value, dict) else None
        if row.get(x) is not None and value is not None:
            found.append((float(row[x]), float(value)))
    return found
