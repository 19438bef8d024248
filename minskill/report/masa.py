"""The MASA part of the edit-provenance report (minskill/report/__main__.py): an evolve_masa.py run
folder as HTML.

What it shows, all read from state.json (every candidate the search made) and run.json /
results.json:

* the hill-climbing trajectory: each general candidate's R = SR − λ·NHR, accepted or not, the best R
  so far;
* each task type's UCB1 tree drawn as a tree: per node its subtree mean R̄, visits N, own reward R,
  the UCB1 value it had each time the search selected it for expansion (replayed:
  minskill/provenance.replay_ucb1), and the chosen node (ucb.best_node) marked;
* every edit (a general rewrite or a tree child): the teacher's failure attribution that drove it,
  the failed episodes of its parent that the teacher was shown, a line diff of the skill set against
  its parent's, its reward and the tasks it gained and lost (metrics["task_rewards"], recorded by
  masa.MasaSearch.evaluate);
* the held-out table, the teacher's skipped replies and the cost per role: run.json's (or, for a run
  that did not finish, state.json's) `usage`: the target's and the teacher's calls, tokens and
  seconds, continued across --resume; the target's cache hits apart, at no cost.
"""
from __future__ import annotations

import json

from minskill.report.html import (SECONDS_NOTE, Safe, cost_table, details, diff_html, esc,
                                  flags_table,
                                  gained_lost_html, join, missing_box, not_recorded, num, page,
                                  plot, pre, table, tag,
                                  usage_row)
from minskill.report.provenance import (NOT_RECORDED, best_node_id, gained_lost, replay_ucb1,
                                        task_rewards)
from minskill.skillsets import SkillSet

MASA_FLAGS = ("suite", "n_train", "n_heldout", "iterations", "patience", "tree_iterations",
              "episodes", "c",
              "max_children", "lam_nh", "task_url", "task_model", "teacher_url", "teacher_model",
              "model_spec",
              "task_quantize", "max_calls", "seed", "gate", "gate_alpha", "gate_tasks")
BOX_W, BOX_H, COL_W, ROW_H = 176, 84, 192, 124


def skills_markdown(skills) -> str:
    """A candidate's skill set as the teacher edits it (SkillSet.to_markdown); raw JSON if it does
    not load."""
    try:
        return SkillSet.from_json(skills).to_markdown()
    except Exception:   # a hand-edited state may hold anything: show it rather than fail the page
        return json.dumps(skills, indent=1, ensure_ascii=False)


def _label(x: dict) -> str:
    if x["phase"] == "tree":
        return f"#{x['id']} tree {x.get('task_type')} node {x.get('node')}"
    return f"#{x['id']} {x['phase']}" + (f" iteration {x.get('iteration')}" if x["phase"]
                                         == "general" else "")


# ----------------------------------------------------------------------------------------------
# curves, costs

def masa_curves(candidates: list[dict]) -> Safe:
    general = [x for x in candidates if x["phase"] in ("base", "general")
               and x.get("reward") is not None]
    # drawn in this order: the candidates' R last, on top of the best R and the success rate it
    # often equals
    series = {"general: SR": [(x["iteration"], x["metrics"]["success_rate"]) for x in general
                              if (x.get("metrics") or {}).get("success_rate") is not None]}
    best, curve = None, []
    for x in general:
        if x.get("accepted"):
            best = x["reward"] if best is None else max(best, x["reward"])
        curve.append((x["iteration"], best if best is not None else x["reward"]))
    series["general: best R"] = curve
    series["general: candidate R"] = [(x["iteration"], x["reward"]) for x in general]
    for task_type in sorted({x.get("task_type") for x in candidates if x["phase"] == "tree"}):
        best, curve = None, []
        for x in (x for x in candidates if x["phase"] == "tree" and x.get("task_type")
                  == task_type):
            if x.get("reward") is not None:
                best = x["reward"] if best is None else max(best, x["reward"])
                curve.append((x["iteration"], best))
        series[f"tree {task_type}: best R"] = curve
    return join(tag("h2", "Curves"),
                plot(series, "MASA stage 1: reward over iterations", "iteration",
                                          "R = SR − λ·NHR (SR: success rate)"))


def masa_costs(run: dict) -> Safe:
    info, spent = run["run"] or {}, run["state"].get("calls_spent")
    usage = info.get("usage") or run["state"]["usage"]   # state.json's: to the last checkpoint
    target, teacher = usage.get("target") or {}, usage.get("teacher") or {}
    tokens = sum(u.get(k, 0) for u in (target, teacher)
                 for k in ("prompt_tokens", "completion_tokens"))
    return join(tag("h2", "Cost per role"), cost_table([
        usage_row("target (task model)", target,
                  f"calls that missed the cache; {target.get('cache_hits', 0)} "
                  "answered by the cache at no call, token or second"),
        usage_row("teacher", teacher, "attribution, rewrites, model summary, one-shot rewrite"),
        ["editor", "n/a", "n/a", "n/a",
         "MASA stage 1 has no editor (the rewriter is rewrite.py's)"],
        ["whole run", spent, tokens, float(usage.get("wall_seconds", 0.0)),
         f"calls charged to --max-calls; wall seconds over {usage.get('sessions', 1)} session(s)"
         + ("" if run["run"] else " (to the last checkpoint: the run did not finish)")]]),
        tag("p", SECONDS_NOTE + ". Counts continue across --resume.", cls="muted small"))


# ----------------------------------------------------------------------------------------------
# hill climb

def climb_table(candidates: list[dict], by_id: dict) -> Safe:
    rows, best = [], None
    for x in (x for x in candidates if x["phase"] in ("base", "general")):
        m = x.get("metrics") or {}
        if x.get("accepted") and x.get("reward") is not None:
            best = x["reward"] if best is None else max(best, x["reward"])
        parent = by_id.get(x.get("parent"))
        verdict = (tag("span", "accepted", cls="badge ok") if x.get("accepted") else
                   tag("span", "not evaluated", cls="badge") if x.get("reward") is None else
                   tag("span", "rejected", cls="badge no"))
        rows.append([x.get("iteration"), f"#{x['id']}", f"#{x['parent']}"
                     if x.get("parent") is not None else "–",
                     num(x.get("reward")), num(m.get("success_rate")), num(m.get("nhr")), verdict,
                     gate_text(x),
                     num(best),
                     gained_lost_html(gained_lost(task_rewards(parent), task_rewards(x)) if parent
                                      else None, None,
                                      "no parent" if parent is None else "metrics.task_rewards")])
    return join(tag("h2", "Hill climbing on the general skills"),
                tag("p", "Accepted only when R is strictly higher than the best so far (--gate "
                    "strict), and with --gate paired only when a one-sided sign test on the tasks "
                    "gained and lost against the best set also gives p ≤ α (minskill/gates.py); "
                    "each candidate is the teacher's rewrite of the best set at its iteration.",
                    cls="muted small"),
                table(["iteration", "candidate", "parent", "R", "SR", "NHR", "verdict",
                       "gate: vs, gained / lost, p",
                       "best R so far", "tasks vs parent"], rows, numeric=(0, 3, 4, 5, 8)))


def gate_text(x: dict) -> str:
    """A candidate's gate decision (minskill/gates.py) in one cell; "–" when it was never gated."""
    g = x.get("gate")
    if not g:
        return "–"
    return (f"{g.get('gate')} vs #{g.get('incumbent')}: {g.get('gained')} / {g.get('lost')} of "
            f"{g.get('n')}, p = {g.get('p', 1.0):.3g}"
            + (f" (α = {g.get('alpha')})" if g.get("gate") == "paired" else "")
            + (f", {g['rescored']} re-evaluated" if g.get("rescored") else ""))


def chosen_node_id(root: dict, by_id: dict) -> str | None:
    """A tree's result: its best node, unless the gate rejected that node against the root
    (masa.tree_result)."""
    best = best_node_id(root)
    gate = (by_id.get(_payload(root, best)) or {}).get("gate") if best not in (None, "0") else None
    return "0" if gate and gate.get("use") == "tree result" and not gate.get("accepted") else best


# ----------------------------------------------------------------------------------------------
# trees

def _layout(root: dict) -> tuple[dict[str, tuple[float, int]], list[tuple[str, str]]]:
    """node id -> (column, depth), leaves in pre-order on columns 0, 1, ...; a parent centred over
    its children."""
    pos, edges, leaves = {}, [], [0]

    def place(node: dict, depth: int) -> float:
        children = node.get("children") or []
        if not children:
            x = float(leaves[0])
            leaves[0] += 1
        else:
            xs = [place(child, depth + 1) for child in children]
            edges.extend((node["id"], child["id"]) for child in children)
            x = (xs[0] + xs[-1]) / 2
        pos[node["id"]] = (x, depth)
        return x

    place(root, 0)
    return pos, edges


def tree_svg(root: dict, selections: dict, best: str | None) -> Safe:
    pos, edges = _layout(root)
    nodes, stack = {}, [root]
    while stack:
        node = stack.pop()
        nodes[node["id"]] = node
        stack.extend(node.get("children") or [])
    width = int((max(x for x, _ in pos.values()) + 1) * COL_W + 16)
    height = int((max(d for _, d in pos.values()) + 1) * ROW_H + 8)
    cx = lambda node_id: 8 + pos[node_id][0] * COL_W + BOX_W / 2   # noqa: E731
    top = lambda node_id: 8 + pos[node_id][1] * ROW_H               # noqa: E731
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">']
    out += [f'<line x1="{cx(a):.0f}" y1="{top(a) + BOX_H}" x2="{cx(b):.0f}" y2="{top(b)}" '
            'stroke="#888"/>'
            for a, b in edges]
    for node_id, node in nodes.items():
        visits = node.get("visits") or 0
        mean = node.get("value_sum", 0.0) / visits if visits else None
        sel = selections.get(node_id, [])
        ucb = ("selected: never" if not sel else "selected as root ×" + str(len(sel))
               if sel[0] is None else
               "UCB1 at selection " + ", ".join(f"{v:.2f}" for v in sel if v is not None))
        chosen = node_id == best
        x0, y0 = cx(node_id) - BOX_W / 2, top(node_id)
        out.append(f'<rect x="{x0:.0f}" y="{y0}" width="{BOX_W}" height="{BOX_H}" rx="6" fill="'
                   f'{"#e9f7e9" if chosen else "white"}" '
                   f'stroke="{"#2ca02c" if chosen else "#555"}" '
                   f'stroke-width="{3 if chosen else 1}"/>')
        lines = [(f"node {node_id} · #{node.get('payload')}" + (" ★ chosen" if chosen else ""),
                  "bold"),
                 (f"R̄ {mean:.3f} · N {visits}" if mean is not None else "not evaluated", "normal"),
                 (f"own R {node['reward']:.3f}" if node.get("reward") is not None else "own R –",
                  "normal"),
                 (ucb[:30], "normal")]
        for k, (text, weight) in enumerate(lines):
            out.append(f'<text x="{x0 + 8:.0f}" y="{y0 + 18 + 18 * k}" '
                       f'font-weight="{weight}">{esc(text)}</text>')
    out.append("</svg>")
    return Safe('<div style="overflow-x:auto">' + "".join(out) + "</div>")


def trees_section(search: dict, c: float, by_id: dict | None = None) -> Safe:
    parts = [tag("h2", "UCB1 trees (task-specific skills, one per task type)"),
             tag("p", "R̄ = mean reward of a node and its descendants, N = visits, own R = the "
                 f"node's reward; UCB1 = R̄ + C·sqrt(ln N(parent) / N) with C = {c}, as it was "
                 "when the search selected the node for expansion (replayed from the tree). The "
                 "chosen node (★) is the one of highest own R (with --gate paired: if it wins the "
                 "sign test against the root, else the root).",
                 cls="muted small")]
    if not search.get("trees"):
        parts.append(tag("p", "no tree yet (the search stopped before phase 2)"))
    for task_type, tree in sorted(search["trees"].items()):
        root = tree["root"]
        selections, visits = replay_ucb1(root, c)
        best = chosen_node_id(root, by_id or {})
        top = best_node_id(root)
        gate = (by_id or {}).get(_payload(root, top), {}).get("gate") if top not in (None,
                                                                                     "0") else None
        recorded, stack = {}, [root]
        while stack:
            node = stack.pop()
            recorded[node["id"]] = node.get("visits")
            stack.extend(node.get("children") or [])
        check = ("" if visits == {k: v for k, v in recorded.items() if v} else
                 " The replay does not match the recorded visits; the UCB1 values are approximate.")
        parts += [tag("h3", f"tree {task_type}: {tree.get('iterations', 0)} iterations, chosen "
                      f"node {best}"),
                  tag("p", f"gate, best node against the root: {gate_text({'gate': gate})}",
                      cls="small")
                  if gate else None,
                  tag("div", check, cls="nr") if check else None, tree_svg(root, selections, best)]
    return join(*parts)


# ----------------------------------------------------------------------------------------------
# edits

def attribution_html(attribution) -> Safe:
    if not attribution:
        return tag("div", "no failure attribution (the teacher's reply was skipped, or this is no "
                   "edit)", cls="nr")
    cats = attribution.get("failure_categories") if isinstance(attribution, dict) else None
    if not isinstance(cats, list) or not all(isinstance(c, dict) for c in cats):
        return pre(json.dumps(attribution, indent=1, ensure_ascii=False))
    rows = [[c.get("category"), c.get("count"),
             Safe("<br>".join(esc(e) for e in (c.get("evidence")
                                               if isinstance(c.get("evidence"), list) else [])
                              if isinstance(e, (str, int, float)))),
             c.get("suggested_fix")] for c in cats]
    return join(tag("div", "summary: ", attribution.get("summary") or "–", cls="small"),
                table(["category", "count", "evidence", "suggested fix"], rows, numeric=(1,)))


def episodes_html(failures: list[dict] | None, parent: dict | None) -> Safe:
    if parent is None:
        return tag("div", "no parent", cls="muted small")
    if not failures:
        return tag("div", f"#{parent['id']} had no failed episode to show" if parent.get("metrics")
                   else
                   f"#{parent['id']}'s episodes: " + NOT_RECORDED, cls="muted small")
    rows = [[f.get("task_id"), f.get("task_type"), pre(f.get("question"), 600), f.get("expected"),
             pre((f"{f['transcript']}\n" if f.get("transcript") else "")
                 + str(f.get("reply") or ""), 900),
             f.get("error") or ""] for f in failures if isinstance(f, dict)]
    return table(["task", "type", "question", "expected", "the target's reply", "error"], rows)


def edit_card(x: dict, by_id: dict, best_nodes: set[int]) -> Safe:
    parent = by_id.get(x.get("parent"))
    same_tasks = parent is not None and (parent["phase"] == "tree") == (x["phase"] == "tree")
    delta = (x["reward"] - parent["reward"] if same_tasks and x.get("reward") is not None
             and parent.get("reward") is not None else None)
    badges = join(tag("span", _label(x), cls="badge"),
                  tag("span", f"R {x['reward']:.3f}", cls="badge")
                  if x.get("reward") is not None else tag("span", "not evaluated", cls="badge"),
                  tag("span", f"Δ {delta:+.3f} vs parent #{parent['id']}", cls="badge")
                  if delta is not None else None,
                  tag("span", "accepted", cls="badge ok") if x.get("accepted") else
                  tag("span", "rejected", cls="badge no") if x["phase"] == "general" else None,
                  tag("span", "★ chosen node", cls="badge best") if x["id"] in best_nodes else None)
    scores = gained_lost(task_rewards(parent), task_rewards(x)) if same_tasks else None
    failures = parent.get("failures") if parent else None
    return Safe('<div '
                f'class="card{" carried" if x.get("accepted") or x["id"] in best_nodes else ""}">'
                + join(
        badges, tag("div", gained_lost_html(scores, None, "metrics.task_rewards"), cls="small"),
        tag("h3", "Why: the teacher's failure attribution"), attribution_html(x.get("attribution")),
        details(f"the {len(failures or [])} failed episodes of parent "
                f"#{parent['id'] if parent else '?'} the teacher was shown",
                episodes_html(failures, parent), open_=False),
        tag("h3", f"What changed: diff against parent #{parent['id'] if parent else '?'}"),
        diff_html(skills_markdown(parent["skills"]) if parent else None,
                  skills_markdown(x["skills"]))) + "</div>")


def edits_section(candidates: list[dict], by_id: dict, best_nodes: set[int]) -> Safe:
    edits = [x for x in candidates if x["phase"] == "general"
             or (x["phase"] == "tree" and x.get("iteration"))]
    base = next((x for x in candidates if x["phase"] == "base"), None)
    return join(tag("h2", f"Every edit ({len(edits)}), in the order the search made them"),
                details("the base skills (#0)", pre(skills_markdown(base["skills"]))) if base
                else None,
                *(edit_card(x, by_id, best_nodes) for x in edits))


# ---------------------------------------------------------------------------------------------- the
# rest

def heldout_section(results: dict | None) -> Safe:
    held = (results or {}).get("heldout")
    if not held:
        failed = (results or {}).get("heldout_error")  # every held-out rollout ended with an error
        return join(tag("h2", "Held-out"),
                    not_recorded("results.json has no held-out table"
                                 + (f": {failed}" if isinstance(failed, str) else "")))
    base, evolved, paired = held["base"], held["evolved"], held.get("gained_lost") or {}
    names = sorted(base.get("per_type") or {}) + ["**all**"]
    rows = []
    for name in names:
        b = base if name == "**all**" else base["per_type"].get(name, {})
        e = evolved if name == "**all**" else (evolved.get("per_type") or {}).get(name, {})
        gained, lost = paired.get(name, (0, 0))
        rows.append([name.strip("*"), b.get("n"), num(b.get("success_rate")),
                     num(e.get("success_rate")),
                     num(b.get("nhr")), num(e.get("nhr")), f"{gained} / {lost}",
                     b.get("errors", "–"), e.get("errors", "–")])
    return join(tag("h2", "Held-out: base vs evolved skills"),
                table(["task type", "n", "success base", "success evolved", "NHR base",
                       "NHR evolved",
                       "gained / lost", "errors base", "errors evolved"], rows,
                      numeric=(1, 2, 3, 4, 5, 7, 8)),
                tag("p", "A rollout that ended with an error (no reply from the target) counts as "
                         "failed in success and is counted apart in the errors columns."))


def events_section(events: list[dict]) -> Safe | None:
    if not events:
        return None
    rows = [[e.get("event"), e.get("phase", ""), e.get("what", e.get("message", "")),
             e.get("attempts", ""),
             pre("\n".join(map(str, e.get("errors") if isinstance(e.get("errors"), list) else []))
                 + (f"\n--- last reply:\n{e['last_reply']}" if e.get("last_reply") else ""), 1500)]
            for e in events]
    return join(tag("h2", "Events (skipped teacher replies, budget stop)"),
                table(["event", "phase", "what", "attempts", "errors / last reply"], rows))


def render_masa(run: dict) -> str:
    state, search = run["state"], run["search"]
    candidates = search.get("candidates") or []
    by_id = {x["id"]: x for x in candidates}
    args = state.get("args") or {}
    c = float(args.get("c", 1.4))
    best_nodes = {_payload(t["root"], chosen_node_id(t["root"], by_id))
                  for t in (search.get("trees") or {}).values()}
    missing = []
    if candidates and not any(task_rewards(x) for x in candidates):
        missing.append("per-task rewards of each candidate (metrics.task_rewards, recorded by runs "
                       "of this version on): tasks gained and lost")
    if run["run"] is None:
        missing.append("run.json (the run did not finish): the cost per role is state.json's, to "
                       "the last checkpoint")
    card = run["card"] or {}
    info = run["run"] or {}
    results = run["results"] or {}
    teacher = results.get("teacher_model") or args.get("teacher_model") or "the embedded model"
    summary = ("target "
               f"{info.get('target_model') or args.get('task_model') or args.get('model_spec')}, "
               f"teacher {teacher}; {len(candidates)} candidates, phase {search.get('phase')}; "
               f"R base {num(results.get('base_reward'))} → evolved {num(info.get('reward_out'))}")
    return page("MASA stage 1: edit provenance",
                f"{run['folder']} · read {', '.join(run['files'])}", [
        missing_box(missing), tag("p", summary), tag("h2", "Run"), flags_table(args, MASA_FLAGS),
        details("model card", table(["field", "value"], [[k, json.dumps(v, ensure_ascii=False)]
                                                         for k, v in card.items()])) if card
        else None,
        masa_curves(candidates), masa_costs(run), climb_table(candidates, by_id),
        trees_section(search, c, by_id),
        edits_section(candidates, by_id, best_nodes), heldout_section(run["results"]),
        events_section(list(search.get("events") or []) + list(state.get("events") or []))])


def _payload(root: dict, node_id: str | None):
    """The candidate id held by tree node `node_id`."""
    stack = [root]
    while stack:
        node = stack.pop()
        if node["id"] == node_id:
            return node.get("payload")
        stack.extend(node.get("children") or [])
    return None
