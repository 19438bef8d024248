"""SVG line plots for training curves (reward per step, loss per step, reward per iteration),
written as plain SVG text: no plotting library.

A plot is a list of named series, each a list of (x, y) points. Axes are scaled linearly to the
data's bounding box, with the y range padded by 5% so flat curves stay visible. The file is written
atomically (files.write_text_atomic).
"""
from __future__ import annotations

import html
import os

from minskill.files import write_text_atomic

COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]


def _ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    step = (hi - lo) / (count - 1)
    return [lo + i * step for i in range(count)]


def svg_line_plot(series: dict[str, list[tuple[float, float]]], title: str = "", xlabel: str = "",
                  ylabel: str = "", width: int = 640, height: int = 400) -> str:
    """Render named series of (x, y) points as an SVG document string."""
    points = [p for pts in series.values() for p in pts]
    if not points:
        points = [(0.0, 0.0), (1.0, 1.0)]
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    x_lo, x_hi = min(xs), max(xs)
    y_lo, y_hi = min(ys), max(ys)
    if x_hi == x_lo:
        x_lo, x_hi = x_lo - 0.5, x_hi + 0.5
    pad = 0.05 * (y_hi - y_lo) if y_hi > y_lo else 0.5
    y_lo, y_hi = y_lo - pad, y_hi + pad
    left, right, top, bottom = 64, 150, 36, 48
    plot_w, plot_h = width - left - right, height - top - bottom
    # 12 px sans: ~5.5 px a glyph
    legend_w = 38 + round(5.5 * max((len(name) for name in series), default=0))
    if legend_w > right:   # a long legend widens the figure instead of running off its edge
        width, right = width + legend_w - right, legend_w

    def sx(x: float) -> float:
        return left + (x - x_lo) / (x_hi - x_lo) * plot_w

    def sy(y: float) -> float:
        return top + (1 - (y - y_lo) / (y_hi - y_lo)) * plot_h

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left + plot_w / 2}" y="20" text-anchor="middle" '
           f'font-size="14">{html.escape(title)}</text>',
           f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" '
           'stroke="#444"/>']
    for y in _ticks(y_lo, y_hi):
        out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{sy(y):.1f}" y2="{sy(y):.1f}" '
                   'stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{sy(y) + 4:.1f}" text-anchor="end">{y:.3g}</text>')
    for x in _ticks(x_lo, x_hi):
        out.append(f'<text x="{sx(x):.1f}" y="{top + plot_h + 16}" '
                   f'text-anchor="middle">{x:.3g}</text>')
    out.append(f'<text x="{left + plot_w / 2}" y="{height - 8}" '
               f'text-anchor="middle">{html.escape(xlabel)}</text>')
    out.append(f'<text x="16" y="{top + plot_h / 2}" text-anchor="middle" '
               f'transform="rotate(-90 16 {top + plot_h / 2})">{html.escape(ylabel)}</text>')
    for i, (name, pts) in enumerate(series.items()):
        color = COLORS[i % len(COLORS)]
        if pts:
            path = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in pts)
            out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="2"/>')
            out.extend(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{color}"/>'
                       for x, y in pts)
        ly = top + 14 + 18 * i
        out.append(f'<line x1="{left + plot_w + 10}" x2="{left + plot_w + 28}" y1="{ly - 4}" '
                   f'y2="{ly - 4}" stroke="{color}" stroke-width="2"/>')
        out.append(f'<text x="{left + plot_w + 32}" y="{ly}">{html.escape(name)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_svg_plot(path: str | os.PathLike, series: dict[str, list[tuple[float, float]]],
                   title: str = "",
                   xlabel: str = "", ylabel: str = "") -> None:
    """Write `svg_line_plot(...)` to `path` atomically."""
    write_text_atomic(path, svg_line_plot(series, title, xlabel, ylabel))
