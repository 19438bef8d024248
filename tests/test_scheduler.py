"""The server's engine (minskill.serve.scheduler): requests join the running batch at the next decoding step,
finished ones leave at once, and a request's tokens do not depend on its companions."""
import threading

import pytest
import torch

from minskill.nn.sampling import generate
from minskill.nn.weights import load_model
from minskill.serve.backends import CompletionRequest, ModelBackend
from minskill.serve.prefix_cache import PrefixCache
from minskill.serve.scheduler import Engine, sequences_for
from minskill.serve.server import BatchScheduler, main
from tiny import make_tiny_model_dir

SAMPLED = dict(temperature=1.0, top_k=0, top_p=1.0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = make_tiny_model_dir(tmp_path_factory.mktemp("sched") / "m", family="llama", chat_format="chatml",
                               init_std=0.2)
    model, tokenizer = load_model(str(path))
    return model.eval(), tokenizer


def _prompt(i, length=20):
    return torch.randint(3, 300, (length,), generator=torch.Generator().manual_seed(i)).tolist()


def _run(engine, joins, max_steps=1000, widths=None):
    """joins: {step: [sequences]} added before that step; runs until the batch is empty (widths: gets the
    cache's slots at each step)."""
    for step in range(max_steps):
        engine.add(joins.pop(step, []))
        if not engine.rows and not joins:
            return step
        if widths is not None and engine.cache is not None:
            widths.append(engine.cache.length)
        engine.step()
    raise AssertionError("the engine did not empty")


@pytest.mark.parametrize("cache_mb, shared", [(0, 0), (2, 0), (2, 80)])
def test_a_seeded_request_gives_the_same_tokens_whatever_shares_its_batch(tiny, cache_mb, shared):
    """shared: the tokens of a prefix every prompt starts with (kept once in the batch: serve.cascade)."""
    model, tokenizer = tiny
    library = _prompt(99, shared) if shared else []
    params = [dict(SAMPLED), dict(temperature=0.8, top_k=20, top_p=1.0), dict(temperature=1.2, top_k=0, top_p=0.7)]
    runs = []
    for companions in ([], [(0, 3), (2, 1)], [(1, 2), (4, 0), (4, 4)]):   # (join step, prompt seed)
        engine = Engine(model, tokenizer, [], tokenizer.pad_token_id, PrefixCache(cache_mb) if cache_mb else None)
        mine = [s for p in params for s in sequences_for(library + _prompt(7), 2, 1234, max_new_tokens=10, **p)]
        joins = {3: mine}
        for step, seed in companions:
            joins.setdefault(step, []).extend(sequences_for(library + _prompt(seed, 10 + seed), 2, seed,
                                                            max_new_tokens=6, **SAMPLED))
        widths = []
        _run(engine, joins, widths=widths)
        if shared:   # the prefix was kept once for the rows sharing it, not in every row's slots
            assert max(widths) < shared
        runs.append([s.tokens for s in mine])
    assert runs[0] == runs[1] == runs[2]
    # the same draws as sampling.generate gives the request alone (on the CPU)
    for k, p in enumerate(params):
        expected = generate(model, [library + _prompt(7)], n=2, max_new_tokens=10, seed=1234, **p)
        assert runs[0][2 * k:2 * k + 2] == [s.token_ids for s in expected]
    assert len({tuple(t) for t in runs[0]}) > 1                    # the samples differ: the seed matters


def test_a_request_joins_at_the_next_step_and_a_finished_one_leaves_at_once(tiny):
    model, tokenizer = tiny
    engine, ended = Engine(model, tokenizer, [], tokenizer.pad_token_id), {}
    long, short = (sequences_for(_prompt(i, n), 1, None, max_new_tokens=m, temperature=0.0)[0]
                   for i, n, m in ((1, 20, 12), (2, 30, 3)))
    for name, s in (("long", long), ("short", short)):
        s.on_done = lambda s, name=name: ended.__setitem__(name, len(long.tokens))
    engine.add([long])
    for _ in range(4):
        engine.step()
    engine.add([short])
    assert len(engine.rows) == 2 and len(long.tokens) == 4 and short.tokens == []
    for _ in range(3):
        engine.step()
    assert ended == {"short": 7} and len(engine.rows) == 1 and engine.cache.batch_size == 1
    # the short row's longer prompt had padded the long row on the left: those slots are cut once it has gone
    assert engine.cache.length == 20 + 7 and not engine.cache.has_pads
    while engine.rows:
        engine.step()
    assert ended == {"short": 7, "long": 12}
    # both replies are the greedy replies of their prompts alone
    assert [long.tokens, short.tokens] == [s.token_ids for s in
                                           generate(model, [_prompt(1), _prompt(2, 30)], max_new_tokens=[12, 3],
                                                    temperature=0, pad_id=tokenizer.pad_token_id)]
    assert engine.cache is None


def test_stop_strings_cancellation_and_n_behave_as_generate(tiny):
    model, tokenizer = tiny
    reference = generate(model, [_prompt(3)], n=3, max_new_tokens=16, seed=5, tokenizer=tokenizer, **SAMPLED)
    stop = reference[0].text[3:5]
    assert stop
    expected = generate(model, [_prompt(3)], n=3, max_new_tokens=16, seed=5, tokenizer=tokenizer,
                        stop_strings=[stop], **SAMPLED)
    engine = Engine(model, tokenizer, [], tokenizer.pad_token_id)
    mine = sequences_for(_prompt(3), 3, 5, max_new_tokens=16, stop_strings=(stop,), **SAMPLED)
    cancel = threading.Event()
    gone = sequences_for(_prompt(4), 1, None, max_new_tokens=50, should_stop=cancel.is_set, **SAMPLED)
    engine.add(mine + gone)
    engine.step()
    cancel.set()
    while engine.rows:
        engine.step()
    got = [s.sample(engine.stop_token_ids, tokenizer) for s in mine]
    assert [(s.text, s.token_ids, s.finish_reason) for s in got] == \
        [(s.text, s.token_ids, s.finish_reason) for s in expected]
    assert got[0].finish_reason == "stop"
    assert gone[0].finish == "cancelled" and len(gone[0].tokens) == 1


def test_the_continuous_server_answers_a_short_request_while_a_long_one_runs(tiny):
    model, tokenizer = tiny
    tokenizer.stop_token_ids, saved = [], tokenizer.stop_token_ids   # a random model must not stop by chance
    try:
        backend = ModelBackend(model, tokenizer, "tiny", scheduler="continuous")
        scheduler = BatchScheduler(backend, max_batch=4)
        user = [{"role": "user", "content": "count"}]
        long = scheduler.enqueue(CompletionRequest(user, temperature=0.0, max_tokens=200))
        while not backend.in_flight() and not long.done.is_set():
            long.done.wait(0.001)
        short = scheduler.enqueue(CompletionRequest(user, temperature=0.0, max_tokens=2, n=2))
        assert short.done.wait(60)
        assert not long.done.is_set()             # under static batching the short one waits for the long one
        assert long.done.wait(60)
        assert [c.completion_tokens for c in short.result] == [2, 2] and long.result[0].completion_tokens == 200
        # its tokens are the long request's own first ones (greedy: the same prompt, the same reply)
        assert long.result[0].text.startswith(short.result[0].text)
        scheduler.stop()
    finally:
        tokenizer.stop_token_ids = saved


def test_the_switches_are_checked():
    with pytest.raises(ValueError, match="scheduler"):
        ModelBackend.__init__(object.__new__(ModelBackend), None, None, scheduler="dynamic")
    with pytest.raises(SystemExit):
        main(["--prefix-cache-mb", "-1"])
    with pytest.raises(SystemExit):
        main(["--scheduler", "dynamic"])
