"""The Skill-R1 pages of the report: a train_grpo.py training folder and a `train_grpo.py --eval`
folder.

Training: the curves of metrics.jsonl, the cost per role, and the skill lineage of every instance
across generations (lineage.jsonl: each skill diffed against its parent, with its reward and the
tasks it gained and lost). --eval: the table and paired table as printed, with what the p-values
generalise over (paired.generalises_over), and, per instance, the skills each editor wrote with
their rewards and the tasks gained and lost against no skill.
"""
from __future__ import annotations

from minskill.paired import generalises_over
from minskill.report.html import (SECONDS_NOTE, Safe, cost_table, details, diff_html, flags_table,
                                  gained_lost_html,
                                  join, kv_table, missing_box, not_recorded, num, page, plot, pre,
                                  table, tag,
                                  tasks_list, usage_row)
from minskill.report.provenance import NOT_RECORDED, gained_lost, lineage_scores
from minskill.rollout import cut_totals


# ----------------------------------------------------------------------------------------------
# Skill-R1

SKILL_R1_FLAGS = ("editor_spec", "suite", "steps", "instances_per_step", "generations",
                  "candidates", "rollouts",
                  "lam", "beta", "agg", "lr", "tasks_per_instance", "max_skill_tokens",
                  "seed_skills", "task_url",
                  "lora_rank", "probe_every", "seed", "checkpoint_step")


def skill_r1_curves(rows: list[dict]) -> Safe:
    n_gen = max(len(r["reward_per_generation"]) for r in rows)
    rewards = {("seed skill (g=0)" if g == 0 else f"generation {g}"):
               [(r["step"] + 1, r["reward_per_generation"][g]) for r in rows
                if g < len(r["reward_per_generation"])]
               for g in range(n_gen)}
    probes = [p for r in rows for p in r.get("probes") or []]
    if probes:
        rewards["probe: candidates"] = [(p["after_steps"], p["reward_per_generation"][-1])
                                        for p in probes]
        rewards["probe: seed skill"] = [(p["after_steps"], p["reward_per_generation"][0])
                                        for p in probes]
    loss = {k: [(r["step"] + 1, r[k]) for r in rows if isinstance(r.get(k), (int, float))]
            for k in ("loss", "kl", "grad_norm")}
    return join(tag("h2", "Curves"),
                plot(rewards, "mean candidate reward per generation (training; held-out probe)",
                     "training step",
                     "mean verifier reward"),
                plot(loss,
                     "policy loss (≈ 0 by construction: advantages are centred), KL, gradient norm",
                     "training step", "value"))


def skill_r1_costs(rows: list[dict]) -> Safe:
    def total(key, scale=None):
        values = [r[key] * (r[scale] if scale else 1) for r in rows if key in r
                  and (scale is None or scale in r)]
        return sum(values) if values else None
    probes = [p for r in rows for p in r.get("probes") or []]
    probe_usage = [p["task_usage"] for p in probes if p.get("task_usage")]
    task_row = usage_row("task model (training rollouts)", {
        "calls": total("task_calls"), "prompt_tokens": total("task_prompt_tokens"),
        "completion_tokens": total("task_completion_tokens"),
        "request_seconds": total("task_request_seconds"),
        "busy_seconds": total("task_seconds")},
        reasoning_note(SECONDS_NOTE, total("task_reasoning_tokens"), rows))
    sampling = ["editor: sampling", "n/a (local)", total("editor_sampled_tokens"),
                total("seconds_editor_sampling"),
                "tokens = sampled skill tokens; seconds = the sampling phase's wall time minus the "
                "task model's busy seconds in it"]
    return join(tag("h2", "Cost per role"), cost_table([
        task_row, sampling,
        ["editor: policy update", "n/a (local)", total("train_tokens_per_s", "seconds_update"),
         total("seconds_update"),
         "tokens = trained completion tokens"],
        ["held-out probes (editor + task model)", sum(p.get("task_calls", 0) for p in probes)
         if probes else None,
         sum(u["prompt_tokens"] + u["completion_tokens"] for u in probe_usage) if probe_usage
         else None,
         sum(p.get("seconds", 0) for p in probes) if probes else None,
         f"{len(probes)} probes; wall seconds"],
        ["teacher", "n/a", "n/a", "n/a", "Skill-R1 has no teacher"]]))


def reasoning_note(note: str, reasoning_tokens: int | None, records: list[dict]) -> str:
    """A task-model cost row's note, plus its reasoning tokens and the replies of `records` cut
    inside their reasoning (scored 0), where the run recorded them."""
    parts = [note]
    if reasoning_tokens is not None:
        parts.append(f"{reasoning_tokens} of the completion tokens were reasoning")
    counted = [r for r in records if "reasoning_cut" in r]
    if counted:
        totals = cut_totals(counted, of="rollouts")
        parts.append(f"{totals['reasoning_cut']} of {totals['n']} replies ended inside their "
                     "reasoning (no answer: scored 0)")
    return "; ".join(parts)


def lineage_card(skill: dict, by_id: dict, task_ids: list[str], questions: dict,
                 carried: set) -> Safe:
    parent = by_id.get(skill.get("parent"))
    scores, parent_scores = lineage_scores(skill, task_ids), parent and lineage_scores(parent,
                                                                                       task_ids)
    badges = [tag("span", skill["id"], cls="badge"),
              tag("span", f"reward {skill.get('reward', 0):.2f}", cls="badge"),
              tag("span", f"A {skill['advantage']:+.2f}", cls="badge")
              if skill.get("advantage") is not None else None,
              tag("span", "carried", cls="badge best") if skill["id"] in carried else None,
              tag("span", f"parent {skill['parent']}", cls="muted small") if skill.get("parent")
              else None]
    if not skill.get("generation"):
        body = join(tag("div", "the instance's seed skill s_0 (no parent)", cls="muted small"),
                    pre(skill.get("text") or "(no skill)"))
    elif skill.get("text") is None:
        body = join(tag("div", "the reply did not parse: ", skill.get("parse_error") or "?",
                        cls="small"),
                    pre(skill.get("reply") or "", 1500))
    else:
        body = join(tag("div", gained_lost_html(gained_lost(parent_scores, scores) if parent
                                                else None, questions,
                                                "no parent" if not parent else "task_scores"),
                        cls="small"),
                    details("skill text", pre(skill.get("text") or "(no skill)")),
                    diff_html(parent.get("text") if parent else None, skill.get("text")))
    return Safe(f'<div class="card{" carried" if skill["id"] in carried else ""}">'
                + join(*badges, body) + "</div>")


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
                 f"{', '.join(p['history'])} (newest first, each with its first "
                 f"{p.get('outcomes_per_entry', '?')} task outcomes; oldest dropped first to fit), "
                 f"{p.get('prompt_tokens', '?')} prompt tokens"
                 if p else "the seed skill" if g == 0 else "editor prompt: " + NOT_RECORDED)
        parts.append(join(tag("h3", f"generation {g}"), tag("div", shown, cls="muted small"),
                          Safe('<div class="grid">'
                               + "".join(lineage_card(s, by_id, task_ids, questions, carried)
                                                             for s in skills) + "</div>")))
    # (an id no skill has: –)
    first, last = (by_id.get(rec["carried"][k], {}).get("reward") for k in (0, -1))
    title = (f"step {rec['step'] + 1} · instance {rec['instance']} ({rec.get('task_type', '?')}): "
             f"carried {' → '.join(rec['carried'])}, reward {num(first, 2)} → {num(last, 2)}")
    return details(title, tag("div", "tasks: ", tasks_list(task_ids, questions), cls="small"),
                   *parts, open_=open_)


def skill_r1_lineage(run: dict) -> Safe:
    lineage = run["lineage"]
    blocks = [lineage_block(rec, open_=i in (0, len(lineage) - 1)) for i, rec in enumerate(lineage)]
    return join(tag("h2", "Skill lineage (each instance, generation by generation)"),
                tag("p", "Each skill is diffed against its parent, the skill carried into its "
                    "generation (the editor's \"current skill\"); gained / lost compare per-task "
                    "scores with that parent.",
                    cls="muted small"), *blocks)


def skill_r1_probes(rows: list[dict]) -> Safe | None:
    probes = [p for r in rows for p in r.get("probes") or []]
    if not probes:
        return None
    return join(tag("h2", "Held-out probes"), table(
        ["after steps", "seed skill", "mean candidate", "carried", "beat the seed",
         "skills written"],
        [[p["after_steps"], num(p["reward_per_generation"][0]), num(p["reward_per_generation"][-1]),
          num(p.get("carried_reward")), num(p.get("beat_seed_share")),
          details(f"{len(p.get('skills') or [])} skills",
                  *(join(tag("div", f"{s.get('instance')}: reward "
                  f"{s.get('reward', 0):.2f} (seed {s.get('seed_reward', 0):.2f})", cls="small"),
                         pre(s.get("skill"), 600))
                  for s in (p.get("skills") or [])))] for p in probes], numeric=(0, 1, 2, 3, 4)))


def render_skill_r1(run: dict) -> str:
    rows, flags = run["rows"], run["flags"]
    missing = []
    if flags is None:   # a run before its first checkpoint
        missing.append("the run's flags (no readable checkpoint/trainer_state.pt)")
    if not rows:
        return page("Skill-R1 training", run["folder"],
                    [missing_box(missing), tag("p", "metrics.jsonl has no step yet.")])
    last = rows[-1]
    summary = (f"{len(rows)} steps; mean candidate reward per generation, first step "
               f"{[round(x, 2) for x in rows[0]['reward_per_generation']]}, last step "
               f"{[round(x, 2) for x in last['reward_per_generation']]}")
    return page("Skill-R1 training: edit provenance",
                f"{run['folder']} · read {', '.join(run['files'])}", [
        missing_box(missing), tag("p", summary), tag("h2", "Run"),
        flags_table(flags, SKILL_R1_FLAGS),
        skill_r1_curves(rows), skill_r1_costs(rows), skill_r1_lineage(run), skill_r1_probes(rows)])


# ----------------------------------------------------------------------------------------------
# --eval

EVAL_FLAGS = ("editor", "grpo_editor", "skillr1_editor", "suite", "seed_skills", "generations",
              "candidates",
              "rollouts", "tasks_per_instance", "eval_instances", "eval_tasks", "max_skill_tokens",
              "task_url",
              "task_model", "carry_gate", "seed")


def eval_tables(record: dict) -> Safe:
    rows, g = record["rows"], (record.get("flags") or {}).get("generations", 0)
    table_rows = [[r["name"], num(r["success"]), "–".join(f"{x:.2f}" for x in r.get("ci95") or []),
                   *(num(x) for x in (r.get("per_generation") or [None] * g)),
                   r.get("evolve_calls"),
                   r.get("eval_calls"), num(r.get("kl"), 4)] for r in rows]
    # eval.json tests by instance (skill_r1.evaluate.eval_record)
    paired = [[c["row"], c["against"],
               f"{c['difference']:+.3f} ({c['ci95'][0]:+.2f} to {c['ci95'][1]:+.2f})",
               f"{c['p']:.3f}", f"{c['per_task_gained']} / {c['per_task_lost']}"]
              for c in record.get("paired") or []]
    return join(tag("h2", "Results (as printed)"),
                table(["method", "success", "95% CI", *(f"g={k + 1}" for k in range(g)),
                       "task calls: evolve",
                       "task calls: evaluate", "KL to the frozen editor"], table_rows,
                      numeric=tuple(range(1, 6 + g))),
                tag("p", "success: share of evaluation tasks solved with the skill carried after "
                    "the last generation; g=k: after generation k; KL: nats per token of the "
                    "skills the trained editor wrote.",
                    cls="muted small"),
                tag("h2", "Paired on the same tasks, by instance (minskill/paired.py)"),
                table(["row", "against", "difference (95% CI, by instance)",
                       "p (sign-flip, by instance)",
                       "per task: gained / lost"], paired, numeric=(3,))
                if paired else not_recorded("the paired table (the evaluation did not finish)"),
                tag("p", "by instance: each instance carries its own evolved skill, so the "
                    "instances are the units: the mean per-instance difference, the two-sided "
                    "sign-flip permutation test on the per-instance differences and the interval "
                    "that inverts it. per task: tasks scored higher / lower, a description only "
                    "(the tasks of an instance share one skill).",
                    cls="muted small") if paired else None,
                tag("p", generalises_over([x["eval_tasks"] for x in record["instances"]]),
                    cls="muted small") if paired and record.get("instances") else None)


def eval_costs(record: dict) -> Safe:
    rows = record["rows"]
    usage = record.get("usage") or {}
    cost_rows = [usage_row("task model (whole evaluation)", record.get("usage"),
                           reasoning_note(SECONDS_NOTE, usage.get("reasoning_tokens"), rows))]
    for r in rows:
        editor = (r.get("costs") or {}).get("editor")
        if editor:
            kl = f"; KL to the frozen editor: {editor['kl_seconds']:.1f} s" if editor.get(
                "kl_seconds") else ""
            cost_rows.append([f"editor: {r['name']}", "n/a (local)", editor["sampled_tokens"],
                              float(editor["seconds"]),
                              "sampled skill tokens; seconds = the evolve phase's wall time minus "
                              "the task model's busy seconds in it" + kl])
    cost_rows.append(["teacher", "n/a", "n/a", "n/a", "Skill-R1 has no teacher"])
    return join(tag("h2", "Cost per role"), cost_table(cost_rows),
                tag("p", f"whole evaluation: {record.get('wall_seconds', 0):.0f} wall seconds",
                    cls="muted small"))


def eval_instance(j: int, inst: dict, rows: list[dict]) -> Safe:
    """One held-out instance: per row the skill it scored with, its score, the tasks gained and lost
    against no skill, and (editor rows) every generation's candidates with their rewards on the
    instance's own tasks."""
    ids, questions = inst["eval_tasks"], dict(zip(inst["eval_tasks"], inst.get("eval_questions")
                                                  or []))
    base = dict(zip(ids, rows[0]["scores"][j])) if rows and j < len(rows[0]["scores"]) else None
    cards = []
    for r in rows:
        if j >= len(r["scores"]):
            continue
        written = (r.get("skills") or [])[j] if j < len(r.get("skills") or []) else {}
        scores = dict(zip(ids, r["scores"][j]))
        gens = [join(tag("div", f"generation {gen['g']}: carried reward "
                         f"{gen.get('carried_reward', 0):.2f} on the instance's own tasks",
                         cls="small"),
                     *(join(tag("span", f"reward {c.get('reward', 0):.2f}", cls="badge"),
                            pre(c["skill"] if c.get("skill") is not None
                                else f"(did not parse) {c.get('reply') or ''}",
                                800)) for c in gen.get("candidates") or []))
                for gen in written.get("generations") or []]
        cards.append(Safe('<div class="card">' + join(
            tag("b", r["name"]), " ",
            tag("span", f"score {sum(scores.values()) / max(1, len(scores)):.2f}", cls="badge"),
            tag("div", gained_lost_html(gained_lost(base, scores), questions) if r is not rows[0]
                else
                tag("span", "the baseline of gained / lost", cls="muted small"), cls="small"),
            details("the skill it was scored with", pre(written.get("carried") or "(no skill)")),
            details(f"what the editor wrote ({len(gens)} generations)", *gens) if gens else None)
                          + "</div>"))
    return details(f"instance {inst['id']} ({inst.get('type')}): {len(ids)} evaluation tasks",
                   tag("div", "evolved on: ", tasks_list(inst.get("evolve_tasks") or []),
                       cls="small"),
                   Safe('<div class="grid">' + "".join(cards) + "</div>"), open_=j == 0)


def render_eval(run: dict) -> str:
    record = run["eval"]
    rows, flags = record["rows"], record.get("flags") or {}
    missing = [] if record.get("finished") else ["the rows after the last one written and the "
                                                 "paired table (the evaluation did not finish)"]
    n_eval = sum(len(x["eval_tasks"]) for x in record.get("instances") or [])
    return page("Skill-R1 evaluation (train_grpo.py --eval)",
                f"{run['folder']} · read {', '.join(run['files'])}", [
        missing_box(missing),
        kv_table([("task model", record.get("task_model")),
                  ("instances", len(record.get("instances") or [])),
                  ("evaluation tasks per row", n_eval)]),
        tag("h2", "Run"), flags_table(flags, EVAL_FLAGS), eval_tables(record), eval_costs(record),
        tag("h2", "Per instance: the skills each row scored with, tasks gained and lost against no "
            "skill"),
        *(eval_instance(j, inst, rows) for j, inst in enumerate(record.get("instances") or []))])
