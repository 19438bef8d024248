"""train_grpo.py end to end with a tiny random editor and a scripted task model behind real HTTP: the outputs
(checkpoint, metrics.jsonl, reward curve), resume == uninterrupted run, the β > 0 path with a reference model,
the --eval table, and the plain message when a multi-turn suite gives no reward at all."""
import io
import json
import re
import shutil
from contextlib import redirect_stdout
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file


import train_grpo
from minskill.paired import wilson_interval
from minskill.measure import combine
from helpers import (KEYWORDS, ROW_FIELDS, TIMING_FIELDS, Interrupted, common_flags, crash_after_checkpoint,
                     keyword_task_model, keyword_tasks, read_rows)
from minskill.nn.sampling import completion_logprobs
from minskill.nn.weights import load_model
from minskill.serve.client import ChatClient
from minskill.serve.backends import ScriptedBackend
from minskill.serve.server import start_server
from minskill.skill_r1 import evaluate as evaluate_module
from minskill.skill_r1.eval_table import joined_rows, success_interval
from minskill.skill_r1.evaluate import heldout_instances, kl_reference, kl_to_frozen, probe_instances, success
from minskill.skill_r1.grpo import policy_loss
from minskill.skill_r1.loop import EvolveConfig


@pytest.fixture(scope="module")
def task_url():
    with start_server(ScriptedBackend(keyword_task_model, name="keywords")) as server:
        yield server.url


@pytest.fixture(scope="module")
def straight_run(editor_dir, suite_file, task_url, tmp_path_factory):
    """4 steps without interruption; returns (out folder, printed text)."""
    out = tmp_path_factory.mktemp("straight")
    buffer = io.StringIO()
    with redirect_stdout(buffer):
        assert train_grpo.main(common_flags(editor_dir, suite_file, task_url, out) + ["--steps", "4"]) == 0
    return out, buffer.getvalue()


def test_smoke_run_writes_checkpoint_metrics_and_picture(straight_run):
    out, printed = straight_run
    rows = read_rows(out)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    for row in rows:
        assert set(ROW_FIELDS) <= set(row)
        assert len(row["reward_per_generation"]) == 3 and len(row["a_inter"]) == 2
        assert all(0.0 <= r <= 1.0 for r in row["reward_per_generation"])
        assert row["task_calls"] > 0 and row["task_tokens"] > 0 and row["kl"] == 0.0
        # the task model's seconds apart from the editor's: the two parts of the sampling phase
        assert row["task_tokens"] == row["task_prompt_tokens"] + row["task_completion_tokens"]
        assert 0 < row["task_seconds"] <= row["seconds_sampling_and_rollouts"] + 0.01 and row["task_request_seconds"] > 0
        assert row["seconds_editor_sampling"] == pytest.approx(row["seconds_sampling_and_rollouts"] - row["task_seconds"])
    # the progress lines, with ETA, and the closing summary
    assert "step 4/4 | reward " in printed and "ETA" in printed and "done: 4 steps" in printed
    svg = (out / "reward_curve.svg").read_text()
    assert svg.lstrip().startswith("<") and "generation 2" in svg
    # the checkpoint is an HF folder that loads, plus the trainer state
    editor, tokenizer = load_model(str(out / "checkpoint"))
    logits = editor(torch.tensor([tokenizer.encode("Solve task 1")]))
    assert logits.shape[-1] == editor.config.vocab_size and torch.isfinite(logits).all()
    state = torch.load(out / "checkpoint" / "trainer_state.pt", weights_only=False)
    assert state["step"] == 4 and len(state["metrics"]) == 4 and "optimizer" in state and "rng" in state
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == [".minskill-run"]   # no staging left


class GradRecorder:
    """Stands in for the optimizer: step() records the accumulated gradients."""

    def __init__(self, model):
        self.model, self.grads = model, []

    def zero_grad(self, set_to_none=True):
        self.model.zero_grad(set_to_none=set_to_none)

    def step(self):
        self.grads.append({n: p.grad.clone() for n, p in self.model.named_parameters() if p.grad is not None})


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean", "dr_grpo"])
def test_micro_batches_give_the_full_batch_gradient(editor_dir, agg):
    """policy_update accumulates micro-batches (skipping A = 0 sequences) into exactly the gradient of
    policy_loss over the whole batch at once, for each aggregation, with and without the shared-prefix pass
    (candidates 2j and 2j+1 share a prompt, as a GRPO group's candidates do)."""
    editor, tok = load_model(str(editor_dir))
    editor.train()
    lengths, advantages = [3, 7, 1, 5, 6, 2], [0.5, -0.25, 0.0, 1.0, 0.0, -1.25]
    cands = [SimpleNamespace(prompt_ids=tok.encode(f"prompt number {i // 2} " * (i // 2 + 1)),
                             token_ids=[(7 * i + 3 * j) % 300 + 3 for j in range(n)], logprobs=[0.0] * n, advantage=a)
             for i, (n, a) in enumerate(zip(lengths, advantages))]
    args = train_grpo.parse_args(["--agg", agg, "--max-skill-tokens", "8", "--grad-clip", "0"])

    logp, mask = completion_logprobs(editor, [c.prompt_ids for c in cands], [c.token_ids for c in cands])
    loss, _ = policy_loss(logp, logp.detach(), torch.tensor(advantages), mask, agg=agg, max_new_tokens=8)
    editor.zero_grad()
    loss.backward()
    reference = {n: p.grad.clone() for n, p in editor.named_parameters()}
    for shared, micro_batch in [(s, m) for s in (True, False) for m in (1, 2, 6)]:
        args.micro_batch, args.shared_prefix = micro_batch, shared
        recorder = GradRecorder(editor)
        stats = train_grpo.policy_update(editor, None, recorder, cands, args)
        assert stats["trained_sequences"] == 4 and stats["ratio_mean"] == pytest.approx(1.0)
        [grads] = recorder.grads
        for name, g in reference.items():
            torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-7,
                                       msg=f"{agg} shared={shared} mb={micro_batch} {name}")


def test_micro_batches_hold_one_prompt_each_and_every_row_once():
    """A micro-batch never mixes two prompts (its activations are then one prompt's), holds at most `size`
    rows, and the micro-batches together hold every row exactly once."""
    rows = [SimpleNamespace(prompt_ids=[1, 2] if i in (0, 1, 4) else [3], name=i) for i in range(7)]
    for size in (1, 2, 3, 8):
        batches = train_grpo.micro_batches(rows, size)
        assert sorted(r.name for b in batches for r in b) == list(range(7))
        assert all(0 < len(b) <= size and len({tuple(r.prompt_ids) for r in b}) == 1 for b in batches)
    assert [[r.name for r in b] for b in train_grpo.micro_batches(rows, 2)] == [[0, 1], [4], [2, 3], [5, 6]]


def test_resume_refuses_a_lineage_line_without_a_step_naming_it(editor_dir, suite_file, task_url, tmp_path,
                                                                 monkeypatch):
    """A lineage.jsonl record without an integer "step" (edited, or another file): --resume exits naming
    FILE:LINE and the field before it writes anything (it used to be a KeyError traceback)."""
    out = tmp_path / "resumed"
    flags = common_flags(editor_dir, suite_file, task_url, out) + ["--steps", "2", "--save-every", "1"]
    crash_after_checkpoint(monkeypatch, flags, step=1)
    with open(out / "lineage.jsonl", "a") as f:
        f.write(json.dumps({"instance": "no step"}) + "\n")
    n = len((out / "lineage.jsonl").read_text().splitlines())
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    with pytest.raises(SystemExit, match=rf"--resume: {re.escape(str(out / 'lineage.jsonl'))}:{n}: lacks the "
                                         rf"field 'step'"):
        train_grpo.main(flags + ["--resume"])
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before


def test_resume_equals_the_uninterrupted_run(straight_run, editor_dir, suite_file, task_url, tmp_path, monkeypatch,
                                             capsys):
    out = tmp_path / "resumed"
    flags = common_flags(editor_dir, suite_file, task_url, out) + ["--steps", "4"]
    crash_after_checkpoint(monkeypatch, flags, step=2)
    assert [r["step"] for r in read_rows(out)] == [0, 1]
    with open(out / "lineage.jsonl", "a") as f:   # as if it had died after logging step 3, before its checkpoint
        f.write(json.dumps({"step": 2, "instance": "lost"}) + "\n")
    # the resume policy (minskill.runs.resume_flags): no flag repeated, the saved ones continue the run
    assert train_grpo.main(["--out", str(out), "--resume"]) == 0
    assert "resuming" in capsys.readouterr().out
    lineage = [[json.loads(line) for line in (run / "lineage.jsonl").read_text().splitlines()] for run in (straight_run[0], out)]
    assert [r["step"] for r in lineage[1]] == [0, 0, 1, 1, 2, 2, 3, 3] and lineage[0] == lineage[1]

    straight, resumed = read_rows(straight_run[0]), read_rows(out)
    assert len(resumed) == 4
    for a, b in zip(straight, resumed):
        for key in set(ROW_FIELDS) - set(TIMING_FIELDS):
            assert a[key] == b[key], (a["step"], key)
    w_straight = load_file(str(straight_run[0] / "checkpoint" / "model.safetensors"))
    w_resumed = load_file(str(out / "checkpoint" / "model.safetensors"))
    assert w_straight.keys() == w_resumed.keys()
    assert all(torch.equal(w_straight[k], w_resumed[k]) for k in w_straight)
    # and training did change the weights
    w_start = load_file(str(Path(editor_dir) / "model.safetensors"))
    assert any(not torch.equal(w_start[k], w_straight[k]) for k in w_start)


def test_resume_refuses_changed_flags(straight_run, editor_dir, suite_file, task_url):
    out = straight_run[0]
    with pytest.raises(SystemExit, match="--lam 0.5 -> 0.0"):
        train_grpo.main(common_flags(editor_dir, suite_file, task_url, out) + ["--steps", "4", "--resume", "--lam", "0"])


def test_resume_names_every_differing_flag_and_takes_a_may_change_one(straight_run, tmp_path, capsys):
    """Given alone, a flag that shapes the run (RESUME_MUST_MATCH) and differs from the saved one is refused,
    each named with both values, even at its default value (-K 4 is the default, the run saved 3); --steps may
    change and is taken, every flag not given is the saved run's."""
    out = tmp_path / "run"
    shutil.copytree(straight_run[0], out)
    with pytest.raises(SystemExit) as caught:
        train_grpo.main(["--out", str(out), "--resume", "--lam", "0", "-K", "4", "--save-every", "1"])
    assert "--lam 0.5 -> 0.0" in str(caught.value.code) and "--candidates 3 -> 4" in str(caught.value.code)
    assert "--save-every" not in str(caught.value.code)
    args = train_grpo.parse_args(["--out", str(out), "--resume", "--steps", "5"])
    assert "--steps 4 -> 5 changes the cosine schedule" in capsys.readouterr().out
    saved = torch.load(out / "checkpoint" / "trainer_state.pt", weights_only=False)["args"]
    assert args.steps == 5 and args.candidates == saved["candidates"] == 3
    assert {k: v for k, v in vars(args).items() if k not in ("steps", "resume", "out")} == \
        {k: v for k, v in saved.items() if k not in ("steps", "resume", "out")}


def test_a_rerun_is_refused_and_overwrite_replaces_the_run(editor_dir, suite_file, task_url, tmp_path):
    """A second run into the same --out is refused (the first run's checkpoint and metrics stay); with
    --overwrite it replaces them."""
    out = tmp_path / "run"
    flags = common_flags(editor_dir, suite_file, task_url, out) + ["--steps", "2"]
    assert train_grpo.main(flags) == 0
    first = (out / "metrics.jsonl").read_bytes(), (out / "checkpoint" / "trainer_state.pt").read_bytes()
    with pytest.raises(SystemExit, match="--overwrite"):
        train_grpo.main(flags[:-1] + ["1"])
    assert ((out / "metrics.jsonl").read_bytes(), (out / "checkpoint" / "trainer_state.pt").read_bytes()) == first
    assert train_grpo.main(flags[:-1] + ["1", "--overwrite"]) == 0
    assert [r["step"] for r in read_rows(out)] == [0]
    assert torch.load(out / "checkpoint" / "trainer_state.pt", weights_only=False)["step"] == 1


def test_resume_without_checkpoint_says_so(tmp_path, editor_dir, suite_file, task_url):
    with pytest.raises(SystemExit, match="no checkpoint"):
        train_grpo.main(common_flags(editor_dir, suite_file, task_url, tmp_path) + ["--resume"])


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 2])


@pytest.mark.parametrize("damage, message", [
    (lambda ckpt: truncate(ckpt / "trainer_state.pt"), "trainer_state.pt: damaged, cannot be read"),
    (lambda ckpt: (ckpt / "trainer_state.pt").write_bytes(b""), "trainer_state.pt: damaged, cannot be read"),
    (lambda ckpt: (ckpt / "model.safetensors").unlink(), "neither model.safetensors"),
    (lambda ckpt: truncate(ckpt / "model.safetensors"), "model.safetensors: damaged, not a readable safetensors"),
    (lambda ckpt: (ckpt / "config.json").write_text('{"model_type": '), "config.json: damaged, not readable JSON"),
])
def test_resume_of_a_damaged_checkpoint_names_the_file_and_writes_nothing(straight_run, editor_dir, suite_file,
                                                                          task_url, tmp_path, damage, message):
    """Each was a traceback; the run keeps one checkpoint, so there is nothing older to use."""
    out = tmp_path / "run"
    shutil.copytree(straight_run[0], out)
    damage(out / "checkpoint")
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(SystemExit) as caught:
        train_grpo.main(common_flags(editor_dir, suite_file, task_url, out) + ["--steps", "4", "--resume"])
    text = str(caught.value.code)
    assert text.startswith("--resume: ") and message in text and str(out / "checkpoint") in text
    assert "no earlier checkpoint" in text and "--overwrite" in text
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_beta_keeps_a_reference_and_reports_kl_with_bf16_and_checkpointing(editor_dir, suite_file, task_url, tmp_path, capsys):
    out = tmp_path / "beta"
    flags = common_flags(editor_dir, suite_file, task_url, out) + ["--steps", "1", "--beta", "0.1", "--ppo-epochs",
                                                                    "2", "--lr", "1e-2", "--agg", "seq_mean",
                                                                    "--bf16", "--grad-checkpointing"]
    assert train_grpo.main(flags) == 0
    assert "reference model: frozen copy of the editor" in capsys.readouterr().out
    [row] = read_rows(out)
    # epoch 1 starts at the reference (KL 0, ratio 1); epoch 2 after one update: KL > 0, ratio != 1
    assert row["kl"] > 0 and row["ratio_mean"] != 1.0
    assert 0 <= row["clip_frac_low"] <= 1 and 0 <= row["clip_frac_high"] <= 1     # shares of the tokens


def test_no_reference_model_when_beta_is_zero(straight_run):
    assert "reference model: none" in straight_run[1]


def test_eval_prints_the_papers_rows(straight_run, editor_dir, suite_file, task_url, capsys, tmp_path):
    ckpt = str(straight_run[0] / "checkpoint")
    flags = common_flags(editor_dir, suite_file, task_url, tmp_path / "eval") + [
        "--eval", "--grpo-editor", ckpt, "--skillr1-editor", ckpt, "--eval-instances", "2", "--eval-tasks", "2"]
    assert train_grpo.main(flags) == 0
    printed = capsys.readouterr().out
    check_eval_folder(tmp_path / "eval", printed)
    lines = printed.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| method |"))
    table = [line for line in lines[start:start + 7]]
    paired = [line for line in lines[start + 7:] if line.startswith("|")]
    assert table[0].startswith("| method | success (95% CI) | g=1 | g=2 | task calls: evolve | task calls: evaluate |")
    # 2 instances x 2 scoring tasks, each counted once
    assert "4 evaluation tasks per row (1 rollout each, averaged per task)" in printed
    names = [line.split("|")[1].strip() for line in table[2:]]
    assert names[0] == "no skill" and names[1].startswith("seed skill")
    assert names[2].startswith("Skill-R1 inference-only") and names[3].startswith("vanilla GRPO (λ = 0.5)")
    assert names[4].startswith("Skill-R1 (λ = 0.5)")           # λ read from the checkpoint's trainer state
    assert "warning: " in printed and "trained with λ = 0.5, yet it fills the row 'vanilla GRPO" in printed
    assert printed.count(f"KL(trained ‖ {editor_dir}) = ") == 2      # the two trained rows, not the frozen one
    for line in table[2:]:
        cells = [c.strip() for c in line.split("|")[1:-1]]
        assert 0.0 <= float(cells[1].split()[0]) <= 1.0
        # every row was scored on the evaluation tasks, but the seed skill's: none given, it is the no-skill row
        assert (int(cells[-1]) > 0) == (cells[0] != "seed skill (--seed-skills none: = no skill)")
    assert all(int(line.split("|")[-3]) > 0 for line in table[4:])  # editor rows spent calls evolving
    # with the scripted model: no skill answers nothing ('no' to everything)
    assert table[2].split("|")[2].strip().startswith("0.000")
    # the paired table: every row against no skill, Skill-R1 against the three other rows, GRPO against the frozen
    assert paired[0].startswith("| row | against | paired difference") and len(paired) == 2 + 4 + 3 + 1
    assert paired[-1].startswith("| vanilla GRPO (λ = 0.5): ") and "| Skill-R1 inference-only (editor frozen): " in paired[-1]
    success = {line.split("|")[1].strip().split(":")[0]: float(line.split("|")[2].split()[0]) for line in table[2:]}
    for line in paired[2:]:
        row, against, diff, p, counts = [c.strip() for c in line.split("|")[1:-1]]
        gained, lost = (int(x) for x in counts.split(" / "))
        assert 0.0 <= float(p) <= 1.0 and gained + lost <= 4
        assert float(diff.split()[0]) == pytest.approx(success[row.split(":")[0]] - success[against.split(":")[0]],
                                                       abs=1e-3)


def check_eval_folder(out, printed):
    """OUT/eval.json holds what the --eval tables print: the rows with their per-task scores (success = their
    mean), the skills each editor wrote per instance, the KL, the paired table, and the cost per role."""
    record = json.loads((out / "eval.json").read_text())
    assert record["kind"] == "skill-r1-eval" and record["finished"] is True and record["flags"]["eval"] is True
    assert f"wrote {out / 'eval.json'}; python -m minskill.report {out}" in printed
    lines = [line for line in printed.splitlines() if line.startswith("| ")]
    table = lines[1:lines.index(next(line for line in lines if line.startswith("| row |")))]
    assert [r["name"] for r in record["rows"]] == [line.split("|")[1].strip() for line in table]
    n_tasks = [len(x["eval_tasks"]) for x in record["instances"]]
    for row, line in zip(record["rows"], table):
        assert [len(s) for s in row["scores"]] == n_tasks
        flat = [x for s in row["scores"] for x in s]
        assert row["success"] == pytest.approx(sum(flat) / len(flat))
        assert line.split("|")[2].strip().startswith(f"{row['success']:.3f} ({row['ci95'][0]:.2f}–{row['ci95'][1]:.2f})")
        assert len(row["skills"]) == len(record["instances"])
        task = row["costs"].get("task_model") or row["costs"]["task_model_evaluate"]
        if row["name"] == "seed skill (--seed-skills none: = no skill)":   # the no-skill row's requests: not sent again
            assert row["scores"] == record["rows"][0]["scores"] and row["eval_calls"] == 0
            assert task["calls"] == task["prompt_tokens"] == task["busy_seconds"] == 0
            continue
        assert task["calls"] == row["eval_calls"] > 0 and task["prompt_tokens"] > 0 and task["busy_seconds"] > 0
        if row["spec"]:                                  # an editor row: what it wrote, and what that cost
            assert row["costs"]["task_model_evolve"]["calls"] == row["evolve_calls"] > 0
            editor = row["costs"]["editor"]
            assert editor["sampled_tokens"] > 0 and 0 <= editor["seconds"] < float("inf")
            for written in row["skills"]:
                assert len(written["generations"]) == 2 and all(len(g["candidates"]) == 3 for g in written["generations"])
                assert written["carried"] == written["generations"][-1]["carried"]
            assert (row["kl"] is None) == (row["spec"] == record["flags"]["editor"]) == (row["kl_reference"] is None)
    printed_paired = [[c.strip() for c in line.split("|")[1:-1]] for line in lines[lines.index(
        next(line for line in lines if line.startswith("| row |"))) + 1:]]
    assert [[p["row"], p["against"], f"{p['p']:.3f}", f"{p['per_task_gained']} / {p['per_task_lost']}"]
            for p in record["paired"]] == [[c[0], c[1], c[3], c[4]] for c in printed_paired]
    assert all(p["instances"] == len(record["instances"]) and p["test"] == "exact" for p in record["paired"])
    assert record["usage"]["calls"] == sum(r["eval_calls"] + r["evolve_calls"] for r in record["rows"])
    return record


def test_eval_refuses_a_non_empty_out_and_writes_nothing_there(straight_run, editor_dir, suite_file, task_url):
    before = sorted(p.name for p in straight_run[0].iterdir())
    flags = common_flags(editor_dir, suite_file, task_url, straight_run[0]) + ["--eval", "--eval-instances", "1",
                                                                              "--eval-tasks", "2"]
    with pytest.raises(SystemExit, match="is not empty"):
        train_grpo.main(flags)
    assert sorted(p.name for p in straight_run[0].iterdir()) == before
    with pytest.raises(SystemExit, match="holds no eval.json, so no --eval run to continue"):
        train_grpo.parse_args(flags + ["--resume"])    # a training run's folder
    assert train_grpo.parse_args([]).out == "runs/skill-r1" and train_grpo.parse_args(["--eval"]).out is None


def test_held_out_probe_every_m_steps_on_instances_eval_never_uses(editor_dir, suite_file, task_url, tmp_path,
                                                                     capsys):
    """--probe-every 2 over 3 steps probes before the first step and after steps 2 and 3, always on the same
    held-out instances with the same seeds (the seed skill's probe reward never moves), records each probe in
    its step's metrics row, draws it in reward_curve.svg, and takes instances that --eval does not use."""
    flags = common_flags(editor_dir, suite_file, task_url, tmp_path) + ["--steps", "3", "--probe-every", "2",
                                                                         "--probe-instances", "1",
                                                                         "--eval-instances", "1", "--eval-tasks", "2"]
    assert train_grpo.main(flags) == 0
    printed = capsys.readouterr().out
    rows = read_rows(tmp_path)
    probes = [(r["step"], pr) for r in rows for pr in r["probes"]]
    assert [(step, pr["after_steps"]) for step, pr in probes] == [(0, 0), (1, 2), (2, 3)]
    for _, pr in probes:
        assert len(pr["reward_per_generation"]) == 2 and all(0 <= x <= 1 for x in pr["reward_per_generation"])
        assert pr["task_calls"] > 0 and 0 <= pr["beat_seed_share"] <= 1
    assert len({pr["reward_per_generation"][0] for _, pr in probes}) == 1
    assert "held-out probe after 0 steps" in printed and "held-out probe after 3 steps" in printed
    assert "probe: candidates" in (tmp_path / "reward_curve.svg").read_text()
    args = train_grpo.parse_args(flags)
    probe_ids = {t.id for x in probe_instances(args) for t in x.tasks}
    evo, test = heldout_instances(args)
    eval_ids = {t.id for x in evo for t in x.tasks} | {t.id for ts in test for t in ts}
    assert len(probe_ids) == 2 and len(eval_ids) == 4 and not probe_ids & eval_ids


def test_eval_takes_several_skill_r1_editors_and_can_skip_the_frozen_row(straight_run, editor_dir, suite_file,
                                                                           task_url, capsys, tmp_path):
    """--skillr1-editor A B gives one Skill-R1 row each, each compared with every other row once;
    --no-frozen-row leaves the inference-only row out."""
    ckpt = str(straight_run[0] / "checkpoint")
    flags = common_flags(editor_dir, suite_file, task_url, tmp_path / "eval") + [
        "--eval", "--skillr1-editor", ckpt, str(editor_dir), "--eval-instances", "1", "--eval-tasks", "2",
        "--no-frozen-row"]
    assert train_grpo.main(flags) == 0
    printed = capsys.readouterr().out
    check_eval_folder(tmp_path / "eval", printed)
    assert "skipped: Skill-R1 inference-only (editor frozen) (--no-frozen-row)" in printed
    lines = [line for line in printed.splitlines() if line.startswith("| ")]
    table = lines[1:lines.index(next(line for line in lines if line.startswith("| row |")))]
    paired = [line.split("|")[1:3] for line in lines[lines.index(next(line for line in lines if line.startswith("| row |"))) + 1:]]
    names = [line.split("|")[1].strip() for line in table]
    assert names[:2] == ["no skill", "seed skill (--seed-skills none: = no skill)"] and len(names) == 4
    assert names[2] == f"Skill-R1 (λ = 0.5): {ckpt}" and names[3] == f"Skill-R1 (λ > 0): {editor_dir}"
    pairs = [tuple(c.strip() for c in p) for p in paired]
    assert len(pairs) == 3 + 2 + 1 and len(set(pairs)) == len(pairs)
    assert (names[2], names[3]) in pairs and (names[3], names[2]) not in pairs


def test_eval_scoring_shared_scores_a_types_instances_on_one_set_of_tasks(editor_dir, suite_file, task_url, capsys,
                                                                           tmp_path):
    """--eval-scoring shared: the instances of a type evolve on tasks of their own and are scored on the same
    tasks; eval.json records them so, and the header counts the distinct tasks apart from instance x task."""
    eval_flags = ["--eval", "--eval-instances", "3", "--eval-tasks", "2"]   # 8 held-out tasks: own fits 2 of 2 + 2
    with pytest.raises(SystemExit) as refused:
        train_grpo.parse_args(common_flags(editor_dir, suite_file, task_url, tmp_path / "own") + eval_flags)
    assert refused.value.code == 2 and "--eval-scoring shared" in capsys.readouterr().err
    assert train_grpo.main(common_flags(editor_dir, suite_file, task_url, tmp_path / "eval") + eval_flags +
                           ["--eval-scoring", "shared"]) == 0
    printed = capsys.readouterr().out
    check_eval_folder(tmp_path / "eval", printed)
    record = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert len(record["instances"]) == 3 and len({tuple(x["eval_tasks"]) for x in record["instances"]}) == 1
    evolve = [t for x in record["instances"] for t in x["evolve_tasks"]]
    assert len(set(evolve)) == 6 and not set(evolve) & set(record["instances"][0]["eval_tasks"])
    assert "6 evaluation tasks per row (instance × task: 2 distinct tasks" in printed
    no_skill = record["rows"][0]   # one skill for all of a type's instances: its 2 distinct tasks count once each
    assert no_skill["ci95"] == pytest.approx(list(wilson_interval(no_skill["success"] * 2, 2)))
    editor = record["rows"][2]     # a skill per instance: the interval is by instance, and 3 say little
    assert editor["ci95"] == [0.0, 1.0]


def test_an_editor_rows_success_interval_is_by_instance_a_fixed_skill_rows_by_distinct_task():
    """Two editor rows with the same 32 scores and the same success 0.5: where every instance scores 0.5 the
    instances agree and the interval is narrow; where half score 1 and half 0 it is wide. A row without an
    editor keeps the Wilson interval over its distinct tasks."""
    agree = {"spec": "ckpt", "success": 0.5, "scores": [[1.0, 1.0, 0.0, 0.0]] * 8}
    split = {"spec": "ckpt", "success": 0.5, "scores": [[1.0] * 4] * 4 + [[0.0] * 4] * 4}
    assert success_interval(agree, []) == pytest.approx([0.5, 0.5])
    low, high = success_interval(split, [])
    assert low < 0.3 and high > 0.7 and 0.0 <= low and high <= 1.0
    tasks = [[SimpleNamespace(id=f"t{i}") for i in range(4)]] * 8   # shared: 4 distinct tasks
    fixed = {"spec": None, "success": 0.5, "scores": agree["scores"]}
    assert success_interval(fixed, tasks) == pytest.approx(list(wilson_interval(2, 4)))


def test_combine_joins_separate_eval_runs_into_the_table_one_run_gives(straight_run, editor_dir, suite_file,
                                                                         task_url, capsys, tmp_path):
    """A Skill-R1 row measured in a later --eval run (--no-frozen-row), joined to a run of the frozen row, gives
    the rows and the paired table of one --eval run of both; runs that differ are refused, naming how."""
    ckpt = str(straight_run[0] / "checkpoint")

    def evaluate(name, *extra):
        flags = common_flags(editor_dir, suite_file, task_url, tmp_path / name) + [
            "--eval", "--eval-instances", "2", "--eval-tasks", "2", *extra]
        assert train_grpo.main(flags) == 0
        return json.loads((tmp_path / name / "eval.json").read_text())
    both = evaluate("both", "--skillr1-editor", ckpt)
    evaluate("frozen")
    evaluate("later", "--no-frozen-row", "--skillr1-editor", ckpt)
    evaluate("other", "--eval-tasks", "1")
    capsys.readouterr()
    assert combine.main([str(tmp_path / "frozen"), str(tmp_path / "later"), "--out", str(tmp_path / "all")]) == 0
    printed = capsys.readouterr().out
    joined = json.loads((tmp_path / "all" / "eval.json").read_text())
    assert [(r["name"], r["scores"]) for r in joined["rows"]] == [(r["name"], r["scores"]) for r in both["rows"]]
    assert joined["paired"] == both["paired"] and len(joined["paired"]) == 3 + 2
    assert joined["combined_from"] == [str(tmp_path / n / "eval.json") for n in ("frozen", "later")]
    assert f"| Skill-R1 (λ = 0.5): {ckpt} | Skill-R1 inference-only" in printed
    for runs, message in [(["frozen", "other"], "--eval-tasks 2 vs 1"), (["later", "later"], "already in an earlier"),
                          (["frozen", "absent"], "absent")]:
        code = combine.main([str(tmp_path / n) for n in runs] + ["--out", str(tmp_path / "refused")])
        assert code == 2 and message in capsys.readouterr().err and not (tmp_path / "refused").exists()


def test_kl_to_frozen_is_the_mean_log_ratio_of_the_sampled_tokens(editor_dir, straight_run):
    """kl_to_frozen: 0 for the frozen editor itself; for the trained one, the mean over the skill tokens of
    log π_θ − log π_0, computed here by hand from sampling.completion_logprobs."""
    trained, tok = load_model(str(straight_run[0] / "checkpoint"))
    frozen, _ = load_model(str(editor_dir))
    cands = [SimpleNamespace(prompt_ids=tok.encode(f"write a skill {i // 2}"), token_ids=[5 + i, 9, 17 + 3 * i][:1 + i % 3])
             for i in range(5)]
    evolutions = [SimpleNamespace(candidates=lambda: cands)]
    args = SimpleNamespace(bf16=False, editor_temperature=1.0)
    assert kl_to_frozen(frozen, str(editor_dir), evolutions, args) == pytest.approx(0.0, abs=1e-6)
    with torch.no_grad():
        logp, mask = completion_logprobs(trained, [c.prompt_ids for c in cands], [c.token_ids for c in cands])
        logp_0, _ = completion_logprobs(frozen, [c.prompt_ids for c in cands], [c.token_ids for c in cands])
    by_hand = float(((logp - logp_0) * mask).sum() / mask.sum())
    assert by_hand != 0 and kl_to_frozen(trained, str(editor_dir), evolutions, args) == pytest.approx(by_hand, abs=1e-5)


def test_a_trained_rows_kl_is_to_the_editor_its_training_started_from(editor_dir, straight_run, tmp_path):
    """kl_reference: None for --editor itself; the --editor recorded in a checkpoint's trainer_state.pt (not the
    eval run's --editor) while it loads; --editor once that folder is gone."""
    ckpt = straight_run[0] / "checkpoint"
    args = SimpleNamespace(editor="smollm2-135m")
    assert kl_reference("smollm2-135m", args) is None
    assert kl_reference(str(ckpt), args) == str(editor_dir)
    moved = shutil.copytree(editor_dir, tmp_path / "start")
    state = torch.load(ckpt / "trainer_state.pt", weights_only=False)
    state["args"]["editor"] = str(moved)
    shutil.copytree(ckpt, tmp_path / "ckpt")
    torch.save(state, tmp_path / "ckpt" / "trainer_state.pt")
    assert kl_reference(str(tmp_path / "ckpt"), args) == str(moved)
    shutil.rmtree(moved)
    assert kl_reference(str(tmp_path / "ckpt"), args) == "smollm2-135m"


def test_eval_counts_n_identical_greedy_rollouts_once(task_url):
    """With -n 3 and a greedy task model each task's three replies are identical: it scores once (its mean),
    so the success and the counts are those of -n 1, not three correlated copies."""
    tasks = keyword_tasks()
    client = ChatClient(task_url)
    args = SimpleNamespace(rollouts=3, task_temperature=0.0, task_max_tokens=4, seed=0)
    rate, _, scores = success(client, [KEYWORDS[0]], [tasks], args)
    assert scores == [[1.0] + [0.0] * (len(tasks) - 1)] and rate == pytest.approx(1 / len(tasks))


def test_all_zero_multi_turn_suite_says_so(editor_dir, tmp_path, capsys):
    with start_server(ScriptedBackend(lambda messages, request: "dance wildly", name="mute")) as server:
        flags = ["--editor", str(editor_dir), "--task-url", server.url, "--suite", "household", "--n-tasks", "6",
                 "--out", str(tmp_path), "-G", "1", "-K", "2", "--tasks-per-instance", "1", "--instances-per-step",
                 "1", "--max-skill-tokens", "8", "--context-tokens", "900", "--task-max-tokens", "4", "--steps", "1"]
        assert train_grpo.main(flags) == 0
    printed = capsys.readouterr().out
    assert "every reward was 0" in printed and "multi-turn" in printed and "nothing was learned" in printed


def test_help_lists_the_flags(capsys):
    with pytest.raises(SystemExit):
        train_grpo.main(["--help"])
    text = capsys.readouterr().out
    for flag in ("--task-url", "--generations", "--candidates", "--lam", "--beta", "--agg", "--eps-low", "--bf16",
                 "--grad-checkpointing", "--resume", "--eval", "--grpo-editor", "--skillr1-editor"):
        assert flag in text


def test_instance_order_is_a_fresh_permutation_per_pass():
    picks = [i for step in range(6) for i in train_grpo.instance_order(5, step, 2, seed=3)]
    assert sorted(picks[:5]) == list(range(5)) and sorted(picks[5:10]) == list(range(5))
    assert picks == [i for step in range(6) for i in train_grpo.instance_order(5, step, 2, seed=3)]
    assert picks != [i for step in range(6) for i in train_grpo.instance_order(5, step, 2, seed=4)]


def test_the_evolve_config_is_the_flags():
    """EvolveConfig's fields are train_grpo's flags of the same names, with the same defaults."""
    assert EvolveConfig.from_args(train_grpo.parse_args([])) == EvolveConfig()
    args = train_grpo.parse_args(["-G", "3", "-K", "5", "--max-skill-tokens", "9", "--editor-top-p", "0.9"])
    cfg = EvolveConfig.from_args(args)
    assert (cfg.generations, cfg.candidates, cfg.max_skill_tokens, cfg.editor_top_p) == (3, 5, 9, 0.9)


def test_a_step_without_gradient_still_steps_and_reports_zeros(editor_dir):
    """Every advantage 0 and β = 0: nothing to train on; the optimizer still steps (a no-op, so the schedule
    stays in sync) and the stats are zeros."""
    editor, tok = load_model(str(editor_dir))
    recorder = GradRecorder(editor)
    cands = [SimpleNamespace(prompt_ids=tok.encode("a prompt"), token_ids=[5, 6], logprobs=[-1.0, -1.0], advantage=0.0)]
    stats = train_grpo.policy_update(editor, None, recorder, cands, train_grpo.parse_args([]))
    assert recorder.grads == [{}]
    assert stats["trained_sequences"] == 0 and stats["train_tokens"] == 0 and stats["loss"] == 0.0


def test_a_prompt_past_the_editors_context_is_refused_at_set_up(editor_dir, suite_file, task_url, tmp_path):
    """--context-tokens + --max-skill-tokens beyond the editor's 1024 positions: refused once the editor is loaded,
    before the run folder is written (it used to fail at the first step, after opening the folder)."""
    out = tmp_path / "out"
    flags = common_flags(editor_dir, suite_file, task_url, out) + ["--context-tokens", "1010", "--steps", "1"]
    with pytest.raises(ValueError, match="= 1026 exceeds the editor's context of 1024 tokens"):
        train_grpo.main(flags)
    assert not out.exists()


def timeless(row: dict) -> dict:
    """A row without what the clock decides (its costs' seconds)."""
    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if "seconds" not in k}
        return value
    return strip(row)


def test_eval_in_chunks_resumes_to_the_uninterrupted_evaluation(straight_run, editor_dir, suite_file, task_url,
                                                                  tmp_path, monkeypatch, capsys):
    """--eval-chunk 2 of 3 instances: killed in the middle of the Skill-R1 row, --resume (no other flag) keeps the
    whole rows and the row's first chunk and ends with the record and table of the uninterrupted run; a resumed
    run that has finished says so and writes nothing; a changed flag is refused by name."""
    ckpt = str(straight_run[0] / "checkpoint")

    def flags(name):
        return common_flags(editor_dir, suite_file, task_url, tmp_path / name) + [
            "--eval", "--eval-instances", "3", "--eval-tasks", "2", "--eval-scoring", "shared", "--eval-chunk", "2",
            "--skillr1-editor", ckpt]
    assert train_grpo.main(flags("straight")) == 0
    straight_printed = capsys.readouterr().out
    assert "evaluated: no skill, instances 1-2 of 3" in straight_printed
    real, calls = evaluate_module.editor_row, []

    def dies_in_the_fourth_chunk(*args, **kwargs):
        calls.append(kwargs.get("first"))
        if len(calls) == 4:
            raise Interrupted
        return real(*args, **kwargs)
    monkeypatch.setattr(evaluate_module, "editor_row", dies_in_the_fourth_chunk)
    with pytest.raises(Interrupted):
        train_grpo.main(flags("resumed"))
    monkeypatch.setattr(evaluate_module, "editor_row", real)
    assert calls == [0, 2, 0, 2]      # the frozen row's two chunks, the Skill-R1 row's two
    killed = json.loads((tmp_path / "resumed" / "eval.json").read_text())
    assert len(killed["rows"]) == 3 and killed["row_under_way"]["instances_done"] == 2
    assert not killed["finished"] and len(killed["row_under_way"]["scores"]) == 2
    capsys.readouterr()
    assert train_grpo.main(["--eval", "--out", str(tmp_path / "resumed"), "--resume"]) == 0
    printed = capsys.readouterr().out
    assert "--resume: 3 whole row(s) kept, 'Skill-R1 (λ = 0.5): " in printed and "after 2 of 3 instances" in printed
    assert "evaluated: no skill" not in printed
    record = check_eval_folder(tmp_path / "resumed", printed)
    straight = json.loads((tmp_path / "straight" / "eval.json").read_text())
    assert [timeless(r) for r in record["rows"]] == [timeless(r) for r in straight["rows"]]
    assert record["paired"] == straight["paired"] and record["row_under_way"] is None
    table = [line for line in straight_printed.splitlines() if line.startswith("| ")]
    assert [line for line in printed.splitlines() if line.startswith("| ")] == table
    before = (tmp_path / "resumed" / "eval.json").read_bytes()
    assert train_grpo.main(["--eval", "--out", str(tmp_path / "resumed"), "--resume"]) == 0
    assert "has finished, nothing is left to measure" in capsys.readouterr().out
    assert (tmp_path / "resumed" / "eval.json").read_bytes() == before
    with pytest.raises(SystemExit, match="--eval-tasks 2 -> 1"):
        train_grpo.main(["--eval", "--out", str(tmp_path / "resumed"), "--resume", "--eval-tasks", "1"])


def test_joined_rows_are_the_row_of_all_the_instances():
    """Two chunks' rows (2 instances x 2 tasks, then 1 x 2) joined: success over all six scores, each generation's
    success weighted by the scoring tasks, the KL weighted by the sampled tokens, counts and costs summed."""
    def row(scores, g1, kl, tokens, calls, seconds):
        flat = [x for g in scores for x in g]
        return {"name": "r", "spec": "e", "scores": scores, "success": sum(flat) / len(flat), "skills": [{}] * len(scores),
                "per_generation": [g1, sum(flat) / len(flat)], "kl": kl, "eval_calls": calls, "evolve_calls": 2 * calls,
                "rollouts": calls, "reasoning_cut": 1, "kl_reference": "f",
                "costs": {"editor": {"sampled_tokens": tokens, "seconds": seconds, "kl_seconds": None}}}
    a = row([[1.0, 0.0], [1.0, 1.0]], 0.5, 0.2, 30, 4, 1.5)
    b = row([[0.0, 0.0]], 1.0, 0.8, 10, 2, 0.5)
    joined = joined_rows(a, b)
    assert joined["success"] == pytest.approx(3 / 6) and joined["scores"] == a["scores"] + b["scores"]
    assert joined["per_generation"] == pytest.approx([(0.5 * 4 + 1.0 * 2) / 6, 3 / 6])
    assert joined["kl"] == pytest.approx((0.2 * 30 + 0.8 * 10) / 40)
    assert (joined["eval_calls"], joined["evolve_calls"], joined["rollouts"], joined["reasoning_cut"]) == (6, 12, 6, 2)
    assert joined["costs"] == {"editor": {"sampled_tokens": 40, "seconds": 2.0, "kl_seconds": None}}
    assert len(joined["skills"]) == 3
