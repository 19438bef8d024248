"""Multi-turn rollouts, the agent loop (rollout.run_rollouts' tasks with `multi_turn`).

`obs = env.reset()`; then, up to the step budget, the model is shown the observation (the first user
message also holds the instruction and the action syntax the environment declares; each turn lists
`env.admissible_actions()` when there are any), its reply is parsed leniently into one action
(`parse_action`, minskill/tasks/base.py) and `obs, done, success = env.step(action)`.

Decisions (in full: docs/rollouts.md):
1. All live episodes advance in lock-step: one round of concurrent requests a step (one batch).
2. An agent prompt keeps the first user message and the last `history` exchanges.
3. A prompt too long for the task model's context (`is_context_refusal`) keeps half as many past
   exchanges, for this and later steps, until it fits; one that never fits ends with `.error`.
4. A broken environment fails its episode (`.error`), never the run."""
from __future__ import annotations

import dataclasses
from typing import Callable

from minskill.serve.client import chat_as_completed
from minskill.tasks import make_env
from minskill.tasks.base import NOTHING_HAPPENS, is_context_refusal, parse_action
from minskill.trajectories import Trajectory, chat_error, with_system
from minskill.web.agent_calls import ToolCalls


def run_multi_turn(client, multi: list, system: list, finish: Callable, *, n, temperature,
                   max_tokens, seed,
                    max_steps, history, on_step):
    """All episodes in lock-step: one round of concurrent requests per step across every live
    episode. `max_steps` overrides the tasks' budgets, `history` bounds the past exchanges a prompt
    keeps (None = all), `on_step(step, live_episodes)` runs before each step."""
    calls = ToolCalls(client)   # a web agent's tools in the request's `tools` field where served
                                # (web.agent_calls)
    def request(ep: _Episode) -> dict:
        return dict(messages=ep.prompt(history), n=1, temperature=temperature,
                    max_tokens=max_tokens,
                    seed=None if seed is None else seed + ep.sample, **calls.fields(ep))

    step, episodes = 0, _start_episodes(multi, system, finish, n, max_steps)
    while episodes:
        if on_step is not None:
            on_step(step, len(episodes))
        step += 1
        for ep, answer in zip(episodes, _fitting_replies(client, episodes, request, calls.refused)):
            if is_context_refusal(answer):
                why = (f"{ep.shown} past exchange shown after {ep.traj.trimmed} trims" if ep.shown
                       else
                       "the system prompt and the task alone do not fit")
                ep.fail("prompt too long for the task model's context, nothing left to trim "
                        f"({why}): {chat_error(answer)}")
            elif isinstance(answer, BaseException):
                ep.fail(chat_error(answer))
            else:
                try:
                    ep.traj.reasoning = "\n\n".join(filter(None,
                                                           (ep.traj.reasoning,
                                                            getattr(answer, "reasoning", ""))))
                    calls.advance(ep, answer)   # (ep.advance on its text, or a tool call)
                except Exception as e:
                    ep.fail(f"environment failed at step {ep.traj.steps}: {type(e).__name__}: {e}")
            if ep.done:
                finish(ep.traj, ep.position)
        episodes = [ep for ep in episodes if not ep.done]


def _start_episodes(multi: list, system: list, finish: Callable, n: int, max_steps: int
                    | None) -> list[_Episode]:
    """The n episodes of each multi-turn task, reset; those that fail or end at once are finished
    here."""
    episodes = []
    for position, task in multi:
        for j in range(n):
            try:
                ep = _Episode(task, j, system[position], max_steps)
            except Exception as e:  # a broken environment fails its task, not the run
                finish(Trajectory(task_id=task.id, task_type=task.type, messages=[], sample=j,
                                  error=f"environment failed at reset: {type(e).__name__}: {e}"),
                       position)
                continue
            ep.position = position
            if ep.done:
                finish(ep.traj, position)
            else:
                episodes.append(ep)
    return episodes


class _Episode:
    """One live multi-turn rollout: its environment, conversation and counters."""

    def __init__(self, task, sample: int, system: str, max_steps: int | None):
        if max_steps is not None and dataclasses.is_dataclass(task):
            # the environment enforces the budget too
            task = dataclasses.replace(task, max_steps=max_steps)
        self.task, self.sample = task, sample
        self.env = make_env(task)
        self.syntax = list(self.env.action_syntax)
        self.budget = int(max_steps if max_steps is not None else task.max_steps)
        obs = self.env.reset()
        self.traj = Trajectory(task_id=task.id, task_type=task.type, sample=sample,
                               observations=[obs],
                               messages=with_system(system, [
                                   {"role": "user",
                                    "content": _first_user_message(task, obs, self.syntax)}]))
        self.admissible = list(self.env.admissible_actions())
        self.done, self.shown = self.budget <= 0, 0     # shown: the past exchanges the last prompt
                                                        # showed

    def prompt(self, history: int | None) -> list[dict]:
        """The messages sent for the next step: system + first user turn + the last `history`
        exchanges (fewer once the task model refused a prompt as too long: `trim`), with the
        admissible actions appended to the newest observation only (they are long)."""
        msgs = self.traj.messages
        head = 2 if msgs[0]["role"] == "system" else 1
        past = (len(msgs) - head) // 2     # each step appended (the reply, its observation)
        self.shown = keep = min(x for x in (past, history, self.traj.history_kept) if x is not None)
        out = [dict(m) for m in msgs[:head] + msgs[len(msgs) - 2 * keep:]]
        out[-1]["content"] += _turn_prompt(self.admissible)
        return out

    def trim(self) -> bool:
        """After the task model refused the last prompt as too long: keep half the past exchanges it
        showed (the oldest go; the newest, which holds the current observation, stays) in this and
        later prompts. False when it showed one or none: nothing is left to drop."""
        if self.shown <= 1:
            return False
        self.traj.history_kept, self.traj.trimmed = self.shown // 2, self.traj.trimmed + 1
        return True

    def advance(self, reply: str, act: Callable | None = None) -> None:
        """One step: `act(reply)` -> (action, env.step's result, messages); default: the text's
        (parse_action)."""
        t = self.traj
        t.reply, t.steps = reply, t.steps + 1
        action, (obs, finished, success), exchange = (act or self._text_step)(reply)
        t.actions.append(action)
        t.observations.append(obs)
        t.nothing_happens += obs.strip() == NOTHING_HAPPENS
        t.messages += exchange
        if finished or t.steps >= self.budget:
            t.success, t.reward, self.done = bool(success), 1.0 if success else 0.0, True
        else:
            self.admissible = list(self.env.admissible_actions())

    def _text_step(self, reply: str) -> tuple:
        action = parse_action(reply, self.admissible, self.syntax)
        result = self.env.step(action)  # an empty action is the env's to judge
        return action, result, [{"role": "assistant", "content": reply},
                                {"role": "user", "content": f"Observation: {result[0].strip()}"}]

    def fail(self, error: str) -> None:
        self.traj.error, self.traj.success, self.traj.reward, self.done = error, False, 0.0, True


def _first_user_message(task, observation: str, syntax: list[str]) -> str:
    parts = []
    question = (getattr(task, "question", "") or "").strip()
    if question and question not in observation:
        parts.append(question)
    if syntax:
        parts.append("Allowed actions (one per reply):\n" + "\n".join(f"- {s}" for s in syntax))
    parts.append(f"Observation: {observation.strip()}")
    return "\n\n".join(parts)


def _turn_prompt(admissible: list[str]) -> str:
    listed = ("\nAdmissible actions: " + ", ".join(admissible)) if admissible else ""
    return f"{listed}\nReply with one action only."


def _fitting_replies(client, episodes: list[_Episode], request: Callable,
                     refused: Callable) -> list:
    """Each episode's reply (or exception) to `request(episode)`, sent concurrently; a prompt the
    task model refuses as too long (is_context_refusal) is built again shorter (_Episode.trim) and
    sent again, until it fits or nothing is left to drop (then the refusal is its answer); so is one
    that refused(episode, answer)."""
    answers, todo = [None] * len(episodes), list(range(len(episodes)))
    while todo:
        for k, answer in zip(todo, _chat_all(client, [request(episodes[k]) for k in todo])):
            answers[k] = answer
        todo = [k for k in todo if refused(episodes[k], answers[k])
                or is_context_refusal(answers[k]) and episodes[k].trim()]
    return answers


def _chat_all(client, requests: list[dict]) -> list:
    """All replies (or exceptions) in request order, requests run concurrently."""
    return [answer
            for _, answer in sorted(chat_as_completed(client, requests), key=lambda done: done[0])]
