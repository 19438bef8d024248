"""The report page of a transfer matrix (minskill/measure/transfer.py's run folder): a heat map and
the table.

    render_transfer(run) -> str    one self-contained HTML page (minskill/report/html.py's page and
                                   helpers)

of a run that provenance.load_run read (load_transfer: transfer.json, checked enough to draw,
NotARun otherwise).

The heat map is inline SVG: a row per library, a column per target, each cell filled by its success
rate on a white → blue scale (0 → 1) and labelled with the rate and the paired difference to its
column's reference (Δ, tasks gained/lost, sign-test p; "reference" on the reference itself), and, in
its corner, the rollouts that ended with an error (the target did not answer; counted as failed).
The best success of each column has a dark border, so a crossing (target A best with library X,
target B with Y) is visible at a glance. Every string of the run (labels, specs, model names,
questions) goes through html.esc.
"""
from __future__ import annotations

from minskill.report.html import (Safe, details, esc, gained_lost_html, join, kv_table, missing_box,
                                  num, page, table,
                                  tag)

CELL_W, CELL_H, LABEL_W, HEAD_H, LEGEND_H = 170, 58, 170, 44, 46
LOW, HIGH = (247, 251, 255), (8, 69, 148)       # the colours of success 0 and 1


def colour(success: float) -> str:
    """The fill of a cell: linear from LOW (0) to HIGH (1)."""
    s = min(1.0, max(0.0, float(success)))
    return "#" + "".join(f"{round(a + (b - a) * s):02x}" for a, b in zip(LOW, HIGH))


def short(text, limit: int = 22) -> str:
    text = str(text)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def delta_text(cell: dict) -> str:
    d = cell.get("paired")
    if cell.get("status") != "scored":
        return "rewrite did not parse"
    if d is None:
        return "reference"
    return f"Δ {d['diff']:+.2f}  +{d['gained']}/−{d['lost']}  p {d['p']:.2g}"


def svg_text(x: float, y: float, text, size: int = 12, fill: str = "#1d1d1f",
             anchor: str = "middle",
             weight: str = "normal") -> str:
    return (f'<text x="{x:.0f}" y="{y:.0f}" font-size="{size}" fill="{fill}" '
            f'text-anchor="{anchor}" font-weight="{weight}" font-family="system-ui, '
            f'sans-serif">{esc(text)}</text>')


def svg_cell(x: float, y: float, cell: dict | None, best: bool) -> str:
    if cell is None or cell.get("success") is None:
        why = "not run" if cell is None else "rewrite did not parse"
        return (f'<rect x="{x}" y="{y}" width="{CELL_W}" height="{CELL_H}" fill="#e4e4e4" '
                'stroke="#fff"/>'
                + svg_text(x + CELL_W / 2, y + CELL_H / 2 + 4, why, 11, "#666"))
    success = float(cell["success"])
    ink = "#ffffff" if success > 0.55 else "#1d1d1f"
    lo, hi = cell.get("ci95") or (0.0, 1.0)
    errors = cell.get("errors") if isinstance(cell.get("errors"), int) else 0
    tip = (f"{cell['library']} on {cell['target']}: success {success:.3f} (95% {lo:.3f}–{hi:.3f}), "
           f"n {cell['n']}; {delta_text(cell)}"
           + (f"; {errors} rollouts ended with an error (counted as failed)" if errors else ""))
    # rollouts that ended with an error are failures of the target's endpoint,
    # not of the library: shown apart
    flag = svg_text(x + CELL_W - 5, y + 12, f"{errors} errors", 10,
                    "#b00020" if success <= 0.55 else "#ffd7dc",
                    anchor="end", weight="bold") if errors else ""
    border = (f'<rect x="{x + 2}" y="{y + 2}" width="{CELL_W - 4}" height="{CELL_H - 4}" '
              f'fill="none" stroke="#111" stroke-width="3"/>') if best else ""
    return (f'<g><title>{esc(tip)}</title><rect x="{x}" y="{y}" width="{CELL_W}" height="{CELL_H}" '
            f'fill="{colour(success)}" stroke="#fff"/>{border}'
            + svg_text(x + CELL_W / 2, y + 24, f"{success:.2f}", 17, ink, weight="bold")
            + svg_text(x + CELL_W / 2, y + 44, delta_text(cell), 11, ink) + flag + "</g>")


def best_per_target(data: dict) -> dict:
    out = {}
    for c in data["cells"]:
        if c.get("success") is not None:
            out[c["target"]] = max(out.get(c["target"], -1.0), float(c["success"]))
    return out


def heat_map(data: dict) -> Safe:
    """The matrix as inline SVG (module docstring)."""
    rows, cols = data["libraries"], data["targets"]
    cells = {(c["library"], c["target"]): c for c in data["cells"]}
    best = best_per_target(data)
    width = max(LABEL_W + CELL_W * len(cols) + 10, LABEL_W + 600)     # room for the legend's words
    height = HEAD_H + CELL_H * len(rows) + LEGEND_H
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" '
             f'role="img"><title>{esc("transfer matrix: success per library and target")}</title>']
    for j, t in enumerate(cols):
        parts.append(svg_text(LABEL_W + CELL_W * (j + 0.5), HEAD_H - 12, short(t["label"]), 13,
                              weight="bold"))
    for i, r in enumerate(rows):
        y = HEAD_H + CELL_H * i
        parts.append(svg_text(LABEL_W - 10, y + CELL_H / 2 + 5, short(r["label"]), 13, anchor="end",
                              weight="bold"))
        for j, t in enumerate(cols):
            cell = cells.get((r["label"], t["label"]))
            is_best = cell is not None and cell.get("success") is not None and \
                float(cell["success"]) == best.get(t["label"])
            parts.append(svg_cell(LABEL_W + CELL_W * j, y, cell, is_best))
    parts.append(legend(LABEL_W, HEAD_H + CELL_H * len(rows) + 12))
    return Safe("".join(parts) + "</svg>")


def legend(x: float, y: float) -> str:
    """The colour scale: ten steps from success 0 to 1, and what the border means."""
    steps = "".join(f'<rect x="{x + 22 * k}" y="{y}" width="22" height="12" fill="{colour(k / 9)}" '
                    'stroke="#ccc"/>'
                    for k in range(10))
    return (steps + svg_text(x, y + 26, "0", 11, anchor="start")
            + svg_text(x + 220, y + 26, "1", 11, anchor="end")
            + svg_text(x + 232, y + 10, "success rate; dark border: the best library of its target",
                       11,
                       anchor="start"))


def cell_summary(cell: dict) -> str:
    if cell.get("success") is None:
        return "–"
    lo, hi = cell.get("ci95") or (0.0, 1.0)
    return f"{float(cell['success']):.2f} ({float(lo):.2f}–{float(hi):.2f})"


def cells_table(data: dict) -> Safe:
    rows = []
    for c in data["cells"]:
        d = c.get("paired") or {}
        rows.append([c["library"], c["target"], c.get("reference"), c.get("n"), cell_summary(c),
                     num(d.get("diff")), d.get("gained", "–"), d.get("lost", "–"), num(d.get("p")),
                     c.get("errors", "–"), c.get("note") or ""])
    return table(["library", "target", "paired against", "n", "success (95% CI)", "Δ", "gained",
                  "lost",
                  "sign test p", "errors", "note"], rows, numeric=(3, 5, 6, 7, 8, 9))


def gained_lost_lists(data: dict) -> list:
    """Per paired cell: which tasks it gained and lost against its reference (from the per-task
    rewards)."""
    ids, questions = data.get("task_ids") or [], dict(zip(data.get("task_ids") or [],
                                                          data.get("questions") or []))
    rewards = {(c["library"], c["target"]): c.get("rewards") for c in data["cells"]}
    out = []
    for c in data["cells"]:
        mine, ref = c.get("rewards"), rewards.get((c.get("reference"), c["target"]))
        if not c.get(
            "paired") or not mine or not ref or len(mine) != len(ids) or len(ref) != len(ids):
            continue
        gained = [t for t, a, b in zip(ids, ref, mine) if b > a]
        lost = [t for t, a, b in zip(ids, ref, mine) if b < a]
        out.append(join(tag("h3", f"{c['library']} on {c['target']}, against {c['reference']}"),
                        gained_lost_html((gained, lost, len(ids)), questions)))
    return out


def render_transfer(run: dict) -> str:
    data = run["transfer"]
    expected = len(data["libraries"]) * len(data["targets"])
    missing = [] if data.get("complete") else [f"{expected - len(data['cells'])} of {expected} "
                                                "cells: the run stopped before them "
                                               "(transfer.json says complete: false)"]
    targets = [[t["label"], t.get("url") or f"embedded {t.get('spec')}", t.get("model"),
                t.get("quantize")]
               for t in data["targets"]]
    libraries = [[r["label"], r.get("spec"), r.get("rewritten_from") or ""]
                 for r in data["libraries"]]
    return page("Transfer matrix: skill libraries × target models",
                f"{run['folder']} · read transfer.json", [
        missing_box(missing),
        kv_table([("tasks",
                   f"{data.get('n_tasks')} held-out tasks of {data.get('suite')} (task seed "
                            f"{data.get('task_seed')}), the same for every cell"),
                  ("rewriter", data.get("rewriter") or "none"), ("seconds", data.get("seconds")),
                  ("command", data.get("command"))]),
        tag("h2", "Success per library and target"),
        tag("p",
            "Each cell: success rate on the same tasks, and the paired difference to the column's "
                 "reference library (its own library: the one with the target's label; else the "
                 "first library; a +rw row against its input): Δ success, tasks gained/lost, "
            "two-sided exact sign test p.",
            cls="muted small"),
        heat_map(data), tag("h2", "Cells"), cells_table(data),
        tag("h2", "Targets"), table(["label", "endpoint", "model", "quantize"], targets),
        tag("h2", "Libraries"), table(["label", "spec", "rewritten from"], libraries),
        details("tasks gained and lost, per cell", *gained_lost_lists(data))])
