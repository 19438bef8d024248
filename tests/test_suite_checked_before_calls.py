"""A suite file is checked whole when it loads: a task type that cannot name a skill folder stops
evolve_masa.py with FILE:LINE before any model call is spent (it used to run the whole search, then crash
when the task-specific skills were saved)."""
import json
import threading

import pytest


import evolve_masa
from minskill.serve.backends import ScriptedBackend
from minskill.serve.server import start_server
from minskill.skillsets import SkillSet


def test_evolve_masa_refuses_a_bad_task_type_before_any_model_call(tmp_path, capsys):
    calls, lock = [], threading.Lock()

    def model(messages, request):
        with lock:
            calls.append(messages)
        return "Answer: 1"

    suite = tmp_path / "suite.jsonl"
    suite.write_text(json.dumps({"question": "What is 1 + 1?", "answer": "2", "type": "sum"}) + "\n"
                     + json.dumps({"question": "What is 2 + 2?", "answer": "4", "type": "sums/../../up"}) + "\n")
    SkillSet().save_json(tmp_path / "base.json")
    server = start_server(ScriptedBackend(model, name="m"))
    try:
        with pytest.raises(SystemExit):   # a usage error naming FILE:LINE, no traceback
            evolve_masa.main(["--suite", str(suite), "--base-skills", str(tmp_path / "base.json"),
                              "--task-url", server.url, "--task-model", "m",
                              "--teacher-url", server.url, "--teacher-model", "m", "--n-train", "1",
                              "--n-prelim", "0", "--n-heldout", "0", "--iterations", "1", "--tree-iterations", "1",
                              "--episodes", "1", "--max-calls", "20", "--out", str(tmp_path / "out")])
    finally:
        server.close()
    assert f"{suite}:2: task type 'sums/../../up'" in capsys.readouterr().err
    assert calls == [] and not (tmp_path / "out").exists()
