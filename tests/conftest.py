"""pytest configuration: tests marked `slow` (the real 135M default model) run only with
`--slow`; fixtures more than one test file uses (the scripted MASA servers, a tiny rewriter trained
by SFT, the tiny Skill-R1 editor and the keyword suite; a test file may define its own under the
same name)."""
import json

import pytest
import torch

from helpers import (SKILLS_IN, TARGET, TASK, run_rewrite, skill, target_fn, teacher_fn,
                     write_keyword_suite, write_suite)
from minskill.masa.model_card import ModelCard
from minskill.serve.backends import ScriptedBackend
from minskill.serve.server import start_server
from minskill.skillsets import SkillSet
from tiny import make_tiny_model_dir


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", default=False,
                     help="also run tests marked slow "
                          "(they load the real SmolLM2-135M default model)")


def pytest_collection_modifyitems(config, items):
    if config.getoption("--slow"):
        return
    skip_slow = pytest.mark.skip(reason="slow: run with --slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """One torch thread for the whole suite: tiny models gain nothing from more, and on a CPU
    shared with other processes (a server subprocess, other jobs) more threads wait for cores and
    run many times slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def editor_dir(tmp_path_factory):
    """A tiny Skill-R1 editor (llama, chatml, 1,024 positions), one per test file."""
    return make_tiny_model_dir(tmp_path_factory.mktemp("editor"), family="llama",
                               chat_format="chatml", max_position_embeddings=1024)


@pytest.fixture(scope="module")
def suite_file(tmp_path_factory):
    """The keyword suite (helpers.write_keyword_suite): 8 training and 8 held-out tasks."""
    return write_keyword_suite(tmp_path_factory.mktemp("suite") / "keywords.jsonl")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("masa")
    suite = write_suite(tmp / "suite.jsonl")
    base = SkillSet(general=[skill("be-helpful", "Answer the question.")],
                    task_specific={"secret": [skill("secret-base", "Think about the name.")]},
                    common_mistakes=[])
    base.save_json(tmp / "base.json")
    servers = [start_server(ScriptedBackend(target_fn, name="target-a")),
               start_server(ScriptedBackend(target_fn, name="target-b")),
               start_server(ScriptedBackend(teacher_fn, name="teacher", max_context=100000))]
    yield {"tmp": tmp, "suite": suite, "base": tmp / "base.json", "a": servers[0].url,
           "b": servers[1].url, "teacher": servers[2].url}
    for server in servers:
        server.close()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("rewrite")
    base = make_tiny_model_dir(root / "base", family="llama", chat_format="chatml",
                               max_position_embeddings=4096)
    alpha, beta = ModelCard(name="alpha").to_json(), ModelCard(name="beta").to_json()
    # (conditioning on the card is tested in test_sft.py)
    records = [{"model_card": alpha, "skills_in": SKILLS_IN, "task_description": TASK,
                "skills_out": TARGET},
               {"model_card": beta, "skills_in": SKILLS_IN, "task_description": TASK,
                "skills_out": TARGET}]
    data = root / "sft.jsonl"
    data.write_text(json.dumps(records[0]) + "\n{not json\n" + json.dumps(records[1]) + "\n")
    (root / "card.json").write_text(json.dumps({"name": "alpha"}))
    (root / "skills_in.json").write_text(json.dumps(SKILLS_IN))
    return {"root": root, "base": base, "data": data, "card": root / "card.json",
            "skills": root / "skills_in.json"}


@pytest.fixture(scope="module")
def trained(files):
    out = files["root"] / "rewriter"
    code, stdout, stderr = run_rewrite(["train", str(files["data"]), "--base-model",
                                        str(files["base"]), "--out", str(out),
                                        "--lr", "2e-2", "--epochs", "40", "--batch-size", "2",
                                        "--micro-batch", "2", "--val-fraction", "0",
                                        "--save-every", "1000", "--log-every", "20",
                                        "--device", "cpu"])
    assert code == 0, stderr
    return out, stdout, stderr
