"""The web agent's tool calls through OpenAI's `tools` field: rollout's agent loop asks a ToolCalls
about each request and reply of a web episode (tasks/webagent.py's environment takes the steps).

--tool-calls (MINSKILL_TOOL_CALLS) says how the agent calls its tools:

    openai   each request of a web episode carries `tools` (the task's tools and `answer` as JSON
             schemas, WebAgentEnv.tool_schemas), `tool_choice` (--tool-choice: "required", the
             default, or "auto") and `parallel_tool_calls: false`; the server parses the model's
             calls (vLLM does, and minskill's own: docs/http-api.md). The reply's first call is
             the step: the conversation keeps it as the assistant turn's tool_calls and its result
             (cut to the observation budget) as a `tool` turn with the call's tool_call_id. A
             malformed call (a tool the task does not offer, arguments that are not the tool's) is
             a tool error the agent sees and the run counts. A reply without a call is read as
             ReAct text.
    react    the ReAct text format that minskill parses (tasks/webagent.py); no `tools` are sent.
    auto     (the default) openai, but where the server refuses `tools` (an HTTP 400 whose message
             names them: llama.cpp without --jinja, vLLM asked for "auto" without
             --enable-auto-tool-choice, a server without tool calls) the refused requests are sent
             again as react, as is every later request through that client (the rest of the run:
             said once on stderr).

Either way the trajectory records a call as the action verb[argument] it is, its result as the
observation (tasks.webagent.tool_call_counts counts both formats alike).
"""
from __future__ import annotations

import json
import re
import sys
import weakref

from minskill.serve.client import ChatError

from .tools import WebSettings

_TOOL_FIELDS = re.compile(r"\btools?\b|tool_choice|tool[ _-]call", re.I)
_REFUSED = weakref.WeakSet()   # clients whose server refused `tools`: ReAct for the rest of the run


class ToolCalls:
    """One run's tool calls to `client`'s server (module docstring): fields() of each request,
    refused() of each failed one, advance() on each reply."""

    def __init__(self, client):
        self.client, self.react = client, client in _REFUSED
        self._settings: WebSettings | None = None

    @property
    def settings(self) -> WebSettings:   # (read at the first web episode: other suites need none)
        if self._settings is None:
            self._settings = WebSettings.from_environ()
        return self._settings

    def fields(self, episode) -> dict:
        """The tool fields of the episode's next request: {} in the ReAct format."""
        episode.tools_sent = callable(getattr(episode.env, "tool_schemas", None)) and (
            self.settings.tool_calls == "openai"
            or self.settings.tool_calls == "auto" and not self.react)
        if not episode.tools_sent:
            return {}
        return {"tools": episode.env.tool_schemas(), "tool_choice": self.settings.tool_choice,
                "parallel_tool_calls": False}

    def refused(self, episode, answer) -> bool:
        """Whether to send the episode's request again in the ReAct format: in auto, when the
        server refused the `tools` it carried; from then on the server is sent none."""
        if not (getattr(episode, "tools_sent", False) and refuses_tools(answer)
                and self.settings.tool_calls == "auto"):
            return False
        if not self.react:
            self.react = True
            try:
                _REFUSED.add(self.client)
            except TypeError:   # (a client that takes no weak reference: this call of the run only)
                pass
            print(f"note: the task model's server refuses OpenAI's `tools` field "
                  f"({answer.message[:300]}); the web agents call their tools in the ReAct text "
                  f"format for the rest of the run (--tool-calls react skips the try)",
                  file=sys.stderr, flush=True)
        return True

    def advance(self, episode, answer) -> None:
        """The episode's step on `answer` (a ChatResult): its first tool call where it made one,
        else its text read as ReAct (the episode's own step)."""
        text = answer.texts[0] if answer.texts else ""
        made = (getattr(answer, "tool_calls", None) or [[]])[0]
        if not (made and getattr(episode, "tools_sent", False)):
            return episode.advance(text)
        written = [f"{_function(c)[0]}({_function(c)[1]})" for c in made]
        step = len(episode.traj.actions) + 1
        episode.advance("\n".join(([text] if text else []) + written),
                        lambda reply: call_step(episode.env, text, made, step))


def refuses_tools(answer) -> bool:
    """Whether a request's answer is an HTTP 400 whose message names the tool fields."""
    return isinstance(answer, ChatError) and answer.status == 400 \
        and bool(_TOOL_FIELDS.search(answer.message))


def call_step(env, content: str, made: list[dict], step: int):
    """(action, env's (observation, done, success), the exchange's two messages) of a reply's
    first call; the calls after it are not run (the tool turn says so)."""
    name, arguments = _function(made[0])
    action, observation, done, success = env.call(name, arguments)
    call_id = made[0].get("id") if isinstance(made[0].get("id"), str) else ""
    call_id = call_id or f"call_step{step}"
    result = observation.strip()
    if len(made) > 1:
        result += f"\n(one call a reply: the {len(made) - 1} after the first were not run)"
    replayed = {"id": call_id, "type": "function",
                "function": {"name": str(name)[:64], "arguments": _object_text(arguments)}}
    exchange = [{"role": "assistant", "content": content, "tool_calls": [replayed]},
                {"role": "tool", "tool_call_id": call_id, "content": result}]
    return action, (observation, done, success), exchange


def _function(call: dict) -> tuple[str, object]:
    function = call.get("function") if isinstance(call.get("function"), dict) else {}
    return str(function.get("name") or ""), function.get("arguments", "")


def _object_text(arguments) -> str:
    """The arguments as a JSON object's text for the conversation: as they came where they are
    one (a malformed call's: {}, its tool error quotes them), since servers reject bad JSON."""
    if isinstance(arguments, dict):
        return json.dumps(arguments, ensure_ascii=False)
    try:
        return arguments if isinstance(json.loads(arguments), dict) else "{}"
    except (TypeError, ValueError, RecursionError):
        return "{}"
