"""One vocabulary and one source of defaults (minskill/cli.py): the same knob has the same flag in every script,
and each script's defaults are its config dataclass's."""
import dataclasses

import pytest

import evolve_masa
import rewrite
import train_grpo
from minskill import rollout
from minskill.cli import client_args
from minskill.measure import transfer
from minskill.masa.run_config import MasaRunConfig

TASK_MODEL = ["--task-url", "--task-model", "--task-api-key", "--task-quantize", "--task-concurrency",
              "--task-max-tokens", "--task-extra-body"]
TEACHER = ["--teacher-url", "--teacher-model", "--teacher-api-key", "--teacher-retries", "--teacher-extra-body"]
APPLY = ["apply", "--rewriter", "r", "--model-card", "c", "--skills", "s", "--task", "t", "--out", "o"]


def flags(parser) -> set[str]:
    return {s for action in parser._actions for s in action.option_strings}


def subparser(name: str):
    commands = next(a for a in rewrite.build_parser()._actions if a.dest == "command")
    return commands.choices[name]


def test_the_frozen_model_and_the_teacher_have_one_name_in_every_script():
    args = train_grpo.parse_args([])   # train_grpo.py builds its parser inside parse_args: its dest names
    assert all(hasattr(args, f[2:].replace("-", "_")) for f in TASK_MODEL + ["--micro-batch", "--grad-checkpointing"])
    for name, parser in {"evolve_masa.py": evolve_masa.build_parser(), "rewrite.py apply": subparser("apply")}.items():
        assert set(TASK_MODEL) <= flags(parser), name
        assert set(TEACHER) <= flags(parser), name
    for old in ("--target-url", "--target-model", "--target-api-key", "--quantize", "--concurrency", "--max-tokens"):
        assert old not in flags(evolve_masa.build_parser())
    assert {"--api-key", "--teacher-attempts"}.isdisjoint(flags(subparser("apply")))
    assert {"--micro-batch", "--grad-checkpointing"} <= flags(subparser("train"))
    assert {"--micro-batch-size", "--gradient-checkpointing"}.isdisjoint(flags(subparser("train")))


def test_the_rollout_and_transfer_commands_use_the_same_task_model_flags():
    rollout_flags, transfer_flags = flags(rollout._parser()), flags(transfer.build_parser())
    # transfer's targets are --targets LABEL=SPEC (a URL, or a model spec with its :int8 suffix)
    assert set(TASK_MODEL) - {"--task-url", "--task-model", "--task-quantize"} <= transfer_flags
    assert set(TASK_MODEL) <= rollout_flags
    for old in ("--api-key", "--quantize", "--concurrency", "--max-tokens"):
        assert old not in rollout_flags and old not in transfer_flags


def test_defaults_come_from_the_config_dataclasses():
    args, config = train_grpo.parse_args([]), train_grpo.TrainConfig()
    resolved = {"task_concurrency": config.candidates * config.tasks_per_instance * config.instances_per_step}
    assert {f.name: getattr(args, f.name) for f in dataclasses.fields(config)} == {**dataclasses.asdict(config),
                                                                                   **resolved}
    args, config = evolve_masa.build_parser().parse_args([]), MasaRunConfig()
    shared = [f.name for f in dataclasses.fields(config) if hasattr(args, f.name)]
    assert {"lam_nh", "iterations", "tree_iterations", "episodes", "n_train", "task_concurrency"} <= set(shared)
    filled_later = {k for k in shared if getattr(args, k) is None}   # None: set_up fills them from the config
    assert filled_later == {"teacher_retries", "teacher_max_tokens"}
    assert {k: getattr(args, k) for k in shared if k not in filled_later} == \
        {k: getattr(config, k) for k in shared if k not in filled_later}
    assert args.task_max_tokens == config.target_max_tokens


def test_compare_scores_the_reward_the_search_optimises():
    """rewrite.py apply --compare's R = SR − λ·NHR used λ = 0 while evolve_masa.py's search used 0.1."""
    compare = rewrite.build_parser().parse_args(APPLY)
    assert compare.lam_nh == evolve_masa.build_parser().parse_args([]).lam_nh == MasaRunConfig().lam_nh


def test_apply_defaults_come_from_apply_config():
    args, config = rewrite.build_parser().parse_args(APPLY), rewrite.ApplyConfig()
    assert {f.name: getattr(args, f.name) for f in dataclasses.fields(config)} == dataclasses.asdict(config)


def test_extra_request_fields_are_a_json_object_named_by_their_flag(capsys):
    off = '{"chat_template_kwargs": {"enable_thinking": false}}'
    args = train_grpo.parse_args(["--task-extra-body", off])
    assert {k: client_args(args, "task")[k] for k in ("url", "model", "api_key", "extra_body")} == {
        "url": None, "model": None, "api_key": None, "extra_body": {"chat_template_kwargs": {"enable_thinking": False}}}
    args = subparser("apply").parse_args([*APPLY[1:], "--teacher-extra-body", off, "--teacher-url", "http://t/v1"])
    assert client_args(args, "teacher")["extra_body"] == {"chat_template_kwargs": {"enable_thinking": False}}
    for value, problem in (("{nope", "--teacher-extra-body is not JSON"), ("[1]", "must be a JSON object"),
                           ('{"n": 4}', "may not set n")):
        with pytest.raises(SystemExit):
            evolve_masa.build_parser().parse_args(["--teacher-extra-body", value])
        assert problem in capsys.readouterr().err
    # the transfer matrix: one flag for every target, LABEL= for one
    targets = transfer.load_targets(transfer.build_parser().parse_args(
        ["--targets", "a=smollm2-135m", "b=http://h:1/v1", "--task-extra-body", '{"x": 1}', 'b={"y": 2}']))
    assert [t.extra_body for t in targets] == [{"x": 1}, {"x": 1, "y": 2}]
    with pytest.raises(transfer.TransferError, match="LABEL one of a"):
        transfer.load_targets(transfer.build_parser().parse_args(
            ["--targets", "a=smollm2-135m", "--task-extra-body", 'c={"y": 2}']))


@pytest.mark.parametrize("parse", [train_grpo.parse_args, evolve_masa.build_parser().parse_args,
                                   lambda argv: rollout._parser().parse_args(["--suite", "qa", *argv])])
def test_the_embedded_servers_prefix_cache_is_one_flag_away(parse, capsys):
    """--task-prefix-cache-mb reaches embedded_client (its prefix_cache_mb, default 256 MB as
    before); 0 means none; a negative or non-number is refused naming the flag."""
    assert client_args(parse([]), "task")["prefix_cache_mb"] == 256
    assert client_args(parse(["--task-prefix-cache-mb", "3000"]), "task")["prefix_cache_mb"] == 3000
    assert client_args(parse(["--task-prefix-cache-mb", "0"]), "task")["prefix_cache_mb"] == 0
    assert client_args(parse([]), "teacher")["prefix_cache_mb"] == 256
    for bad in ("-1", "nan", "lots"):
        with pytest.raises(SystemExit):
            parse(["--task-prefix-cache-mb", bad])
        assert "--task-prefix-cache-mb must be a number of MB >= 0" in capsys.readouterr().err
