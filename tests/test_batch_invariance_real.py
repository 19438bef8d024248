"""The real offline default (SmolLM2-135M) behind the embedded server: the same held-out qa rollouts give the
same replies one request at a time and twelve at a time, with int8 weights (what --task-quantize auto picks)."""
import pytest

from minskill.rollout import base_skills, run_rollouts
from minskill.serve.client import ChatClient
from minskill.serve.server import embedded_client
from minskill.tasks import load_suite

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("quantize, dtype", [("int8", "float32")])
def test_rollout_replies_do_not_depend_on_the_concurrency(quantize, dtype):
    tasks = load_suite("qa", split="heldout", seed=0, n=24)
    skills = base_skills("qa")
    with embedded_client(quantize=quantize, server_args=("--dtype", dtype), max_workers=12) as many:
        one = ChatClient(many.base_url, model=many.model, api_key=many.api_key, max_workers=1)
        replies = [[t.reply for t in run_rollouts(client, tasks, skills, max_tokens=256)] for client in (one, many)]
    assert all(replies[0])                     # the server answered every task
    assert replies[0] == replies[1]
