"""The real offline default (SmolLM2-135M): the same held-out qa rollouts give the same replies one
request at a time and twelve at a time behind the embedded server (int8 and int4 weights; int4 with
the decoding step in C too), and a prompt prefilled from prefix blocks that other prompts computed
has the bits of a cold prefill."""
import pytest
import torch

from minskill.nn.quantize import apply_quantization
from minskill.nn.weights import load_model
from minskill.rollout import base_skills, run_rollouts
from minskill.serve.aligned import pad_single_rows, prefill_aligned
from minskill.serve.client import ChatClient
from minskill.serve.prefix_cache import PrefixCache
from minskill.serve.embedded import embedded_client
from minskill.tasks import load_suite

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("quantize, dtype, c_kernels", [("int8", "float32", "off"),
                                                       ("int4", "float32", "off"),
                                                       ("int4", "float32", "on")])
def test_rollout_replies_do_not_depend_on_the_concurrency(quantize, dtype, c_kernels):
    tasks = load_suite("qa", split="heldout", seed=0, n=24)
    skills = base_skills("qa")
    # two torch threads, whatever the machine: a query block's bits once moved with the thread
    server = ("--dtype", dtype, "--threads", "2", "--c-kernels", c_kernels)
    with embedded_client(quantize=quantize, server_args=server, max_workers=12) as many:
        one = ChatClient(many.base_url, model=many.model, api_key=many.api_key, max_workers=1)
        rollouts = [run_rollouts(client, tasks, skills, max_tokens=256) for client in (one, many)]
    # the server answered every task (a reply lost to a timeout on a loaded machine says so here)
    errors = [t.error for trajs in rollouts for t in trajs if t.error is not None]
    assert not errors, errors[:3]
    assert all(t.reply for t in rollouts[0])
    assert [t.reply for t in rollouts[0]] == [t.reply for t in rollouts[1]]


def _tokens(seed, n):
    return torch.randint(3, 40000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("mode", ["int8", "int4", "bf16"])
def test_a_prefix_cached_by_other_prompts_gives_the_bits_of_a_cold_prefill(mode):
    """Each query reads a key width fixed by its own position (serve.aligned): the blocks a
    637-token prompt stored, prefilled in a call of another width, are those the 1,041-token prompt
    computes itself."""
    model, _ = load_model(dtype=torch.bfloat16 if mode == "bf16" else torch.float32)
    model.eval()
    if mode in ("int8", "int4"):
        apply_quantization(model, mode)
    pad_single_rows(model)
    library = _tokens(5, 900)
    with torch.inference_mode():
        for target in (library + _tokens(77, 141), library[:300] + _tokens(78, 13)):
            _, cold = prefill_aligned(model, [target], 4, PrefixCache(256))
            for chain in ([300], [600], [300, 600, 900]):
                cache = PrefixCache(256)
                for n in chain:
                    prefill_aligned(model, [library[:n] + _tokens(n, 37)], 4, cache)
                _, warm = prefill_aligned(model, [target], 4, cache)
                assert torch.equal(cold, warm), (len(target), chain)
        # a prompt seen before, of 16k + 1 tokens: every block cached, its last token alone
        again = library[:48] + _tokens(79, 1)
        cache = PrefixCache(256)
        _, cold = prefill_aligned(model, [again], 4, cache)
        _, warm = prefill_aligned(model, [again], 4, cache)
        assert torch.equal(cold, warm)
