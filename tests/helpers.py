"""Helpers the test files share: scripted task models and suites, the scripts' flags for tiny runs, readers of
run folders, report checks. Fixtures built from them (the MASA servers, a tiny trained rewriter) are in
conftest.py; tiny model folders are in tiny.py."""
import contextlib
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

import evolve_masa
import rewrite
import train_grpo
from minskill import rollout
from minskill.masa import search as masa, teacher as masa_teacher
from minskill.masa.model_card import ModelCard
from minskill.serve.client import ChatResult
from minskill.serve.backends import ScriptedBackend
from minskill.serve.server import start_server
from minskill.skill_r1.loop import EvolveConfig, Instance, assign_advantages, evolve_batch
from minskill.skills import Skill
from minskill.skillsets import SkillSet
from minskill.tasks import Task


# The synthetic suite: task k is answered right only when the skill (the task model's system prompt) contains
# KEYWORDS[k]. These strings each occur in roughly 20-40% of 32-token samples of the random tiny editor, so
# the reward r = share of keywords present is dense from the start (about 0.3) and can reach 1.
KEYWORDS = ("is", "ap", "at", "th")


def keyword_task_model(messages, request):
    """The scripted frozen task model: 'yes' to 'Solve task k' when the system prompt holds KEYWORDS[k]."""
    system = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
    k = int(messages[-1]["content"].rsplit(maxsplit=1)[-1])
    return "yes" if KEYWORDS[k] in system else "no"


def write_keyword_suite(path: Path, heldout: int = 8) -> Path:
    """The keyword suite as a JSONL file for the scripts: 8 training and `heldout` held-out tasks "Item i: solve
    task i % 4" (keyword_task_model reads the last number)."""
    path.write_text("".join(json.dumps({"id": f"{split}-{i}", "type": "keywords", "question": f"Item {i}: solve task "
                                        f"{i % 4}", "answer": "yes", "verifier": "exact", "split": split}) + "\n"
                            for split, n in (("train", 8), ("heldout", heldout)) for i in range(n)))
    return path


def keyword_tasks(prefix="kw"):
    return [Task(id=f"{prefix}-{k}", type="keywords", question=f"Solve task {k}", answer="yes", verifier="exact")
            for k in range(len(KEYWORDS))]


def assert_learning_raises_the_reward(editor, tok, client, params, lr: float, steps: int,
                                      scale_by_std: bool = True) -> None:
    """The learning tests' loop (test_skill_r1's and test_lora's): `steps` of bi-level GRPO (λ = 0.5, K = 4, G = 2,
    2 instances a step, 32-token skills, AdamW at `lr` over `params`); the mean candidate reward of the last 3
    steps must be at least 0.25 above that of the first 3."""
    args = train_grpo.parse_args(["--lr", str(lr), "--max-skill-tokens", "32", "--micro-batch", "8"])
    optimizer = torch.optim.AdamW(params, lr=args.lr, betas=(0.9, 0.99), weight_decay=0.0)
    instances = [Instance(f"x{j}", "keywords", keyword_tasks()) for j in range(2)]
    cfg = EvolveConfig(generations=2, candidates=4, max_skill_tokens=32, context_tokens=512, task_max_tokens=4)
    rewards = []
    for step in range(steps):
        editor.eval()
        evolutions = evolve_batch(editor, tok, client, instances, cfg, seeds=[step * 10 + j for j in range(2)])
        candidates = assign_advantages(evolutions, lam=0.5, scale_by_std=scale_by_std)
        editor.train()
        stats = train_grpo.policy_update(editor, None, optimizer, candidates, args)
        assert stats["ratio_mean"] == pytest.approx(1.0) and stats["logp_mismatch"] < 1e-4
        rewards.append(sum(c.reward for c in candidates) / len(candidates))
    first, last = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    print(f"mean candidate reward: first 3 steps {first:.3f}, last 3 steps {last:.3f}")
    assert last >= first + 0.25, rewards


ROW_FIELDS = ("step", "reward_per_generation", "carried_reward_per_generation", "reward_mean_candidates", "a_inter",
              "loss", "kl", "ratio_mean", "clip_frac_low", "clip_frac_high", "grad_norm", "logp_mismatch", "lr",
              "zero_variance_groups", "unparsed_share", "skill_tokens_mean", "skill_chars_mean", "task_calls",
              "task_tokens", "task_prompt_tokens", "task_completion_tokens", "task_seconds", "task_request_seconds",
              "seconds_editor_sampling", "editor_sampled_tokens", "editor_sample_tokens_per_s", "train_tokens_per_s", "seconds_sampling_and_rollouts",
              "seconds_update", "instances", "best_skill", "best_skill_reward", "best_skill_gain",
              "best_skill_instance", "inter_share")
TIMING_FIELDS = ("editor_sample_tokens_per_s", "train_tokens_per_s", "seconds_sampling_and_rollouts", "task_seconds",
                 "task_request_seconds", "seconds_editor_sampling",
                 "seconds_update")


def common_flags(editor_dir, suite_file, task_url, out):
    return ["--editor", str(editor_dir), "--task-url", task_url, "--suite", str(suite_file), "--out", str(out),
            "-G", "2", "-K", "3", "--tasks-per-instance", "2", "--instances-per-step", "2", "--micro-batch", "4",
            "--max-skill-tokens", "16", "--context-tokens", "512", "--task-max-tokens", "4", "--lr", "1e-3",
            "--save-every", "2"]


def read_rows(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


class Interrupted(Exception):
    pass


def crash_after_checkpoint(monkeypatch, flags: list[str], step: int, error: type = Interrupted) -> None:
    """Run train_grpo.py with `flags` and let the process die (raise `error`) right after the step-`step`
    checkpoint is written, as a killed run would; the real save_checkpoint is put back afterwards."""
    save = train_grpo.save_checkpoint

    def save_then_crash(folder, editor, tokenizer, state, keep=1):
        save(folder, editor, tokenizer, state, keep=keep)
        if state["step"] == step:
            raise error

    monkeypatch.setattr(train_grpo, "save_checkpoint", save_then_crash)
    with pytest.raises(error):
        train_grpo.main(flags)
    monkeypatch.setattr(train_grpo, "save_checkpoint", save)


NAMES = ["zorp", "vekk", "milo", "brax", "quon", "tano", "lixa", "drom", "fenn", "sulk", "garr", "pimm",
         "rokk", "nell", "thux", "wexo", "jall", "korr"]
ANSWERS: dict[str, str] = {}


def write_suite(path: Path) -> Path:
    """8 train tasks per type (2 of them become preliminary tasks) and 6 held-out per type."""
    lines = []
    for i in range(14):
        split = "train" if i < 8 else "heldout"
        q_sum = f"What is {i + 3} plus {2 * i + 1}?"
        q_secret = f"What is the secret number of {NAMES[i]}?"
        ANSWERS[q_sum], ANSWERS[q_secret] = str(3 * i + 4), str(100 + 7 * i)
        lines.append({"id": f"sum-{i}", "type": "sum", "question": q_sum, "answer": ANSWERS[q_sum], "split": split})
        lines.append({"id": f"secret-{i}", "type": "secret", "question": q_secret, "answer": ANSWERS[q_secret],
                      "split": split})
    path.write_text("".join(json.dumps(l) + "\n" for l in lines))
    return path


def target_fn(messages, request):
    system = messages[0]["content"] if messages[0]["role"] == "system" else ""
    question = messages[-1]["content"]
    needed = "KEY-GENERAL" if question.startswith("What is") and "plus" in question else "KEY-SECRET"
    if needed in system and question in ANSWERS:
        return f"Answer: {ANSWERS[question]}"
    return "I am not sure, maybe 1."


def skill(name, body):
    return Skill(name=name, description=f"{name} skill; use it on every task.", body=body, metadata={})


def teacher_fn(messages, request):
    prompt = messages[1]["content"]
    task = re.search(r"^## Task: (.*)$", prompt, re.M).group(1)
    if masa_teacher.STRENGTHS_TASK in task:
        return 'Summary:\n{"strengths": ["follows instructions"], "weaknesses": ["knows no keys"]}'
    if masa_teacher.ATTRIBUTION_TASK in task:
        return ('Analysis below.\n```json\n{"failure_categories": [{"category": "missing key", "count": 3, '
                '"evidence": ["replied: I am not sure"], "suggested_fix": "give the key"}], "summary": "no key"}\n```')
    if masa_teacher.GENERAL_REWRITE_TASK in task:
        if len(messages) == 2:  # the first answer never parses: exercises the retry
            return "Let me think about what the model needs."
        return SkillSet(general=[skill("use-key", "KEY-GENERAL: answer with 'Answer: N'.")], task_specific={},
                        common_mistakes=["no key"]).to_markdown()
    if masa_teacher.TASK_REWRITE_TASK in task:
        task_type = re.search(r"of type '([\w-]+)'", task).group(1)
        body = "KEY-SECRET: look the number up." if task_type == "secret" else "Add the two numbers."
        return SkillSet(general=[], task_specific={task_type: [skill(f"{task_type.replace('_', '-')}-tip", body)]},
                        common_mistakes=[]).to_markdown()
    if masa_teacher.ONESHOT_TASK in task:
        return json.dumps({"general_skills": [{"skill_id": "oneshot", "title": "One shot", "principle": "Be careful.",
                                               "when_to_apply": "one-shot skill"}],   # the keys the prompt asks for
                           "task_specific_skills": {}, "common_mistakes": []})
    return "?"


class NumberedTeacher:
    """A scripted MASA teacher (in-process: `chat` as the clients have it). Attributions always parse; its k-th
    rewrite (k = 0, 1, ...: the general skills in the climb, a task type's skills in a tree) is one skill named
    `rewrite-k`, or, for k in `skipped`, a reply that does not parse."""

    def __init__(self, skipped=()):
        self.rewrites, self.skipped = 0, set(skipped)

    def chat(self, messages, **kwargs):
        task = re.search(r"^## Task: (.*)$", messages[1]["content"], re.M).group(1)
        if masa_teacher.ATTRIBUTION_TASK in task:
            return ChatResult(['{"failure_categories": [], "summary": "scripted"}'], ["stop"], 0, 0)
        k, self.rewrites = self.rewrites, self.rewrites + 1
        if k in self.skipped:
            return ChatResult(["No skills in this reply."], ["stop"], 0, 0)
        new = [skill(f"rewrite-{k}", f"Rewrite number {k}.")]
        task_type = re.search(r"of type '([\w-]+)'", task)
        skills = SkillSet(general=[], task_specific={task_type.group(1): new}) if task_type else SkillSet(general=new)
        return ChatResult([skills.to_markdown()], ["stop"], 0, 0)


def scripted_search(rewards, base_reward=0.0, n_tasks=4, skipped=(), state=None, **config) -> masa.MasaSearch:
    """A MasaSearch on tasks t0..t{n-1} of type qa (MasaConfig(**config), no teacher retries) with a NumberedTeacher
    (`search.teacher`) and, in place of the target's rollouts, scripted rewards: a skill set whose newest skill is
    `rewrite-k` scores rewards[k], the base skills `base_reward`; a number is every task's reward, a dict
    {task id: reward} one per task (R: their mean). `search.evaluated` lists the k of each evaluation (None: base)."""
    tasks = [Task(f"t{i}", "qa", f"question {i}?", "1") for i in range(n_tasks)]
    config = masa.MasaConfig(**{"teacher_retries": 0, **config})
    search = masa.MasaSearch(None, NumberedTeacher(skipped), ModelCard(name="m"), tasks, SkillSet([], {}, []),
                             config, state=state)
    search.evaluated = []

    def evaluate(skills, task_list):
        made = [int(s.name.split("-")[1]) for s in skills.skills() if s.name.startswith("rewrite-")]
        k = max(made) if made else None
        search.evaluated.append(k)
        scores = base_reward if k is None else rewards[k]
        task_rewards = {t.id: float(scores[t.id] if isinstance(scores, dict) else scores) for t in task_list}
        reward = sum(task_rewards.values()) / len(task_rewards)
        return {"adjusted_reward": reward, "task_rewards": task_rewards}, []
    search.evaluate = evaluate
    return search


def run_climb(search: masa.MasaSearch):
    """Run `search` (MasaSearch.run) until its climb ends; returns the state saved (as the script saves it, after each
    yield) after the climb's last iteration."""
    saved = None
    for _ in search.run():
        if search.phase != "general":
            return saved
        saved = search.checkpoint()
    return saved


def argv(env, out, *extra, target="a"):
    return ["--suite", str(env["suite"]), "--base-skills", str(env["base"]), "--n-train", "12", "--n-prelim", "2",
            "--n-heldout", "12", "--task-url", env[target], "--task-model", f"target-{target}",
            "--teacher-url", env["teacher"], "--teacher-model", "teacher", "--iterations", "3", "--patience", "2",
            "--tree-iterations", "3", "--episodes", "4", "--task-concurrency", "4", "--out", str(out), *extra]


def read(out, name):
    return json.loads((out / name).read_text())


def interrupted_at_save(monkeypatch, stop_at: int, args: list[str]) -> None:
    """Run evolve_masa.py with `args` and stop it (as Ctrl-C would) right after its `stop_at`-th checkpoint."""
    real_save, saves = evolve_masa.save_checkpoint, []

    def interrupt(folder, state):
        real_save(folder, state)
        saves.append(1)
        if len(saves) == stop_at:
            raise KeyboardInterrupt

    monkeypatch.setattr(evolve_masa, "save_checkpoint", interrupt)
    assert evolve_masa.main(args) == 130
    monkeypatch.setattr(evolve_masa, "save_checkpoint", real_save)


XSS = "<script>alert(1)</script>"


def assert_self_contained_and_escaped(text: str) -> None:
    assert "<script" not in text.lower() and "<img" not in text.lower()  # every run text escaped
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    # nothing fetched: inside tags the only URL is the SVG namespace (URLs in the text, e.g. --task-url, are text)
    tags = re.findall(r"<[^>]*>", text)
    assert {url for t in tags for url in re.findall(r"[a-z]+://[^\s\"'>]+", t)} <= {"http://www.w3.org/2000/svg"}
    assert not [t for t in tags if re.search(r"\b(?:src|href|on\w+)\s*=", t)]
    assert not re.search(r"url\(|@import", text[text.index("<style>"):text.index("</style>")])


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def browse(page: Path, png: Path, profile: Path, height: int = 2400) -> list[str]:
    """Load `page` in headless Chromium, save a screenshot; returns the console lines it logged."""
    proc = subprocess.run([CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--enable-logging=stderr",
                           "--v=0", f"--user-data-dir={profile}", "--hide-scrollbars", f"--screenshot={png}",
                           f"--window-size=1280,{height}", page.resolve().as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert png.is_file() and png.stat().st_size > 5000, proc.stderr[-2000:]
    return [line for line in proc.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]


TASK = "Sums of small numbers."
SKILLS_IN = {"common_mistakes": []}


TARGET = {"common_mistakes": ["Carry the one."]}


def run_rewrite(argv):
    """rewrite.main(argv) -> (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = rewrite.main(argv)
    return code, out.getvalue(), err.getvalue()


def run_rewrite_compare(rewriter, files, suite, out, task_url):
    """`rewrite.py apply --compare` of the shared fixtures' card, skills and TASK on `suite`
    (all of it), the task model at `task_url`: (exit code, stdout, stderr)."""
    return run_rewrite(["apply", "--compare", "--rewriter", str(rewriter),
                        "--model-card", str(files["card"]), "--skills", str(files["skills"]),
                        "--task", TASK, "--out", str(out), "--max-new-tokens", "40",
                        "--json-schema", "off",   # the trained tiny rewriter's own reply
                        "--device", "cpu", "--suite", str(suite), "--split", "all",
                        "--task-url", task_url])


def make_skill(name="count-carefully", **kw):
    defaults = dict(description="Use when a question asks for a count.", body="# Count carefully\n\nTick items.")
    return Skill(name=name, **{**defaults, **kw})


def masa_library():
    return {
        "general_skills": [
            {"skill_id": "gen_001", "title": "Check the state", "principle": "Look before acting.\n\n- one\n- two",
             "when_to_apply": "Always"},
            {"skill_id": "gen_001", "title": "Same id: twice", "principle": "Ids may repeat."},  # no when_to_apply
            {"skill_id": "../../etc/passwd", "title": "Evil id", "principle": "p", "when_to_apply": "w"},
            {"title": "No id at all", "principle": "  padded  \n", "when_to_apply": "x" * 1500},   # too long
        ],
        "task_specific_skills": {
            "pick_and_place": [{"skill_id": "pp_001", "title": "T", "principle": "Go, take, go, put.",
                                "when_to_apply": "put tasks", "score": 0.5, "tags": ["a", "b"],
                                "parent": None, "nested": {"k": [1, 2]}, "note": "kept"}],
            "Math_Algebra": [{"when_to_apply": "w", "principle": "p", "title": "order differs", "skill_id": "m1"}],
            "empty": [],
        },
        "common_mistakes": [
            "Repeating an action that gave Nothing happens.",
            {"mistake_id": "err_001", "description": "Looping", "why_it_happens": "no memory",
             "how_to_avoid": "Try another place --> then report"},
            "  surrounded by spaces  ",
            "two\nlines",
            {"description": "only a description"},
        ],
        "version": "1.0",
        "stats": {"iterations": 3},
    }


def render_set():
    return SkillSet(general=[make_skill("g-one", description="General one.", body="Body G1."),
                             make_skill("g-two", description="General two.", body="Body G2.")],
                    task_specific={"counting": [make_skill("c-one", description="Counting one.", body="Body C1.")],
                                   "lookup": [make_skill("l-one", description="Lookup one.", body="Body L1.")]},
                    common_mistakes=["Mistake A.", "Mistake\nB."])


def rollouts_by_plan(tasks, reply) -> list:
    """Every multi-turn task rolled out over real HTTP by a scripted agent that plays the task's oracle plan
    (tasks.oracle_actions), writing each action as reply(action) (the way a model words it)."""
    from minskill.tasks import oracle_actions
    plans = {t.question: oracle_actions(t) for t in tasks}

    def agent(messages, request):
        first = next(m["content"] for m in messages if m["role"] == "user")
        question = next(q for q in plans if q in first)
        return reply(plans[question][sum(m["role"] == "assistant" for m in messages)])

    server = start_server(ScriptedBackend(agent))
    try:
        return rollout.run_rollouts(server.client(max_retries=0), tasks, None)
    finally:
        server.close()


def random_prompt(seed: int, length: int) -> list[int]:
    return torch.randint(3, 300, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


# requests arriving at decoding steps 0, 1, 3, 4 and 9: (prompt, max_new_tokens)
ARRIVALS = {0: [(random_prompt(1, 30), 20)],
            1: [(random_prompt(2, 90), 5), (random_prompt(3, 7), 12)],
            3: [(random_prompt(4, 150), 30)], 4: [(random_prompt(5, 64), 1)],
            9: [(random_prompt(6, 2), 8)]}


def engine_tokens(engine, arrivals=ARRIVALS) -> list[list[int]]:
    """Each request's greedy tokens from `engine`, the requests joining at the steps `arrivals`
    names and leaving as they end."""
    from minskill.serve.scheduler import sequences_for
    every = []
    with torch.inference_mode():
        for step in range(200):
            joining = [sequences_for(p, 1, None, max_new_tokens=n)[0]
                       for p, n in arrivals.get(step, [])]
            every += joining
            engine.add(joining)
            if not engine.rows and step > max(arrivals):
                break
            engine.step()
    return [s.tokens for s in every]


def quantized_model(path, mode: str):
    """(model, tokenizer) of a model folder, loaded in float32 and quantized by `mode` (--quantize)."""
    from minskill.nn.quantize import apply_quantization
    from minskill.nn.weights import load_model
    model, tokenizer = load_model(str(path), dtype=torch.float32)
    model.eval()
    apply_quantization(model, mode)
    return model, tokenizer
