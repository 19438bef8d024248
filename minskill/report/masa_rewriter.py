"""MASA stage 2, the rewrite.py pages of the report: an `apply --compare` folder (the three skill
sets side by side, the tasks gained and lost against the input skills, the cost per role) and a
`train` folder (the SFT curves).
"""
from __future__ import annotations

import json

from minskill.report.html import (SECONDS_NOTE, Safe, cost_table, details, diff_html,
                                  gained_lost_html, join, kv_table, missing_box, not_recorded, num,
                                  page, plot, pre, table, tag, usage_row)
from minskill.report.provenance import gained_lost


# ------------------------------------------------------------------------------------ --compare

def render_compare(run: dict) -> str:
    compare, trajs = run["compare"], run["trajectories"]
    results = compare.get("results") or {}
    types = sorted({t for r in results.values() for t in (r.get("per_type") or {})})
    rows = [[name, r.get("n"), num(r.get("success_rate")),
             "–".join(f"{x:.2f}" for x in r.get("success_ci95") or []), num(r.get("nhr")),
             num(r.get("adjusted_reward")),
             # rollouts that ended with an error (counted as failed in success)
             num(r.get("errors")),
             *(num((r.get("per_type") or {}).get(t, {}).get("success_rate")) for t in types)]
            for name, r in results.items()]
    scores = {name: {t["task_id"]: float(t.get("reward", 0)) for t in ts}
              for name, ts in trajs.items()}
    questions = {t["task_id"]: next((m.get("content") or "" for m in t["messages"]
                                     if m.get("role") == "user"), "")
                 for ts in trajs.values() for t in ts}
    base = "input" if "input" in scores else None
    pairs = [[f"{base} → {name}", gained_lost_html(gained_lost(scores[base], s), questions)]
             for name, s in scores.items() if base and name != base]
    prompts = {name: _system_prompts(ts) for name, ts in trajs.items()}
    diffs = []
    for name, p in prompts.items():
        if not base or name == base:
            continue
        # the task types that read the same two prompts: one diff
        groups: dict[tuple[str, str], list[str]] = {}
        for t in sorted(set(p) | set(prompts[base])):
            groups.setdefault((prompts[base].get(t, ""), p.get(t, "")), []).append(t)
        diffs += [join(tag("h3", f"{name} vs input, task type{'s' if len(ts) > 1 else ''} "
                                 f"{', '.join(ts)}"),
                       diff_html(old, new, "input", name)) for (old, new), ts in groups.items()]
    costs = compare.get("costs")
    missing = [] if costs else ["calls, tokens and seconds of the task model, the rewriter and the "
                                "teacher (compare.json holds none)"]
    if not trajs:
        missing.append("the trajectories (no trajectories-*.jsonl): gained / lost tasks and the "
                       "skills as read")
    raw = run["teacher_raw"]
    return page("rewrite.py apply --compare: edit provenance",
                f"{run['folder']} · read {', '.join(run['files'])}", [
        missing_box(missing),
        kv_table([("suite / split", f"{compare.get('suite')} / {compare.get('split')}"),
                  ("tasks", compare.get("n_tasks")),
                  ("task model", compare.get("task_model") or compare.get("task_url")
                   or "the embedded default"),
                  ("rewriter", compare.get("rewriter")),
                  ("task description", compare.get("task"))]),
        tag("h2", "Results"),
        table(["skills", "n", "success", "95% CI", "NHR", "adjusted R", "errors", *types], rows,
              numeric=tuple(range(1, 7 + len(types)))),
        tag("h2", "Tasks gained and lost against the input skills"),
        table(["pair", "tasks"], pairs) if pairs else
        not_recorded("trajectories of the input skills"),
        tag("h2", "The skills as the task model read them (system prompt per task type)"), *diffs,
        details("teacher one-shot: raw reply (it did not parse)", pre(raw)) if raw else None,
        tag("h2", "Cost per role"), compare_costs(costs)])


def compare_costs(costs: dict | None) -> Safe:
    if not costs:
        return cost_table([[role, None, None, None, ""]
                           for role in ("task model", "rewriter", "teacher (one-shot)")])
    rewriter = costs.get("rewriter")
    return cost_table([
        usage_row("task model", costs.get("task model"),
                  "the three skill sets' rollouts; " + SECONDS_NOTE),
        ["rewriter", "n/a (local)", rewriter["completion_tokens"], float(rewriter["wall_seconds"]),
         f"generated tokens, one pass (finish: {rewriter.get('finish_reason')})"] if rewriter else
        ["rewriter", None, None, None, "not given to compare()"],
        usage_row("teacher (one-shot)", costs.get("teacher (one-shot)"), "until a reply parses")])


def _system_prompts(trajectories: list[dict]) -> dict[str, str]:
    """task type -> the system prompt the task model read (the rendered skills) in these
    trajectories."""
    out = {}
    for t in trajectories:
        messages = t.get("messages") or []
        if t["task_type"] not in out:
            first = messages[0] if messages else {}
            out[t["task_type"]] = first.get("content", "") if first.get("role") == "system" else ""
    return out


# --------------------------------------------------------------------------------- rewriter SFT

def render_rewriter(run: dict) -> str:
    rows, config = run["rows"], run["config"] or {}
    series = {"train loss": [(r["step"], r["loss"]) for r in rows
                             if isinstance(r.get("loss"), (int, float))],
              "validation loss": [(r["step"], r["val_loss"]) for r in rows
                                  if isinstance(r.get("val_loss"), (int, float))]}
    tokens = sum(r.get("target_tokens", 0) for r in rows)
    timed = bool(rows) and all(isinstance(r.get("seconds"), (int, float)) for r in rows)
    seconds = sum(r["seconds"] for r in rows) if timed else None
    return page("rewrite.py train: rewriter SFT",
                f"{run['folder']} · read {', '.join(run['files'])}", [
        missing_box([] if timed else
                    ["seconds per step (metrics.jsonl holds tokens per second, not the time)"]),
        kv_table([("command", config.get("command")), ("base model", config.get("base_model")),
                  ("data", json.dumps(config.get("data_counts"), ensure_ascii=False))]),
        tag("h2", "Curves"),
        plot(series, "rewriter SFT: target-token loss", "optimizer step", "mean NLL"),
        tag("h2", "Cost per role"),
        cost_table([["rewriter (training)", "n/a (local)", tokens, seconds,
                     f"{len(rows)} optimizer steps; target tokens"]])])
