"""Tokenizer: a Hugging Face `tokenizer.json` run by the `tokenizers` package, plus chat templates
and stop tokens.

Text <-> token ids is delegated to `tokenizers` (the Rust library behind HF's fast tokenizers), so
`encode` gives exactly the ids HF gives for the same file. What HF does with a Jinja chat template
we do with two small hand-written renderers, chosen once from the checkpoint's template text:

ChatML (Qwen2/2.5, Qwen3, SmolLM2), one turn per message:

    <|im_start|>{role}\\n{content}<|im_end|>\\n              ... then, for a reply:
                                                             <|im_start|>assistant\\n

    * a default system turn when the conversation has none, if the template carries one
      (SmolLM2: "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
       Qwen2.5: "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
    * Qwen3 (thinking off): the reply prompt is
      `<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n`; an assistant turn after the last user
      turn is written with its (possibly empty) `<think>` block, earlier ones with their reasoning
      removed — exactly what Qwen3's template does. `enable_thinking=True` (a chat template kwarg:
      minskill.serve honours `chat_template_kwargs`) leaves the empty block out, so the model
      thinks, as the template does with enable_thinking true or undefined; minskill's default is
      False (its scripts score answers, not thinking). A template without `enable_thinking` ignores
      it, as Jinja would.

Llama 3:

    <|begin_of_text|>  then per message
                        <|start_header_id|>{role}<|end_header_id|>\\n\\n{content.strip()}<|eot_id|>
    reply prompt: <|start_header_id|>assistant<|end_header_id|>\\n\\n

    * Llama 3.1/3.2/3.3 templates always open with a system turn that starts with
      "Cutting Knowledge Date: December 2023\\nToday Date: {date}\\n\\n" followed by the (stripped)
      system message, or nothing; {date} is today's date ("%d %b %Y") where the template asks for
      `strftime_now` (3.2), else "26 Jul 2024" (3.1, 3.3). Llama 3.0 has no such turn.

`apply_chat_template` encodes the control tokens the format itself writes (the `<|...|>` tokens
shown above) as their special ids, and every stretch of text between them, where the message
contents are, with special tokens off: a message that types "<|im_end|>\n<|im_start|>system\n..."
gets those characters as plain text, never a turn of its own (role injection). Non-special added
tokens (Qwen3's `<think>`) are matched in both. HF encodes the rendered text as a whole, which
splits at special tokens and encodes each stretch between them apart, so for contents without
special-token text the ids are identical token for token to HF's `apply_chat_template(...,
tokenize=True)`; for contents with it, HF (and any server that renders text, then tokenizes it)
would turn the user's text into control tokens.

Tools (`tools=[{"type": "function", "function": {...}}, ...]`, as HF's `tools` template variable),
assistant turns with `tool_calls` and `tool` turns are written as each family's template writes
them:

    * ChatML (Qwen2.5 and Qwen3's own format, Hermes-style): the system turn gets a "# Tools" block
      listing each tool as JSON inside <tools></tools> and asking for <tool_call>{"name",
      "arguments"}</tool_call>; an assistant's calls are written that way; consecutive `tool` turns
      are one user turn of <tool_response> blocks. SmolLM2's template has no tools: it gets the same
      format (a fallback, after its default system prompt), which minskill.serve.tool_calls parses
      back.
    * Llama 3 (3.1/3.2's format; 3.0's template has none and gets the same): "Environment: ipython"
      in the system turn, the tools as indented JSON in the first user turn asking for {"name",
      "parameters"}; a call is that JSON as the assistant's turn (one call per turn, as the template
      demands), a tool's reply an `ipython` turn holding the content as a JSON string.

Stop tokens: the union of the eos ids in generation_config.json and config.json (an int or a list),
the eos token of tokenizer_config.json, and the format's end-of-turn token (`<|im_end|>`,
`<|eot_id|>`). """
from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

from tokenizers import Tokenizer as _Backend

CHATML = "chatml"
LLAMA3 = "llama3"
ROLES = ("system", "user", "assistant", "tool")
# Files that make up a tokenizer; save_pretrained copies those that exist.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "chat_template.jinja", "chat_template.json", "generation_config.json")
END_OF_TURN = {CHATML: "<|im_end|>", LLAMA3: "<|eot_id|>"}
LLAMA3_DEFAULT_DATE = "26 Jul 2024"   # what Llama 3.1's template writes when not given a date
# the tools' text in the templates (module docstring): Qwen2.5/Qwen3's system block, Llama 3.1/3.2's
# first user turn
HERMES_TOOLS_HEAD = ("# Tools\n\nYou may call one or more functions to assist with the user "
                     "query.\n\nYou are provided with function signatures within <tools></tools> "
                     "XML tags:\n<tools>")
HERMES_TOOLS_TAIL = ("\n</tools>\n\nFor each function call, return a json object with function "
                     "name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
                     '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
LLAMA3_TOOLS_HEAD = ("Given the following functions, please respond with a JSON for a function "
                     "call with its proper arguments that best answers the given prompt.\n\n"
                     'Respond in the format {"name": function name, "parameters": dictionary of '
                     "argument name and its value}.Do not use variables.\n\n")


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:   # (bad UTF-8: named, no traceback)
        raise ValueError(f"{path} is not valid JSON: {e}") from e


def _token_text(value) -> str | None:
    """tokenizer_config.json writes a special token as a string or as {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


def _as_id_list(value) -> list[int]:
    """eos_token_id in config files is an int, a list of ints, or absent."""
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return list(value)
    raise ValueError(f"eos_token_id must be an int or a list of ints, got {value!r}")


def _chat_template_text(path: Path, tokenizer_config: dict) -> str | None:
    """The default chat template: chat_template.jinja (newer HF), chat_template.json, or
    tokenizer_config.json."""
    if (path / "chat_template.jinja").is_file():
        return (path / "chat_template.jinja").read_text(encoding="utf-8")
    template = (_read_json(path / "chat_template.json").get("chat_template")
                or tokenizer_config.get("chat_template"))
    if isinstance(template, list):  # [{"name": "default", "template": ...}, {"name": "tool_use",
                                    # ...}]
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


class Tokenizer:
    """Encode/decode through `tokenizers`; render chats as ChatML or Llama 3; know the stop
    tokens."""

    def __init__(self, backend: _Backend, *, chat_format: str | None, stop_token_ids: list[int],
                 eos_token_id: int, pad_token_id: int, bos_token: str | None = None,
                 default_system: str | None = None, qwen3_thinking: bool = False,
                 empty_think_prompt: bool = False, llama3_date: str | None = None,
                 source_dir: Path | None = None):
        self.backend = backend
        self.chat_format = chat_format
        self.stop_token_ids = stop_token_ids
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id
        self.bos_token = bos_token
        self.default_system = default_system          # ChatML: system turn used when none is given
        self.qwen3_thinking = qwen3_thinking          # ChatML: Qwen3's handling of <think> in
                                                      # assistant turns
        self.empty_think_prompt = empty_think_prompt  # ChatML: reply prompt ends with an empty
                                                      # <think> block
        self.llama3_date = llama3_date                # Llama 3: None (3.0, no date turn), "today",
                                                      # or a fixed date
        self.source_dir = source_dir
        self.vocab_size = backend.get_vocab_size(with_added_tokens=True)
        self._plain_backend: _Backend | None = None  # a copy that reads special-token text as
        # plain text

    # ----------------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, path) -> "Tokenizer":
        path = Path(path)
        if not (path / "tokenizer.json").is_file():
            raise FileNotFoundError(f"no tokenizer.json in {path} (minskill reads HF "
                                    f"fast-tokenizer files)")
        backend = _Backend.from_file(str(path / "tokenizer.json"))
        tok_config = _read_json(path / "tokenizer_config.json")
        gen_config = _read_json(path / "generation_config.json")
        model_config = _read_json(path / "config.json")
        template = _chat_template_text(path, tok_config)

        def token_id(text: str | None) -> int | None:
            return None if text is None else backend.token_to_id(text)

        # Which chat format: from the template text, else from the special tokens in the vocabulary.
        chat_format = None
        probe = template if template is not None else "".join(
            t for t in ("<|im_start|>", "<|start_header_id|>")
            if backend.token_to_id(t) is not None)
        if "<|im_start|>" in probe:
            chat_format = CHATML
        elif "<|start_header_id|>" in probe:
            chat_format = LLAMA3

        default_system = None
        qwen3_thinking = empty_think_prompt = False
        llama3_date = None
        if chat_format == CHATML and template is not None:
            # A literal system turn in the template is its default system prompt (SmolLM2,
            # Qwen2/2.5);
            # the Jinja source spells the newline either as a newline (SmolLM2) or as backslash-n
            # (Qwen).
            m = re.search(r"<\|im_start\|>system(?:\n|\\n)([^'\"{}]*?)<\|im_end\|>", template)
            default_system = m.group(1) if m else None
            qwen3_thinking = "<think>" in template and "last_query_index" in template
            empty_think_prompt = "enable_thinking" in template
        if chat_format == LLAMA3 and template is not None and "Cutting Knowledge Date" in template:
            llama3_date = "today" if "strftime_now" in template else LLAMA3_DEFAULT_DATE

        eos_text = _token_text(tok_config.get("eos_token"))
        eos_candidates = ([token_id(eos_text)] + _as_id_list(gen_config.get("eos_token_id"))
                          + _as_id_list(model_config.get("eos_token_id")))
        end_of_turn = token_id(END_OF_TURN.get(chat_format))
        stop_token_ids = []
        for i in eos_candidates + [end_of_turn]:
            if i is not None and i not in stop_token_ids:
                stop_token_ids.append(i)
        eos_token_id = next((i for i in eos_candidates if i is not None), end_of_turn)
        if eos_token_id is None:
            raise ValueError(f"no eos token found in {path} (looked at tokenizer_config.json "
                             f"eos_token, "
                             "generation_config.json and config.json eos_token_id)")
        pad_candidates = [token_id(_token_text(tok_config.get("pad_token"))),
                          gen_config.get("pad_token_id"), model_config.get("pad_token_id"),
                          eos_token_id]
        pad_token_id = next(i for i in pad_candidates if isinstance(i, int))
        bos_token = _token_text(tok_config.get("bos_token"))
        if chat_format == LLAMA3 and bos_token is None:
            bos_token = "<|begin_of_text|>"
        return cls(backend, chat_format=chat_format, stop_token_ids=stop_token_ids,
                   eos_token_id=eos_token_id, pad_token_id=pad_token_id, bos_token=bos_token,
                   default_system=default_system, qwen3_thinking=qwen3_thinking,
                   empty_think_prompt=empty_think_prompt, llama3_date=llama3_date, source_dir=path)

    # ----------------------------------------------------------------------------------------------
    def encode(self, text: str, special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; nothing is added. Special-token text (e.g. "<|im_end|>") becomes
        its id, or, with special_tokens=False, the plain characters it is (for text that must not
        control the model)."""
        backend = self.backend
        if not special_tokens:
            if self._plain_backend is None:  # a copy, not a toggled flag: other threads encode
                                             # meanwhile
                plain = _Backend.from_str(self.backend.to_str())
                plain.encode_special_tokens = True
                self._plain_backend = plain
            backend = self._plain_backend
        return backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.backend.decode([int(i) for i in ids],
                                   skip_special_tokens=skip_special_tokens)  # tensors too

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, *,
                            date_string: str | None = None, enable_thinking: bool = False,
                            tools: list[dict] | None = None) -> list[int]:
        """Token ids of the rendered chat: the format's control tokens as special ids, all other
        text (the message contents) with special tokens off. HF's ids for the same template, unless
        a content holds special-token text (see the module docstring). `enable_thinking`: Qwen3's
        reply prompt without the empty think block; `tools`: the tools the model may call (module
        docstring)."""
        ids, text = [], ""
        for part in self._render_parts(messages, add_generation_prompt, date_string,
                                       enable_thinking, tools):
            if isinstance(part, _Control):
                ids += self.encode(text, special_tokens=False) + self.encode(part)
                text = ""
            else:
                text += part
        return ids + self.encode(text, special_tokens=False)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True, *,
                    date_string: str | None = None, enable_thinking: bool = False,
                    tools: list[dict] | None = None) -> str:
        """The chat as text. `date_string` overrides the date in Llama 3.1+ system turns;
        enable_thinking and tools as in apply_chat_template."""
        return "".join(
            self._render_parts(messages, add_generation_prompt, date_string, enable_thinking, tools)
        )

    def _render_parts(self, messages, add_generation_prompt, date_string, enable_thinking=False,
                      tools=None) -> list[str]:
        """The rendered chat as a list of strings; the format's own control tokens are _Control
        strings."""
        _check_messages(messages)
        if self.chat_format == CHATML:
            return self._render_chatml(messages, add_generation_prompt, enable_thinking,
                                       tools or None)
        if self.chat_format == LLAMA3:
            return self._render_llama3(messages, add_generation_prompt, date_string, tools or None)
        where = f" of {self.source_dir}" if self.source_dir else ""
        raise ValueError(f"the tokenizer{where} has no chat format minskill knows "
                         f"(supported: ChatML '<|im_start|>' and Llama 3 '<|start_header_id|>' "
                         f"templates)")

    def _render_chatml(self, messages: list[dict], add_generation_prompt: bool,
                       enable_thinking: bool, tools: list[dict] | None = None) -> list[str]:
        start, end = _Control("<|im_start|>"), _Control("<|im_end|>")
        parts = []
        if tools:       # Qwen's tools block in the system turn, after the system message's text
            opening = messages[0]
            system = opening["content"] if opening["role"] == "system" else self.default_system
            listed = "".join("\n" + _tojson(tool) for tool in tools)
            head = system + "\n\n" if system else ""
            parts += [start, f"system\n{head}{HERMES_TOOLS_HEAD}{listed}{HERMES_TOOLS_TAIL}", end,
                      "\n"]
            messages = messages[1:] if messages[0]["role"] == "system" else messages
        elif messages[0]["role"] != "system" and self.default_system is not None:
            parts += [start, f"system\n{self.default_system}", end, "\n"]
        # Qwen3: turns after the last user message keep their <think> block; earlier ones lose it.
        last_user = len(messages) - 1
        for i in range(len(messages) - 1, -1, -1):
            content = messages[i]["content"]
            if messages[i]["role"] == "user" and not (content.startswith("<tool_response>")
                                                     and content.endswith("</tool_response>")):
                last_user = i
                break
        for i, message in enumerate(messages):
            role, content = message["role"], message["content"]
            if role == "tool":      # consecutive tool turns: one user turn of <tool_response>s
                first = i == 0 or messages[i - 1]["role"] != "tool"
                last = i == len(messages) - 1 or messages[i + 1]["role"] != "tool"
                parts += [*([start, "user"] if first else []),
                          f"\n<tool_response>\n{content}\n</tool_response>",
                          *([end, "\n"] if last else [])]
                continue
            bare = content
            if role == "assistant" and self.qwen3_thinking:
                reasoning = message.get("reasoning_content")
                if not isinstance(reasoning, str):
                    reasoning = ""
                    if "</think>" in content:
                        reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[
                                -1].lstrip("\n")
                        content = content.split("</think>")[-1].lstrip("\n")
                bare = content
                is_last = i == len(messages) - 1
                if i > last_user and (is_last or reasoning):
                    reasoning, content = reasoning.strip("\n"), content.lstrip("\n")
                    content = f"<think>\n{reasoning}\n</think>\n\n{content}"
            calls = "".join(("\n" if k or bare else "") + "<tool_call>\n"
                            + _call_json(call, "arguments") + "\n</tool_call>"
                            for k, call in enumerate(message.get("tool_calls") or ()))
            parts += [start, f"{role}\n{content}{calls}", end, "\n"]
        if add_generation_prompt:
            parts += [start, "assistant\n"]
            if self.empty_think_prompt and not enable_thinking:  # Qwen3 with enable_thinking=False
                parts.append("<think>\n\n</think>\n\n")
        return parts

    def _render_llama3(self, messages: list[dict], add_generation_prompt: bool,
                       date_string: str | None, tools: list[dict] | None = None) -> list[str]:
        header, end_header, end = _Control("<|start_header_id|>"), _Control(
                "<|end_header_id|>"), _Control("<|eot_id|>")
        parts = [_Control(self.bos_token or "")]
        if self.llama3_date is not None or tools:  # Llama 3.1+: the system turn is always there
            system = ""
            if messages[0]["role"] == "system":
                system, messages = messages[0]["content"].strip(), messages[1:]
            if date_string is None:
                date_string = time.strftime("%d %b %Y") if self.llama3_date == "today" else \
                    self.llama3_date or LLAMA3_DEFAULT_DATE
            environment = "Environment: ipython\n" if tools else ""
            parts += [header, "system", end_header,
                      f"\n\n{environment}Cutting Knowledge Date: December 2023\n"
                      f"Today Date: {date_string}\n\n{system}", end]
        if tools:       # in the first user turn (tools_in_user_message, the template's default)
            if not messages:
                raise ValueError("Cannot put tools in the first user message when there's no first "
                                 "user message!")
            listed = "".join(_tojson(tool, indent=4) + "\n\n" for tool in tools)
            parts += [header, "user", end_header, f"\n\n{LLAMA3_TOOLS_HEAD}{listed}"
                                                  f"{messages[0]['content'].strip()}", end]
            messages = messages[1:]
        for message in messages:
            if message.get("tool_calls"):
                if len(message["tool_calls"]) != 1:
                    raise ValueError("This model only supports single tool-calls at once!")
                content = _call_json(message["tool_calls"][0], "parameters")
                parts += [header, "assistant", end_header, f"\n\n{content}", end]
            elif message["role"] == "tool":
                parts += [header, "ipython", end_header, f"\n\n{_tojson(message['content'])}", end]
            else:
                parts += [header, message["role"], end_header, f"\n\n{message['content'].strip()}",
                          end]
        if add_generation_prompt:
            parts += [header, "assistant", end_header, "\n\n"]
        return parts

    # ----------------------------------------------------------------------------------------------
    def save_pretrained(self, path) -> None:
        """Copy the tokenizer files this tokenizer was loaded from into `path` (each written
        atomically)."""
        if self.source_dir is None:
            raise ValueError("this tokenizer was not loaded from a folder; nothing to copy")
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        for name in TOKENIZER_FILES:
            src = self.source_dir / name
            if not src.is_file() or (path / name).resolve() == src.resolve():
                continue
            # atomically, as minskill.files.atomic_output writes (a .tmp- file that
            # runs.clean_staging removes,
            # then a rename), in these few lines of its own: this module imports nothing from
            # minskill
            fd, tmp = tempfile.mkstemp(dir=path, prefix=f".tmp-{name}-")
            os.close(fd)
            try:
                shutil.copyfile(src, tmp)
                os.chmod(tmp, 0o644)   # mkstemp makes files private (0600); these are ordinary
                                       # outputs
                os.replace(tmp, path / name)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise


class _Control(str):
    """A control token the chat format writes itself ("<|im_start|>", ...): the only text of a
    rendered chat that apply_chat_template encodes with special tokens on."""


def _tojson(value, indent: int | None = None) -> str:
    """A template's `tojson` as HF's Jinja environment defines it."""
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _call_json(call: dict, arguments_key: str) -> str:
    """One tool call as the templates write it: {"name": "...", "<arguments_key>": <arguments>};
    a call may be OpenAI's {"function": {"name", "arguments"}} or the function itself, its
    arguments an object or JSON text (written as it is, as Qwen3's template writes a string)."""
    call = call.get("function", call)
    arguments = call["arguments"]
    arguments = arguments if isinstance(arguments, str) else _tojson(arguments)
    return f'{{"name": "{call["name"]}", "{arguments_key}": {arguments}}}'


def _check_messages(messages) -> None:
    if not isinstance(messages, list) or not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise ValueError(f"messages[{i}] must be a dict with role in {ROLES}, got {m!r:.200}")
        calls = m.get("tool_calls")
        if calls is not None and not (isinstance(calls, list) and all(
                isinstance(c, dict) and isinstance(c.get("function", c).get("name"), str)
                for c in calls)):
            raise ValueError(f"messages[{i}]['tool_calls'] must be a list of {{'function': "
                             f"{{'name', 'arguments'}}}} dicts, got {calls!r:.200}")
        if not isinstance(m.get("content"), str):
            raise ValueError(f"messages[{i}]['content'] must be a string, got "
                             f"{type(m.get('content')).__name__}")
