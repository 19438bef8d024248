"""minskill/masa/rewriter_sft.py (records -> chats, bad data handling) and minskill/sft.py (chats -> masked tokens, the chunked
target-token loss, the training loop: memorisation, resume round trip)."""
import itertools
import json
import math

import pytest
import torch

from minskill import sft
from minskill.masa import rewriter_sft as masa_sft
from minskill.nn.optim import lr_factor
from minskill.nn.sampling import generate
from minskill.nn.tokenizer import Tokenizer
from minskill.nn.weights import load_pretrained
from tiny import make_tiny_model_dir, make_tiny_tokenizer_dir



@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("tiny") / "model", family="llama", chat_format="chatml",
                               max_position_embeddings=4096)


def record(card_name: str, mistake: str, task: str = "Sums of small numbers.") -> dict:
    return {"model_card": {"name": card_name}, "skills_in": {"common_mistakes": []}, "task_description": task,
            "skills_out": {"common_mistakes": [mistake]}, "source": "late", "target_model": card_name,
            "reward_out": 1.0}


# ----------------------------------------------------------------------------------------------- data

def test_malformed_jsonl_lines_are_reported_with_line_numbers_and_skipped(tmp_path):
    good = record("alpha", "Carry the one.")
    lines = [json.dumps(good),                                   # 1 ok
             '{"model_card": {}, "skills_in": ',                 # 2 cut JSON
             "",                                                 # 3 blank: ignored silently
             json.dumps({k: v for k, v in good.items() if k != "skills_out"}),   # 4 missing field
             json.dumps([1, 2]),                                 # 5 not an object
             json.dumps({**good, "task_description": 7}),        # 6 wrong type
             json.dumps(good)]                                   # 7 ok
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(lines) + "\n")
    warnings = []
    records, problems = masa_sft.read_records([path], warn=warnings.append)
    assert records == [good, good]
    assert problems == warnings
    assert [p.split(": skipped")[0] for p in problems] == [f"{path}:{n}" for n in (2, 4, 5, 6)]
    assert "invalid JSON" in problems[0]
    assert "missing field 'skills_out'" in problems[1]
    assert "expected a JSON object" in problems[2]
    assert "'task_description' must be a JSON string" in problems[3]
    with pytest.raises(FileNotFoundError, match="not found"):
        masa_sft.read_records([tmp_path / "absent.jsonl"])


def test_a_byte_order_mark_keeps_the_first_record(tmp_path):
    records = [record("alpha", "Carry the one."), record("beta", "Borrow ten.")]
    path = tmp_path / "data.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\r\n" for r in records).encode())
    assert masa_sft.read_records([path], warn=pytest.fail) == (records, [])


def test_invalid_utf8_is_reported_with_file_and_line_not_replaced(tmp_path):
    good = json.dumps(record("alpha", "Carry the one.")).encode()
    path = tmp_path / "data.jsonl"
    path.write_bytes(good + b"\n" + good.replace(b"Carry", b"C\xe4rry") + b"\n" + good + b"\n")
    warnings = []
    records, problems = masa_sft.read_records([path], warn=warnings.append)
    assert records == [record("alpha", "Carry the one.")] * 2
    assert problems == warnings and len(problems) == 1
    assert problems[0].startswith(f"{path}:2: skipped: not UTF-8")


def test_a_record_with_a_lone_surrogate_is_reported_with_file_and_line_and_skipped(tmp_path):
    """The string "\\ud800" is valid JSON but no text; the tokenizer raised on it (a traceback)."""
    good = json.dumps(record("alpha", "Carry the one."))
    path = tmp_path / "data.jsonl"
    path.write_text(good + "\n" + good.replace("Carry", "C\\ud800rry") + "\n" + good + "\n")
    warnings = []
    records, problems = masa_sft.read_records([path], warn=warnings.append)
    assert records == [record("alpha", "Carry the one.")] * 2
    assert problems == warnings == [f"{path}:2: skipped: skills_out.common_mistakes[0] is not Unicode text "
                                    "(a lone surrogate: a \\ud800-\\udfff escape without its pair)"]


@pytest.mark.parametrize("chat_format", ["chatml", "llama3"])
def test_loss_mask_covers_exactly_the_target_tokens(tmp_path, chat_format):
    tok = Tokenizer.from_pretrained(make_tiny_tokenizer_dir(tmp_path / chat_format, chat_format))
    prompt, target = masa_sft.record_messages(record("alpha", "Carry the one."))
    assert prompt[0]["content"] == masa_sft.REWRITER_SYSTEM_PROMPT and '"name": "alpha"' in prompt[1]["content"]
    assert json.loads(target) == {"common_mistakes": ["Carry the one."]}
    eot = sft.end_of_turn_id(tok)
    assert eot == tok.token_to_id("<|im_end|>" if chat_format == "chatml" else "<|eot_id|>")

    example = sft.encode_chat(tok, prompt, target, max_length=4096)
    prompt_ids = tok.apply_chat_template(prompt, add_generation_prompt=True)
    assert example.input_ids[:example.num_prompt_tokens] == prompt_ids          # the inference prompt, as is
    assert example.input_ids[example.num_prompt_tokens:] == tok.encode(target) + [eot]
    # The sequence is the chat template's rendering of the whole conversation (up to the end of the turn).
    full = tok.render_chat(prompt + [{"role": "assistant", "content": target}], add_generation_prompt=False)
    assert tok.decode(example.input_ids, skip_special_tokens=False) == full.rstrip("\n")

    short = sft.encode_chat(tok, prompt[:1] + [{"role": "user", "content": "hi"}], "{}", max_length=4096)
    input_ids, loss_mask = sft.collate([example, short], pad_id=tok.pad_token_id)
    assert input_ids.shape == loss_mask.shape == (2, len(example.input_ids))
    for row, e in enumerate([example, short]):
        expected = [i >= e.num_prompt_tokens and i < len(e.input_ids) for i in range(input_ids.shape[1])]
        assert loss_mask[row].tolist() == expected
        assert tok.decode(input_ids[row][loss_mask[row]].tolist(), skip_special_tokens=False) == \
            tok.decode(e.input_ids[e.num_prompt_tokens:], skip_special_tokens=False)
    assert input_ids[1, len(short.input_ids):].eq(tok.pad_token_id).all()      # right padding


def test_too_long_records_are_skipped_or_truncated_and_counted(tiny_dir):
    tok = Tokenizer.from_pretrained(tiny_dir)
    records = [record("alpha", "Carry the one."), record("beta", "x " * 300)]
    lengths = [len(sft.encode_chat(tok, *masa_sft.record_messages(r), max_length=10**6).input_ids) for r in records]
    limit = (lengths[0] + lengths[1]) // 2
    kept, counts = masa_sft.encode_records(tok, records, max_length=limit, too_long="skip")
    assert len(kept) == 1 and counts == {"kept": 1, "truncated": 0, "skipped_too_long": 1}
    kept, counts = masa_sft.encode_records(tok, records, max_length=limit, too_long="truncate")
    assert counts == {"kept": 2, "truncated": 1, "skipped_too_long": 0}
    assert len(kept[1].input_ids) == limit and kept[1].truncated and kept[1].num_target_tokens > 0
    _, counts = masa_sft.encode_records(tok, records, max_length=20, too_long="truncate")   # prompt alone too long
    assert counts["skipped_too_long"] == 2


# ----------------------------------------------------------------------------------------------- loss

def test_target_nll_equals_full_logit_reference_and_ignores_padding(tiny_dir):
    tok, model = Tokenizer.from_pretrained(tiny_dir), load_pretrained(tiny_dir)
    examples, _ = masa_sft.encode_records(tok, [record("alpha", "Carry the one."),
                                           record("beta", "Check the units twice.", task="Unit conversion.")])
    assert len(examples[0].input_ids) != len(examples[1].input_ids)
    with torch.no_grad():
        reference = []
        for e in examples:     # -Σ log softmax(logits[t-1])[y_t] over target tokens, from the full logits
            ids = torch.tensor([e.input_ids])
            logp = torch.log_softmax(model(ids).float()[0, :-1], dim=-1)
            targets = ids[0, 1:]
            picked = logp.gather(1, targets[:, None])[:, 0][e.num_prompt_tokens - 1:]
            reference.append((-picked.sum().item(), e.num_target_tokens))
        input_ids, loss_mask = sft.collate(examples, tok.pad_token_id)
        batch_nll, batch_n = sft.target_nll(model, input_ids, loss_mask, chunk_tokens=7)
    assert batch_n == sum(n for _, n in reference)
    assert batch_nll.item() == pytest.approx(sum(v for v, _ in reference), rel=1e-5)
    # chunked + checkpointed with gradients gives the same value and a gradient
    nll, _ = sft.target_nll(model, input_ids, loss_mask, chunk_tokens=5)
    nll.backward()
    assert nll.item() == pytest.approx(batch_nll.item(), rel=1e-5)
    assert model.lm_head.weight.grad is not None and model.lm_head.weight.grad.abs().sum() > 0


def test_shared_prompts_give_the_same_loss_and_gradient_as_whole_chats(tiny_dir):
    tok, model = Tokenizer.from_pretrained(tiny_dir), load_pretrained(tiny_dir)
    prompt = [{"role": "user", "content": "Write a skill for sums."}]
    other = [{"role": "user", "content": "Write a skill for unit conversion, please."}]
    examples = [sft.encode_chat(tok, p, t, 4096) for p, t in [(prompt, "Add the two numbers."),
                (prompt, "Carry the one, then say the answer."), (prompt, "Sum."), (other, "1 hour = 60 minutes.")]]

    def loss_and_grads(share: bool):
        model.zero_grad(set_to_none=True)
        cfg = sft.SFTConfig(micro_batch_size=4, share_prompts=share)
        n_targets = sum(e.num_target_tokens for e in examples)
        nll = sft._forward_backward(model, examples, tok.pad_token_id, torch.device("cpu"), cfg, n_targets)
        return nll, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    whole, shared = loss_and_grads(False), loss_and_grads(True)
    assert shared[0] == pytest.approx(whole[0], rel=1e-5)
    assert whole[1].keys() == shared[1].keys() and len(whole[1]) > 0
    for name, grad in whole[1].items():
        assert torch.allclose(shared[1][name], grad, rtol=1e-4, atol=1e-6), name


def test_shared_prompts_keep_each_prompts_chats_together_in_the_epoch_order(tiny_dir):
    tok = Tokenizer.from_pretrained(tiny_dir)
    chats = [([{"role": "user", "content": f"prompt {k % 3}"}], f"target {k}") for k in range(10)]
    examples = [sft.encode_chat(tok, p, t, 4096) for p, t in chats]
    groups = sft.prompt_groups(examples)
    assert groups == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]
    group_of = {i: k for k, g in enumerate(groups) for i in g}
    for epoch in range(4):
        order = sft.epoch_order(len(examples), 0, epoch, groups)
        assert sorted(order) == list(range(10)) and order == sft.epoch_order(len(examples), 0, epoch, groups)
        runs = [list(run) for _, run in itertools.groupby(order, key=group_of.get)]   # each group: one whole run
        assert sorted(runs) == sorted(groups)
    assert len({tuple(sft.epoch_order(10, 0, e, groups)) for e in range(4)}) > 1   # shuffled between epochs


def test_learning_rate_schedule_warmup_then_cosine():
    """SFT's schedule is minskill.nn.optim.lr_factor times the peak lr (the one Skill-R1 uses too)."""
    total, peak = 100, 1e-3
    lrs = [peak * lr_factor(s, total, warmup_ratio=0.1) for s in range(total)]
    assert lrs[0] == pytest.approx(peak / 10) and lrs[9] == pytest.approx(peak)       # 10 warmup steps
    assert all(a < b for a, b in zip(lrs[:9], lrs[1:10]))
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))                          # then decays
    assert peak * lr_factor(10 + 45, total, 0.1) == pytest.approx(peak * 0.5)        # halfway through cosine
    assert peak * lr_factor(total, total, 0.1, min_ratio=0.1) == pytest.approx(peak * 0.1)
    with pytest.raises(ValueError, match="multiple of micro_batch_size"):
        sft.SFTConfig(batch_size=4, micro_batch_size=3)


# ----------------------------------------------------------------------------------------------- training

def test_training_loss_falls_and_the_model_reproduces_memorised_targets(tiny_dir, tmp_path):
    tok, model = Tokenizer.from_pretrained(tiny_dir), load_pretrained(tiny_dir)
    records = [record("alpha", "Carry the one."), record("beta", "Check units.")]
    examples, _ = masa_sft.encode_records(tok, records)
    cfg = sft.SFTConfig(lr=2e-2, epochs=40, batch_size=2, micro_batch_size=2, eval_every=10, save_every=1000,
                        log_every=10)
    lines = []
    summary = sft.train_sft(model, tok, examples, tmp_path / "run", cfg, val_examples=examples, log=lines.append)
    assert summary["finished"] and summary["step"] == 40

    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 41))
    assert rows[0]["loss"] > 4.0 and rows[-1]["loss"] < 0.1 * rows[0]["loss"]          # falls clearly
    assert [r["step"] for r in rows if "val_loss" in r] == [10, 20, 30, 40]
    assert all(0 < r["seconds"] < 600 for r in rows)                                  # per step, for the report
    assert any(line.startswith("step 10/40 | loss ") and "tok/s | ETA " in line for line in lines)
    assert (tmp_path / "run" / "loss.svg").read_text().startswith("<svg")

    trained = load_pretrained(tmp_path / "run" / "final")                  # the saved HF folder
    Tokenizer.from_pretrained(tmp_path / "run" / "final")
    for e, r in zip(examples, records):
        sample = generate(trained, [e.input_ids[:e.num_prompt_tokens]], max_new_tokens=40, temperature=0,
                          stop_token_ids=tok.stop_token_ids, tokenizer=tok, pad_id=tok.pad_token_id)[0]
        assert sample.finish_reason == "stop"
        assert json.loads(sample.text) == r["skills_out"]          # conditioned on the model card


def test_resume_continues_exactly_like_an_uninterrupted_run(tiny_dir, tmp_path):
    tok = Tokenizer.from_pretrained(tiny_dir)
    records = [record(n, m) for n, m in [("a", "One."), ("b", "Two two."), ("c", "Three."), ("d", "Four!")]]
    examples, _ = masa_sft.encode_records(tok, records)
    # 4 records, batch 2 (2 micro-batches of 1) -> 2 steps per epoch; 3 epochs = 6 steps; stop mid-epoch at 3
    cfg = dict(lr=1e-2, epochs=3, batch_size=2, micro_batch_size=1, save_every=100, log_every=100, seed=3)

    full = load_pretrained(tiny_dir)
    sft.train_sft(full, tok, examples, tmp_path / "full", sft.SFTConfig(**cfg), log=lambda _: None)

    first = load_pretrained(tiny_dir)
    summary = sft.train_sft(first, tok, examples, tmp_path / "cut", sft.SFTConfig(**cfg, max_steps=3),
                            log=lambda _: None)
    assert not summary["finished"] and sft.latest_checkpoint(tmp_path / "cut").name == "checkpoint-3"
    assert not (tmp_path / "cut" / "final").exists()
    with open(tmp_path / "cut" / "metrics.jsonl", "a") as f:     # a row logged after the checkpoint is dropped
        f.write(json.dumps({"step": 4, "loss": 123.0}) + "\n")
    with pytest.raises(ValueError, match="checkpoints of an earlier run"):   # never mixed with a fresh run
        sft.train_sft(first, tok, examples, tmp_path / "cut", sft.SFTConfig(**cfg), log=lambda _: None)
    with pytest.raises(ValueError, match=r"differ from the checkpoint's run.*lr 0.01 -> 0.02"):  # the result's flags
        sft.train_sft(load_pretrained(tiny_dir), tok, examples, tmp_path / "cut",
                      sft.SFTConfig(**{**cfg, "lr": 2e-2}), resume=True, log=lambda _: None)
    with pytest.raises(ValueError, match="training data differ"):
        sft.train_sft(load_pretrained(tiny_dir), tok, examples[:3], tmp_path / "cut", sft.SFTConfig(**cfg),
                      resume=True, log=lambda _: None)
    resumed = load_pretrained(tiny_dir)              # fresh base weights, replaced on resume
    lines = []
    summary = sft.train_sft(resumed, tok, examples, tmp_path / "cut", sft.SFTConfig(**cfg), resume=True,
                            log=lines.append)
    assert summary["finished"] and any("continuing from" in line and "step 3/6" in line for line in lines)

    expected = full.state_dict()
    for name, tensor in resumed.state_dict().items():
        assert torch.equal(tensor, expected[name]), name
    loss_of = lambda run: [json.loads(l)["loss"] for l in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]
    assert loss_of("cut") == loss_of("full") and len(loss_of("full")) == 6
    saved = load_pretrained(tmp_path / "cut" / "final")
    assert all(torch.equal(t, expected[n]) for n, t in saved.state_dict().items())


def test_keep_checkpoints_leaves_the_newest_ones(tiny_dir, tmp_path):
    """6 steps saved every step, keep 2: checkpoint-5 and checkpoint-6 stay (and final), the older ones go."""
    tok = Tokenizer.from_pretrained(tiny_dir)
    records = [record(n, m) for n, m in [("a", "One."), ("b", "Two two."), ("c", "Three."), ("d", "Four!")]]
    examples, _ = masa_sft.encode_records(tok, records)
    cfg = sft.SFTConfig(lr=1e-2, epochs=3, batch_size=2, micro_batch_size=1, save_every=1, log_every=100,
                        keep_checkpoints=2)
    sft.train_sft(load_pretrained(tiny_dir), tok, examples, tmp_path / "run", cfg, log=lambda _: None)
    assert [p.name for p in sft.checkpoints(tmp_path / "run")] == ["checkpoint-6", "checkpoint-5"]
    assert (tmp_path / "run" / "final").is_dir()


def test_svg_plot_and_throughput_hook(tiny_dir, tmp_path):
    sft.write_svg_plot(tmp_path / "p.svg", {"train": [(1, 3.0), (2, 2.0)], "val": [(2, 2.5)]}, "t", "x", "y")
    text = (tmp_path / "p.svg").read_text()
    assert text.startswith("<svg") and text.count("<polyline") == 2 and "val" in text
    model = load_pretrained(tiny_dir)
    ids = torch.randint(3, model.config.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
    result = sft.sft_throughput(model, ids, steps=2, warmup_steps=1)
    assert result["tokens_per_step"] == 64 and result["tokens_per_s"] > 0 and math.isfinite(result["loss"])
