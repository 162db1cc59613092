"""Charts of a tune report: tok/s against concurrency per layout, as terminal text and as SVG.

Pure string building, no plotting library: the SVG is a small hand-written line chart (concurrency
on a log2 axis), readable in any browser.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from html import escape
from typing import Any

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf")


def _series(report: Mapping[str, Any]) -> list[tuple[str, bool, str | None, list[tuple[int, float]]]]:
    """(label, winner, error, [(C, tok/s)]) per candidate, in report order."""
    out = []
    for row in report["candidates"]:
        pts = sorted((int(c), float(v["tok_s"])) for c, v in row["levels"].items())
        out.append((row["layout"], bool(row["winner"]), row.get("error"), pts))
    return out


def text_chart(report: Mapping[str, Any], width: int = 40) -> str:
    """Bars grouped by concurrency; the winner marked with *; a failed layout says so."""
    series = _series(report)
    peak = max((v for _, _, _, pts in series for _, v in pts), default=0.0) or 1.0
    levels: Sequence[int] = report["concurrency"]
    name_w = max((len(s[0]) for s in series), default=6) + 2
    lines = [f"output tok/s by concurrency (full bar = {peak:,.0f} tok/s)"]
    for c in levels:
        lines.append(f"C={c}")
        for label, win, error, pts in series:
            mark = "*" if win else " "
            value = dict(pts).get(c)
            if value is None:
                lines.append(f"  {mark}{label:<{name_w}}" + ("failed to load" if error else "-"))
                continue
            bar = "#" * max(1 if value > 0 else 0, round(value / peak * width))
            lines.append(f"  {mark}{label:<{name_w}}{bar:<{width}} {value:,.0f}")
    return "\n".join(lines)


def svg_chart(report: Mapping[str, Any], width: int = 720, height: int = 420) -> str:
    series = _series(report)
    levels = sorted(int(c) for c in report["concurrency"])
    peak = max((v for _, _, _, pts in series for _, v in pts), default=0.0) or 1.0
    left, right, top, bottom = 70, 190, 40, 50
    pw, ph = width - left - right, height - top - bottom
    lo, hi = math.log2(levels[0]), math.log2(levels[-1])

    def x(c: int) -> float:
        return left + (pw / 2 if hi == lo else (math.log2(c) - lo) / (hi - lo) * pw)

    def y(v: float) -> float:
        return top + ph - v / peak * ph

    title = f"{report['model']} on {report['host']}: output tok/s vs concurrency (tune run #{report['run']})"
    out = [
        (
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'font-family="sans-serif" font-size="12">'
        ),
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="22" font-size="14">{escape(title)}</text>',
        f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="black"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="black"/>',
        f'<text x="{left + pw / 2}" y="{height - 12}" text-anchor="middle">concurrency</text>',
        (
            f'<text x="16" y="{top + ph / 2}" transform="rotate(-90 16 {top + ph / 2})" '
            'text-anchor="middle">output tok/s</text>'
        ),
    ]
    for c in levels:
        out.append(f'<text x="{x(c):.1f}" y="{top + ph + 18}" text-anchor="middle">{c}</text>')
    for i in range(5):
        v = peak * i / 4
        out.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:,.0f}</text>')
        out.append(f'<line x1="{left}" y1="{y(v):.1f}" x2="{left + pw}" y2="{y(v):.1f}" stroke="#ddd"/>')
    for i, (label, win, error, pts) in enumerate(series):
        color = COLORS[i % len(COLORS)]
        if len(pts) > 1:
            path = " ".join(f"{x(c):.1f},{y(v):.1f}" for c, v in pts)
            out.append(f'<polyline points="{path}" fill="none" stroke="{color}" stroke-width="{3 if win else 1.5}"/>')
        out += [f'<circle cx="{x(c):.1f}" cy="{y(v):.1f}" r="3" fill="{color}"/>' for c, v in pts]
        legend = label + (" (winner)" if win else "") + (" (failed to load)" if error else "")
        ly = top + 16 * i
        out.append(f'<rect x="{left + pw + 14}" y="{ly}" width="10" height="10" fill="{color}"/>')
        out.append(f'<text x="{left + pw + 30}" y="{ly + 9}">{escape(legend)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
