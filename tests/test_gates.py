"""The acceptance gates (minskill/gates.py): the one-sided sign test by hand, the decision record, strict = the
rule the code had before (MASA's climb and trees, Skill-R1's carry), paired rejecting a higher mean that rests
on one task, the flags checked on --resume (old runs count as strict), and a scripted evolve_masa.py run with
--gate paired that records every decision. --gate fresh (MASA): a gain on the search tasks only is rejected
(strict and paired accept it), a gain on the gate tasks too is accepted, the gate tasks are disjoint from the
search, preliminary and held-out tasks, too few are refused before any model call, and a resumed run makes the
same decisions."""
import json
import random
from pathlib import Path

import pytest

import evolve_masa
import train_grpo
from helpers import argv, interrupted_at_save, read, run_climb, scripted_search
from minskill import gates
from minskill.masa import search as masa, ucb
from minskill.masa.model_card import ModelCard
from minskill.paired import sign_test_p, sign_test_p_greater
from minskill.skill_r1 import loop as skill_r1, run_setup
from minskill.skill_r1.records import lineage_records
from minskill.skillsets import SkillSet
from minskill.tasks.base import Task


RECORD_KEYS = {"gate", "alpha", "use", "candidate", "incumbent", "candidate_reward", "incumbent_reward", "n",
               "gained", "lost", "p", "rescored", "accepted"}


# ---------------------------------------------------------------------------------------------- sign test

@pytest.mark.parametrize("gained, lost, expected", [
    (1, 0, 1 / 2),                    # one untied task: P(X >= 1 | Bin(1, 1/2))
    (5, 0, 1 / 32),
    (4, 0, 1 / 16),
    (6, 2, (28 + 8 + 1) / 256),       # C(8,6) + C(8,7) + C(8,8) over 2^8
    (2, 2, (6 + 4 + 1) / 16),         # C(4,2) + C(4,3) + C(4,4) over 2^4
    (0, 3, 1.0),                      # X >= 0 always
    (0, 0, 1.0)])                     # no untied task: no evidence
def test_one_sided_sign_test_by_hand(gained, lost, expected):
    assert sign_test_p_greater(gained, lost) == pytest.approx(expected)


def test_one_sided_is_half_the_two_sided_in_its_direction():
    for gained, lost in [(5, 0), (6, 2), (7, 3)]:
        assert sign_test_p_greater(gained, lost) == pytest.approx(sign_test_p(gained, lost) / 2)


# ---------------------------------------------------------------------------------------------- decisions

def test_paired_rejects_a_higher_mean_that_rests_on_one_task_of_four():
    scores = [(1.0, 0.0), (1.0, 1.0), (0.0, 0.0), (0.0, 0.0)]     # candidate 0.5 > incumbent 0.25: 1 gained
    strict = gates.decision("strict", 0.1, "climb", 3, 1, 0.5, 0.25, scores, strict_ok=True)
    paired = gates.decision("paired", 0.1, "climb", 3, 1, 0.5, 0.25, scores, strict_ok=True)
    assert strict["accepted"] is True and paired["accepted"] is False
    assert set(paired) == RECORD_KEYS
    assert paired == {"gate": "paired", "alpha": 0.1, "use": "climb", "candidate": 3, "incumbent": 1,
                      "candidate_reward": 0.5, "incumbent_reward": 0.25, "n": 4, "gained": 1, "lost": 0,
                      "p": 0.5, "rescored": 0, "accepted": False}
    assert strict["p"] == 0.5   # computed under strict too, for the record


def test_paired_accepts_five_gained_none_lost_and_never_what_strict_rejects():
    scores = [(1.0, 0.0)] * 5 + [(1.0, 1.0)]
    yes = gates.decision("paired", 0.1, "carry", "g1.0", "g0", 1.0, 1 / 6, scores, strict_ok=True)
    assert yes["accepted"] and yes["p"] == pytest.approx(1 / 32) and (yes["gained"], yes["lost"]) == (5, 0)
    assert not gates.decision("paired", 0.01, "carry", "g1.0", "g0", 1.0, 1 / 6, scores, True)["accepted"]
    assert not gates.decision("paired", 0.1, "carry", "g1.0", "g0", 1.0, 1 / 6, scores, strict_ok=False)["accepted"]


def test_bad_gate_and_alpha_are_refused():
    with pytest.raises(ValueError, match="gate must be one of strict, paired"):
        gates.check_gate("loose", 0.1)
    with pytest.raises(ValueError, match="alpha"):
        gates.check_gate("paired", 0.0)


# ---------------------------------------------------------------------------------------------- MASA

def tasks(n=4, task_type="qa"):
    return [Task(f"t{i}", task_type, f"question {i}?", "1") for i in range(n)]


def search(gate="strict", n=4):
    config = masa.MasaConfig(gate=gate, gate_alpha=0.1)
    return masa.MasaSearch(None, None, ModelCard(name="m"), tasks(n), SkillSet([], {}, []), config)


def cand(s, scores: dict, phase="general"):
    x = s.add_candidate(SkillSet([], {}, []), phase)
    x.reward = sum(scores.values()) / len(scores)
    x.metrics = {"adjusted_reward": x.reward, "task_rewards": dict(scores)}
    return x


def test_masa_gate_strict_is_the_papers_rule_and_paired_needs_the_sign_test():
    for gate in ("strict", "paired"):
        s = search(gate)
        incumbent = cand(s, {"t0": 0, "t1": 1, "t2": 0, "t3": 0})
        one_task = cand(s, {"t0": 1, "t1": 1, "t2": 0, "t3": 0})
        equal = cand(s, {"t0": 1, "t1": 0, "t2": 0, "t3": 0})
        assert s.gate(one_task, incumbent, "climb") is (gate == "strict")
        assert not s.gate(equal, incumbent, "climb")            # equal R: rejected by both
        assert one_task.gate["incumbent"] == incumbent.id and one_task.gate["n"] == 4
        assert s.to_json()["candidates"][one_task.id]["gate"] == one_task.gate     # in state.json
        assert masa.search_log(s.to_json())[one_task.id]["gate"] == one_task.gate   # and in search_log.jsonl


def test_masa_strict_and_paired_gates_pair_the_tasks_both_hold_without_a_model_call(monkeypatch):
    for gate in ("strict", "paired"):
        s = search(gate, n=6)
        incumbent = cand(s, {"t0": 0, "t1": 0})                 # scored on two of the candidate's tasks only
        challenger = cand(s, {f"t{i}": 1 for i in range(6)})
        monkeypatch.setattr(s, "evaluate", lambda *a: pytest.fail("the gate re-evaluated a skill set"))
        accepted = s.gate(challenger, incumbent, "climb")
        assert (challenger.gate["n"], challenger.gate["gained"], challenger.gate["rescored"]) == (2, 2, 0)
        assert accepted is (gate == "strict")                   # paired: 2 gained of 2, p = 1/4 > 0.1


def test_hill_climb_with_a_gate_records_and_keeps_the_strict_default():
    s = scripted_search([{"t0": 1, "t1": 1, "t2": 0, "t3": 0}, {"t0": 1, "t1": 1, "t2": 1, "t3": 1}],
                        {"t0": 0, "t1": 1, "t2": 0, "t3": 0}, iterations=2, patience=3, gate="paired")
    run_climb(s)
    base, one, two = s.candidates
    # 1 gained of 4 (p = 1/2): rejected; then 3 gained, 0 lost (p = 1/8 > 0.1): rejected as well
    assert not one.gate["accepted"] and not two.gate["accepted"] and s.climb.best is base and s.climb.stale == 2
    assert (one.gate["gained"], two.gate["gained"], two.gate["p"]) == (1, 3, 1 / 8)
    # the default gate is the old rule: strictly higher R
    strict = scripted_search([0.5, 0.75], 0.5, iterations=2, patience=3)
    run_climb(strict)
    assert [x.accepted for x in strict.candidates[1:]] == [False, True] and strict.climb.best.reward == 0.75


def tree_search(gate):
    s = search(gate)
    root = ucb.Node(payload=cand(s, {"t0": 1, "t1": 0, "t2": 0, "t3": 1}, "tree"))
    ucb.backpropagate(root, root.payload.reward)
    root.reward = root.payload.reward
    child = ucb.expand(root, cand(s, {"t0": 1, "t1": 1, "t2": 0, "t3": 1}, "tree"))
    child.reward = child.payload.reward
    ucb.backpropagate(child, child.reward)
    s.trees["qa"] = masa.Tree(root, 1)
    return s, root, child


def test_tree_result_strict_is_the_best_node_paired_keeps_the_root_without_significance():
    s, root, child = tree_search("strict")
    assert ucb.best_node(root) is child and s.best_per_type()["qa"] is child.payload
    assert child.payload.gate["use"] == "tree result" and child.payload.gate["accepted"]
    s, root, child = tree_search("paired")
    assert s.best_per_type()["qa"] is root.payload                     # 1 gained, 0 lost: p = 1/2
    assert child.payload.gate["incumbent"] == root.payload.id and not child.payload.gate["accepted"]
    restored = search("paired")
    restored.restore(s.to_json())                                       # the decision survives a checkpoint
    assert restored.best_per_type()["qa"].id == root.payload.id


# ---------------------------------------------------------------------------------------------- Skill-R1

def outcome(r):
    return skill_r1.Outcome("q", float(r), "reply")


def evolution(seed_scores):
    instance = skill_r1.Instance("x", "qa", tasks(len(seed_scores)))
    return skill_r1.Evolution(instance, "seed", sum(seed_scores) / len(seed_scores), [outcome(r) for r in seed_scores])


def candidate(g, scores, skill="s"):
    c = skill_r1.Candidate(g, [], [], [], "text", skill, None if skill else "unparsed")
    if skill is not None:
        c.outcomes = [outcome(r) for r in scores]
        c.reward = sum(scores) / len(scores)
    return c


def old_carry(ev, g, group):
    """skill_r1._carry as it was before the gates (commit 3053a21)."""
    mean = sum(c.reward for c in group) / len(group)
    prev_mean = ev.generations[-1].mean_reward if ev.generations else ev.seed_reward
    best = max(range(len(group)), key=lambda i: (group[i].reward, -i))
    current, current_r = ev.final_skill, ev.final_reward
    if group[best].skill is not None and group[best].reward > current_r:
        current, current_r = group[best].skill, group[best].reward
    return skill_r1.Generation(g, group, mean, mean - prev_mean, best, current, current_r)


def test_skill_r1_strict_carry_reproduces_the_old_rule_exactly():
    rng, cfg = random.Random(0), skill_r1.EvolveConfig()
    assert cfg.carry_gate == "strict"
    for _ in range(300):
        ev, ev_old = evolution([rng.choice([0, 0.5, 1]) for _ in range(4)]), None
        ev_old = skill_r1.Evolution(ev.instance, ev.seed_skill, ev.seed_reward, ev.seed_outcomes)
        for g in (1, 2, 3):
            group = [candidate(g, [rng.choice([0, 0.5, 1]) for _ in range(4)],
                               None if rng.random() < 0.2 else f"skill {g}.{i}") for i in range(3)]
            new, old = skill_r1._carry(ev, g, group, cfg), old_carry(ev_old, g, group)
            assert (new.best_index, new.current_skill, new.current_reward, new.mean_reward) == \
                   (old.best_index, old.current_skill, old.current_reward, old.mean_reward)
            ev.generations.append(new)
            ev_old.generations.append(old)


def test_skill_r1_paired_carry_compares_with_the_carried_skills_tasks():
    cfg = skill_r1.EvolveConfig(carry_gate="paired", carry_gate_alpha=0.1)
    ev = evolution([0, 0, 0, 0, 0])
    five = [candidate(1, [1, 1, 1, 1, 1], "five"), candidate(1, [1, 0, 0, 0, 0], "one")]
    gen1 = skill_r1._carry(ev, 1, five, cfg)                            # 5 gained of 5: p = 1/32
    assert gen1.current_skill == "five" and gen1.gate["accepted"] and gen1.gate["p"] == pytest.approx(1 / 32)
    assert (gen1.gate["candidate"], gen1.gate["incumbent"]) == ("g1.0", "g0")
    ev.generations.append(gen1)
    assert gates.carried(ev) == ("g1.0", five[0].outcomes)
    ev2 = evolution([0, 1, 0, 0])
    one = [candidate(1, [1, 1, 0, 0], "one of four")]                 # mean 0.5 > 0.25 on one gained task
    gen = skill_r1._carry(ev2, 1, one, cfg)
    assert gen.current_skill == "seed" and gen.current_reward == 0.25 and not gen.gate["accepted"]
    assert (gen.gate["gained"], gen.gate["lost"], gen.gate["p"], gen.gate["n"]) == (1, 0, 0.5, 4)
    ev2.generations.append(gen)
    record = lineage_records(0, [ev2])[0]
    assert record["carried"] == ["g0", "g0"] and record["gates"] == [gen.gate]
    unparsed = skill_r1._carry(ev2, 2, [candidate(2, [], None)], cfg)
    assert not unparsed.gate["accepted"] and unparsed.gate["n"] == 0


# ---------------------------------------------------------------------------------------------- flags, resume

def test_train_grpo_carry_gate_flags_and_resume(monkeypatch, tmp_path):
    args = train_grpo.parse_args([])
    assert (args.carry_gate, args.carry_gate_alpha) == ("strict", 0.1)
    assert skill_r1.EvolveConfig.from_args(train_grpo.parse_args(["--carry-gate", "paired"])).carry_gate == "paired"
    assert {"carry_gate", "carry_gate_alpha"} <= set(train_grpo.RESUME_MUST_MATCH)
    with pytest.raises(SystemExit):
        train_grpo.parse_args(["--carry-gate-alpha", "0"])
    old = dict(vars(args))   # a checkpoint of a run with the strict gate
    monkeypatch.setattr(run_setup, "find_checkpoint", lambda out: tmp_path)
    monkeypatch.setattr(run_setup, "load_trainer_state", lambda ckpt, restore_rng, required=(), mmap=False:
                        {"args": old})
    assert train_grpo.parse_args(["--resume", "--out", str(tmp_path)]).carry_gate == "strict"
    with pytest.raises(SystemExit, match="--carry-gate 'strict' -> 'paired'"):
        train_grpo.parse_args(["--resume", "--out", str(tmp_path), "--carry-gate", "paired"])


def test_evolve_masa_gate_on_resume(tmp_path):
    parser = evolve_masa.build_parser()
    saved_args = {**vars(parser.parse_args([])), "gate": "strict", "gate_alpha": 0.1, "gate_tasks": 24}   # as set_up saves
    (tmp_path / "state.json").write_text(json.dumps({"args": saved_args, "calls_spent": 0, "events": [], "card": None, "search": None}))
    def resume(*flags):
        return evolve_masa.resume_args(parser, parser.parse_args(["--resume", *flags]), tmp_path,
                                       ["--resume", *flags])[0]
    args = resume()
    assert (args.gate, args.gate_alpha, args.gate_tasks) == ("strict", 0.1, 24)   # the saved gate
    with pytest.raises(SystemExit, match="--gate-tasks 24 -> 12"):
        resume("--gate-tasks", "12")
    assert resume("--gate", "strict").gate == "strict"
    with pytest.raises(SystemExit, match="--gate 'strict' -> 'paired'"):
        resume("--gate", "paired")
    with pytest.raises(SystemExit, match="--gate-alpha 0.1 -> 0.05"):
        resume("--gate-alpha", "0.05")


@pytest.fixture(scope="module")
def paired_run(env):
    out = env["tmp"] / "run-paired"
    assert evolve_masa.main(argv(env, out, "--gate", "paired", "--n-heldout", "0")) == 0
    return out


def test_evolve_masa_paired_run_records_every_decision(paired_run):
    out = paired_run
    state = read(out, "state.json")
    assert state["args"]["gate"] == "paired" and state["args"]["gate_alpha"] == 0.1
    general = [x for x in state["search"]["candidates"] if x["phase"] == "general" and x["reward"] is not None]
    assert general and all(set(x["gate"]) == RECORD_KEYS and x["gate"]["gate"] == "paired" for x in general)
    assert all(x["accepted"] == x["gate"]["accepted"] for x in general)
    # KEY-GENERAL fixes the 6 sum tasks of the 12 search tasks and loses nothing: p = 1/64, accepted
    first = general[0]["gate"]
    assert first["accepted"] and (first["gained"], first["lost"], first["n"]) == (6, 0, 12)
    assert first["p"] == pytest.approx(1 / 64)
    # the secret tree's child solves its 4 episodes, the root none: 4 gained, p = 1/16 <= 0.1, it replaces the root
    tree_results = [x["gate"] for x in state["search"]["candidates"] if (x.get("gate") or {}).get("use") == "tree result"]
    assert [(g["gained"], g["lost"], g["accepted"]) for g in tree_results] == [(4, 0, True)]
    assert "KEY-SECRET" in json.dumps(read(out, "library.json")["task_specific_skills"]["secret"])
    log = [json.loads(line) for line in (out / "search_log.jsonl").read_text().splitlines()]
    assert [r["gate"] for r in log if r["kind"] == "candidate" and r["phase"] == "general" and r["reward"] is not None] \
        == [x["gate"] for x in general]
    with pytest.raises(SystemExit):                                      # the gate is part of the run
        evolve_masa.main(["--resume", "--out", str(out), "--gate", "strict"])


@pytest.mark.parametrize("stop_at", [4, 8])   # saves: start, base, general 1..3, trees, roots and tree iterations
def test_evolve_masa_paired_resume_is_the_same_search(env, paired_run, monkeypatch, stop_at):
    out = env["tmp"] / f"run-paired-interrupted-{stop_at}"
    interrupted_at_save(monkeypatch, stop_at, argv(env, out, "--gate", "paired", "--n-heldout", "0"))
    assert evolve_masa.main(["--resume", "--out", str(out)]) == 0        # the gate comes from the saved run
    keys = ("phase", "task_type", "parent", "reward", "accepted", "node", "gate")
    strip = lambda state: [{k: c.get(k) for k in keys} for c in state["search"]["candidates"]]  # noqa: E731
    assert strip(read(out, "state.json")) == strip(read(paired_run, "state.json"))
    assert read(out, "library.json") == read(paired_run, "library.json")


def test_the_masa_report_shows_the_gate_decisions(paired_run):
    from minskill.report.masa import render_masa
    from minskill.report.provenance import load_run
    html = render_masa(load_run(paired_run))
    assert "gate: vs, gained / lost, p" in html and "paired vs #0: 6 / 0 of 12, p = 0.0156 (α = 0.1)" in html
    assert "gate, best node against the root: paired vs #" in html


# ---------------------------------------------------------------------------------------------- fresh (MASA)

FRESH_KEYS = RECORD_KEYS | {"tasks", "gate_tasks", "search", "gate_rewards"}


def fresh_search(n_gate=6, gate_types=("qa",)):
    """A search on 4 search tasks t0..t3 with gate tasks g0.. (types cycling through `gate_types`) whose target
    is scripted per skill set: `scripted[skill name]` = {task id: reward} on the gate tasks."""
    gate_tasks = [Task(f"g{i}", gate_types[i % len(gate_types)], f"gate question {i}?", "1") for i in range(n_gate)]
    config = masa.MasaConfig(gate="fresh", gate_alpha=0.1)
    s = masa.MasaSearch(None, None, ModelCard(name="m"), tasks(4), SkillSet([], {}, []), config, gate_tasks=gate_tasks)
    s.scripted, s.asked = {}, []

    def evaluate(skills, task_list):
        name = skills.general[0].name
        s.asked.append((name, [t.id for t in task_list]))
        return {"task_rewards": {t.id: s.scripted[name].get(t.id, 0.0) for t in task_list}}, []
    s.evaluate = evaluate
    return s


def named(s, name, search_scores: dict, gate_scores: dict, phase="general", task_type=None):
    from minskill.skills import Skill
    x = s.add_candidate(SkillSet([Skill(name=name, description="d", body="b", metadata={})], {}, []), phase,
                        task_type=task_type)
    x.reward = sum(search_scores.values()) / len(search_scores)
    x.metrics = {"adjusted_reward": x.reward, "task_rewards": dict(search_scores)}
    s.scripted[name] = dict(gate_scores)
    return x


def test_fresh_rejects_a_gain_on_the_search_tasks_only_which_strict_and_paired_accept():
    search_gain = {"t0": 1, "t1": 1, "t2": 1, "t3": 1}                       # 4 gained of 4 search tasks: p = 1/16
    for gate in ("strict", "paired", "fresh"):
        s = fresh_search()
        s.config.gate = gate
        base = named(s, "base", {f"t{i}": 0 for i in range(4)}, {})          # 0 on every gate task
        overfit = named(s, "overfit", search_gain, {})                       # and so is this one
        assert s.gate(overfit, base, "climb") is (gate != "fresh"), gate
    record = overfit.gate
    assert set(record) == FRESH_KEYS and record["tasks"] == "gate" and record["gate"] == "fresh"
    assert record["gate_tasks"] == [f"g{i}" for i in range(6)] and record["n"] == 6
    assert (record["gained"], record["lost"], record["p"], record["accepted"]) == (0, 0, 1.0, False)
    assert record["search"] == {"n": 4, "gained": 4, "lost": 0, "p": pytest.approx(1 / 16)}
    assert record["gate_rewards"] == {"candidate": {f"g{i}": 0.0 for i in range(6)},
                                      "incumbent": {f"g{i}": 0.0 for i in range(6)}}
    assert overfit.metrics["task_rewards"] == search_gain and overfit.reward == 1.0   # search metrics untouched
    assert s.to_json()["candidates"][overfit.id]["gate"] == record
    assert masa.search_log(s.to_json())[overfit.id]["gate"] == record


def test_fresh_accepts_a_gain_on_both_and_pays_the_incumbent_once():
    s = fresh_search()
    base = named(s, "base", {f"t{i}": 0 for i in range(4)}, {})
    general = named(s, "general", {"t0": 1, "t1": 0, "t2": 0, "t3": 0}, {f"g{i}": 1 for i in range(5)})
    assert s.gate(general, base, "climb")                                   # 5 gained, 0 lost on g0..g5: p = 1/32
    assert (general.gate["gained"], general.gate["lost"], general.gate["rescored"]) == (5, 0, 6)
    assert general.gate["search"]["p"] == 0.5                                # paired on the search tasks: rejected
    assert s.asked == [("general", [f"g{i}" for i in range(6)]), ("base", [f"g{i}" for i in range(6)])]
    s.asked.clear()
    better = named(s, "better", {"t0": 1, "t1": 1, "t2": 0, "t3": 0}, {f"g{i}": 1 for i in range(6)})
    assert not s.gate(better, general, "climb")                             # 1 gained of 6: p = 1/2
    assert s.asked == [("better", [f"g{i}" for i in range(6)])]              # the incumbent's came from its record
    assert better.gate["rescored"] == 0 and better.gate["gate_rewards"]["incumbent"] == general.gate["gate_rewards"]["candidate"]
    s.asked.clear()
    worse = named(s, "worse", {f"t{i}": 0 for i in range(4)}, {f"g{i}": 1 for i in range(6)})
    assert not s.gate(worse, base, "climb") and s.asked == []               # R not higher: no rollout at all
    assert (worse.gate["n"], worse.gate["p"], worse.gate["gate_rewards"]) == (0, 1.0, {"candidate": {}, "incumbent": {}})


def test_fresh_tree_result_uses_the_gate_tasks_of_its_type():
    s = fresh_search(n_gate=12, gate_types=("qa", "other"))                 # 6 gate tasks of type qa, 6 of another
    root = ucb.Node(payload=named(s, "root", {"t0": 0, "t1": 0, "t2": 0, "t3": 0}, {}, "tree", "qa"))
    root.reward = root.payload.reward
    child = ucb.expand(root, named(s, "child", {"t0": 1, "t1": 0, "t2": 0, "t3": 0},
                                   {f"g{i}": 1 for i in range(12)}, "tree", "qa"))
    child.reward = child.payload.reward
    s.trees["qa"] = masa.Tree(root, 1)
    assert s.best_per_type()["qa"] is child.payload
    record = child.payload.gate
    assert record["use"] == "tree result" and record["gate_tasks"] == [f"g{i}" for i in range(0, 12, 2)]
    assert (record["n"], record["gained"], record["p"]) == (6, 6, pytest.approx(1 / 64))
    restored = fresh_search(n_gate=12, gate_types=("qa", "other"))
    restored.restore(s.to_json())                                           # the decision survives a checkpoint
    assert restored.best_per_type()["qa"].id == child.payload.id and restored.asked == []


# ------------------------------------------------------------------ fresh: gate tasks of evolve_masa.py

def test_gate_tasks_are_disjoint_balanced_and_leave_the_search_tasks_as_they_were():
    parser = evolve_masa.build_parser()
    for suite in ("qa", "household", "webwalk"):
        args = parser.parse_args(["--suite", suite, "--gate", "fresh", "--gate-tasks", "24"])
        prelim, search_tasks, heldout = evolve_masa.load_task_splits(args)
        gate = evolve_masa.load_gate_tasks(args, prelim + search_tasks + heldout)
        assert len(gate) == 24 and len({t.id for t in gate}) == 24
        assert not {t.id for t in gate} & {t.id for t in prelim + search_tasks + heldout}, suite
        assert all(t.metadata["split"] == "train" for t in gate)
        # the other gates: unchanged
        strict = evolve_masa.load_task_splits(parser.parse_args(["--suite", suite]))
        assert [[t.id for t in part] for part in strict] == [[t.id for t in part] for part in (prelim, search_tasks, heldout)]
        assert evolve_masa.load_gate_tasks(parser.parse_args(["--suite", suite]), []) == []
        counts = {t.type: sum(g.type == t.type for g in gate) for t in gate}
        assert max(counts.values()) - min(counts.values()) <= 1, (suite, counts)
        if suite == "qa":
            assert counts == {"counting": 6, "lookup": 6, "arithmetic": 6, "conversion": 6}
            assert gate == evolve_masa.load_gate_tasks(args, prelim + search_tasks + heldout)   # deterministic


def test_too_few_gate_tasks_are_refused_before_any_model_call(env, tmp_path, capsys):
    out = tmp_path / "refused"
    bogus = ["--task-url", "http://127.0.0.1:9/v1", "--teacher-url", "http://127.0.0.1:9/v1"]
    with pytest.raises(SystemExit):     # the test suite's train split: 16 tasks, 14 of them search + preliminary
        evolve_masa.main(argv(env, out, "--gate", "fresh", *bogus))
    err = capsys.readouterr().err
    assert ("--gate fresh needs --gate-tasks 24 train tasks beyond the 14 search and preliminary ones "
            "(--n-train 12 + --n-prelim 2), but the train split of") in err
    assert "holds 16 tasks, which leaves 2; lower --gate-tasks" in err and not out.exists()
    with pytest.raises(SystemExit):     # a generated suite that cannot draw that many
        evolve_masa.main(["--suite", "qa", "--n-train", "280", "--gate", "fresh", "--out", str(out), *bogus])
    assert "beyond the 284 search and preliminary ones" in capsys.readouterr().err and not out.exists()
    with pytest.raises(SystemExit):
        evolve_masa.main(["--suite", "qa", "--gate", "fresh", "--gate-tasks", "0", "--out", str(out), *bogus])


# ------------------------------------------------------------------ fresh: a scripted run end to end

FRESH_ANSWERS: dict[str, str] = {}
SEEN_SUMS: set[str] = set()


def write_fresh_suite(path: Path) -> Path:
    """16 train tasks per type (2 preliminary, 12 search, then gate tasks) and 4 held-out per type."""
    lines = []
    for i in range(20):
        split = "train" if i < 16 else "heldout"
        q_sum, q_secret = f"What is {i + 3} plus {2 * i + 1}?", f"What is the secret number of agent {i}?"
        FRESH_ANSWERS[q_sum], FRESH_ANSWERS[q_secret] = str(3 * i + 4), str(100 + 7 * i)
        if i <= 6:                      # sum-0 (preliminary) and sum-1..6 (search)
            SEEN_SUMS.add(q_sum)
        lines.append({"id": f"sum-{i}", "type": "sum", "question": q_sum, "answer": FRESH_ANSWERS[q_sum], "split": split})
        lines.append({"id": f"secret-{i}", "type": "secret", "question": q_secret,
                      "answer": FRESH_ANSWERS[q_secret], "split": split})
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def overfit_target(messages, request):
    """KEY-GENERAL helps only on the sum tasks the search scores (a gain specific to that sample); KEY-SECRET
    helps on every secret task."""
    system = messages[0]["content"] if messages[0]["role"] == "system" else ""
    question = messages[-1]["content"]
    if question in FRESH_ANSWERS and (("KEY-GENERAL" in system and question in SEEN_SUMS)
                                      or ("KEY-SECRET" in system and "secret" in question)):
        return f"Answer: {FRESH_ANSWERS[question]}"
    return "I am not sure, maybe 1."


@pytest.fixture(scope="module")
def fresh_env(env):
    from minskill.serve.backends import ScriptedBackend
    from minskill.serve.server import start_server
    server = start_server(ScriptedBackend(overfit_target, name="overfit"))
    suite = write_fresh_suite(env["tmp"] / "fresh-suite.jsonl")

    def fresh_argv(out, *extra):
        return ["--suite", str(suite), "--base-skills", str(env["base"]), "--n-train", "12", "--n-prelim", "2",
                "--n-heldout", "8", "--task-url", server.url, "--task-model", "overfit", "--teacher-url",
                env["teacher"], "--teacher-model", "teacher", "--iterations", "3", "--patience", "2",
                "--tree-iterations", "3", "--episodes", "4", "--task-concurrency", "4", "--out", str(out), *extra]
    yield {"argv": fresh_argv, "tmp": env["tmp"], "suite": suite}
    server.close()


@pytest.fixture(scope="module")
def fresh_run(fresh_env):
    out = fresh_env["tmp"] / "run-fresh"
    assert evolve_masa.main(fresh_env["argv"](out, "--gate", "fresh", "--gate-tasks", "8")) == 0
    return out


def test_evolve_masa_fresh_rejects_the_overfit_climb_that_paired_accepts(fresh_env, fresh_run):
    state = read(fresh_run, "state.json")
    assert (state["args"]["gate"], state["args"]["gate_tasks"]) == ("fresh", 8)
    gate_ids = [f"{kind}-{i}" for i in range(7, 11) for kind in ("sum", "secret")]
    assert state["gate_tasks"] == gate_ids                                   # after the 2 + 12 train tasks
    args = evolve_masa.build_parser().parse_args(fresh_env["argv"](fresh_run))
    used = [t.id for part in evolve_masa.load_task_splits(args) for t in part]
    assert not set(gate_ids) & set(used) and len(used) == 2 + 12 + 8
    general = [x for x in state["search"]["candidates"] if x["phase"] == "general" and x["reward"] is not None]
    assert len(general) == 2 and all(set(x["gate"]) == FRESH_KEYS and not x["accepted"] for x in general)
    first, second = general[0]["gate"], general[1]["gate"]
    # KEY-GENERAL fixes the 6 search sum tasks (paired would accept: p = 1/64) but none of the 8 gate tasks
    assert first["search"] == {"n": 12, "gained": 6, "lost": 0, "p": pytest.approx(1 / 64)}
    assert (first["n"], first["gained"], first["lost"], first["p"]) == (8, 0, 0, 1.0)
    assert first["gate_tasks"] == gate_ids and first["rescored"] == 8 and second["rescored"] == 0
    # the secret tree's child solves its 4 secret gate tasks too: 4 gained, p = 1/16, it replaces the root
    trees = [x["gate"] for x in state["search"]["candidates"] if (x.get("gate") or {}).get("use") == "tree result"]
    assert [(g["gate_tasks"], g["gained"], g["lost"], g["accepted"]) for g in trees] == \
        [([f"secret-{i}" for i in range(7, 11)], 4, 0, True)]
    library = read(fresh_run, "library.json")
    assert "KEY-SECRET" in json.dumps(library) and "KEY-GENERAL" not in json.dumps(library)
    paired = fresh_env["tmp"] / "run-fresh-vs-paired"
    assert evolve_masa.main(fresh_env["argv"](paired, "--gate", "paired")) == 0
    climb = [x["gate"] for x in read(paired, "state.json")["search"]["candidates"] if x["phase"] == "general"]
    assert climb[0]["accepted"] and (climb[0]["gained"], climb[0]["lost"]) == (6, 0)
    # on the held-out split the accepted KEY-GENERAL gains nothing on sum: the gain was the search sample's
    assert read(paired, "results.json")["heldout"]["gained_lost"]["**all**"] == \
        read(fresh_run, "results.json")["heldout"]["gained_lost"]["**all**"] == [4, 0]


@pytest.mark.parametrize("stop_at", [3, 6])   # saves: start, base, general 1, 2, trees, roots, tree iterations
def test_evolve_masa_fresh_resume_is_the_same_search(fresh_env, fresh_run, monkeypatch, stop_at):
    out = fresh_env["tmp"] / f"run-fresh-interrupted-{stop_at}"
    interrupted_at_save(monkeypatch, stop_at, fresh_env["argv"](out, "--gate", "fresh", "--gate-tasks", "8"))
    with pytest.raises(SystemExit):                                         # the gate tasks are part of the run
        evolve_masa.main(["--resume", "--out", str(out), "--gate-tasks", "6"])
    assert evolve_masa.main(["--resume", "--out", str(out)]) == 0
    keys = ("phase", "task_type", "parent", "reward", "accepted", "node", "gate")
    strip = lambda state: [{k: c.get(k) for k in keys} for c in state["search"]["candidates"]]  # noqa: E731
    assert strip(read(out, "state.json")) == strip(read(fresh_run, "state.json"))
    assert read(out, "library.json") == read(fresh_run, "library.json")
    assert read(out, "state.json")["gate_tasks"] == read(fresh_run, "state.json")["gate_tasks"]


def test_evolve_masa_fresh_resume_refuses_other_gate_tasks(fresh_env, fresh_run, tmp_path, capsys):
    import shutil
    out = tmp_path / "edited"
    shutil.copytree(fresh_run, out)
    state = read(out, "state.json")
    state["gate_tasks"][0] = "sum-15"                                       # as if the suite file had changed
    (out / "state.json").write_text(json.dumps(state))
    with pytest.raises(SystemExit):
        evolve_masa.main(["--resume", "--out", str(out)])
    assert "the suite now gives other gate tasks than the saved run's (8 vs 8; differing ids: sum-15, sum-7)" \
        in capsys.readouterr().err


def test_the_masa_report_shows_fresh_decisions(fresh_run):
    from minskill.report.masa import render_masa
    from minskill.report.provenance import load_run
    assert "fresh vs #0: 0 / 0 of 8" in render_masa(load_run(fresh_run))
