"""One vocabulary and one source of defaults (minskill/cli.py): the same knob has the same flag in every script,
and each script's defaults are its config dataclass's."""
import dataclasses

import evolve_masa
import rewrite
import train_grpo
from minskill import rollout
from minskill.masa import transfer
from minskill.masa.run_config import MasaRunConfig

TASK_MODEL = ["--task-url", "--task-model", "--task-api-key", "--task-quantize", "--task-concurrency",
              "--task-max-tokens"]
TEACHER = ["--teacher-url", "--teacher-model", "--teacher-api-key", "--teacher-retries"]
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
    assert {f.name: getattr(args, f.name) for f in dataclasses.fields(config)} == dataclasses.asdict(config)
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
