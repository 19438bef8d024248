"""The server's engine reads the device at most once a decoding step (issue: a GPU waits for the
host at each read): the tokens and log-probs of its rows come back in one transfer, and the rows'
lengths, which the batch-invariant cache needs for its key widths, are kept on the host."""
import pytest
import torch

from minskill.nn.quantize import apply_quantization
from minskill.nn.weights import load_model
from minskill.serve.prefix_cache import PrefixCache
from minskill.serve.scheduler import Engine, sequences_for
from tiny import make_tiny_model_dir

READS = ("tolist", "item", "__bool__", "__int__", "__float__")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("reads") / "m", family="llama",
                               init_std=0.2, head_dim=32, max_position_embeddings=1024)


def _prompt(seed, length):
    return torch.randint(3, 300, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("mode", ["none", "int8", "int4"])
def test_a_decoding_step_reads_the_device_at_most_once(model_dir, mode, monkeypatch):
    model, tokenizer = load_model(str(model_dir), dtype=torch.float32)
    apply_quantization(model.eval(), mode)
    engine = Engine(model, tokenizer, [], tokenizer.pad_token_id, PrefixCache(4),
                    batch_invariant=True)
    arrivals = {0: [(_prompt(1, 30), 0.0, 9)],                    # (prompt, temperature, tokens)
                2: [(_prompt(2, 70), 0.8, 5), (_prompt(3, 7), 0.0, 20)],
                6: [(_prompt(4, 140), 1.0, 12)]}
    reads = []
    for name in READS:
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(torch.Tensor, name,
                            lambda self, *a, _o=original, _n=name: reads.append(_n) or _o(self, *a))
    per_step, ended = [], 0
    with torch.inference_mode():
        for step in range(100):
            for prompt, temperature, n in arrivals.get(step, []):
                engine.add(sequences_for(prompt, 1, 3, max_new_tokens=n, temperature=temperature))
            if not engine.rows and step > max(arrivals):
                break
            rows = len(engine.rows)
            reads.clear()
            engine.step()
            per_step.append(len(reads))
            ended += rows - len(engine.rows)
    assert ended == 4 and len(per_step) > 20        # rows joined, decoded and left on the way
    assert max(per_step) <= 1, per_step
