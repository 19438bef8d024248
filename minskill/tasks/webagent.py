"""`web:` suites: a tool-using agent (Skill-R1's GAIA and WebWalker setting) that searches the web,
visits pages over HTTP and reads its task's file: in a ReAct text format that minskill parses, or
through OpenAI's `tools` field where the task model's server serves tool calls (below).

    load_suite("web:PATH.jsonl")   GAIA's metadata.jsonl (or {question, answer} lines), with tools
    load_suite("PATH.jsonl")       a file in WebWalkerQA's format (lines with "root_url") is one too

The agent's actions, one a reply (rollout.parse_action finds it in free text: "Action: visit[3]",
"Answer: 42", "FINAL ANSWER: 42" all read):

    search[query]          the web search backend's top results: title, URL and snippet each
    visit[URL]  visit[n]   a page as readable text with its links numbered [1] [2] ...; visit[n]
                           follows link n of the page shown last
    read_file[name]        the task's own attachment (GAIA's file_name), and no other file
    answer[text]           ends the episode

A task offers the tools its setting has: a WebWalkerQA task `visit` (WebWalker's agent starts at the
root URL and browses; the root page is the first observation), a GAIA task `search`, `visit` and,
with a file, `read_file`; `search` only where a search backend is set. --tools (MINSKILL_WEB_TOOLS)
narrows or widens that. A tool that fails (a backend or page that does not answer, a refused host, a
binary file, a redirect loop) answers "Tool error (verb): why" — the agent sees it and goes on;
`env.tool_errors` counts them and `env.tool_calls` the calls of each tool. An action that is none of
these (or a tool the task does not offer) is "Nothing happens.". Each observation is cut to the
observation budget (--observation-chars, MINSKILL_OBSERVATION_CHARS).

Scoring of answer[text]: a GAIA task by GAIA's scorer (verifiers.gaia_score on "FINAL ANSWER:
text"); any other by normalised exact match (success) and token F1 (`env.em`, `env.f1`,
verifiers.exact_match / token_f1), or, where a judge is set (--judge-url, MINSKILL_JUDGE_URL), by
the judge's verdict on WebWalker's judging prompt (minskill.web.tools.JUDGE_PROMPT); the last
observation records the scores and the verdict. A judge that fails fails the episode (an error the
run counts; --resume runs it again), never a silent 0.

WebWalkerQA's lines: {"question", "answer", "root_url", "info": {"type": "single_source" |
"multi_source", "difficulty_level": "easy" | "medium" | "hard", ...}} -> task type
"<type>_<difficulty_level>", WebWalker's six report rows. Optional minskill fields on either format:
"id", "split" (else a stable hash of the id decides), "oracle" (a list of actions that solves the
task: `oracle_actions`, for tests). A bad line is a ValueError naming FILE:LINE; a GAIA task whose
answer is hidden (GAIA's test split) is refused (nothing here can score it).

Tool calls (OpenAI's `tools` field, minskill.web.agent_calls): `tool_schemas()` lists the task's
tools and `answer` as that field does (web_search, visit, read_file, answer: one string argument
each, TOOL_ARGUMENTS), and `call(name, arguments)` takes a step on one call as the action
verb[argument] it is (recorded so in the trajectory); a malformed call (a tool the task does not
offer, arguments that are not a JSON object with the tool's string) is a counted tool error the
agent sees, "Tool error (name): why".

The tools themselves (HTTP, the host allow-list, size caps) live in minskill.web, which hands them
in with `use_toolbox` when it is imported (the scripts import it), so that tasks/ imports nothing
else of minskill.
"""
from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

from .base import (NOTHING_HAPPENS, Environment, Task, TaskWarning, check_split, check_task_type,
                   stable_hash)
from .qa import (GAIA_PROMPT, _file_beside, _lines, _task_from_record, is_hidden_answer,
                 tasks_from_jsonl)
from .verifiers import exact_match, gaia_score, token_f1

WEB_PREFIX = "web:"
MAX_STEPS = 12
TOOLS = ("search", "visit", "read_file")
SYNTAX = {"search": "search [query]", "visit": "visit [URL or link number]",
          "read_file": "read_file [file name]", "answer": "answer [text]"}
# each tool's one argument (OpenAI's `tools` field): (tool name, argument, what the tool does)
TOOL_ARGUMENTS = {
    "search": ("web_search", "query", "Search the web: the top results' titles, URLs, snippets."),
    "visit": ("visit", "url", "A web page as text with its links numbered [1] [2] ...; `url` is an "
              "http(s) URL or the number of a link on the page shown last."),
    "read_file": ("read_file", "name", "The task's own attached file, as text."),
    "answer": ("answer", "answer", "Give your final answer; this ends the task.")}
_ACTION = re.compile(r"(search|visit|read_file|answer)\s*(?:\[(.*)\]|[:\s]\s*(.+))", re.S | re.I)
_LINK_NUMBER = re.compile(r"(?:link\s*)?\[?\s*(\d{1,4})\s*\]?", re.I)


class ToolError(Exception):
    """A tool call that failed for a reason the agent is told (the message names what and why)."""


_toolbox_factory = None


def use_toolbox(factory) -> None:
    """Install the tools: `factory()` makes an episode's toolbox (WebTools.from_environ)."""
    global _toolbox_factory
    _toolbox_factory = factory


def _toolbox():
    if _toolbox_factory is None:
        raise RuntimeError("web tasks need minskill.web's tools: import minskill.web (scripts do)")
    return _toolbox_factory()


# --------------------------------------------------------------------------- environment

class WebAgentEnv(Environment):
    """An episode of a web task: the tools of its setting, the page's links, the answer's scores."""

    def __init__(self, spec: dict, max_steps: int = MAX_STEPS):
        super().__init__(max_steps)
        self.spec = spec
        self.tools = _toolbox()
        offered = [t for t in (self.tools.tools or spec["tools"]) if t in TOOLS]
        self.offered = [t for t in offered if (t != "search" or self.tools.can_search)
                        and (t != "read_file" or spec.get("file"))]
        self.action_syntax = tuple(SYNTAX[t] for t in self.offered + ["answer"])

    def step(self, action: str) -> tuple[str, bool, bool]:
        """As Environment.step, but the tools read the action as written (a URL's path is
        case-sensitive), without its trailing full stop (as normalize_action)."""
        written = " ".join(str(action).split()).strip("`'\"")
        self._written = written[:-1].rstrip() if written.endswith(".") else written
        return super().step(action)

    def tool_schemas(self) -> list[dict]:
        """The task's tools and `answer` as OpenAI's `tools` field lists them (TOOL_ARGUMENTS)."""
        schemas = []
        for verb in self.offered + ["answer"]:
            name, argument, description = TOOL_ARGUMENTS[verb]
            parameters = {"type": "object", "properties": {argument: {"type": "string"}},
                          "required": [argument], "additionalProperties": False}
            schemas.append({"type": "function", "function": {
                "name": name, "description": description, "parameters": parameters}})
        return schemas

    def call(self, name: str, arguments) -> tuple[str, str, bool, bool]:
        """A step on one tool call (OpenAI's: a name, its arguments as JSON text): (the action it
        is, verb[argument], then step's observation, done, success). A malformed call is a step
        whose observation is "Tool error (name): why", counted as a failing tool is."""
        name = str(name)[:64]
        verb = next((v for v, (tool, _, _) in TOOL_ARGUMENTS.items() if tool == name), name)
        try:
            action = f"{verb}[{self._call_argument(verb, arguments)}]"
        except ToolError as error:
            self._call_error = (verb, f"Tool error ({name}): {error}")
            written = arguments if isinstance(arguments, str) else json.dumps(arguments)
            action = f"{verb}[{written}]"
        return (action, *self.step(action))

    def _call_argument(self, verb: str, arguments) -> str:
        if verb not in self.offered + ["answer"]:
            tools = ", ".join(TOOL_ARGUMENTS[v][0] for v in self.offered + ["answer"])
            raise ToolError(f"no such tool here; this task's tools: {tools}")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments or "{}")
            except (ValueError, RecursionError):
                raise ToolError(f"its arguments are not JSON: {arguments[:200]!r}") from None
        key = TOOL_ARGUMENTS[verb][1]
        value = arguments.get(key) if isinstance(arguments, dict) else None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)   # (visit's link number as a number)
        if not isinstance(value, str) or not value.strip():
            raise ToolError(f"its arguments must be a JSON object with a non-empty string "
                            f"{key!r}, got {json.dumps(arguments)[:200]}")
        return " ".join(value.split())

    def _reset(self) -> str:
        self.links: list[tuple[str, str]] = []
        self._call_error: tuple | None = None    # (verb, error) of a malformed call, for its step
        self.answer, self.em, self.f1, self.verdict = None, False, 0.0, None
        self.tool_calls, self.tool_errors = {t: 0 for t in TOOLS}, 0
        tools = ", ".join(SYNTAX[t].split()[0] for t in self.offered) or "none"
        parts = [self.spec["prompt"],
                 f"Tools: {tools} (one call a reply); answer[text] gives your answer and ends."]
        if self.spec.get("start_url"):
            parts.append(self._tool("visit", self.spec["start_url"], counted=False))
        return "\n\n".join(parts)

    def _step(self, action: str) -> str:
        if self._call_error is not None:
            (verb, error), self._call_error = self._call_error, None
            if verb in self.tool_calls:
                self.tool_calls[verb] += 1
            self.tool_errors += 1
            return self._cut(error)
        m = _ACTION.fullmatch(self._written)
        if not m:
            return NOTHING_HAPPENS
        verb = m.group(1).lower()
        argument = (m.group(2) if m.group(2) is not None else m.group(3)).strip()
        if not argument or (verb != "answer" and verb not in self.offered):
            return NOTHING_HAPPENS
        if verb == "answer":
            return self._answer(argument)
        return self._tool(verb, argument)

    def _tool(self, verb: str, argument: str, counted: bool = True) -> str:
        """What a tool call shows the agent: its result, or "Tool error (verb): why" (counted)."""
        self.tool_calls[verb] += counted
        try:
            if verb == "search":
                return self._cut(f"Search results for {argument!r}:\n{self.tools.search(argument)}")
            if verb == "visit":
                page = self.tools.visit(self._link_or_url(argument))
                self.links = list(page.links)
                return page.render(self.tools.observation_chars)
            return self._cut(self._read_file(argument))
        except ToolError as error:
            self.tool_errors += 1
            return self._cut(f"Tool error ({verb}): {error}")

    def _link_or_url(self, argument: str) -> str:
        m = _LINK_NUMBER.fullmatch(argument)
        if m is None:
            return argument
        number = int(m.group(1))
        if not 1 <= number <= len(self.links):
            raise ToolError(f"no link [{number}] on the page shown last (it has {len(self.links)} "
                            f"links); visit a number it lists, or a URL")
        return self.links[number - 1][1]

    def _read_file(self, name: str) -> str:
        file = Path(self.spec["file"])
        if name.strip("'\"` ").lower() != file.name.lower():
            raise ToolError(f"no file {name!r}: this task's file is {file.name!r} (no other is)")
        return f"File {file.name}:\n{self.tools.read_file(file)}"

    def _cut(self, text: str) -> str:
        budget = self.tools.observation_chars
        if len(text) <= budget:
            return text
        return text[:budget] + f"\n(... {len(text) - budget:,} characters cut)"

    def _answer(self, text: str) -> str:
        reference, self.answer, self.done = self.spec["answer"], text, True
        self.em, self.f1 = exact_match(text, reference), token_f1(text, reference)
        if self.spec["scoring"] == "gaia":
            self.success = gaia_score(f"FINAL ANSWER: {text}", reference)
            verdict = "right" if self.success else "wrong"
            return f"You answered: {text}\n(scored by GAIA's scorer: {verdict})"
        self.success = self.em
        scores = f"exact match {int(self.em)}, F1 {self.f1:.2f}"
        if self.tools.judges:   # (a judge that fails raises: the run counts the episode's error)
            self.verdict, explanation = self.tools.judge(self.spec["question"], text, reference)
            self.success = self.verdict
            grade = "CORRECT" if self.verdict else "INCORRECT"
            scores += f", judge: {grade} ({explanation[-300:]})"
        return f"You answered: {text}\n({scores})"


# --------------------------------------------------------------------------- suites

def is_web_suite(name) -> bool:
    """Whether a suite name is a web suite: web:PATH.jsonl, or a .jsonl whose first line has a
    root_url."""
    name = str(name)
    if name.startswith(WEB_PREFIX):
        return True
    try:
        if not name.endswith(".jsonl"):
            return False
        first = next((line for _, line in _lines(Path(name))), "")
        return '"root_url"' in first and "root_url" in json.loads(first)
    except (OSError, ValueError, TypeError):   # (not readable here: the JSONL loader says why)
        return False


def load_web_suite(name: str, split: str = "all", seed: int = 0,
                   n: int | None = None) -> list[Task]:
    """The tasks of a web suite (module docstring): WebWalkerQA's lines, GAIA's or plain ones."""
    check_split(split)
    path = Path(name[len(WEB_PREFIX):] if name.startswith(WEB_PREFIX) else name)
    if not path.is_file():
        raise FileNotFoundError(f"task file not found: {path}")

    def web_task(record, where: str) -> Task:
        if not isinstance(record, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
        task = (_webwalker_task(record, where) if "root_url" in record
                else _tool_task(record, where, path.parent))
        task.env_spec["oracle"] = _oracle_field(record, where)
        if "split" in record:
            task.metadata["split"] = record["split"]
        return task
    return tasks_from_jsonl(path, split, seed, n, "web", web_task)


def _text(record: dict, key: str, where: str) -> str:
    value = record.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: field {key!r} must be a non-empty string, got {value!r:.80}")
    return value.strip()


def _webwalker_task(record: dict, where: str) -> Task:
    question, answer, root = (_text(record, k, where) for k in ("question", "answer", "root_url"))
    if not root.lower().startswith(("http://", "https://")):
        raise ValueError(f"{where}: field 'root_url' must be an http(s) URL, got {root!r:.80}")
    info = {} if record.get("info") is None else record["info"]
    if not isinstance(info, dict):
        raise ValueError(f"{where}: field 'info' must be a JSON object, got {type(info).__name__}")
    kind, level = info.get("type") or "single_source", info.get("difficulty_level") or "unknown"
    task_type = check_task_type(f"{kind}_{level}", where)
    identifier = str(record.get("id") or f"webwalker-{stable_hash(root + '|' + question):012x}")
    prompt = (f"Question: {question}\nFind the answer on the website that starts at {root} "
              f"(shown below).")
    spec = {"kind": "webagent", "scoring": "em", "question": question, "answer": answer,
            "start_url": root, "prompt": prompt, "tools": ["visit"], "file": None}
    return Task(id=identifier, type=task_type, question=question, answer=answer, verifier="exact",
                multi_turn=True, max_steps=MAX_STEPS, env_spec=spec,
                metadata={"root_url": root, "source_type": kind, "difficulty_level": level})


def _tool_task(record: dict, where: str, folder: Path) -> Task:
    """A GAIA line (or a plain {question, answer} one): a task with search, visit and its file."""
    base = _task_from_record(record, where)
    if is_hidden_answer(base.answer):
        raise ValueError(f"{where}: the answer of task {base.id} is hidden (GAIA's test split): "
                         f"a web suite scores every task (answer such tasks single-turn: --suite "
                         f"{folder}/FILE.jsonl --split all)")
    check_task_type(base.type, where)
    gaia = base.verifier == "gaia"
    prompt = (GAIA_PROMPT + "\n\n" if gaia else "") + f"Question: {base.question}"
    name, file = base.metadata.get("file_name"), None
    if name:
        file = _file_beside(name, folder, where)
        if file.is_file():
            prompt += (f"\n\nA file comes with the question: {file.name} (read it with "
                       f"read_file[{file.name}]).")
        else:
            warnings.warn(f"{where}: task {base.id}: its file {name!r} is not in {folder}; the "
                          f"task runs without it", TaskWarning)
            file = None
    spec = {"kind": "webagent", "scoring": "gaia" if gaia else "em", "question": base.question,
            "answer": base.answer, "start_url": None, "prompt": prompt,
            "tools": ["search", "visit"] + (["read_file"] if file else []),
            "file": str(file) if file else None}
    return Task(id=base.id, type=base.type, question=base.question, answer=base.answer,
                verifier=base.verifier, multi_turn=True, max_steps=MAX_STEPS, env_spec=spec,
                metadata=base.metadata)


def _oracle_field(record: dict, where: str) -> list[str] | None:
    plan = record.get("oracle")
    if plan is not None and not (isinstance(plan, list) and all(isinstance(a, str) for a in plan)):
        raise ValueError(f"{where}: field 'oracle' must be a list of actions (strings)")
    return plan


def oracle_actions(task: Task) -> list[str]:
    """The scripted solution a task's line carries ("oracle"); a ValueError for a line without."""
    if not task.env_spec.get("oracle"):
        raise ValueError(f"task {task.id} has no scripted solution (its line has no 'oracle')")
    return list(task.env_spec["oracle"])


def tool_call_counts(trajectories) -> dict[str, dict[str, int]]:
    """Per tool, the calls and the tool errors of rollouts of web tasks (trajectories.Trajectory:
    `actions`, and `observations`, whose entry k + 1 answers action k)."""
    counts = {t: {"calls": 0, "errors": 0} for t in TOOLS}
    for traj in trajectories:
        for action, observation in zip(traj.actions, traj.observations[1:]):
            m = _ACTION.fullmatch(" ".join(action.split()))
            if m and m.group(1).lower() in counts and observation != NOTHING_HAPPENS:
                counts[m.group(1).lower()]["calls"] += 1
                counts[m.group(1).lower()]["errors"] += observation.startswith("Tool error")
    return counts
