"""Task suites: determinism, disjoint splits, JSONL loading, and the environments (every generated task
is solved by the scripted oracle; impossible actions give exactly "Nothing happens." and are counted)."""
import copy
import json
import re

import pytest

from minskill.skills import SkillFormatError, validate_task_type
from minskill.tasks import NOTHING_HAPPENS, Task, load_suite, make_env, oracle_actions, task_types
from minskill.tasks.base import check_task_type
from minskill.tasks.household import TASK_TYPES as HOUSEHOLD_TYPES
from minskill.tasks.qa import TASK_TYPES as QA_TYPES, _CONVERSIONS, generate_qa
from minskill.tasks.webwalk import LEVELS


def _ids(tasks):
    return [t.id for t in tasks]


# --------------------------------------------------------------------------- common

@pytest.mark.parametrize("suite", ["qa", "household", "webwalk", "webshop", "searchqa"])
def test_suites_are_deterministic_and_splits_disjoint(suite):
    train = load_suite(suite, "train", seed=0)
    assert _ids(train) == _ids(load_suite(suite, "train", seed=0))
    assert [t.to_dict() for t in train] == [t.to_dict() for t in load_suite(suite, "train", seed=0)]
    heldout = load_suite(suite, "heldout", seed=0)
    assert not set(_ids(train)) & set(_ids(heldout))
    assert not {t.question for t in train} & {t.question for t in heldout}
    assert len(set(_ids(train))) == len(train)
    # another seed draws other tasks, still never from the other split
    other_seed = load_suite(suite, "heldout", seed=1)
    assert _ids(other_seed) != _ids(heldout)
    assert not set(_ids(other_seed)) & set(_ids(train))
    assert all(t.metadata["split"] == "train" for t in train)
    everything = load_suite(suite, "all", seed=0)
    assert _ids(everything) == _ids(train) + _ids(heldout)


def test_household_splits_hold_different_goals_whatever_the_seed():
    goals = {split: {(t.type, t.env_spec["goal"]["object"], t.env_spec["goal"]["target"])
                     for seed in (0, 1, 2) for t in load_suite("household", split, seed=seed)}
             for split in ("train", "heldout")}
    assert not goals["train"] & goals["heldout"]


def _arithmetic_key(question):
    a, b = map(int, re.findall(r"\d+", question))
    if question.startswith("Subtract"):
        a, b = b, a
    return (a, "+" if ("+" in question or "plus" in question or "Add" in question) else "-", b)


def test_qa_problem_keys_are_disjoint_across_seeds():
    def keys(split, seed):
        return {_arithmetic_key(t.question) for t in load_suite("qa", split, seed, n=200) if t.type == "arithmetic"}
    # the same sum never appears in both splits, whatever the seeds and the wording
    assert not (keys("train", 0) | keys("train", 3)) & (keys("heldout", 0) | keys("heldout", 5))


def test_n_and_interleaved_types():
    tasks = load_suite("qa", "train", n=10)
    assert len(tasks) == 10
    assert [t.type for t in tasks[:4]] == list(QA_TYPES)
    assert task_types(tasks) == list(QA_TYPES)
    assert [t.type for t in load_suite("household", "heldout", n=6)] == list(HOUSEHOLD_TYPES)
    assert [t.type for t in load_suite("webwalk", "train", n=3)] == list(LEVELS)
    assert len(load_suite("qa")) == 50 * len(QA_TYPES)
    assert load_suite("qa", n=0) == []


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="unknown suite 'nope'"):
        load_suite("nope")
    with pytest.raises(ValueError, match="unknown split 'test'"):
        load_suite("qa", "test")
    with pytest.raises(ValueError, match="qa/arithmetic: asked for 100 train tasks, the split holds only"):
        load_suite("qa", "train", n=400)
    with pytest.raises(ValueError, match="n must be >= 0"):
        load_suite("qa", n=-1)


# --------------------------------------------------------------------------- qa

def test_qa_tasks_score_their_own_answer():
    tasks = load_suite("qa", "heldout", n=40)
    for task in tasks:
        assert not task.multi_turn and task.verifier == "final"
        assert task.answer.isdigit()
        assert task.score(f"The answer is {task.answer}.") == 1.0
        assert task.score(f"The answer is {int(task.answer) + 1}.") == 0.0
    by_type = {t.type: t for t in tasks}
    assert "How many" in by_type["counting"].question
    with pytest.raises(ValueError, match="single-turn"):
        make_env(tasks[0])


@pytest.mark.parametrize("split, n", [("train", 200), ("heldout", 4 * 400)])
def test_qa_generated_answers_are_right(split, n):
    for task in load_suite("qa", split, n=n):   # (held-out: its extension too)
        q = task.question
        if task.type == "arithmetic":
            a, op, b = _arithmetic_key(q)
            assert int(task.answer) == (a + b if op == "+" else a - b)
        elif task.type == "counting":
            items = q.split(":")[1].split(".")[0].split(", ")
            word = re.search(r"How many (\w+)", q).group(1)
            singular = {"peaches": "peach"}.get(word, word[:-1] if word.endswith("s") else word)
            assert int(task.answer) == sum(item.strip() == singular for item in items)
        elif task.type == "conversion":
            value = int(re.search(r"\d+", q).group())
            factor = next(f for big, one, small, f in _CONVERSIONS
                          if small in q and (f" {big}" in q or f" {one}" in q))
            assert int(task.answer) == value * factor
        elif task.type == "lookup":
            name = re.search(r"does (\w+) have", q).group(1)
            assert re.search(rf"{name} has {task.answer} ", q)


def test_qa_heldout_extension_holds_more_and_changes_no_draw_that_fit():
    """Past the split's own 81 arithmetic / 125 conversion problems, held-out draws go on with
    problems outside the train / held-out space: a smaller draw is the larger one's front, no
    training task is among them, and the end of the extension is still refused."""
    small, large = load_suite("qa", "heldout", n=4 * 80), load_suite("qa", "heldout", n=4 * 400)
    for task_type in ("arithmetic", "conversion", "counting", "lookup"):
        front = [t for t in large if t.type == task_type][:80]
        assert front == [t for t in small if t.type == task_type], task_type
    def problem(task):   # what a task asks, whatever its wording
        if task.type == "arithmetic":
            return _arithmetic_key(task.question)
        value = int(re.search(r"\d+", task.question).group())
        return value, next((big, small) for big, one, small, _ in _CONVERSIONS if small in
                           task.question and (f" {big}" in task.question or f" {one}" in
                                              task.question))

    train = {problem(t) for t in generate_qa("train", n=74, types=("arithmetic",))}
    train |= {problem(t) for t in generate_qa("train", n=100, types=("conversion",))}
    heldout = [problem(t) for t in large if t.type in ("arithmetic", "conversion")]
    assert len(set(heldout)) == len(heldout) == 2 * 400 and not train & set(heldout)
    operands = [_arithmetic_key(t.question) for t in large if t.type == "arithmetic"]
    assert max(max(a, b) for a, _, b in operands) == 19
    with pytest.raises(ValueError, match="qa/arithmetic: asked for 537 heldout tasks, the split "
                                         "holds only 536"):
        generate_qa("heldout", n=537, types=("arithmetic",))


# --------------------------------------------------------------------------- JSONL

def _write_jsonl(path, rows):
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def test_jsonl_gaia_and_plain_formats(tmp_path):
    path = _write_jsonl(tmp_path / "tasks.jsonl", [
        {"task_id": "g1", "Question": "Capital of France?", "Final answer": "Paris", "Level": 1},
        "",
        {"question": "2+2?", "answer": 4, "type": "math", "id": "p1", "split": "heldout"},
        {"question": "Colour of the sky?", "answer": "blue", "verifier": "exact", "choices": ["blue", "red"]},
    ])
    tasks = load_suite("qa", split="all", path=path)
    assert [t.id for t in tasks] == ["g1", "p1", tasks[2].id]
    gaia, plain, exact = tasks
    assert (gaia.type, gaia.verifier, gaia.answer) == ("level1", "gaia", "Paris")
    assert gaia.score("paris") == 1.0 and gaia.score("Lyon") == 0.0
    assert (plain.type, plain.answer, plain.metadata["split"], plain.metadata["line"]) == ("math", "4", "heldout", 3)
    assert exact.type == "qa" and exact.env_spec["choices"] == ["blue", "red"]
    assert exact.score("The blue") == 1.0
    assert [t.id for t in load_suite(str(path), split="heldout")].count("p1") == 1
    train, heldout = load_suite(str(path), "train"), load_suite(str(path), "heldout")
    assert sorted(_ids(train) + _ids(heldout)) == sorted(_ids(tasks))
    assert load_suite(str(path), "all", n=1) == tasks[:1]


@pytest.mark.parametrize("bad_line, message", [
    ("{not json", r"tasks.jsonl:2: not valid JSON"),
    ("[1, 2]", r"tasks.jsonl:2: expected a JSON object, got list"),
    ('{"question": "q"}', r"tasks.jsonl:2: missing field 'answer'"),
    ('{"question": "", "answer": "a"}', r"tasks.jsonl:2: field 'question' is empty"),
    ('{"question": "q", "answer": ["a"]}', r"tasks.jsonl:2: field 'answer' must be a string, got list"),
    ('{"Question": "q", "Level": 1}', r"tasks.jsonl:2: missing field 'Final answer'"),
    ('{"prompt": "q"}', r"tasks.jsonl:2: a task needs 'question' and 'answer'"),
    ('{"question": "q", "answer": "a", "verifier": "magic"}', r"tasks.jsonl:2: unknown verifier 'magic'"),
    ('{"question": "q", "answer": "a", "split": "dev"}', r"tasks.jsonl:2: field 'split' must be"),
    ('{"question": "q", "answer": "a", "id": "x"}', r"tasks.jsonl:2: duplicate task id 'x'"),
])
def test_jsonl_malformed_lines_name_file_and_line(tmp_path, bad_line, message):
    path = _write_jsonl(tmp_path / "tasks.jsonl", [{"question": "ok?", "answer": "yes", "id": "x"}, bad_line])
    with pytest.raises(ValueError, match=message):
        load_suite("qa", "all", path=path)


def test_jsonl_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="task file not found"):
        load_suite(str(tmp_path / "none.jsonl"))


def test_jsonl_with_a_byte_order_mark_loads_every_task(tmp_path):
    rows = [{"question": "2+2?", "answer": "4", "id": "a"}, {"question": "3+3?", "answer": "6", "id": "b"}]
    plain = _write_jsonl(tmp_path / "plain.jsonl", rows)
    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes().replace(b"\n", b"\r\n"))  # as Windows editors save
    assert [(t.id, t.question, t.answer) for t in load_suite("qa", "all", path=bom)] == \
           [(t.id, t.question, t.answer) for t in load_suite("qa", "all", path=plain)]


def test_jsonl_invalid_utf8_names_file_and_line(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_bytes(b'{"question": "ok?", "answer": "yes"}\n{"question": "caf\xe9?", "answer": "x"}\n')
    with pytest.raises(ValueError, match=r"tasks.jsonl:2: not UTF-8"):
        load_suite("qa", "all", path=path)


@pytest.mark.parametrize("text", ["", "\n\n  \n", "\ufeff\n"])
def test_an_empty_task_file_is_an_error(tmp_path, text):
    path = tmp_path / "tasks.jsonl"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=f"{path}: no tasks"):
        load_suite(str(path))


@pytest.mark.parametrize("row, shown", [
    ({"question": "q", "answer": "a", "type": "../../etc"}, "'../../etc'"),
    ({"question": "q", "answer": "a", "type": "two words"}, "'two words'"),
    ({"question": "q", "answer": "a", "type": ".hidden"}, "'.hidden'"),
    ({"question": "q", "answer": "a", "type": "x" * 65}, "'xxx"),
    ({"Question": "q", "Final answer": "a", "Level": "1/2"}, "'level1/2'"),
])
def test_a_task_type_that_is_no_safe_folder_name_is_refused_at_load(tmp_path, row, shown):
    """Task types name the folders of task-specific skills: a bad one is refused before any model call."""
    path = _write_jsonl(tmp_path / "tasks.jsonl", [{"question": "ok?", "answer": "yes"}, row])
    with pytest.raises(ValueError, match=rf"tasks.jsonl:2: task type {re.escape(shown)}"):
        load_suite("qa", "all", path=path)


def test_the_task_type_rule_is_the_skill_folder_rule():
    """tasks/ keeps its own copy of skills.validate_task_type (each can be copied alone): they agree."""
    candidates = ["qa", "level1", "Math_Algebra", "a.b-c", "x" * 64, "x" * 65, "", ".x", "-x", "_x", "a..b",
                  "a/b", "a\\b", "a b", "é", "a\n", "..", "1", "level1/2", None, 3]
    for candidate in candidates:
        try:
            validate_task_type(candidate)
            skills_ok = True
        except SkillFormatError:
            skills_ok = False
        try:
            check_task_type(candidate, "here")
            tasks_ok = True
        except ValueError:
            tasks_ok = False
        assert tasks_ok == skills_ok, candidate


# --------------------------------------------------------------------------- environments

def _run(task, actions):
    env = make_env(task)
    observation = env.reset()
    done = success = False
    for action in actions:
        assert not done, f"{task.id}: episode ended before {action!r}"
        observation, done, success = env.step(action)
        assert observation != NOTHING_HAPPENS, f"{task.id}: oracle action {action!r} did nothing"
    return env, done, success


@pytest.mark.parametrize("suite", ["household", "webwalk"])
@pytest.mark.parametrize("split", ["train", "heldout"])
def test_oracle_solves_every_generated_task(suite, split):
    tasks = load_suite(suite, split)
    assert {t.type for t in tasks} == set(HOUSEHOLD_TYPES if suite == "household" else LEVELS)
    for task in tasks:
        assert task.multi_turn and task.max_steps >= 1
        plan = oracle_actions(task)
        assert len(plan) <= task.max_steps
        env, done, success = _run(task, plan)
        assert done and success, f"{task.id} not solved by {plan}"
        assert env.nothing_happens == 0 and env.steps == len(plan)


def _household(task_type="pick_heat_then_place", split="train"):
    return next(t for t in load_suite("household", split) if t.type == task_type)


def test_household_invalid_actions_say_nothing_happens_and_are_counted():
    task = _household()
    env = make_env(task)
    first = env.reset()
    assert "Your task is to: heat some" in first and task.question in first
    closed = next(r for r, s in env.receptacles.items() if s["openable"])
    open_air = next(r for r, s in env.receptacles.items() if not s["openable"])
    some_object = next(iter(env.objects))
    invalid = ["fly to the moon", "", f"open {closed}",  # not there yet
               f"take {some_object} from {open_air}", f"put {some_object} on {open_air}",
               "go to nowhere 9", f"heat {some_object} with microwave 1", "use desklamp 1",
               f"examine {some_object}"]
    for k, action in enumerate(invalid, start=1):
        observation, done, success = env.step(action)
        assert observation == NOTHING_HAPPENS, action
        assert env.nothing_happens == k and not success
    env.step(f"go to {open_air}")
    assert env.step(f"go to {open_air}")[0] == NOTHING_HAPPENS       # already there
    assert env.step(f"open {open_air}")[0] == NOTHING_HAPPENS        # cannot be opened
    counted = env.nothing_happens
    for info in ("look", "inventory", f"examine {open_air}"):
        assert env.step(info)[0] != NOTHING_HAPPENS                   # reports are valid actions
    assert env.nothing_happens == counted


def test_household_mechanics():
    task = _household("pick_cool_then_place")
    env = make_env(task)
    env.reset()
    fridge = next(r for r, s in env.receptacles.items() if s["type"] == "fridge")
    assert env.step(f"go to {fridge}")[0] == f"You arrive at {fridge}. The {fridge} is closed."
    assert env.step(f"open {fridge}")[0].startswith(f"You open the {fridge}. The {fridge} is open. In it, you see")
    assert env.step(f"open {fridge}")[0] == NOTHING_HAPPENS
    assert env.step(f"close {fridge}")[0] == f"You close the {fridge}."
    assert env.step("inventory")[0] == "You are not carrying anything."
    # hands full: a second take does nothing
    plan = oracle_actions(task)
    env.reset()
    take = next(i for i, a in enumerate(plan) if a.startswith("take "))
    for action in plan[:take + 1]:
        env.step(action)
    assert env.step(f"examine {env.holding}")[0] == f"There's nothing special about {env.holding}."
    article = "an" if env.holding[0] in "aeiou" else "a"
    assert env.step("inventory")[0] == f"You are carrying: {article} {env.holding}."
    others = [f"take {o} from {env.location}" for o in env._contents(env.location)]
    for action in others:
        assert env.step(action)[0] == NOTHING_HAPPENS


def test_household_admissible_actions_all_do_something():
    for task in load_suite("household", "train", n=12):
        env = make_env(task)
        env.reset()
        for action in oracle_actions(task)[:-1]:
            for candidate in env.admissible_actions():
                probe = copy.deepcopy(env)
                probe.max_steps = 10 ** 6
                assert probe.step(candidate)[0] != NOTHING_HAPPENS, (task.id, candidate)
            assert action in env.admissible_actions()
            env.step(action)


def test_step_budget_and_end_of_episode():
    task = _household()
    env = make_env(task)
    env.reset()
    for k in range(task.max_steps):
        observation, done, success = env.step("look")
        assert done is (k == task.max_steps - 1) and not success
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("look")
    env.reset()
    assert env.steps == 0 and env.nothing_happens == 0 and not env.done
    with pytest.raises(ValueError, match="multi-turn"):
        task.score("anything")


def test_action_normalisation():
    task = _household("pick_and_place")
    plan = oracle_actions(task)
    env = make_env(task)
    env.reset()
    for action in plan:
        observation, done, success = env.step(f"  `{action.upper()}.`  ")
        assert observation != NOTHING_HAPPENS
    assert success


def test_webwalk_navigation_and_answers():
    task = next(t for t in load_suite("webwalk", "train") if t.type == "hard" and t.metadata["sources"] == 2)
    env = make_env(task)
    first = env.reset()
    assert first.startswith(f"Question: {task.question}") and "Page: " in first and "Links: [About]" in first
    assert env.step("back")[0] == NOTHING_HAPPENS                    # nothing to go back to
    assert env.step("click Nowhere")[0] == NOTHING_HAPPENS
    assert env.step("answer")[0] == NOTHING_HAPPENS                  # an empty answer
    assert env.nothing_happens == 3
    assert env.step("click [Departments]")[0].startswith("Page: Departments")
    assert env.step("back")[0].startswith("Page: ")
    assert env.admissible_actions()[:3] == ["click About", "click News", "click Departments"]
    observation, done, success = env.step(f"answer The {task.answer}.")  # SQuAD normalisation
    assert done and success and observation.startswith("You answered")
    env.reset()
    assert env.step("answer something else")[1:] == (True, False)
    with pytest.raises(RuntimeError):
        env.step("back")


def test_tasks_round_trip_as_dicts():
    for suite in ("qa", "household", "webwalk", "webshop", "searchqa"):
        task = load_suite(suite, n=1)[0]
        again = Task.from_dict(json.loads(json.dumps(task.to_dict())))
        assert again == task


def test_household_types_are_read_by_alfworld_s_and_masa_s_names():
    """The suite's six types keep their names; ALFWorld's names and MASA's library keys are read as them."""
    from minskill.tasks import skill_key_type
    from minskill.tasks.household import TYPE_NAMES
    assert set(TYPE_NAMES) == set(HOUSEHOLD_TYPES)
    alfworld = ["pick_and_place_simple", "look_at_obj_in_light", "pick_clean_then_place_in_recep",
                "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep", "pick_two_obj_and_place"]
    assert sorted(skill_key_type(name, HOUSEHOLD_TYPES) for name in alfworld) == sorted(HOUSEHOLD_TYPES)
    masa = {"pick_and_place": "pick_and_place", "pick_two_obj_and_place": "pick_two_obj", "clean":
            "pick_clean_then_place", "heat": "pick_heat_then_place", "cool": "pick_cool_then_place",
            "examine": "look_at_obj_in_light", "look_at_obj_in_light": "look_at_obj_in_light"}
    assert {key: skill_key_type(key, HOUSEHOLD_TYPES) for key in masa} == masa
    assert skill_key_type("clean", ["arithmetic"]) is None and skill_key_type("slice", HOUSEHOLD_TYPES) is None
    assert skill_key_type("clean", ["clean"]) == "clean"   # a suite's own type is itself
