"""minskill/nn/lora.py and the --lora-* flags of train_grpo.py and rewrite.py, on tiny random models: at init the
adapted model is the base and only the adapters train; merged weights and PEFT (the reference, test-only) give
the adapted logits; adapters_disabled is the base (the KL reference); train_grpo writes merged + adapter/ and
resumes exactly; the learning test passes with LoRA; rewrite.py train trains and resumes a LoRA rewriter."""
import contextlib
import io
import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

import train_grpo
from helpers import (ROW_FIELDS, TIMING_FIELDS, assert_learning_raises_the_reward, common_flags,
                     crash_after_checkpoint, keyword_task_model, read_rows, run_rewrite)
from minskill.nn.lora import (ADAPTER_DIR, AdaptersOff, adapters_disabled, apply_lora,
                              load_peft_adapter, lora_layers, merged_model, save_lora_model,
                              save_peft_adapter, trainable_parameters)
from minskill.nn.weights import load_model, load_pretrained
from minskill.skill_r1 import run_setup
from minskill.serve.backends import ScriptedBackend
from minskill.serve.server import start_server
from tiny import make_tiny_model_dir

IDS = torch.tensor([[1, 5, 7, 9, 11, 40, 3, 77], [2, 8, 30, 31, 32, 6, 90, 4]])
FAMILIES = [("llama", True), ("qwen2", False), ("qwen3", True)]      # (family, tied embeddings)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora-models")
    return {family: make_tiny_model_dir(root / family, family=family, tied=tied) for family, tied in FAMILIES}


def adapted(folder, rank=4, seed=0, **kwargs):
    model = load_pretrained(folder)
    return apply_lora(model, rank, seed=seed, base_model_name_or_path=str(folder), **kwargs)


def train_steps(model, steps=3, lr=1e-2):
    """A few AdamW steps of next-token cross-entropy on IDS, as a trainer would take them."""
    optimizer = torch.optim.AdamW(trainable_parameters(model), lr=lr)
    model.train()
    for _ in range(steps):
        logits = model(IDS[:, :-1])
        F.cross_entropy(logits.flatten(0, 1), IDS[:, 1:].flatten()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()
    return optimizer


# ------------------------------------------------------------------------------------------ the method


def test_at_init_the_adapted_model_is_the_base_and_only_the_adapters_train(model_dirs):
    base = load_pretrained(model_dirs["qwen3"])
    with torch.no_grad():
        base_logits = base(IDS)
    before = {k: v.clone() for k, v in base.state_dict().items()}
    model = apply_lora(base, rank=4)
    with torch.no_grad():
        assert torch.equal(model(IDS), base_logits)                     # B = 0: exactly the base
    cfg = model.config
    H, L, I = cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size
    q, kv = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim
    per_layer = 4 * ((H + q) * 2 + (H + kv) * 2 + (H + I) * 3)      # r·(in + out) for the 7 projections
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert all(".lora_A." in n or ".lora_B." in n for n in names) and len(names) == 2 * 7 * L
    assert sum(p.numel() for p in trainable_parameters(model)) == L * per_layer
    assert all(p.dtype == torch.float32 for p in trainable_parameters(model))

    optimizer = train_steps(model)
    after = model.state_dict()
    for key, value in before.items():                                # the base: bit-identical
        assert torch.equal(after[key], value), key
    for name, layer in lora_layers(model):                           # the adapters: both moved
        assert layer.lora_B.weight.abs().sum() > 0, name
    assert all(s["exp_avg"].dtype == torch.float32 for s in optimizer.state.values())
    assert len(optimizer.state) == 2 * 7 * L
    with torch.no_grad():
        assert not torch.allclose(model(IDS), base_logits)


@pytest.mark.parametrize("family", [f for f, _ in FAMILIES])
def test_merged_weights_give_the_adapted_logits(model_dirs, family, tmp_path):
    model = adapted(model_dirs[family])
    train_steps(model)
    with torch.no_grad():
        logits = model(IDS)
        torch.testing.assert_close(merged_model(model)(IDS), logits, rtol=0, atol=1e-5)
    save_lora_model(model, tmp_path / "ckpt")                        # merged in HF layout + adapter/
    base_keys = set(load_file(str(model_dirs[family] / "model.safetensors")))
    assert set(load_file(str(tmp_path / "ckpt" / "model.safetensors"))) == base_keys
    with torch.no_grad():
        torch.testing.assert_close(load_pretrained(tmp_path / "ckpt")(IDS), logits, rtol=0, atol=1e-5)
        # the adapter folder alone, loaded onto a fresh base, is the same model
        again = load_peft_adapter(adapted(model_dirs[family], seed=7), tmp_path / "ckpt" / ADAPTER_DIR)
        assert torch.equal(again(IDS), logits)


@pytest.mark.parametrize("family", [f for f, _ in FAMILIES])
def test_peft_loads_the_adapter_onto_the_transformers_base_with_the_same_logits(model_dirs, family, tmp_path):
    peft = pytest.importorskip("peft")
    transformers = pytest.importorskip("transformers")
    model = adapted(model_dirs[family])
    train_steps(model)
    save_peft_adapter(model, tmp_path / "adapter")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["lora_alpha"] == 8
    assert config["base_model_name_or_path"] == str(model_dirs[family])
    names = set(load_file(str(tmp_path / "adapter" / "adapter_model.safetensors")))
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in names
    assert "base_model.model.model.layers.1.mlp.down_proj.lora_B.weight" in names and len(names) == 2 * 7 * 2
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(model_dirs[family]), dtype=torch.float32)
    with torch.no_grad():
        base = hf(IDS).logits
        reference = peft.PeftModel.from_pretrained(hf, str(tmp_path / "adapter")).eval()   # wraps hf in place
        theirs, ours = reference(IDS).logits, model(IDS)
    assert not torch.allclose(ours, base)                            # the adapter does something
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-4)


def test_adapters_disabled_is_the_base_the_kl_reference(model_dirs):
    base = load_pretrained(model_dirs["llama"])
    with torch.no_grad():
        base_logits, base_hidden = base(IDS), base.hidden_states(IDS)
    model = adapted(model_dirs["llama"])
    train_steps(model)
    with torch.no_grad():
        trained = model(IDS)
        with adapters_disabled(model):
            assert torch.equal(model(IDS), base_logits)
            with adapters_disabled(model):                           # nesting restores the outer state
                pass
            assert torch.equal(model(IDS), base_logits)
        assert torch.equal(model(IDS), trained)
        reference = AdaptersOff(model)                               # a view, not a copy of the weights
        assert torch.equal(reference(IDS), base_logits) and torch.equal(reference.hidden_states(IDS), base_hidden)
        assert reference.lm_head is model.lm_head and reference.config is model.config
        assert torch.equal(model(IDS), trained)


def test_a_bfloat16_base_keeps_float32_adapters_and_optimizer_state(model_dirs):
    model = adapted(model_dirs["qwen2"], base_dtype=torch.bfloat16)
    bf16 = load_pretrained(model_dirs["qwen2"], dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(model(IDS), bf16(IDS))
    assert {p.dtype for n, p in model.named_parameters() if ".lora_" not in n} == {torch.bfloat16}
    optimizer = train_steps(model)
    assert {p.dtype for p in trainable_parameters(model)} == {torch.float32}
    assert all(s["exp_avg"].dtype == torch.float32 and s["exp_avg_sq"].dtype == torch.float32
               for s in optimizer.state.values())
    assert merged_model(model).dtype == torch.float32               # a bf16 merge would round the update away


def test_lora_creates_its_tensors_on_the_models_device(model_dirs, tmp_path):
    """As tests/test_device_placement.py: the model on the CPU while torch's default device is `meta`, so a tensor
    made without device= would raise (the CPU stand-in for CUDA). Adapting, a GRPO update with the adapters-off
    reference (β > 0), merging and saving all run there. SGD, because AdamW makes its step counter on the default
    device by design."""
    model, tokenizer = load_model(str(model_dirs["llama"]), device="cpu")
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": f"q {i}"}], add_generation_prompt=True)
               for i in range(2)]
    candidates = [SimpleNamespace(prompt_ids=prompts[i % 2], token_ids=[5 + i, 6, 7], logprobs=[-1.0] * 3,
                                  advantage=a) for i, a in enumerate([0.5, -0.5, 0.25, -0.25])]
    args = train_grpo.parse_args(["--beta", "0.05", "--ppo-epochs", "2", "--max-skill-tokens", "8"])
    with torch.device("meta"):
        apply_lora(model, 4)
        optimizer = torch.optim.SGD(trainable_parameters(model), lr=1e-2)
        stats = train_grpo.policy_update(model, AdaptersOff(model), optimizer, candidates, args)
        merged = merged_model(model)
        save_lora_model(model, tmp_path / "ckpt")
    assert stats["trained_sequences"] == 4 and stats["kl_mean"] > 0
    assert merged.device.type == "cpu" and (tmp_path / "ckpt" / ADAPTER_DIR / "adapter_model.safetensors").is_file()


def test_bad_settings_are_clear_errors(model_dirs, capsys):
    with pytest.raises(ValueError, match="rank must be a positive integer"):
        adapted(model_dirs["llama"], rank=0)
    with pytest.raises(ValueError, match="unknown LoRA target module 'qproj'"):
        adapted(model_dirs["llama"], target_modules=("q_proj", "qproj"))
    with pytest.raises(ValueError, match="already has LoRA"):
        apply_lora(adapted(model_dirs["llama"]), 4)
    folder = save_peft_adapter(adapted(model_dirs["llama"]), Path(model_dirs["llama"]).parent / "r4")
    with pytest.raises(ValueError, match="saved with"):              # a rank-8 model cannot take a rank-4 adapter
        load_peft_adapter(adapted(model_dirs["llama"], rank=8), folder)
    for argv, message in ((["--lora-rank", "-2"], "--lora-rank must be >= 0"),
                          (["--lora-rank", "4", "--lora-targets", "q_proj,mlp"], "unknown LoRA target module 'mlp'"),
                          (["--lora-alpha", "8"], "need --lora-rank > 0"),
                          (["--lora-rank", "4", "--lora-dropout", "1"], "dropout must be in [0, 1)")):
        with pytest.raises(SystemExit):
            train_grpo.parse_args(argv)
        assert message in capsys.readouterr().err, argv
    args = train_grpo.parse_args(["--lora-rank", "8"])
    assert args.lora_alpha == 16.0 and args.lora_targets == ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                             "up_proj", "down_proj"]


def truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 2])


def with_config(folder: Path, **changes) -> None:
    config = json.loads((folder / "adapter_config.json").read_text())
    (folder / "adapter_config.json").write_text(json.dumps({**config, **changes}))


ADAPTER_DAMAGE = [   # (what is done to adapter/, what the error says)
    (lambda folder: shutil.rmtree(folder), "no LoRA adapter (missing adapter_config.json and adapter_model.safetensors)"),
    (lambda folder: (folder / "adapter_model.safetensors").unlink(), "no LoRA adapter (missing adapter_model.safetensors)"),
    (lambda folder: truncated(folder / "adapter_model.safetensors"),
     "adapter_model.safetensors: damaged, not a readable safetensors file"),
    (lambda folder: (folder / "adapter_config.json").write_text("{"), "adapter_config.json: damaged, not readable JSON"),
    (lambda folder: (folder / "adapter_config.json").write_text("[4]"), "adapter_config.json: not a PEFT adapter config"),
    (lambda folder: with_config(folder, r=8), "adapter_config.json: the adapter was saved with {'r': 8"),
    (lambda folder: with_config(folder, lora_alpha="x"), "adapter_config.json: the adapter was saved with"),
]


@pytest.mark.parametrize("damage, message", ADAPTER_DAMAGE)
def test_a_damaged_adapter_is_an_error_naming_the_file_and_leaves_the_model_alone(model_dirs, tmp_path, damage,
                                                                                 message):
    """Each was a traceback (or an error that named no file)."""
    model = adapted(model_dirs["llama"])
    train_steps(model)
    folder = save_peft_adapter(model, tmp_path / "adapter")
    damage(folder)
    target = adapted(model_dirs["llama"], seed=3)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises((FileNotFoundError, ValueError), match=re.escape(message)):
        load_peft_adapter(target, folder)
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())


def test_an_adapter_missing_one_tensor_is_refused_before_any_is_copied(model_dirs, tmp_path):
    model = adapted(model_dirs["llama"])
    train_steps(model)
    folder = save_peft_adapter(model, tmp_path / "adapter")
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    last = sorted(tensors)[-1]
    save_file({k: v for k, v in tensors.items() if k != last}, str(folder / "adapter_model.safetensors"))
    target = adapted(model_dirs["llama"], seed=3)
    before = {k: v.clone() for k, v in target.state_dict().items()}
    with pytest.raises(ValueError, match=re.escape(f"adapter_model.safetensors: tensor {last} is missing")):
        load_peft_adapter(target, folder)
    assert all(torch.equal(before[k], v) for k, v in target.state_dict().items())


# ------------------------------------------------------------------------------------------ train_grpo.py


@pytest.fixture(scope="module")
def task_server():
    with start_server(ScriptedBackend(keyword_task_model, name="keywords")) as server:
        yield server


def lora_flags(editor_dir, suite_file, task_server, out):
    """LoRA r = 4 with dropout 0.1 on the adapters' input: its masks come from torch's RNG, which a resume
    must restore for the run to continue exactly."""
    return common_flags(editor_dir, suite_file, task_server.url, out) + ["--lora-dropout", "0.1", "--lora-rank", "4",
                                                                          "--lr", "3e-2", "--steps", "3"]


@pytest.fixture(scope="module")
def lora_run(editor_dir, suite_file, task_server, tmp_path_factory):
    """3 LoRA steps without interruption (checkpoints after steps 2 and 3); returns (out, printed)."""
    out = tmp_path_factory.mktemp("lora-straight")
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        assert train_grpo.main(lora_flags(editor_dir, suite_file, task_server, out)) == 0
    return out, buffer.getvalue()


def test_a_lora_run_writes_the_merged_editor_and_its_peft_adapter(lora_run, editor_dir):
    out, printed = lora_run
    assert "LoRA r=4 α=8 on q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj" in printed
    assert "its LoRA adapter alone in adapter/ (PEFT layout)" in printed
    ckpt = out / "checkpoint"
    assert set(load_file(str(ckpt / "model.safetensors"))) == set(load_file(str(editor_dir / "model.safetensors")))
    assert (ckpt / ADAPTER_DIR / "adapter_config.json").is_file()
    config = json.loads((ckpt / ADAPTER_DIR / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(Path(editor_dir).resolve())
    merged, tokenizer = load_model(str(ckpt))                        # what --eval and HF tools load
    rebuilt = load_peft_adapter(adapted(editor_dir), ckpt / ADAPTER_DIR)
    with torch.no_grad():
        torch.testing.assert_close(merged(IDS), rebuilt(IDS), rtol=0, atol=1e-5)
        assert not torch.allclose(merged(IDS), load_pretrained(editor_dir)(IDS))   # it trained
    state = torch.load(ckpt / "trainer_state.pt", weights_only=True)
    assert state["args"]["lora_rank"] == 4 and len(state["optimizer"]["state"]) == 2 * 7 * 2   # adapters only


def test_a_lora_run_resumed_equals_the_uninterrupted_one(lora_run, editor_dir, suite_file, task_server, tmp_path,
                                                         monkeypatch):
    out = tmp_path / "resumed"
    flags = lora_flags(editor_dir, suite_file, task_server, out)
    crash_after_checkpoint(monkeypatch, flags, step=2, error=KeyboardInterrupt)
    assert train_grpo.main(flags + ["--resume"]) == 0
    straight, resumed = read_rows(lora_run[0]), read_rows(out)
    assert len(resumed) == 3
    for a, b in zip(straight, resumed):
        for key in set(ROW_FIELDS) - set(TIMING_FIELDS):
            assert a[key] == b[key], (a["step"], key)
    for name in ("model.safetensors", f"{ADAPTER_DIR}/adapter_model.safetensors"):
        w_straight = load_file(str(lora_run[0] / "checkpoint" / name))
        w_resumed = load_file(str(out / "checkpoint" / name))
        assert w_straight.keys() == w_resumed.keys() and all(torch.equal(w_straight[k], w_resumed[k]) for k in w_straight)
    with pytest.raises(SystemExit, match="--lora-rank 4 -> 8"):
        train_grpo.main(flags[:-6] + ["--lora-rank", "8", "--lr", "3e-2", "--steps", "3", "--resume"])


@pytest.mark.parametrize("damage, message", [ADAPTER_DAMAGE[0], ADAPTER_DAMAGE[2], ADAPTER_DAMAGE[5]])
def test_train_grpo_resume_of_a_damaged_adapter_names_the_file(lora_run, editor_dir, suite_file, task_server,
                                                              tmp_path, damage, message):
    """A missing or corrupt adapter, or one saved with another r, was a traceback."""
    out = tmp_path / "run"
    shutil.copytree(lora_run[0], out)
    damage(out / "checkpoint" / ADAPTER_DIR)
    with pytest.raises(SystemExit) as caught:
        train_grpo.main(lora_flags(editor_dir, suite_file, task_server, out) + ["--resume"])
    text = str(caught.value.code)
    assert text.startswith(f"--resume: {out / 'checkpoint' / ADAPTER_DIR}") and message in text
    assert "no earlier checkpoint" in text


def test_beta_with_lora_uses_the_editor_with_adapters_off_as_reference(editor_dir, suite_file, task_server, tmp_path,
                                                                       capsys):
    def flags(out):
        return lora_flags(editor_dir, suite_file, task_server, out)[:-2] + [
            "--steps", "1", "--beta", "0.1", "--ppo-epochs", "2", "--agg", "seq_mean", "--bf16", "--grad-checkpointing"]

    assert train_grpo.main(flags(tmp_path / "beta")) == 0
    assert "reference model: the editor with its LoRA adapters off" in capsys.readouterr().out
    [row] = read_rows(tmp_path / "beta")
    # epoch 1 starts at the reference (adapters at B = 0: KL 0); epoch 2 after one update: KL > 0, ratio != 1
    assert row["kl"] > 0 and row["ratio_mean"] != 1.0
    run = run_setup.setup(train_grpo.parse_args(flags(tmp_path / "setup")))
    assert isinstance(run.ref_model, AdaptersOff) and run.ref_model.model is run.editor   # no second copy


def test_bilevel_grpo_raises_the_reward_of_a_tiny_lora_editor(tmp_path, task_server):
    """test_skill_r1's learning test with LoRA (r = 4, α = 8, all 7 projections), lr 3e-2, 40 steps, on a tiny
    editor drawn with init_std 0.2. Why not its 15 steps at lr 1e-2 on the init_std 0.05 editor: LoRA leaves the
    (tied) embedding and lm_head frozen, and that editor's logits span too little (std ≈ 0.4) for a frozen output
    layer to make keyword tokens likely: measured there, LoRA gained +0.02..+0.15 in 40 steps at lr 3e-2, and full
    training of everything but the embedding +0.14..+0.15 in 15 steps. On init_std 0.2 editors (logit std ≈ 1.6,
    nearer a trained LM) with exactly this loop (first 3 steps -> last 3 steps), seeds 0-4: +0.61, +0.35, +0.57,
    +0.55, +0.36 (lr 5e-2 was less stable: +0.13..+0.47; r = 8: +0.31..+0.70). The threshold is the full-FT test's
    +0.25. About 20 s on one busy core."""
    folder = make_tiny_model_dir(tmp_path / "editor", family="llama", chat_format="chatml",
                                 max_position_embeddings=1024, init_std=0.2)
    torch.manual_seed(0)
    editor, tok = load_model(str(folder))
    apply_lora(editor, 4)
    assert_learning_raises_the_reward(editor, tok, task_server.client(), trainable_parameters(editor), lr=3e-2,
                                      steps=40)


# ------------------------------------------------------------------------------------------ rewrite.py train





@pytest.fixture(scope="module")
def sft_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("rewriter")
    base = make_tiny_model_dir(root / "base", family="qwen3", chat_format="chatml", max_position_embeddings=4096)
    records = [{"model_card": {"name": name}, "skills_in": {"common_mistakes": []}, "task_description": "Sums.",
                "skills_out": {"common_mistakes": [mistake]}} for name, mistake in (("a", "Carry."), ("b", "Borrow."))]
    (root / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (root / "card.json").write_text(json.dumps({"name": "a"}))
    (root / "skills.json").write_text(json.dumps({"common_mistakes": []}))
    return root, base


def train_rewriter(sft_files, out, *extra):
    root, base = sft_files
    return run_rewrite(["train", str(root / "sft.jsonl"), "--base-model", str(base), "--out", str(out),
                        "--lora-rank", "4", "--lr", "2e-2", "--epochs", "6", "--batch-size", "2",
                        "--micro-batch", "2", "--val-fraction", "0", "--save-every", "2", "--device", "cpu",
                        *extra])


def test_rewrite_train_with_lora_writes_merged_and_adapter_and_resumes_exactly(sft_files, tmp_path):
    root, base = sft_files
    code, stdout, stderr = train_rewriter(sft_files, tmp_path / "straight")
    assert code == 0, stderr
    assert "M trained" in stdout and "step 6/6" in stdout
    final = tmp_path / "straight" / "final"
    assert set(load_file(str(final / "model.safetensors"))) == set(load_file(str(base / "model.safetensors")))
    assert (final / ADAPTER_DIR / "adapter_model.safetensors").is_file()
    assert (tmp_path / "straight" / "checkpoint-6" / ADAPTER_DIR / "adapter_config.json").is_file()
    losses = [json.loads(line)["loss"] for line in (tmp_path / "straight" / "metrics.jsonl").read_text().splitlines()]
    assert losses[-1] < losses[0]
    assert json.loads((tmp_path / "straight" / "run_config.json").read_text())["lora"]["lora_rank"] == 4
    with torch.no_grad():
        rebuilt = load_peft_adapter(adapted(base), final / ADAPTER_DIR)
        torch.testing.assert_close(load_pretrained(final)(IDS), rebuilt(IDS), rtol=0, atol=1e-5)

    # stopped after 3 steps, then resumed: the same final weights as the uninterrupted run
    assert train_rewriter(sft_files, tmp_path / "resumed", "--max-steps", "3")[0] == 0
    code, stdout, stderr = run_rewrite(["train", "--out", str(tmp_path / "resumed"), "--resume", "--max-steps", "6"])
    assert code == 0 and "continuing from" in stdout, stderr   # the saved --lora-* flags (minskill.runs.resume_flags)
    for name in ("model.safetensors", f"{ADAPTER_DIR}/adapter_model.safetensors"):
        a, b = (load_file(str(tmp_path / run / "final" / name)) for run in ("straight", "resumed"))
        assert all(torch.equal(a[k], b[k]) for k in a), name
    # resuming a LoRA run as a full fine-tune is refused, naming the flag
    with pytest.raises(SystemExit, match="--lora-rank 4 -> 0"):
        run_rewrite(["train", "--out", str(tmp_path / "resumed"), "--resume", "--lora-rank", "0"])

    # rewrite.py apply reads the merged rewriter like any other
    code, _, stderr = run_rewrite(["apply", "--rewriter", str(tmp_path / "straight"), "--model-card",
                                   str(root / "card.json"), "--skills", str(root / "skills.json"), "--task", "Sums.",
                                   "--out", str(tmp_path / "adapted"), "--max-new-tokens", "8", "--device", "cpu"])
    assert code in (0, 2) and f"rewriter {final}" in stderr, stderr


def test_rewrite_train_refuses_bad_lora_flags(sft_files, tmp_path):
    code, _, stderr = train_rewriter(sft_files, tmp_path / "bad", "--lora-targets", "q_proj,attn")
    assert code == 1 and "unknown LoRA target module 'attn'" in stderr and not (tmp_path / "bad").exists()


def test_rewrite_train_resume_falls_back_past_a_checkpoint_whose_adapter_is_damaged(sft_files, tmp_path):
    """The newest checkpoint's adapter missing (or corrupt) was a dead end."""
    out = tmp_path / "cut"
    assert train_rewriter(sft_files, out, "--max-steps", "4")[0] == 0        # checkpoint-2 and checkpoint-4
    truncated(out / "checkpoint-4" / ADAPTER_DIR / "adapter_model.safetensors")
    code, stdout, stderr = train_rewriter(sft_files, out, "--resume", "--max-steps", "6")   # a larger budget
    assert code == 0, stderr
    assert f"{out / 'checkpoint-4' / ADAPTER_DIR / 'adapter_model.safetensors'}: damaged" in stdout
    assert f"continuing from {out / 'checkpoint-2'} at step 2/6" in stdout and "step 6/6" in stdout
