"""The edit-provenance report: one self-contained HTML page for a run folder.

    python -m minskill.report RUN_DIR [-o report.html]       (default: RUN_DIR/report.html; -o FOLDER:
                                                               FOLDER/report.html)

RUN_DIR is a train_grpo.py training folder, a `train_grpo.py --eval` folder, an evolve_masa.py folder, a
`rewrite.py apply --compare` folder, a `rewrite.py train` folder (minskill/provenance.py reads them) or a
`python -m minskill.transfer` folder (its heat map: minskill/report_transfer.py). The
page shows the reward and loss curves (minskill/plot.py's SVG), the cost per role (calls, tokens, seconds:
client.Usage as the runs record it), and the story of each edit: for Skill-R1 the skill lineage of every
instance across generations (each skill diffed against its parent, with its reward and the tasks it gained
and lost); for --eval the table and paired table as printed and, per instance, the skills each editor wrote
with their rewards and the tasks gained and lost against no skill; for MASA the hill-climbing trajectory,
each UCB1 tree drawn as a tree and every candidate with the teacher's failure attribution and the failed
episodes that motivated it (minskill/report_masa.py); for --compare the three skill sets side by side.
Whatever the run did not record (e.g. a folder written before a field existed) is shown as "not recorded by
this run", never guessed, and no model is run.

The page is one file: inline CSS and inline SVG, no script, nothing fetched (a Content-Security-Policy of
default-src 'none' makes a browser refuse anything else and say so in its console, which the test reads).
Every text that comes from a run (skills, model replies, task questions, teacher output) is untrusted and
goes through html.escape: the helpers below take plain strings and escape them, and only their own markup is
marked `Safe`. The page is written atomically (runs.write_text_atomic). Only the run's own files are read: one
that links out of RUN_DIR, a file of the wrong shape or one nested too deeply is an error naming it (exit 2).
"""
from __future__ import annotations

import argparse
import difflib
import html
import json
import sys
from pathlib import Path

from minskill.plot import svg_line_plot
from minskill.provenance import NOT_RECORDED, NotARun, gained_lost, lineage_scores, load_run
from minskill.runs import write_text_atomic

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0 auto; max-width: 1200px;
       padding: 16px 24px; color: #1d1d1f; background: #fafafa; }
h1 { font-size: 22px; margin: 8px 0 4px; } h2 { font-size: 18px; margin: 28px 0 8px; border-bottom: 1px solid #ccc; }
h3 { font-size: 15px; margin: 18px 0 6px; } .muted { color: #666; } .small { font-size: 12px; }
table { border-collapse: collapse; margin: 6px 0 12px; background: white; }
th, td { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
th { background: #f0f0f0; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
pre { white-space: pre-wrap; word-break: break-word; background: white; border: 1px solid #ddd; padding: 6px 8px;
      margin: 4px 0; font: 12px/1.35 ui-monospace, Menlo, Consolas, monospace; max-height: 340px; overflow: auto; }
.nr { color: #a15c00; font-style: italic; }
.card { background: white; border: 1px solid #ddd; border-radius: 6px; padding: 8px 12px; margin: 8px 0; }
.card.carried { border: 2px solid #2ca02c; } .card.rejected { opacity: .85; }
.badge { display: inline-block; padding: 0 6px; border-radius: 9px; font-size: 12px; background: #eee; margin-right: 4px; }
.badge.ok { background: #d7f0d7; } .badge.no { background: #f6d6d6; } .badge.best { background: #2ca02c; color: white; }
.add { background: #e6ffec; display: block; } .del { background: #ffebe9; display: block; } .hunk { color: #888; display: block; }
.grid { display: flex; flex-wrap: wrap; gap: 8px; } .grid > .card { flex: 1 1 340px; margin: 0; }
.box { background: #fff8e6; border: 1px solid #f0d9a0; padding: 6px 12px; border-radius: 6px; }
svg { max-width: 100%; height: auto; } details > summary { cursor: pointer; }
.flags { display: flex; flex-wrap: wrap; gap: 4px 14px; font-size: 13px; } .flags > span { white-space: nowrap; }
"""


class Safe(str):
    """Markup made here (escaped already): the helpers insert it as it is and escape every other string."""


def esc(value) -> Safe:
    return value if isinstance(value, Safe) else Safe(html.escape("" if value is None else str(value), quote=True))


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
        out.append("<tr>" + "".join(f'<td class="num">{esc(c)}</td>' if i in numeric else f"<td>{esc(c)}</td>"
                                    for i, c in enumerate(row)) + "</tr>")
    return Safe("".join(out) + "</table>")


def pre(text, limit: int = 6000) -> Safe:
    text = "" if text is None else str(text)
    return tag("pre", text if len(text) <= limit else text[:limit] + f"\n[... {len(text) - limit} more characters]")


def details(summary, *body, open_: bool = False) -> Safe:
    return Safe(f"<details{' open' if open_ else ''}><summary>{esc(summary)}</summary>"
                + "".join(esc(b) for b in body) + "</details>")


def diff_html(old: str | None, new: str | None, old_name: str = "parent", new_name: str = "this") -> Safe:
    """A line diff of `new` against `old` (difflib, 2 lines of context), each line escaped."""
    if old is None:
        return tag("span", "no parent to diff against", cls="muted small")
    if new is None:
        return tag("span", "no skill (the reply did not parse)", cls="muted small")
    if old == new:
        return tag("span", f"identical to its {old_name}", cls="muted small")
    lines = list(difflib.unified_diff(old.splitlines(), new.splitlines(), old_name, new_name, n=2, lineterm=""))
    spans = []
    for line in lines[2:]:
        cls = "hunk" if line.startswith("@@") else "add" if line.startswith("+") else "del" if line.startswith("-") else None
        spans.append(tag("span", line, cls=cls) if cls else Safe(esc(line) + "\n"))
    return Safe("<pre>" + "".join(spans) + "</pre>")


def plot(series: dict, title: str, xlabel: str, ylabel: str) -> Safe:
    """minskill/plot.py's SVG, inline (it escapes its own labels)."""
    svg = svg_line_plot(series, title=title, xlabel=xlabel, ylabel=ylabel)
    return Safe(svg[svg.index("<svg"):])


def tasks_list(ids: list[str], questions: dict[str, str] | None = None, limit: int = 12) -> Safe:
    if not ids:
        return esc("none")
    shown = [f"{t}: {questions[t][:90]}" if questions and t in questions else t for t in ids[:limit]]
    return join(", ".join(shown) if not questions else Safe("<br>".join(esc(s) for s in shown)),
                f" (+{len(ids) - limit} more)" if len(ids) > limit else "")


def gained_lost_html(result, questions: dict[str, str] | None = None, what: str = "") -> Safe:
    """Badges with the counts of tasks gained and lost, the tasks in a <details>; what="no parent": nothing to
    compare, otherwise None is `what` not being recorded."""
    if what == "no parent":
        return tag("span", "no parent to compare with", cls="muted small")
    if result is None:
        return not_recorded(what or "per-task scores")
    gained, lost, n = result
    return join(tag("span", f"gained {len(gained)}", cls="badge ok"), tag("span", f"lost {len(lost)}", cls="badge no"),
                tag("span", f"of {n} tasks scored on both", cls="muted small"),
                details("which tasks", tag("div", "gained: ", tasks_list(gained, questions)),
                        tag("div", "lost: ", tasks_list(lost, questions))) if gained or lost else None)


def cost_table(rows: list[list]) -> Safe:
    """[role, calls, tokens, seconds, note]: None cells say "not recorded by this run", strings are shown as
    they are (e.g. "n/a")."""
    return table(["role", "calls", "tokens", "seconds", "note"],
                 [[r[0], *(not_recorded() if v is None else v if isinstance(v, str) else num(v, 1) for v in r[1:4]),
                   r[4]] for r in rows],
                 numeric=(1, 2, 3))


SECONDS_NOTE = ("seconds: wall seconds with a request of this role in flight; the summed request seconds of "
                "concurrent calls exceed the wall time")


def usage_row(role: str, usage: dict | None, note: str = "") -> list:
    """A cost_table row from client.Usage counts (None: not recorded): calls, prompt + completion tokens, busy
    seconds; the note adds the token split, the summed request seconds, failures and a phase's wall seconds."""
    if not usage:
        return [role, None, None, None, note]
    parts = [note, f"{usage.get('prompt_tokens', 0)} prompt + {usage.get('completion_tokens', 0)} completion tokens",
             f"Σ request seconds {usage.get('request_seconds', 0):.1f}"]
    if usage.get("wall_seconds") is not None:
        parts.append(f"phase wall seconds {usage['wall_seconds']:.1f}")
    if usage.get("failures"):
        parts.append(f"{usage['failures']} failed calls")
    return [role, usage.get("calls", 0), usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0),
            float(usage.get("busy_seconds", 0.0)), "; ".join(p for p in parts if p)]


def flags_table(flags: dict | None, keys: tuple[str, ...]) -> Safe:
    """The run's flags as compact `--flag value` chips."""
    if not flags:
        return not_recorded("the run's flags")
    chips = [tag("span", tag("b", f"--{k.replace('_', '-')}"), " ", json.dumps(flags[k], ensure_ascii=False))
             for k in keys if k in flags]
    return Safe('<div class="flags">' + "".join(chips) + "</div>")


def kv_table(pairs: list[tuple]) -> Safe:
    return Safe("<table>" + "".join(f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in pairs) + "</table>")


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
            f"<title>{esc(title)}</title><style>{CSS}</style></head>\n<body>\n{body}\n</body></html>\n")


# ---------------------------------------------------------------------------------------------- Skill-R1

SKILL_R1_FLAGS = ("editor_spec", "suite", "steps", "instances_per_step", "generations", "candidates", "rollouts",
                  "lam", "beta", "agg", "lr", "tasks_per_instance", "max_skill_tokens", "seed_skills", "task_url",
                  "lora_rank", "probe_every", "seed", "checkpoint_step")


def skill_r1_curves(rows: list[dict]) -> Safe:
    n_gen = max(len(r["reward_per_generation"]) for r in rows)
    rewards = {("seed skill (g=0)" if g == 0 else f"generation {g}"):
               [(r["step"] + 1, r["reward_per_generation"][g]) for r in rows if g < len(r["reward_per_generation"])]
               for g in range(n_gen)}
    probes = [p for r in rows for p in r.get("probes") or []]
    if probes:
        rewards["probe: candidates"] = [(p["after_steps"], p["reward_per_generation"][-1]) for p in probes]
        rewards["probe: seed skill"] = [(p["after_steps"], p["reward_per_generation"][0]) for p in probes]
    loss = {k: [(r["step"] + 1, r[k]) for r in rows if isinstance(r.get(k), (int, float))]
            for k in ("loss", "kl", "grad_norm")}
    return join(tag("h2", "Curves"),
                plot(rewards, "mean candidate reward per generation (training; held-out probe)", "training step",
                     "mean verifier reward"),
                plot(loss, "policy loss (≈ 0 by construction: advantages are centred), KL, gradient norm",
                     "training step", "value"))


def skill_r1_costs(rows: list[dict]) -> Safe:
    def total(key, scale=None):
        values = [r[key] * (r[scale] if scale else 1) for r in rows if key in r and (scale is None or scale in r)]
        return sum(values) if values else None
    probes = [p for r in rows for p in r.get("probes") or []]
    split = split_task_seconds(rows)
    probe_usage = [p["task_usage"] for p in probes if p.get("task_usage")]
    task_row = (usage_row("task model (training rollouts)", {
        "calls": total("task_calls"), "prompt_tokens": total("task_prompt_tokens"),
        "completion_tokens": total("task_completion_tokens"), "request_seconds": total("task_request_seconds"),
        "busy_seconds": total("task_seconds")}, SECONDS_NOTE) if split else
        ["task model (training rollouts)", total("task_calls"), total("task_tokens"), None,
         "its seconds are not separate: they are in the editor's sampling row"])
    sampling = (["editor: sampling", "n/a (local)", total("editor_sampled_tokens"), total("seconds_editor_sampling"),
                 "tokens = sampled skill tokens; seconds = the sampling phase's wall time minus the task model's "
                 "busy seconds in it"] if split else
                ["editor: sampling + task rollouts", "n/a (local)",
                 total("editor_sample_tokens_per_s", "seconds_sampling_and_rollouts"),
                 total("seconds_sampling_and_rollouts"), "tokens = sampled skill tokens"])
    return join(tag("h2", "Cost per role"), cost_table([
        task_row, sampling,
        ["editor: policy update", "n/a (local)", total("train_tokens_per_s", "seconds_update"), total("seconds_update"),
         "tokens = trained completion tokens"],
        ["held-out probes (editor + task model)", sum(p.get("task_calls", 0) for p in probes) if probes else None,
         sum(u["prompt_tokens"] + u["completion_tokens"] for u in probe_usage) if probe_usage else None,
         sum(p.get("seconds", 0) for p in probes) if probes else None, f"{len(probes)} probes; wall seconds"],
        ["teacher", "n/a", "n/a", "n/a", "Skill-R1 has no teacher"]]))


def split_task_seconds(rows: list[dict]) -> bool:
    """Whether the metrics rows time the task model apart from the editor (runs of this version on)."""
    return bool(rows) and all("task_seconds" in r and "seconds_editor_sampling" in r for r in rows)


def lineage_card(skill: dict, by_id: dict, task_ids: list[str], questions: dict, carried: set) -> Safe:
    parent = by_id.get(skill.get("parent"))
    scores, parent_scores = lineage_scores(skill, task_ids), parent and lineage_scores(parent, task_ids)
    badges = [tag("span", skill["id"], cls="badge"),
              tag("span", f"reward {skill.get('reward', 0):.2f}", cls="badge"),
              tag("span", f"A {skill['advantage']:+.2f}", cls="badge") if skill.get("advantage") is not None else None,
              tag("span", "carried", cls="badge best") if skill["id"] in carried else None,
              tag("span", f"parent {skill['parent']}", cls="muted small") if skill.get("parent") else None]
    if not skill.get("generation"):
        body = join(tag("div", "the instance's seed skill s_0 (no parent)", cls="muted small"),
                    pre(skill.get("text") or "(no skill)"))
    elif skill.get("text") is None:
        body = join(tag("div", "the reply did not parse: ", skill.get("parse_error") or "?", cls="small"),
                    pre(skill.get("reply") or "", 1500))
    else:
        body = join(tag("div", gained_lost_html(gained_lost(parent_scores, scores) if parent else None, questions,
                                                "no parent" if not parent else "task_scores"), cls="small"),
                    details("skill text", pre(skill.get("text") or "(no skill)")),
                    diff_html(parent.get("text") if parent else None, skill.get("text")))
    return Safe(f'<div class="card{" carried" if skill["id"] in carried else ""}">' + join(*badges, body) + "</div>")


def lineage_block(rec: dict, open_: bool) -> Safe:
    task_ids = list(rec.get("task_ids") or [])
    questions = dict(zip(task_ids, rec.get("questions") or []))
    by_id = {s["id"]: s for s in rec["skills"]}
    carried = set(rec["carried"])
    by_gen: dict[int, list[dict]] = {}
    for s in rec["skills"]:
        by_gen.setdefault(int(s.get("generation", 0)), []).append(s)
    prompts = {p["generation"]: p for p in rec.get("editor_prompts") or []}
    parts = []
    for g, skills in sorted(by_gen.items()):
        p = prompts.get(g)
        shown = (f"the editor was shown the current skill {p['current']} and the history "
                 f"{', '.join(p['history'])} (newest first, each with its first {p.get('outcomes_per_entry', '?')} "
                 f"task outcomes; oldest dropped first to fit), {p.get('prompt_tokens', '?')} prompt tokens"
                 if p else "the seed skill" if g == 0 else "editor prompt: " + NOT_RECORDED)
        parts.append(join(tag("h3", f"generation {g}"), tag("div", shown, cls="muted small"),
                          Safe('<div class="grid">' + "".join(lineage_card(s, by_id, task_ids, questions, carried)
                                                             for s in skills) + "</div>")))
    first, last = (by_id.get(rec["carried"][k], {}).get("reward") for k in (0, -1))   # (an id no skill has: –)
    title = (f"step {rec['step'] + 1} · instance {rec['instance']} ({rec.get('task_type', '?')}): carried "
             f"{' → '.join(rec['carried'])}, reward {num(first, 2)} → {num(last, 2)}")
    return details(title, tag("div", "tasks: ", tasks_list(task_ids, questions), cls="small"), *parts, open_=open_)


def skill_r1_lineage(run: dict) -> Safe:
    lineage = run["lineage"]
    if lineage is None:
        rows = run["rows"]
        best = table(["step", "instance", "best carried skill", "reward", "gain over its seed skill"],
                     [[r["step"] + 1, r.get("best_skill_instance", "?"), pre(r.get("best_skill", ""), 800),
                       num(r.get("best_skill_reward")), num(r.get("best_skill_gain"))] for r in rows], numeric=(0, 3, 4))
        return join(tag("h2", "Skill lineage"),
                    tag("p", not_recorded("lineage.jsonl: the parent, text, reward and per-task scores of every "
                                          "candidate; provenance.lineage_records"), ". What metrics.jsonl records: "
                        "the best carried skill of each step (no parent, no per-task outcome)."), best)
    blocks = [lineage_block(rec, open_=i in (0, len(lineage) - 1)) for i, rec in enumerate(lineage)]
    return join(tag("h2", "Skill lineage (each instance, generation by generation)"),
                tag("p", "Each skill is diffed against its parent, the skill carried into its generation (the "
                    "editor's \"current skill\"); gained / lost compare per-task scores with that parent.",
                    cls="muted small"), *blocks)


def skill_r1_probes(rows: list[dict]) -> Safe | None:
    probes = [p for r in rows for p in r.get("probes") or []]
    if not probes:
        return None
    return join(tag("h2", "Held-out probes"), table(
        ["after steps", "seed skill", "mean candidate", "carried", "beat the seed", "skills written"],
        [[p["after_steps"], num(p["reward_per_generation"][0]), num(p["reward_per_generation"][-1]),
          num(p.get("carried_reward")), num(p.get("beat_seed_share")),
          details(f"{len(p.get('skills') or [])} skills", *(join(tag("div", f"{s.get('instance')}: reward "
                  f"{s.get('reward', 0):.2f} (seed {s.get('seed_reward', 0):.2f})", cls="small"), pre(s.get("skill"), 600))
                  for s in (p.get("skills") or [])))] for p in probes], numeric=(0, 1, 2, 3, 4)))


def render_skill_r1(run: dict) -> str:
    rows, flags = run["rows"], run["flags"]
    missing = ([] if run["lineage"] is not None else
               ["the skill lineage (parent, text, reward, per-task scores and editor prompt of every candidate): "
                "train_grpo.py writes no lineage.jsonl yet (provenance.lineage_records is the record)"])
    if not split_task_seconds(rows):
        missing.append("the task model's seconds apart from the editor's sampling (one timer covers both)")
    if flags is None:
        missing.append("the run's flags (no readable checkpoint/trainer_state.pt)")
    if not rows:
        return page("Skill-R1 training", run["folder"], [missing_box(missing), tag("p", "metrics.jsonl has no step yet.")])
    last = rows[-1]
    summary = (f"{len(rows)} steps; mean candidate reward per generation, first step "
               f"{[round(x, 2) for x in rows[0]['reward_per_generation']]}, last step "
               f"{[round(x, 2) for x in last['reward_per_generation']]}")
    return page("Skill-R1 training: edit provenance", f"{run['folder']} · read {', '.join(run['files'])}", [
        missing_box(missing), tag("p", summary), tag("h2", "Run"), flags_table(flags, SKILL_R1_FLAGS),
        skill_r1_curves(rows), skill_r1_costs(rows), skill_r1_lineage(run), skill_r1_probes(rows)])


# ---------------------------------------------------------------------------------------------- --eval

EVAL_FLAGS = ("editor", "grpo_editor", "skillr1_editor", "suite", "seed_skills", "generations", "candidates",
              "rollouts", "tasks_per_instance", "eval_instances", "eval_tasks", "max_skill_tokens", "task_url",
              "task_model", "carry_gate", "seed")


def eval_tables(record: dict) -> Safe:
    rows, g = record["rows"], (record.get("flags") or {}).get("generations", 0)
    table_rows = [[r["name"], num(r["success"]), "–".join(f"{x:.2f}" for x in r.get("ci95") or []),
                   *(num(x) for x in (r.get("per_generation") or [None] * g)), r.get("evolve_calls"),
                   r.get("eval_calls"), num(r.get("kl"), 4)] for r in rows]
    # eval.json version 2 tests by instance (skill_r1_eval.eval_record); a version-1 record's p is the per-task
    # sign test and its interval a bootstrap over instances: shown as such
    by_task = record.get("version", 1) < 2
    paired = [[c["row"], c["against"], f"{c['difference']:+.3f} ({c['ci95'][0]:+.2f} to {c['ci95'][1]:+.2f})"
               + (" bootstrap" if by_task else ""), f"{c['p']:.3f}" + (" per task" if by_task else ""),
               f"{c.get('per_task_gained', c.get('gained'))} / {c.get('per_task_lost', c.get('lost'))}"]
              for c in record.get("paired") or []]
    return join(tag("h2", "Results (as printed)"),
                table(["method", "success", "95% CI", *(f"g={k + 1}" for k in range(g)), "task calls: evolve",
                       "task calls: evaluate", "KL to the frozen editor"], table_rows,
                      numeric=tuple(range(1, 6 + g))),
                tag("p", "success: share of evaluation tasks solved with the skill carried after the last generation; "
                    "g=k: after generation k; KL: nats per token of the skills the trained editor wrote.",
                    cls="muted small"),
                tag("h2", "Paired on the same tasks, by instance (minskill/paired.py)"),
                table(["row", "against", "difference (95% CI, by instance)", "p (sign-flip, by instance)",
                       "per task: gained / lost"], paired, numeric=(3,))
                if paired else not_recorded("the paired table (the evaluation did not finish)"),
                tag("p", "by instance: each instance carries its own evolved skill, so the instances are the units: "
                    "the mean per-instance difference, the two-sided sign-flip permutation test on the "
                    "per-instance differences and the interval that inverts it. per task: tasks scored higher / "
                    "lower, a description only (the tasks of an instance share one skill)." if not by_task else
                    "This record is of eval.json version 1: its p is the per-task sign test, which treats the "
                    "tasks of one instance as independent and overstates significance, and its interval a "
                    "percentile bootstrap over instances; evaluate again for the test by instance.",
                    cls="muted small") if paired else None)


def eval_costs(record: dict) -> Safe:
    rows = record["rows"]
    cost_rows = [usage_row("task model (whole evaluation)", record.get("usage"), SECONDS_NOTE)]
    for r in rows:
        editor = (r.get("costs") or {}).get("editor")
        if editor:
            kl = f"; KL to the frozen editor: {editor['kl_seconds']:.1f} s" if editor.get("kl_seconds") else ""
            cost_rows.append([f"editor: {r['name']}", "n/a (local)", editor["sampled_tokens"], float(editor["seconds"]),
                              "sampled skill tokens; seconds = the evolve phase's wall time minus the task model's "
                              "busy seconds in it" + kl])
    cost_rows.append(["teacher", "n/a", "n/a", "n/a", "Skill-R1 has no teacher"])
    return join(tag("h2", "Cost per role"), cost_table(cost_rows),
                tag("p", f"whole evaluation: {record.get('wall_seconds', 0):.0f} wall seconds", cls="muted small"))


def eval_instance(j: int, inst: dict, rows: list[dict]) -> Safe:
    """One held-out instance: per row the skill it scored with, its score, the tasks gained and lost against no
    skill, and (editor rows) every generation's candidates with their rewards on the instance's own tasks."""
    ids, questions = inst["eval_tasks"], dict(zip(inst["eval_tasks"], inst.get("eval_questions") or []))
    base = dict(zip(ids, rows[0]["scores"][j])) if rows and j < len(rows[0]["scores"]) else None
    cards = []
    for r in rows:
        if j >= len(r["scores"]):
            continue
        written = (r.get("skills") or [])[j] if j < len(r.get("skills") or []) else {}
        scores = dict(zip(ids, r["scores"][j]))
        gens = [join(tag("div", f"generation {gen['g']}: carried reward {gen.get('carried_reward', 0):.2f} on the "
                         "instance's own tasks", cls="small"),
                     *(join(tag("span", f"reward {c.get('reward', 0):.2f}", cls="badge"),
                            pre(c["skill"] if c.get("skill") is not None else f"(did not parse) {c.get('reply') or ''}",
                                800)) for c in gen.get("candidates") or []))
                for gen in written.get("generations") or []]
        cards.append(Safe('<div class="card">' + join(
            tag("b", r["name"]), " ", tag("span", f"score {sum(scores.values()) / max(1, len(scores)):.2f}", cls="badge"),
            tag("div", gained_lost_html(gained_lost(base, scores), questions) if r is not rows[0] else
                tag("span", "the baseline of gained / lost", cls="muted small"), cls="small"),
            details("the skill it was scored with", pre(written.get("carried") or "(no skill)")),
            details(f"what the editor wrote ({len(gens)} generations)", *gens) if gens else None) + "</div>"))
    return details(f"instance {inst['id']} ({inst.get('type')}): {len(ids)} evaluation tasks",
                   tag("div", "evolved on: ", tasks_list(inst.get("evolve_tasks") or []), cls="small"),
                   Safe('<div class="grid">' + "".join(cards) + "</div>"), open_=j == 0)


def render_eval(run: dict) -> str:
    record = run["eval"]
    rows, flags = record["rows"], record.get("flags") or {}
    missing = [] if record.get("finished") else ["the rows after the last one written and the paired table "
                                                 "(the evaluation did not finish)"]
    n_eval = sum(len(x["eval_tasks"]) for x in record.get("instances") or [])
    return page("Skill-R1 evaluation (train_grpo.py --eval)", f"{run['folder']} · read {', '.join(run['files'])}", [
        missing_box(missing),
        kv_table([("task model", record.get("task_model")), ("instances", len(record.get("instances") or [])),
                  ("evaluation tasks per row", n_eval)]),
        tag("h2", "Run"), flags_table(flags, EVAL_FLAGS), eval_tables(record), eval_costs(record),
        tag("h2", "Per instance: the skills each row scored with, tasks gained and lost against no skill"),
        *(eval_instance(j, inst, rows) for j, inst in enumerate(record.get("instances") or []))])


# ---------------------------------------------------------------------------------------------- --compare

def _system_prompts(trajectories: list[dict]) -> dict[str, str]:
    """task type -> the system prompt the task model read (the rendered skills) in these trajectories."""
    out = {}
    for t in trajectories:
        messages = t.get("messages") or []
        if t["task_type"] not in out:
            out[t["task_type"]] = messages[0].get("content", "") if messages and messages[0].get("role") == "system" else ""
    return out


def render_compare(run: dict) -> str:
    compare, trajs = run["compare"], run["trajectories"]
    results = compare.get("results") or {}
    types = sorted({t for r in results.values() for t in (r.get("per_type") or {})})
    rows = [[name, r.get("n"), num(r.get("success_rate")),
             "–".join(f"{x:.2f}" for x in r.get("success_ci95") or []), num(r.get("nhr")), num(r.get("adjusted_reward")),
             *(num((r.get("per_type") or {}).get(t, {}).get("success_rate")) for t in types)] for name, r in results.items()]
    scores = {name: {t["task_id"]: float(t.get("reward", 0)) for t in ts} for name, ts in trajs.items()}
    questions = {t["task_id"]: next((m.get("content") or "" for m in t["messages"] if m.get("role") == "user"), "")
                 for ts in trajs.values() for t in ts}
    base = "input" if "input" in scores else None
    pairs = [[f"{base} → {name}", gained_lost_html(gained_lost(scores[base], s), questions)]
             for name, s in scores.items() if base and name != base]
    prompts = {name: _system_prompts(ts) for name, ts in trajs.items()}
    diffs = []
    for name, p in prompts.items():
        if not base or name == base:
            continue
        groups: dict[tuple[str, str], list[str]] = {}   # task types that read the same two prompts: one diff
        for t in sorted(set(p) | set(prompts[base])):
            groups.setdefault((prompts[base].get(t, ""), p.get(t, "")), []).append(t)
        diffs += [join(tag("h3", f"{name} vs input, task type{'s' if len(ts) > 1 else ''} {', '.join(ts)}"),
                       diff_html(old, new, "input", name)) for (old, new), ts in groups.items()]
    costs = compare.get("costs")
    missing = [] if costs else ["calls, tokens and seconds of the task model, the rewriter and the teacher "
                                "(compare.json holds none)"]
    if not trajs:
        missing.append("the trajectories (no trajectories-*.jsonl): gained / lost tasks and the skills as read")
    return page("rewrite.py apply --compare: edit provenance", f"{run['folder']} · read {', '.join(run['files'])}", [
        missing_box(missing),
        kv_table([("suite / split", f"{compare.get('suite')} / {compare.get('split')}"),
                  ("tasks", compare.get("n_tasks")),
                  ("task model", compare.get("task_model") or compare.get("task_url") or "the embedded default"),
                  ("rewriter", compare.get("rewriter")), ("task description", compare.get("task"))]),
        tag("h2", "Results"), table(["skills", "n", "success", "95% CI", "NHR", "adjusted R", *types], rows,
                                    numeric=tuple(range(1, 6 + len(types)))),
        tag("h2", "Tasks gained and lost against the input skills"),
        table(["pair", "tasks"], pairs) if pairs else not_recorded("trajectories of the input skills"),
        tag("h2", "The skills as the task model read them (system prompt per task type)"), *diffs,
        details("teacher one-shot: raw reply (it did not parse)", pre(run["teacher_raw"])) if run["teacher_raw"] else None,
        tag("h2", "Cost per role"), compare_costs(costs)])


def compare_costs(costs: dict | None) -> Safe:
    if not costs:
        return cost_table([[role, None, None, None, ""] for role in ("task model", "rewriter", "teacher (one-shot)")])
    rewriter = costs.get("rewriter")
    return cost_table([
        usage_row("task model", costs.get("task model"), "the three skill sets' rollouts; " + SECONDS_NOTE),
        ["rewriter", "n/a (local)", rewriter["completion_tokens"], float(rewriter["wall_seconds"]),
         f"generated tokens, one pass (finish: {rewriter.get('finish_reason')})"] if rewriter else
        ["rewriter", None, None, None, "not given to compare()"],
        usage_row("teacher (one-shot)", costs.get("teacher (one-shot)"), "until a reply parses")])


# ---------------------------------------------------------------------------------------------- rewriter SFT

def render_rewriter(run: dict) -> str:
    rows, config = run["rows"], run["config"] or {}
    series = {"train loss": [(r["step"], r["loss"]) for r in rows if isinstance(r.get("loss"), (int, float))],
              "validation loss": [(r["step"], r["val_loss"]) for r in rows if isinstance(r.get("val_loss"), (int, float))]}
    tokens = sum(r.get("target_tokens", 0) for r in rows)
    timed = bool(rows) and all(isinstance(r.get("seconds"), (int, float)) for r in rows)
    return page("rewrite.py train: rewriter SFT", f"{run['folder']} · read {', '.join(run['files'])}", [
        missing_box([] if timed else ["seconds per step (metrics.jsonl holds tokens per second, not the time)"]),
        kv_table([("command", config.get("command")), ("base model", config.get("base_model")),
                  ("data", json.dumps(config.get("data_counts"), ensure_ascii=False))]),
        tag("h2", "Curves"), plot(series, "rewriter SFT: target-token loss", "optimizer step", "mean NLL"),
        tag("h2", "Cost per role"),
        cost_table([["rewriter (training)", "n/a (local)", tokens, sum(r["seconds"] for r in rows) if timed else None,
                     f"{len(rows)} optimizer steps; target tokens"]])])


# ---------------------------------------------------------------------------------------------- CLI

def render(run: dict) -> str:
    """The page for a run loaded by provenance.load_run."""
    if run["kind"] == "transfer":
        from minskill.report_transfer import render_transfer
        return render_transfer(run)
    if run["kind"] == "masa":
        from minskill.report_masa import render_masa   # it builds on the helpers above
        return render_masa(run)
    return {"skill-r1": render_skill_r1, "skill-r1-eval": render_eval, "compare": render_compare,
            "rewriter": render_rewriter}[run["kind"]](run)


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Read `run_dir`, write its report (default RUN_DIR/report.html; `out` a folder: OUT/report.html)
    atomically; returns the path."""
    out = Path(out) if out else Path(run_dir) / "report.html"
    if out.is_dir():
        out = out / "report.html"
    if out.is_dir():
        raise NotARun(f"-o {out}: is a folder (give the HTML file to write)")
    return write_text_atomic(out, render(load_run(run_dir)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m minskill.report", description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir", help="a run folder of train_grpo.py (training or --eval), evolve_masa.py, rewrite.py "
                   "apply --compare, rewrite.py train or python -m minskill.transfer")
    p.add_argument("-o", "--out", default=None, help="the HTML file to write (default RUN_DIR/report.html; a "
                   "folder: FOLDER/report.html)")
    args = p.parse_args(argv)
    try:
        path = write_report(args.run_dir, args.out)
    except (NotARun, FileNotFoundError) as e:
        print(f"minskill.report: {e}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
