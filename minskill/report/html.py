"""The HTML of the report pages (minskill/report/): escaping helpers, tables, diffs and the page
itself.

The page is one file: inline CSS and inline SVG, no script, nothing fetched (a
Content-Security-Policy of default-src 'none' makes a browser refuse anything else and say so in its
console, which the test reads). Every text that comes from a run (skills, model replies, task
questions, teacher output) is untrusted and goes through html.escape: the helpers below take plain
strings and escape them, and only their own markup is marked `Safe`.
"""
from __future__ import annotations

import difflib
import html
import json

from minskill.plot import svg_line_plot
from minskill.report.provenance import NOT_RECORDED

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; \
max-width: 1200px;
       padding: 16px 24px; color: #1d1d1f; background: #fafafa; }
h1 { font-size: 22px; margin: 8px 0 4px; } h2 { font-size: 18px; margin: 28px 0 8px; \
border-bottom: 1px solid #ccc; }
h3 { font-size: 15px; margin: 18px 0 6px; } .muted { color: #666; } .small { font-size: 12px; }
table { border-collapse: collapse; margin: 6px 0 12px; background: white; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
pre { white-space: pre-wrap; word-break: break-word; background: white; border: 1px solid #ddd; \
padding: 6px 8px;
      margin: 4px 0; font: 12px/1.35 ui-monospace, Menlo, Consolas, monospace; max-height: 340px; \
overflow: auto; }
.nr { color: #a15c00; font-style: italic; }
.card { background: white; border: 1px solid #ddd; border-radius: 6px; padding: 8px 12px; margin: \
8px 0; }
.card.carried { border: 2px solid #2ca02c; } .card.rejected { opacity: .85; }
.badge { display: inline-block; padding: 0 6px; border-radius: 9px; font-size: 12px; background: \
#eee; margin-right: 4px; }
.badge.ok { background: #d7f0d7; } .badge.no { background: #f6d6d6; } .badge.best { background: \
#2ca02c; color: white; }
.add { background: #e6ffec; display: block; } .del { background: #ffebe9; display: block; } .hunk \
{ color: #888; display: block; }
.grid { display: flex; flex-wrap: wrap; gap: 8px; } .grid > .card { flex: 1 1 340px; margin: 0; }
.box { background: #fff8e6; border: 1px solid #f0d9a0; padding: 6px 12px; border-radius: 6px; }
svg { max-width: 100%; height: auto; } details > summary { cursor: pointer; }
.flags { display: flex; flex-wrap: wrap; gap: 4px 14px; font-size: 13px; } .flags > span { \
white-space: nowrap; }
"""


class Safe(str):
    """Markup made here (escaped already): the helpers insert it as it is and escape every other
    string."""


def esc(value) -> Safe:
    return value if isinstance(value, Safe) else Safe(html.escape("" if value is None
                                                                  else str(value), quote=True))


def tag(name: str, *children, cls: str | None = None) -> Safe:
    attr = f' class="{esc(cls)}"' if cls else ""
    return Safe(f"<{name}{attr}>" + "".join(esc(c) for c in children) + f"</{name}>")


def join(*parts) -> Safe:
    return Safe("".join(esc(p) for p in parts if p is not None))


def not_recorded(what: str = "") -> Safe:
    return tag("span", NOT_RECORDED + (f" ({what})" if what else ""), cls="nr")


def num(value, digits: int = 3) -> Safe:
    """A number for a table cell: floats with `digits` decimals (none from 100 up), '–' for None."""
    if value is None:
        return esc("–")
    if isinstance(value, float):
        return esc(f"{value:.0f}" if abs(value) >= 100 else f"{value:.{digits}f}")
    return esc(value)


def table(head: list, rows: list[list], numeric: tuple[int, ...] = ()) -> Safe:
    out = ["<table><tr>", *(f"<th>{esc(h)}</th>" for h in head), "</tr>"]
    for row in rows:
        out.append("<tr>" + "".join(f'<td class="num">{esc(c)}</td>' if i in numeric
                                    else f"<td>{esc(c)}</td>"
                                    for i, c in enumerate(row)) + "</tr>")
    return Safe("".join(out) + "</table>")


def pre(text, limit: int = 6000) -> Safe:
    text = "" if text is None else str(text)
    return tag("pre", text if len(text) <= limit else text[:limit]
               + f"\n[... {len(text) - limit} more characters]")


def details(summary, *body, open_: bool = False) -> Safe:
    return Safe(f"<details{' open' if open_ else ''}><summary>{esc(summary)}</summary>"
                + "".join(esc(b) for b in body) + "</details>")


def diff_html(old: str | None, new: str | None, old_name: str = "parent",
              new_name: str = "this") -> Safe:
    """A line diff of `new` against `old` (difflib, 2 lines of context), each line escaped."""
    if old is None:
        return tag("span", "no parent to diff against", cls="muted small")
    if new is None:
        return tag("span", "no skill (the reply did not parse)", cls="muted small")
    if old == new:
        return tag("span", f"identical to its {old_name}", cls="muted small")
    lines = list(difflib.unified_diff(old.splitlines(), new.splitlines(), old_name, new_name, n=2,
                                      lineterm=""))
    spans = []
    for line in lines[2:]:
        cls = "hunk" if line.startswith(
            "@@") else "add" if line.startswith("+") else "del" if line.startswith("-") else None
        spans.append(tag("span", line, cls=cls) if cls else Safe(esc(line) + "\n"))
    return Safe("<pre>" + "".join(spans) + "</pre>")


def plot(series: dict, title: str, xlabel: str, ylabel: str) -> Safe:
    """minskill/plot.py's SVG, inline (it escapes its own labels)."""
    svg = svg_line_plot(series, title=title, xlabel=xlabel, ylabel=ylabel)
    return Safe(svg[svg.index("<svg"):])


def tasks_list(ids: list[str], questions: dict[str, str] | None = None, limit: int = 12) -> Safe:
    if not ids:
        return esc("none")
    shown = [f"{t}: {questions[t][:90]}" if questions and t in questions else t
             for t in ids[:limit]]
    return join(", ".join(shown) if not questions else Safe("<br>".join(esc(s) for s in shown)),
                f" (+{len(ids) - limit} more)" if len(ids) > limit else "")


def gained_lost_html(result, questions: dict[str, str] | None = None, what: str = "") -> Safe:
    """Badges with the counts of tasks gained and lost, the tasks in a <details>; what="no parent":
    nothing to compare, otherwise None is `what` not being recorded."""
    if what == "no parent":
        return tag("span", "no parent to compare with", cls="muted small")
    if result is None:
        return not_recorded(what or "per-task scores")
    gained, lost, n = result
    return join(tag("span", f"gained {len(gained)}", cls="badge ok"),
                tag("span", f"lost {len(lost)}", cls="badge no"),
                tag("span", f"of {n} tasks scored on both", cls="muted small"),
                details("which tasks", tag("div", "gained: ", tasks_list(gained, questions)),
                        tag("div", "lost: ", tasks_list(lost, questions))) if gained or lost
                else None)


def cost_table(rows: list[list]) -> Safe:
    """[role, calls, tokens, seconds, note]: None cells say "not recorded by this run", strings are
    shown as they are (e.g. "n/a")."""
    return table(["role", "calls", "tokens", "seconds", "note"],
                 [[r[0], *(not_recorded() if v is None else v if isinstance(v, str) else num(v, 1)
                           for v in r[1:4]),
                   r[4]] for r in rows],
                 numeric=(1, 2, 3))


SECONDS_NOTE = ("seconds: wall seconds with a request of this role in flight; the summed request "
                "seconds of concurrent calls exceed the wall time")


def usage_row(role: str, usage: dict | None, note: str = "") -> list:
    """A cost_table row from client.Usage counts (None: not recorded): calls, prompt + completion
    tokens, busy seconds; the note adds the token split, the summed request seconds, failures and a
    phase's wall seconds."""
    if not usage:
        return [role, None, None, None, note]
    parts = [note, f"{usage.get('prompt_tokens', 0)} prompt + {usage.get('completion_tokens', 0)} "
             "completion tokens",
             f"Σ request seconds {usage.get('request_seconds', 0):.1f}"]
    if usage.get("wall_seconds") is not None:
        parts.append(f"phase wall seconds {usage['wall_seconds']:.1f}")
    if usage.get("failures"):
        parts.append(f"{usage['failures']} failed calls")
    return [role, usage.get("calls", 0), usage.get("prompt_tokens", 0)
            + usage.get("completion_tokens", 0),
            float(usage.get("busy_seconds", 0.0)), "; ".join(p for p in parts if p)]


def flags_table(flags: dict | None, keys: tuple[str, ...]) -> Safe:
    """The run's flags as compact `--flag value` chips."""
    if not flags:
        return not_recorded("the run's flags")
    chips = [tag("span", tag("b", f"--{k.replace('_', '-')}"), " ",
                 json.dumps(flags[k], ensure_ascii=False))
             for k in keys if k in flags]
    return Safe('<div class="flags">' + "".join(chips) + "</div>")


def kv_table(pairs: list[tuple]) -> Safe:
    return Safe("<table>" + "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>"
                                    for k, v in pairs) + "</table>")


def missing_box(items: list[str]) -> Safe | None:
    if not items:
        return None
    return Safe('<div class="box"><b>Not recorded by this run</b> (shown as such below):<ul>'
                + "".join(f"<li>{esc(i)}</li>" for i in items) + "</ul></div>")


def page(title: str, subtitle: str, sections: list) -> str:
    body = join(tag("h1", title), tag("div", subtitle, cls="muted"), *sections)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{esc(CSP)}\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{esc(title)}</title><style>{CSS}</style></head>\n"
            f"<body>\n{body}\n</body></html>\n")
