"""The alfworld suite: ALFWorld's own engine, games generated offline from the wheel's layouts,
ALFWorld's official game folders, and MASA's library keys. The engine tests skip without the extra
(pip install alfworld==0.4.2 'textworld[pddl]'); the rest run everywhere."""
import json
import os
import shutil
import sys

import pytest

from minskill.tasks import load_suite, make_env, oracle_actions, skill_key_type, suite_types
from minskill.tasks.alfworld import (DATA_ENV, INSTALL_COMMAND, MAX_STEPS, TASK_TYPES,
                                     generate_alfworld)
from minskill.tasks.alfworld_games import EngineMissing, GameError

MASA_KEYS = {"pick_and_place": "pick_and_place_simple", "look_at_obj": "look_at_obj_in_light",
             "pick_clean_then_place": "pick_clean_then_place_in_recep",
             "pick_heat_then_place": "pick_heat_then_place_in_recep",
             "pick_cool_then_place": "pick_cool_then_place_in_recep",
             "pick_two_obj": "pick_two_obj_and_place"}


def test_masa_library_keys_reach_the_six_alfworld_types():
    types = suite_types("alfworld")
    assert types == list(TASK_TYPES)
    assert {key: skill_key_type(key, types) for key in MASA_KEYS} == MASA_KEYS
    household = suite_types("household")   # and household's own keys still reach household's types
    assert skill_key_type("look_at_obj", household) == "look_at_obj_in_light"
    assert skill_key_type("pick_and_place_simple", household) == "pick_and_place"


def test_a_missing_engine_is_an_error_naming_the_pip_line(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "textworld", None)   # `import textworld` now fails
    monkeypatch.delenv(DATA_ENV, raising=False)
    with pytest.raises(EngineMissing) as caught:
        load_suite("alfworld", split="heldout", n=1)
    assert INSTALL_COMMAND in str(caught.value) and isinstance(caught.value, ValueError)


# ------------------------------------------------------------------------------------ on the engine

@pytest.fixture(scope="module")
def engine():
    for module in ("textworld", "alfworld", "fast_downward"):
        pytest.importorskip(module)


@pytest.fixture(scope="module")
def cache(engine, tmp_path_factory):
    return tmp_path_factory.mktemp("alfworld-cache")


@pytest.fixture(scope="module")
def heldout(cache):
    """One generated held-out game of each type."""
    return generate_alfworld("heldout", seed=0, n=len(TASK_TYPES), cache_dir=cache)


def test_the_oracle_wins_a_generated_game_of_each_type(heldout):
    assert [t.type for t in heldout] == list(TASK_TYPES)
    for task in heldout:
        env = make_env(task)
        first = env.reset()
        assert first.startswith("You are in the middle of a room.") and task.question in first
        plan = oracle_actions(task)
        for action in plan:
            assert action in env.admissible_actions()
            observation, done, success = env.step(action)
        assert ((done, success, env.steps, env.nothing_happens)
                == (True, True, len(plan), 0)), task.id
        assert task.max_steps == MAX_STEPS and task.env_spec["kind"] == "alfworld"


def test_generation_is_seeded_cached_and_split_by_floor_plan(heldout, cache):
    from minskill.tasks.alfworld_games import make_games
    from minskill.tasks.base import split_of
    heard = []
    again = make_games("heldout", 0, {t: 1 for t in TASK_TYPES}, cache, progress=heard.append)
    assert heard == []   # all cached: nothing made again
    assert ([str(again[t][0] / "game.tw-pddl") for t in TASK_TYPES]
            == [t.env_spec["game"] for t in heldout])
    plans = [json.loads((again[t][0] / "traj_data.json").read_text())["scene"]["floor_plan"]
             for t in TASK_TYPES]
    assert all(split_of(f"alfworld|{p}") == "heldout" for p in plans)
    train = make_games("train", 0, {"pick_and_place_simple": 1}, cache, progress=heard.append)
    plan = json.loads((train["pick_and_place_simple"][0] / "traj_data.json").read_text()
                      )["scene"]["floor_plan"]
    assert split_of(f"alfworld|{plan}") == "train" and plan not in plans and heard


def test_an_unsolvable_game_is_dropped_counted_and_kept_marked(engine, tmp_path, monkeypatch):
    from minskill.tasks import alfworld_games
    real, calls = alfworld_games.solve, []

    def first_fails(game, problem=None):
        calls.append(1)
        return None if len(calls) == 1 else real(game, problem)

    monkeypatch.setattr(alfworld_games, "solve", first_fails)
    heard = []
    games = alfworld_games.make_games("heldout", 0, {"pick_and_place_simple": 1}, tmp_path,
                                      heard.append)
    assert len(calls) == 2 and "1 unsolvable" in heard[-1]
    marked = [json.loads(f.read_text())["solvable"] for f in tmp_path.rglob("game.tw-pddl")]
    assert sorted(marked) == [False, True]
    game_file = games["pick_and_place_simple"][0] / "game.tw-pddl"
    assert json.loads(game_file.read_text())["solvable"] is True


def test_nothing_happens_is_counted_and_the_step_limit_ends_a_game(heldout):
    task = heldout[0]
    env = make_env(type(task)(**{**task.to_dict(), "max_steps": 2}))
    env.reset()
    assert env.step("jump over the fridge") == ("Nothing happens.", False, False)
    observation, done, success = env.step("look")
    assert (done, success, env.nothing_happens, env.steps) == (True, False, 1, 2)


def test_the_engine_leaves_sys_argv_alone(heldout, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["rollout", "--suite", "alfworld"])
    make_env(heldout[1]).reset()   # (its PDDL translator sets sys.argv for its own parser)
    assert sys.argv == ["rollout", "--suite", "alfworld"]


def fake_download(root, heldout):
    """A folder laid out as alfworld-download's: json_2.1.1/<split>/<task>/<trial>/, with games to
    skip."""
    for split, games in (("train", heldout[:2]), ("valid_seen", heldout[2:3]),
                         ("valid_unseen", heldout[3:])):
        for k, task in enumerate(games):
            src = __import__("pathlib").Path(task.env_spec["game"]).parent
            shutil.copytree(src, root / "json_2.1.1" / split / src.parent.name / f"trial_T{k}")
    unseen = root / "json_2.1.1" / "valid_unseen"
    trial = next(unseen.glob("*/trial_*"))
    # skipped
    shutil.copytree(trial, unseen / "pick_and_place_with_movable_recep-x-movable" / "trial_T9")
    unsolved = unseen / "unsolved-1" / "trial_T9"
    shutil.copytree(trial, unsolved)
    game = json.loads((unsolved / "game.tw-pddl").read_text())
    (unsolved / "game.tw-pddl").write_text(json.dumps({**game, "solvable": False}))
    return root


def test_alfworld_data_loads_alfworlds_own_splits(heldout, tmp_path, monkeypatch):
    root = fake_download(tmp_path / "alfworld", heldout)
    from minskill.rollout import _parser
    monkeypatch.setenv(DATA_ENV, "")   # (restored after the test: the flag sets it)
    args = _parser().parse_args(["--suite", "alfworld", "--alfworld-data", str(root)])
    assert args.alfworld_data == str(root)
    unseen = load_suite("alfworld", split="heldout")
    # valid_unseen: its 3 solvable games
    assert [t.type for t in unseen] == [t.type for t in heldout[3:]]
    assert all(t.metadata["path"].startswith("valid_unseen/") for t in unseen)
    assert [t.type for t in load_suite("alfworld", split="valid_seen")] == [heldout[2].type]
    assert len(load_suite("alfworld", split="train")) == 2
    assert len(load_suite("alfworld", split="all")) == 5
    assert len(load_suite("alfworld", split="heldout", n=1)) == 1
    task = unseen[-1]
    env = make_env(task)
    env.reset()
    for action in oracle_actions(task):
        env.step(action)
    assert env.success
    with pytest.raises(FileNotFoundError, match="valid_unseen"):
        generate_alfworld("heldout", data=tmp_path / "nowhere")


def test_a_game_file_that_does_not_parse_is_an_error_naming_it(heldout, tmp_path):
    root = fake_download(tmp_path / "alfworld", heldout)
    broken = next((root / "json_2.1.1" / "train").rglob("game.tw-pddl"))
    broken.write_text("{not json")
    with pytest.raises(GameError, match=str(broken)):
        generate_alfworld("train", data=root)


@pytest.mark.parametrize("script", ["evolve_masa", "rewrite", "train_grpo"])
def test_every_script_with_a_task_model_takes_alfworld_data(script, tmp_path, monkeypatch):
    """--alfworld-data is parsed by each script that runs tasks (cli.add_task_model_args), and set
    for the processes it starts (the environment variable tasks.alfworld reads)."""
    import importlib
    monkeypatch.delenv(DATA_ENV, raising=False)
    module = importlib.import_module(script)
    parse = module.parse_args if script == "train_grpo" else module.build_parser().parse_args
    argv = ["--alfworld-data", str(tmp_path)]
    if script == "rewrite":   # (its apply command's required flags)
        argv = ["apply", *argv, "--rewriter", "r", "--model-card", "c", "--skills", "base",
                "--task", "qa", "--out", str(tmp_path / "out")]
    parse(argv)
    assert os.environ[DATA_ENV] == str(tmp_path.resolve())
