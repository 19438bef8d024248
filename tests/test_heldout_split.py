"""The held-out split of train_grpo.py --eval and of the training probe (skill_r1_eval.heldout_split): exactly
the instances asked for or a clear refusal saying how many fit, never a silent shrink; the probe never
shares a task with --eval's instances (checked by task id), within one command and against the probe of a
trained editor that --eval evaluates."""

import pytest
import torch


import train_grpo
from minskill.runs import TRAINER_STATE
from minskill.skill_r1 import evaluate as skill_r1_eval
from minskill.skill_r1.evaluate import HeldoutSplitError, check_probes_of, heldout_split
from minskill.skill_r1.loop import load_split


def flags(*argv):
    """train_grpo.py's flags without --eval or --probe-every, so parse_args itself checks no split."""
    return train_grpo.parse_args(list(argv))


def task_ids(instances, tests=()):
    return {t.id for x in instances for t in x.tasks} | {t.id for ts in tests for t in ts}


def test_household_with_five_eval_tasks_is_exact_or_refused():
    """household holds about 10 held-out tasks per type: 6 instances of 4 + 5 tasks fit, not the default 12
    (before: 6 silently, and the probe shared 12 tasks with them)."""
    with pytest.raises(HeldoutSplitError, match=r"room for 6 instance\(s\) of --tasks-per-instance 4 \+ "
                                                r"--eval-tasks 5 tasks, not --eval-instances 12: ask for at most 6"):
        heldout_split(flags("--suite", "household", "--eval-tasks", "5"))
    evo, test, probe = heldout_split(flags("--suite", "household", "--eval-tasks", "5", "--eval-instances", "6"))
    assert len(evo) == 6 and [len(x.tasks) for x in evo] == [4] * 6 and [len(ts) for ts in test] == [5] * 6
    assert probe == [] and len(task_ids(evo, test)) == 6 * 9
    with pytest.raises(HeldoutSplitError, match="room for 0 of the training probe's --probe-instances 4"):
        heldout_split(flags("--suite", "household", "--eval-tasks", "5", "--eval-instances", "6"), probe=True)
    evo, test, probe = heldout_split(flags("--suite", "household", "--eval-tasks", "5", "--eval-instances", "4"),
                                     probe=True)
    assert len(evo) == 4 and len(probe) == 4 and not task_ids(evo, test) & task_ids(probe)


def test_qa_with_200_tasks_and_8_instances_keeps_the_probe_apart_or_refuses():
    """--n-tasks 200 (50 per type): --eval's 8 instances of 24 take 48 of each type's 50, so the probe's 4
    instances of 4 cannot stay clear of them (before: they shared 8 tasks)."""
    evo, test, _ = heldout_split(flags("--n-tasks", "200", "--eval-instances", "8"))
    assert len(evo) == 8 and all(len(ts) == 20 for ts in test)
    with pytest.raises(HeldoutSplitError) as refused:
        heldout_split(flags("--n-tasks", "200", "--eval-instances", "8"), probe=True)
    assert "--probe-instances 4" in str(refused.value) and "--eval-instances 8" in str(refused.value)
    assert "4 beside 7 --eval instance(s)" in str(refused.value) and "raise --n-tasks" in str(refused.value)
    evo, test, probe = heldout_split(flags("--n-tasks", "200", "--eval-instances", "7"), probe=True)
    assert len(evo) == 7 and len(probe) == 4 and not task_ids(evo, test) & task_ids(probe)


@pytest.mark.parametrize("argv, fit, tasks", [(["--eval-instances", "24", "--eval-tasks", "100"], 16, 100),
                                              (["--eval-instances", "40", "--eval-tasks", "60"], 24, 60)])
def test_more_instances_than_the_split_holds_is_refused_not_shrunk(argv, fit, tasks):
    """qa draws at most 440 held-out tasks per type (conversion: the split's 125 and the extension's 315):
    16 instances of 4 + 100 fit (not 24), 24 of 4 + 60 (not 40); before, --eval evaluated fewer without a
    word. Asking for what fits gives exactly that (and the probe beside it), and train_grpo.py refuses the
    rest as a usage error."""
    with pytest.raises(HeldoutSplitError, match=rf"room for {fit} instance\(s\) .* ask for at most {fit}"):
        heldout_split(flags(*argv))
    evo, test, probe = heldout_split(flags(*argv, "--eval-instances", str(fit)), probe=True)
    assert len(evo) == fit and [len(ts) for ts in test] == [tasks] * fit and len(probe) == 4
    assert not task_ids(evo, test) & task_ids(probe)
    with pytest.raises(SystemExit) as usage:
        train_grpo.parse_args(["--eval", *argv])
    assert usage.value.code == 2


def test_shared_scoring_fits_24_qa_instances_each_type_scored_on_one_set():
    """qa holds 440 held-out conversion problems: 72 instances of 8 + 20 tasks of their own do not fit (the
    refusal names --eval-scoring shared); shared, each instance evolves on 8 tasks of its own and the instances
    of a type are scored on the same 20, never one of any instance's evolve tasks nor the probe's."""
    argv = ["--tasks-per-instance", "8", "--eval-instances", "24", "--probe-instances", "4"]
    with pytest.raises(HeldoutSplitError, match=r"room for 60 instance.*--eval-scoring shared"):
        heldout_split(flags(*argv, "--eval-instances", "72"), probe=True)
    evo, test, probe = heldout_split(flags(*argv, "--eval-scoring", "shared"), probe=True)
    assert len(evo) == 24 and all(len(x.tasks) == 8 for x in evo) and len(probe) == 4
    scoring_sets = {}
    for x, ts in zip(evo, test):
        assert len(ts) == 20 and all(t.type == x.type for t in ts)
        scoring_sets.setdefault(x.type, set()).add(tuple(t.id for t in ts))
    assert len(scoring_sets) == 4 and all(len(sets) == 1 for sets in scoring_sets.values())
    evolve = [t.id for x in evo for t in x.tasks]
    assert len(set(evolve)) == 24 * 8 and not set(evolve) & task_ids((), test)
    assert not task_ids(evo, test) & task_ids(probe)


def test_a_training_probe_that_cannot_stay_clear_of_eval_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as usage:
        train_grpo.parse_args(["--suite", "household", "--eval-tasks", "5", "--probe-every", "1"])
    assert usage.value.code == 2
    assert "--probe-instances 4" in capsys.readouterr().err
    assert train_grpo.parse_args(["--probe-every", "1"]).probe_every == 1     # qa's defaults fit


def test_eval_refuses_an_editor_whose_probe_meets_its_tasks(tmp_path, capsys):
    """An editor trained with --probe-every and --eval-instances 4 kept its probe clear of 4 instances on a
    smaller draw; --eval with the default 12 instances would score on some of its probe tasks: refused, by
    task id, naming the flags that run used, as train_grpo.py parses its flags (and by skill_r1_eval.evaluate
    itself, before any model is loaded and before --out is written). With the run's own --eval-instances 4 the
    tasks are apart and the check passes."""
    trained_flags = vars(flags("--eval-instances", "4", "--probe-every", "1"))
    ckpt = tmp_path / "checkpoint"
    ckpt.mkdir()
    torch.save({"args": trained_flags}, ckpt / TRAINER_STATE)
    out = tmp_path / "eval"
    with pytest.raises(SystemExit) as usage:
        train_grpo.main(["--eval", "--skillr1-editor", str(ckpt), "--out", str(out)])
    err = capsys.readouterr().err
    assert usage.value.code == 2 and f"error: --eval's held-out tasks meet the probe of {ckpt}" in err
    assert "--eval-instances 4 --eval-tasks 20 --tasks-per-instance 4" in err and not out.exists()
    library = flags("--out", str(out))
    library.eval, library.skillr1_editor = True, [str(ckpt)]
    with pytest.raises(HeldoutSplitError, match="meet the probe of"):
        skill_r1_eval.evaluate(library)
    assert not out.exists()
    args = flags("--eval-instances", "4")
    evo, test, _ = heldout_split(args)
    check_probes_of({str(ckpt): trained_flags}, evo, test, args)                      # no error
    check_probes_of({str(ckpt): {**trained_flags, "probe_every": 0}}, *heldout_split(flags())[:2], flags())
    assert train_grpo.parse_args(["--eval", "--eval-instances", "4", "--skillr1-editor", str(ckpt)]).eval


def test_training_seeds_share_the_probe_and_the_evaluation_heldout_seed_moves_them():
    """--seed draws the training tasks and samples, not the held-out split: two training seeds probe on the same
    instances and are evaluated on the same tasks (before, seed 1's probe shared 12 of its 32 tasks with the
    seed-0 evaluation, so --eval refused its editor); --heldout-seed draws another split, still clear of --eval."""
    argv = ["--tasks-per-instance", "8", "--eval-instances", "24", "--eval-scoring", "shared"]
    evo0, test0, probe0 = heldout_split(flags(*argv), probe=True)
    evo1, test1, probe1 = heldout_split(flags(*argv, "--seed", "1"), probe=True)
    assert task_ids(evo0, test0) == task_ids(evo1, test1) and task_ids(probe0) == task_ids(probe1)
    assert load_split(flags("--seed", "1"), "train") != load_split(flags(), "train")
    evo2, test2, probe2 = heldout_split(flags(*argv, "--heldout-seed", "1"), probe=True)
    assert task_ids(probe2) != task_ids(probe0) and not task_ids(evo2, test2) & task_ids(probe2)


def test_a_run_saved_before_heldout_seed_is_checked_with_the_probe_it_drew_with_its_seed():
    """A trainer_state.pt without heldout_seed drew its probe with --seed: --eval rebuilds that probe, and
    refuses an evaluation that meets it; the same run saved with heldout_seed 0 is clear."""
    argv = ["--tasks-per-instance", "8", "--eval-instances", "24", "--eval-scoring", "shared"]
    old_run = {k: v for k, v in vars(flags(*argv, "--probe-every", "8", "--seed", "1")).items() if k != "heldout_seed"}
    assert skill_r1_eval.with_heldout_seed(old_run)["heldout_seed"] == 1
    evo, test, _ = heldout_split(flags(*argv))
    with pytest.raises(HeldoutSplitError, match="meet the probe of old-run"):
        check_probes_of({"old-run": old_run}, evo, test, flags(*argv))
    check_probes_of({"new-run": {**old_run, "heldout_seed": 0}}, evo, test, flags(*argv))   # no error
