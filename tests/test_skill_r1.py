"""minskill.skill_r1: reply parsing, the editor's prompt and its token budget, the multi-generation loop
(advantages per candidate, unparseable replies, best-skill carry, history), and a learning test: a tiny random
editor trained with bi-level GRPO against a scripted frozen task model behind real HTTP raises its reward."""
import math
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch


from helpers import assert_learning_raises_the_reward, keyword_task_model, keyword_tasks
from minskill.nn.sampling import Sample
from minskill.nn.tokenizer import Tokenizer
from minskill.nn.weights import load_model
from minskill.serve.backends import ScriptedBackend
from minskill.serve.server import start_server
from minskill.skill_r1 import loop as skill_r1
from minskill.skill_r1.loop import (EvolveConfig, HistoryEntry, Instance, Outcome, assign_advantages,
                                    SuiteError, editor_messages, evolve_batch, load_split, make_instances,
                                    parse_candidate)
from minskill.tasks import Task


@pytest.fixture(scope="module")
def task_server():
    calls = []

    def fn(messages, request):
        calls.append(messages)
        return keyword_task_model(messages, request)

    with start_server(ScriptedBackend(fn, name="keywords")) as server:
        server.calls = calls
        yield server


# ------------------------------------------------------------------------------------------ parsing


def test_parse_candidate_plain_text_is_the_body():
    assert parse_candidate("Step 1: add.\nStep 2: answer.", "arithmetic") == ("Step 1: add.\nStep 2: answer.", None)


def test_parse_candidate_front_matter_is_rendered_as_a_skill():
    text, error = parse_candidate("---\nname: add\ndescription: Adding numbers\n---\nAdd them.", "arithmetic")
    assert error is None
    assert "Adding numbers" in text and "Add them." in text


@pytest.mark.parametrize("reply, reason", [("", "empty reply"), ("  \n\t", "empty reply"),
                                           ('---\nname: x\ndescription: "open quote\n---\nbody', "front matter")])
def test_parse_candidate_rejects_non_skills_with_the_reason(reply, reason):
    text, error = parse_candidate(reply, "arithmetic")
    assert text is None and reason in error


# ------------------------------------------------------------------------------------------ the prompt


def _history(n_entries, skill_words=60):
    return [HistoryEntry(generation=1 + i // 3, skill=f"skill number {i}: " + "apply the procedure " * skill_words,
                         reward=i / n_entries, outcomes=[Outcome(f"Solve task {k}", float(k % 2), "yes" if k % 2 else "no")
                                                         for k in range(4)])
            for i in range(n_entries)]


def test_check_config_refuses_knobs_below_1_and_a_prompt_past_the_editors_context():
    """The loop's configuration is checked once, at set-up (train_grpo.setup, the --eval rows), not per step."""
    editor = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=600))
    skill_r1.check_config(editor, EvolveConfig(context_tokens=512, max_skill_tokens=88))   # 600 tokens fit
    with pytest.raises(ValueError, match="= 601 exceeds the editor's context of 600 tokens"):
        skill_r1.check_config(editor, EvolveConfig(context_tokens=512, max_skill_tokens=89))
    with pytest.raises(ValueError, match="generations, candidates and rollouts must be >= 1, got 2, 4, 0"):
        skill_r1.check_config(editor, EvolveConfig(rollouts=0))


def test_editor_prompt_shows_history_newest_first(editor_dir):
    tok = Tokenizer.from_pretrained(editor_dir)
    count = lambda m: len(tok.apply_chat_template(m))  # noqa: E731
    history = _history(3, skill_words=2) + [HistoryEntry(2, None, 0.0, [], "empty reply")]
    messages = editor_messages(Instance("x", "keywords", keyword_tasks()), "current text", 0.5, history, count,
                               context_tokens=100_000)
    user = messages[-1]["content"]
    assert messages[0]["role"] == "system" and "Current skill (reward 0.50):\ncurrent text" in user
    order = [user.index(f"skill number {i}:") for i in (2, 1, 0)]
    assert order == sorted(order)                         # newest first
    assert user.index("the reply was not a skill") < order[0]
    assert "task: Solve task 1 -> correct; reply: yes" in user and "task: Solve task 0 -> wrong; reply: no" in user


@pytest.mark.parametrize("budget", [100_000, 2000, 1200, 800, 600, 450])
def test_editor_prompt_fits_the_budget_dropping_oldest_history_first(editor_dir, budget):
    tok = Tokenizer.from_pretrained(editor_dir)
    count = lambda m: len(tok.apply_chat_template(m))  # noqa: E731
    history = _history(9)
    instance = Instance("x", "keywords", keyword_tasks())
    messages = editor_messages(instance, "the current skill " * 80, 0.25, history, count, context_tokens=budget)
    assert count(messages) <= budget
    user = messages[-1]["content"]
    shown = [i for i in range(9) if f"skill number {i}:" in user]
    assert shown == list(range(9 - len(shown), 9))        # whatever is kept is the newest entries
    if budget == 100_000:
        assert len(shown) == 9 and ("the current skill " * 80).strip() in user
    if budget == 450:  # the bare prompt is ~370 tiny-tokenizer tokens: history dropped, then the skill cut
        assert not shown and "[... cut to fit the prompt]" in user


def test_editor_prompt_too_small_budget_is_an_error(editor_dir):
    tok = Tokenizer.from_pretrained(editor_dir)
    count = lambda m: len(tok.apply_chat_template(m))  # noqa: E731
    with pytest.raises(ValueError, match="context_tokens=20 is too small"):
        editor_messages(Instance("x", "keywords", keyword_tasks()), "s", 0.0, _history(2), count, context_tokens=20)


# ------------------------------------------------------------------------------------------ the loop


class ScriptedEditor:
    """Stands in for sampling.generate: generation g returns the scripted replies REPLIES[g] (K per prompt)
    and records the prompts it was given."""

    def __init__(self, tokenizer, replies):
        self.tokenizer, self.replies, self.prompts, self.g = tokenizer, replies, [], 0

    def __call__(self, model, prompts, *, n, seed, **kwargs):
        self.prompts.append(prompts)
        texts = self.replies[self.g]
        self.g += 1
        assert len(texts) == n
        return [Sample(p, self.tokenizer.encode(t) + [2], [-1.0] * (len(self.tokenizer.encode(t)) + 1), t, "stop")
                for p in range(len(prompts)) for t in texts]


def test_evolve_advantages_unparseable_replies_and_best_skill_carry(editor_dir, task_server, monkeypatch):
    tok = Tokenizer.from_pretrained(editor_dir)
    replies = [["is ap at th", "just is", "", '---\nname: x\ndescription: "broken\n---\nap'],   # r = 1, .25, 0, 0
               ["ap", "zero help", "   ", "is and at"]]                                  # r = .25, 0, 0, .5
    scripted = ScriptedEditor(tok, replies)
    monkeypatch.setattr(skill_r1, "generate", scripted)
    client = task_server.client()
    task_server.calls.clear()
    [ev] = evolve_batch(None, tok, client, [Instance("x", "keywords", keyword_tasks())],
                        EvolveConfig(generations=2, candidates=4, max_skill_tokens=64, context_tokens=4000), seeds=[3])
    assert all(c.advantage == 0.0 for c in ev.candidates())   # the loop itself only samples and scores
    assert assign_advantages([ev], lam=0.5) == ev.candidates()

    assert ev.seed_reward == 0.0 and ev.seed_skill == ""
    g1, g2 = ev.generations
    assert [c.reward for c in g1.candidates] == [1.0, 0.25, 0.0, 0.0]
    assert [c.reward for c in g2.candidates] == [0.25, 0.0, 0.0, 0.5]
    # unparseable replies: reward 0, the reason kept, no task-model call; the run went on to generation 2
    for c in (g1.candidates[2], g1.candidates[3], g2.candidates[2]):
        assert c.skill is None and c.parse_error and c.reward == 0.0
    assert len(task_server.calls) == 4 * (1 + 2 + 3)   # seed skill + 2 parsed in g1 + 3 parsed in g2, 4 tasks each
    # A(g,i) = r_i − mean_g + λ·(mean_g − mean_{g−1}), generation 0's mean = the seed skill's reward
    mean1, mean2 = 1.25 / 4, 0.75 / 4
    for c in g1.candidates:
        assert c.advantage == pytest.approx(c.reward - mean1 + 0.5 * (mean1 - 0.0))
    for c in g2.candidates:
        assert c.advantage == pytest.approx(c.reward - mean2 + 0.5 * (mean2 - mean1))
    assert g1.inter_advantage == pytest.approx(mean1) and g2.inter_advantage == pytest.approx(mean2 - mean1)
    # the best skill is carried; generation 2's best (0.5) does not beat it, so it stays
    assert g1.best_index == 0 and g1.current_skill == "is ap at th" and g1.current_reward == 1.0
    assert g2.best_index == 3 and g2.current_skill == "is ap at th" and ev.final_reward == 1.0
    # K candidates of a generation share one prompt; generation 2's prompt shows generation 1, newest first
    assert all(c.prompt_ids == g1.candidates[0].prompt_ids for c in g1.candidates)
    second = tok.decode(g2.candidates[0].prompt_ids)
    assert "Current skill (reward 1.00):\nis ap at th" in second
    assert "[generation 1, reward 1.00]" in second and "the reply was not a skill" in second
    assert second.index("[generation 1, reward 0.00] (the reply was not a skill") < second.index("[generation 0")


def test_evolve_batch_instances_do_not_depend_on_each_other(editor_dir, task_server):
    torch.manual_seed(0)
    editor, tok = load_model(str(editor_dir))
    client = task_server.client()
    a, b = Instance("a", "keywords", keyword_tasks("a")), Instance("b", "keywords", keyword_tasks("b"))
    cfg = EvolveConfig(generations=2, candidates=3, max_skill_tokens=16, context_tokens=512, task_max_tokens=4)
    together = evolve_batch(editor, tok, client, [a, b], cfg, seeds=[11, 12])
    [alone] = evolve_batch(editor, tok, client, [b], cfg, seeds=[12])
    assert [c.text for c in together[1].candidates()] == [c.text for c in alone.candidates()]
    assert [c.reward for c in together[1].candidates()] == [c.reward for c in alone.candidates()]
    for c in together[0].candidates():  # token ids, log-probs and text of each candidate line up
        assert len(c.token_ids) == len(c.logprobs) > 0 and all(math.isfinite(x) for x in c.logprobs)


def test_make_instances_groups_by_type():
    tasks = [Task(id=f"{t}{i}", type=t, question="q", answer="a") for i in range(5) for t in ("b", "a")]
    insts = make_instances(tasks, 2, prefix="p")
    assert [(i.id, [t.id for t in i.tasks]) for i in insts] == [
        ("p-a-0", ["a0", "a1"]), ("p-a-1", ["a2", "a3"]), ("p-b-0", ["b0", "b1"]), ("p-b-1", ["b2", "b3"])]


# ------------------------------------------------------------------------------------------ learning


@pytest.mark.parametrize("scale_by_std", [True, False], ids=["scale-by-std", "no-scale-by-std"])
def test_bilevel_grpo_raises_the_reward_of_a_tiny_editor(editor_dir, task_server, scale_by_std):
    """15 steps of bi-level GRPO (λ = 0.5, K = 4, G = 2, 2 instances a step, 32-token skills, AdamW lr 1e-2),
    with A_intra divided by the group's std (train_grpo's default) and without. Measured with exactly this loop
    (mean candidate reward of the first 3 steps -> last 3 steps), tiny editors made with seeds 0-4:
    scaled +0.52, +0.65, +0.65, +0.69, +0.65 (mean +0.63); unscaled +0.58, +0.49, +0.50, +0.47, +0.67 (mean
    +0.54). The threshold +0.25 leaves a wide margin. About 20-30 s each on one busy core."""
    torch.manual_seed(0)
    editor, tok = load_model(str(editor_dir))
    assert_learning_raises_the_reward(editor, tok, task_server.client(), editor.parameters(), lr=1e-2, steps=15,
                                      scale_by_std=scale_by_std)


def test_a_bad_suite_file_is_a_suite_error_in_the_library_and_a_usage_error_of_the_script(editor_dir, tmp_path):
    """load_split raises SuiteError naming the file and line (the library never exits); train_grpo.py run as a
    script turns it into a one-line usage error, exit status 1 and no traceback."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "type": "t", "question": "q", "answer": "a"}\n{not json\n')
    with pytest.raises(SuiteError, match=rf"--suite {bad}: .*{bad.name}:2"):
        load_split(SimpleNamespace(suite=str(bad), seed=0, n_tasks=None), "train")
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, str(root / "train_grpo.py"), "--editor", str(editor_dir), "--suite",
                           str(bad), "--task-url", "http://127.0.0.1:9/v1", "--out", str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip().startswith(f"train_grpo.py: --suite {bad}: ") and f"{bad.name}:2" in done.stderr
