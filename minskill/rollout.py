"""Rollouts: run a frozen task model (reached over HTTP through a ChatClient) on tasks under a skill
set, and return verified trajectories; `summarize` turns them into MASA's reward R = SR − λ·NHR.

    python -m minskill.rollout --suite qa --skills base --split heldout --n-tasks 320

The command prints a table per task type and writes OUT/trajectories.jsonl + OUT/summary.json; it
exits 1 when every rollout ended with an error, naming the first; --resume runs the missing and the
failed tasks again. The rewards, the Wilson interval and the rules below in full: docs/rollouts.md.

Decisions:
1. Skills meet this code through one method, `render(task_type, max_tokens)`; no skill means no
   system message (the chat template's own default: the "no skill" baseline).
2. Single-turn tasks: every request in flight at once, the `n` rollouts of a task as one request
   with `n` choices (one prefill); each trajectory is written the moment its reply arrives.
3. Multi-turn tasks (agents) run in lock-step, one round of requests a step (agent_loop.py).
4. Failures never crash a run and are never a silent 0: `.error` is counted apart, and `all_failed`
   says when every rollout failed (the evaluations then exit non-zero).
5. R = SR − λ·NHR, λ = LAM_NH = 0.1 by default; SR with a 95% Wilson score interval."""
from __future__ import annotations

import argparse
import dataclasses
import signal
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Callable, Protocol, runtime_checkable

from minskill.files import append_jsonl, write_json_atomic, write_jsonl_atomic
from minskill.cli import (EXTRA_BODY_EXAMPLE, QUANTIZE_HELP, add_alfworld_data_arg,
                          add_extra_body_arg, add_prefix_cache_arg,
                          add_max_reply_arg, add_skill_files_arg, client_args)
from minskill.nn.quantize import QUANTIZE_CHOICES
from minskill.retrieval import (RetrievalError, add_retrieval_args, check_retrieval_args,
                                retriever_from_args,
                                with_retrieval)
from minskill.paired import wilson_interval
from minskill.runs import clean_staging
from minskill.agent_loop import run_multi_turn
from minskill.serve.client import chat_as_completed
from minskill.serve.embedded import embedded_client
from minskill.skillsets import SkillSet
from minskill.trajectories import Trajectory, chat_error, load_trajectories, with_system
from minskill.tasks import (BASE_SKILLS_DIR, GAIA_SUBMISSION, SUITES, TaskWarning, is_task_file,
                            load_suite, skill_key_type, suite_types, withhold_hidden)
from minskill.tasks.search_r1 import add_retriever_url_arg
from minskill.web import add_web_args   # (importing it gives web suites their tools)


# ------------------------------------------------------------------------------------------ running


def run_rollouts(client, tasks, skills=None, *, n: int = 1, temperature: float = 0.0,
                 max_tokens: int = 256, seed: int | None = 0, out_path=None, progress: Callable
                 | None = None,
                 max_steps: int | None = None, action_max_tokens: int = 64, history: int | None = 8,
                 skill_max_tokens: int = 1024, on_step: Callable | None = None) -> list[Trajectory]:
    """`n` rollouts of every task under `skills`, in task order (a task's samples together); agents:
    agent_loop.run_multi_turn."""
    if n < 1:
        raise ValueError(f"run_rollouts: n must be >= 1, got {n}")
    tasks = list(tasks)
    results: list[tuple[int, int, Trajectory]] = []   # (task position, sample, trajectory)

    def finish(traj: Trajectory, position: int) -> None:
        results.append((position, traj.sample, traj))
        if out_path is not None or progress is not None:
            _report(traj, out_path, progress, len(results), len(tasks) * n)

    system = skill_prompts(skills, tasks, skill_max_tokens)   # by task position
    multi = [(i, t) for i, t in enumerate(tasks) if t.multi_turn]
    single = [(i, t) for i, t in enumerate(tasks) if not t.multi_turn]
    _run_single_turn(client, single, system, finish, n=n, temperature=temperature,
                     max_tokens=max_tokens, seed=seed)
    if multi:   # the agent loop
        run_multi_turn(client, multi, system, finish, n=n, temperature=temperature,
                       max_tokens=action_max_tokens, seed=seed, max_steps=max_steps,
                       history=history, on_step=on_step)
    return [traj for _, _, traj in sorted(results, key=lambda r: r[:2])]


@runtime_checkable
class RendersSkills(Protocol):
    """What the rollout code needs of skills: Skill and SkillSet both render their system-prompt
    text for a task type within a token budget (skills.py and skillsets.py)."""

    def render(self, task_type: str | None = None, max_tokens: int = 1024) -> str: ...


def skill_prompts(skills, tasks: list, max_tokens: int = 1024) -> list[str]:
    """Each task's system-prompt text: one rendering per task type, or per task when the skills
    retrieve."""
    if callable(getattr(skills, "render_for_tasks", None)):
        return skills.render_for_tasks(tasks, max_tokens)
    by_type = {t: skill_text(skills, t, max_tokens)
               for t in dict.fromkeys(task.type for task in tasks)}
    return [by_type[task.type] for task in tasks]


def skill_text(skills, task_type: str | None = None, max_tokens: int = 1024) -> str:
    """The system-prompt text of `skills` (module docstring) for a task of `task_type`: a string
    as-is, None ""."""
    if skills is None or isinstance(skills, str):
        return (skills or "").strip()
    if isinstance(skills, RendersSkills):
        return skills.render(task_type=task_type, max_tokens=max_tokens).strip()
    raise TypeError("skills must be a SkillSet, a Skill, a str or None, not "
                    f"{type(skills).__name__}")


def _run_single_turn(client, single: list, system: list, finish: Callable, *, n, temperature,
                     max_tokens, seed):
    """Every request in flight at once (n choices each), each task finished the moment its reply
    arrives."""
    requests = [dict(messages=with_system(system[i],
                                          [{"role": "user", "content": t.prompt or t.question}]),
                     n=n, temperature=temperature, max_tokens=max_tokens, seed=seed)
                for i, t in single]
    for k, answer in chat_as_completed(client, requests):
        position, task = single[k]
        for j in range(n):
            traj = Trajectory(task_id=task.id, task_type=task.type,
                              messages=list(requests[k]["messages"]), sample=j, steps=1)
            if isinstance(answer, BaseException):
                traj.error = chat_error(answer)
            elif j >= len(answer.texts):
                traj.error = f"server returned {len(answer.texts)} choices, asked for {n}"
            else:
                traj.reply, traj.reasoning = answer.texts[j] or "", (getattr(answer, "reasonings",
                                                                             0) or [""] * n)[j]
                traj.messages.append({"role": "assistant", "content": traj.reply})
                traj.reward, traj.error = _score(task, traj.reply)
                traj.success = traj.reward >= 1.0
            finish(traj, position)


def _score(task, reply: str) -> tuple[float, str | None]:
    try:   # (a task whose answer is hidden, GAIA's test split's, is answered and never scored)
        return (0.0 if getattr(task, "answer", "") is None else float(task.score(reply))), None
    except Exception as e:  # a verifier bug must not take the whole run down
        return 0.0, f"verifier failed: {type(e).__name__}: {e}"


def _report(traj: Trajectory, out_path, progress: Callable | None, done: int, total: int) -> None:
    """A finished rollout appended to out_path and passed to `progress(done, total, trajectory)`,
    where asked."""
    if out_path is not None:
        append_jsonl(out_path, traj.to_json())
    if progress is not None:
        progress(done, total, traj)


# ---------------------------------------------------------------------------------------- summaries


# the default λ of R = SR − λ·NHR: MASA's search (MasaConfig), rewrite.py and --lam-nh read it
LAM_NH = 0.1


def summarize(trajectories, lam_nh: float = LAM_NH) -> dict:
    """`_stats` (adjusted_reward: R = SR − lam_nh·NHR) over all trajectories and per task type
    (types sorted)."""
    trajs = list(trajectories)
    types = sorted({t.task_type for t in trajs})
    per_type = {ty: _stats([t for t in trajs if t.task_type == ty], lam_nh) for ty in types}
    return {**_stats(trajs, lam_nh), "lam_nh": lam_nh, "per_type": per_type}


def _stats(trajs: list[Trajectory], lam_nh: float) -> dict:
    # d: the means' divisor
    n, wins, d = len(trajs), sum(t.success for t in trajs), max(len(trajs), 1)
    sr, nhr = wins / d, sum(t.nothing_happens / t.steps if t.steps else 0.0 for t in trajs) / d
    return dict(n=n, success_rate=sr, success_ci95=list(wilson_interval(wins, n)), nhr=nhr,
                adjusted_reward=sr - lam_nh * nhr, mean_reward=sum(t.reward for t in trajs) / d,
                mean_steps=sum(t.steps for t in trajs) / d,
                errors=sum(t.error is not None for t in trajs),
                trimmed=sum(t.trimmed > 0 for t in trajs),
                reasoning_cut=sum(bool(t.reasoning) and not t.reply.strip() and t.error is None
                                  for t in trajs))


def all_failed(trajectories) -> str | None:
    """When there are rollouts and every one ended with an error, none scored (the task model
    unreachable, or refusing every request): a sentence saying so and quoting the first error. None
    otherwise. Every evaluation that reports a success rate asks this, and stops non-zero on it
    rather than report a 0."""
    trajs = list(trajectories)
    if not trajs or any(t.error is None for t in trajs):
        return None
    return (f"every one of the {len(trajs)} rollouts ended with an error, none was scored (is the "
            f"task model reachable?); the first: {trajs[0].error[:600]}")


def reasoning_cut_note(summary: dict, budget_flag: str = "--task-max-tokens") -> str | None:
    """What a run says once when replies ended inside their reasoning: the count and the fix (None:
    none did)."""
    cut = summary.get("reasoning_cut")
    return (f"note: {cut} of the {summary['n']} replies ended inside the task model's reasoning "
            f"(no answer: scored 0); give a larger {budget_flag}, or turn thinking off: "
            f"--task-extra-body '{EXTRA_BODY_EXAMPLE}'") \
        if cut else None


def cut_totals(records, of: str = "n") -> dict:
    """reasoning_cut_note's summary over several records: summaries, or rows that count their
    rollouts under `of` (None, and a record written before the counts existed, adds 0)."""
    records = [r for r in records if r is not None]
    return {"reasoning_cut": sum(r.get("reasoning_cut", 0) for r in records),
            "n": sum(r.get(of, 0) for r in records)}


def format_table(summary: dict) -> str:
    """A Markdown table: one row per task type, then the whole run."""
    head = ("| task type | n | success | 95% CI | NHR | mean steps | errors |\n"
            "|---|---|---|---|---|---|---|")
    rows = [head]
    for name, s in list(summary["per_type"].items()) + [("**all**", summary)]:
        lo, hi = s["success_ci95"]
        rows.append(f"| {name} | {s['n']} | {s['success_rate']:.2f} | {lo:.2f}–{hi:.2f} | "
                    f"{s['nhr']:.2f} | {s['mean_steps']:.1f} | {s['errors']} |")
    return "\n".join(rows)


# ------------------------------------------------------------------------------------- which skills


class SkillsNotFound(FileNotFoundError):
    """--skills / --seed-skills names no file or folder, or "base" for a suite without base
    skills."""


def load_skills(spec: str | None, suite: str):
    """--skills: "none" -> None; "base" -> the suite's hand-written base skills (`base_skills`); a
    folder or .json -> SkillSet.load, read for the suite (`fit_to_suite`); any other file -> its
    text, used as-is. Raises SkillsNotFound naming what is missing."""
    if spec is None or spec.lower() in ("", "none"):
        return None
    if spec.lower() == "base":
        return base_skills(suite)
    path = Path(spec)
    if not path.exists():
        raise SkillsNotFound(f"--skills {spec}: no such file or folder (or use 'none' / 'base')")
    if path.is_dir() or path.suffix.lower() == ".json":
        return fit_to_suite(SkillSet.load(path), suite, spec)
    return path.read_text(encoding="utf-8-sig")


def base_skills(suite: str) -> SkillSet:
    """A built-in suite's base skills (BASE_SKILLS_DIR/<suite>); for a JSONL suite, those of its
    task types from every built-in base skill set that has some (its general skills, its skills for
    those types, its common mistakes). SkillsNotFound, naming the file and its types, when none has
    any."""
    if not is_task_file(suite):
        if suite in SUITES and (BASE_SKILLS_DIR / suite).is_dir():
            return SkillSet.load(BASE_SKILLS_DIR / suite)
        raise SkillsNotFound(f"--skills base: no base skills for suite {suite!r} under "
                             f"{BASE_SKILLS_DIR}")
    types, general, task_specific, mistakes = suite_types(suite), [], {}, []
    for folder in sorted(p for p in BASE_SKILLS_DIR.iterdir() if p.is_dir()):
        base = SkillSet.load(folder)
        keys = [key for key in base.task_specific if skill_key_type(key, types)]
        if keys:
            general += [s for s in base.general if s.name not in {g.name for g in general}]
            task_specific.update({key: base.task_specific[key] for key in keys})
            mistakes += [m for m in base.common_mistakes if m not in mistakes]
    if not task_specific:
        raise SkillsNotFound(f"--skills base: {suite}: no built-in base skills for its task types "
                             f"({', '.join(types)}); give a skill-set folder or .json, or 'none'")
    return fit_to_suite(SkillSet(general=general, task_specific=task_specific,
                                 common_mistakes=mistakes), suite,
                        "base")


def fit_to_suite(skills: SkillSet, suite: str, where: str) -> SkillSet:
    """A library as `suite` reads it: task-specific skills keyed by another name of one of its types
    (tasks.skill_key_type: ALFWorld's and MASA's household names) moved under that type (a skill
    whose name the type already holds is left out); a TaskWarning names the keys that match no type
    of the suite (their skills are never shown). Every loader of a library for a suite calls
    this."""
    types = suite_types(suite)
    target = {key: skill_key_type(key, types) for key in skills.task_specific}
    unmatched = [key for key, task_type in target.items() if task_type is None]
    if unmatched:
        warnings.warn(f"{where}: task-specific skills for {', '.join(map(repr, unmatched))} match "
                      f"no task type of suite {suite} ({', '.join(types)}); they are never shown",
                      TaskWarning, stacklevel=2)
    if all(task_type in (key, None) for key, task_type in target.items()):
        return skills
    keyed: dict[str, list] = {}
    for key, group in skills.task_specific.items():
        held = keyed.setdefault(target[key] or key, [])
        held += [s for s in group if s.name not in {h.name for h in held}]
    return dataclasses.replace(skills, task_specific=keyed).validate()


# --------------------------------------------------------------------------- the evaluation command


def main(argv=None) -> int:
    p = _parser()
    args = p.parse_args(argv)
    if threading.current_thread() is threading.main_thread():
        # `timeout`/`kill` send SIGTERM: exit through the `with` blocks so the embedded server is
        # stopped too
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        tasks = load_suite(args.suite, split=args.split, seed=args.task_seed, n=args.n_tasks,
                           hidden_answers=True)
    except (ValueError, FileNotFoundError) as e:
        p.error(str(e))
    hidden = {t.id for t in tasks if t.answer is None and not t.multi_turn}   # GAIA's test split
    try:
        skills = load_skills(args.skills, args.suite)
        check_retrieval_args(args)
    except (RetrievalError, SkillsNotFound, ValueError) as e:   # (SkillFormatError is a ValueError)
        p.error(str(e))
    suite_name = Path(args.suite).stem if args.suite.endswith(".jsonl") else args.suite
    out_dir = Path(args.out or f"runs/eval-{suite_name}-{time.strftime('%Y%m%d-%H%M%S')}")
    out_dir.mkdir(parents=True, exist_ok=True)
    clean_staging(out_dir)  # what a killed earlier run left half-written
    traj_path = out_dir / "trajectories.jsonl"
    previous: list[Trajectory] = []
    if traj_path.exists() and traj_path.stat().st_size > 0:
        if not args.resume:
            p.error(f"{traj_path} already exists; pass --resume to continue it or choose another "
                    "--out")
        try:
            previous, tasks = _resume(traj_path, tasks, args.n)
        except ValueError as e:
            p.error(str(e))
        print(f"resuming: {len(previous)} trajectories kept, {len(tasks)} tasks to run",
              file=sys.stderr)

    started = time.time()
    n_multi = sum(t.multi_turn for t in tasks)
    print(f"{suite_name}/{args.split}: {len(tasks)} tasks ({n_multi} multi-turn) x {args.n}, "
          f"skills={args.skills}, temperature={args.temperature} -> {out_dir}", file=sys.stderr,
          flush=True)
    skills, trajs, stats = _run_tasks(p, args, skills, tasks, traj_path, started)
    scored = withhold_hidden(previous + trajs, hidden,   # GAIA's test split: its answers are hidden
                             lambda lines: write_jsonl_atomic(out_dir / GAIA_SUBMISSION, lines))
    summary = summarize(scored, lam_nh=args.lam_nh)
    summary["run"] = dict(suite=args.suite, split=args.split, n_tasks=args.n_tasks,
                          task_seed=args.task_seed, skills=args.skills, retrieve=args.retrieve,
                          temperature=args.temperature, n=args.n, task_url=args.task_url,
                          task_model=args.task_model, alfworld_data=args.alfworld_data,
                          model=None if args.task_url else args.model_spec,
                          # seconds and client_stats cover this call only
                          seconds=round(time.time() - started, 1), client_stats=stats,
                          resumed_trajectories=len(previous),
                          skills_left_out=said_left_out(skills, tasks, args.skill_max_tokens),
                          command="python -m minskill.rollout "
                          + " ".join(sys.argv[1:] if argv is None else argv))
    write_json_atomic(out_dir / "summary.json", summary, indent=2)
    print(format_table(summary))
    _print_notes(summary, n_multi, traj_path)
    print(f"\nwrote {traj_path} and {out_dir / 'summary.json'}")
    if failed := all_failed(trajs):
        where = args.task_url or "the embedded server"
        print(f"error: {failed}\n(task model: {where}; once it answers, rerun with --resume --out "
              f"{out_dir})", file=sys.stderr)
        return 1
    return 0


def _run_tasks(p, args, skills, tasks: list, traj_path: Path, started: float):
    """(the skills, retrieving where asked; the trajectories; the client's stats) of the command's
    rollouts on --task-url's model, or the embedded server's."""
    def on_step(step, live):
        print(f"  agent step {step + 1}: {live} episodes live  {time.time() - started:.0f}s",
              file=sys.stderr, flush=True)
    server_args = ("--max-batch", str(args.task_concurrency), "--dtype", args.dtype)
    with embedded_client(**client_args(args, "task"), model_spec=args.model_spec,
                         max_workers=args.task_concurrency, timeout=args.timeout,
                         server_args=server_args, quantize=args.task_quantize) as client:
        try:   # a bad endpoint or a reply that does not parse: a usage error naming --embed-url
            skills = with_retrieval(skills, retriever_from_args(args, client, args.task_api_key))
            trajs = run_rollouts(client, tasks, skills, n=args.n, temperature=args.temperature,
                                 max_tokens=args.task_max_tokens, seed=args.seed,
                                 out_path=traj_path, progress=_progress_printer(started),
                                 max_steps=args.max_steps, action_max_tokens=args.action_max_tokens,
                                 history=args.history, skill_max_tokens=args.skill_max_tokens,
                                 on_step=on_step)
        except RetrievalError as e:
            p.error(str(e))
        usage = getattr(client, "usage", None) or {}   # and the tokens of thinking (reasoning_cut)
        stats = dict(getattr(client, "stats", {}) or {},
                     reasoning_tokens=usage.get("reasoning_tokens", 0))
    return skills, trajs, stats


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m minskill.rollout",
        description="Evaluate a frozen task model on a task suite under a skill set. Prints "
                    "success, NHR (share of 'Nothing happens.' steps), mean steps and n per task "
                    "type, with a 95% Wilson interval for success, and writes "
                    "OUT/trajectories.jsonl (appended as tasks finish) and OUT/summary.json. With "
                    "no --task-url it starts the embedded default model (SmolLM2-135M-Instruct, "
        "offline) on a loopback port.",
        epilog="example: python -m minskill.rollout --suite qa --skills base --split heldout "
               "--n-tasks 320   (on a CPU shared with other jobs, export OMP_NUM_THREADS=1 first: "
               "the embedded server inherits it and decodes far faster than with a busy-waiting "
        "thread pool)")
    p.add_argument("--suite", required=True,
                   help="qa | household | alfworld | webwalk | webshop | searchqa | "
                   "PATH.jsonl | web:PATH.jsonl")
    add_alfworld_data_arg(p)
    add_retriever_url_arg(p)
    p.add_argument("--skills", default="none",
                   help="skill set: an Agent Skills folder, a MASA .json, a text file used as-is, "
                        "'base' (the suite's hand-written base skills) or 'none' (no system "
                   "prompt; default)")
    p.add_argument("--split", default="heldout", help="train | heldout (default heldout)")
    p.add_argument("--n-tasks", type=int, default=None,
                   help="number of tasks (default: the whole split)")
    p.add_argument("--task-seed", type=int, default=0,
                   help="seed of the generated suite (default 0)")
    p.add_argument("--task-url", default=None, help="OpenAI-compatible base URL of the task model "
                   "(default $OPENAI_BASE_URL, else the embedded default model)")
    p.add_argument("--task-model", default=None, help="model name sent to --task-url")
    p.add_argument("--task-api-key", default=None,
                   help="API key for --task-url (default $OPENAI_API_KEY)")
    p.add_argument("--model-spec", default="smollm2-135m",
                   help="embedded server's model (no --task-url)")
    p.add_argument("--task-quantize", choices=QUANTIZE_CHOICES, default="none", help=QUANTIZE_HELP)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="embedded server's dtype (default float32)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="task model temperature (default 0 = greedy)")
    p.add_argument("--n", type=int, default=1,
                   help="rollouts per task (default 1; greedy makes more useless)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed sent with each request")
    p.add_argument("--task-max-tokens", type=int, default=256,
                   help="reply budget of a single-turn answer")
    add_prefix_cache_arg(p)
    add_extra_body_arg(p, "task")
    add_max_reply_arg(p)
    add_skill_files_arg(p)
    p.add_argument("--action-max-tokens", type=int, default=64,
                   help="reply budget of one agent action")
    p.add_argument("--max-steps", type=int, default=None, help="override the tasks' step budget")
    p.add_argument("--history", type=int, default=8,
                   help="past exchanges kept in an agent prompt (halved, "
                   "oldest dropped, while the task model refuses the prompt as too long for its "
                   "context)")
    p.add_argument("--skill-max-tokens", type=int, default=1024,
                   help="token budget of the rendered skills")
    add_retrieval_args(p)
    p.add_argument("--lam-nh", type=float, default=LAM_NH,
                   help="λ of the adjusted reward SR − λ·NHR (default %(default)s: MASA's "
                        "search's)")
    p.add_argument("--task-concurrency", type=int, default=16, help="requests in flight at once")
    p.add_argument("--timeout", type=float, default=600.0,
                   help="seconds one request may take (a CPU batch of long replies is slow; "
                   "default 600)")
    p.add_argument("--out", default=None, help="output folder (default runs/eval-SUITE-TIME)")
    p.add_argument("--resume", action="store_true",
                   help="OUT/trajectories.jsonl exists: keep it and run only the missing (task, "
                        "sample)s and those that ended with an error")
    add_web_args(p)
    return p


def _resume(traj_path: Path, tasks: list, n: int) -> tuple[list[Trajectory], list]:
    """(trajectories kept, tasks still to run) of an earlier run's trajectories.jsonl. A task with
    only some of its n samples done, or one that ended with an error (the task model was down), is
    run again whole; its other samples are dropped. What is kept is written back, so that new lines
    never follow a torn one. A file holding tasks outside this run's list (another --n-tasks,
    --split or --task-seed) is refused: writing back only this run's tasks would lose them."""
    previous = load_trajectories(traj_path)
    ids = {t.id for t in tasks}
    if foreign := sorted({t.task_id for t in previous} - ids):
        raise ValueError(
            f"{traj_path} holds {len(foreign)} task(s) that this run does not draw (first: "
            f"{foreign[0]!r}); --resume continues the same task list: pass the earlier run's "
            "--n-tasks, --split and --task-seed (a larger --n-tasks keeps them), or another --out")
    done = {(t.task_id, t.sample) for t in previous if t.error is None}
    complete = {t.id for t in tasks if all((t.id, j) in done for j in range(n))}
    previous = [t for t in previous if t.task_id in complete]
    write_jsonl_atomic(traj_path, [t.to_json() for t in previous])
    return previous, [t for t in tasks if t.id not in complete]


def _progress_printer(started: float) -> Callable:
    """progress(done, total, trajectory) for run_rollouts: the success rate so far, about 20 times a
    run."""
    wins = [0]

    def report(done: int, total: int, traj: Trajectory) -> None:
        wins[0] += traj.success
        if done == total or done % max(1, total // 20) == 0:
            print(f"  [{done}/{total}] success so far {wins[0] / done:.2f}  "
                  f"{time.time() - started:.0f}s", file=sys.stderr, flush=True)
    return report


def _print_notes(summary: dict, n_multi: int, traj_path: Path) -> None:
    if cut := reasoning_cut_note(summary):   # what the reply budget cut scored 0, not the task
                                             # model's weakness
        print(f"\n{cut}")
    elif summary[
        "n"] and summary["mean_reward"] == 0.0 and n_multi and summary["errors"] < summary["n"]:
        print(f"\nNote: every reward is 0 on this suite — the task model solved none of the "
              f"{summary['n']} episodes (it is too weak for this multi-turn suite).")
    if summary["trimmed"]:
        print(f"\n{summary['trimmed']} episodes had their prompts trimmed to fit the task model's "
              "context (oldest past exchanges dropped; see .trimmed and .history_kept in "
              f"{traj_path})")
    if summary["errors"]:
        print(f"\n{summary['errors']} of the {summary['n']} trajectories ended with an error and "
              f"were not scored (counted as failed; see .error in {traj_path}; --resume runs them "
              "again)")


def said_left_out(skills, tasks: list, max_tokens: int) -> dict[str, dict[str, int]]:
    """What the skills' prompt of each task type leaves out to fit `max_tokens` (SkillSet.left_out;
    {} for other skills), said once on the console: the summary keeps it as run.skills_left_out."""
    if not isinstance(skills, SkillSet):
        return {}
    left_out = skills.left_out([t.type for t in tasks], max_tokens)
    if left_out:
        counts = "; ".join(f"{t}: {c['task_specific']} own, {c['general']} general, "
                           f"{c['common_mistakes']} mistakes" for t, c in left_out.items())
        print(f"note: to fit --skill-max-tokens {max_tokens}, the prompt leaves out skills "
              f"({counts}; summary.json: run.skills_left_out)", file=sys.stderr)
    return left_out


if __name__ == "__main__":
    sys.exit(main())
