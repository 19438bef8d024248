"""Which request fields minskill.serve.server reads, which it accepts and ignores, and which it
refuses.

A field that would change the tokens sampled or the reply's shape is either implemented or refused
with a 400 that names it, never ignored: a client asking for `min_p: 0.05` or `best_of: 3` must not
get an ordinary reply that looks as if it had been honoured. Every field of a request body is one
of:

  * implemented (CHAT_FIELDS, COMPLETION_FIELDS): read and checked by minskill.serve.backends;
  * harmless (IGNORED): it changes nothing that is sampled or returned (bookkeeping, scheduling,
    caching);
  * refused unless neutral (NEUTRAL): accepted when null or when its value changes nothing (a
    penalty of 0, an empty `tools` list, `response_format: {"type": "text"}`, ...), else a 400
    naming it, code "unsupported_field";
  * anything else: a 400 naming it, code "unrecognized_field", as OpenAI answers an unknown
    argument (a typo such as "temprature" is not served as if absent).

The same table is printed in docs/http-api.md; tests/test_openai_api.py holds the two to each other.
"""
from __future__ import annotations

from minskill.serve.errors import bad_request

SAMPLING_CONTROLS = ("frequency_penalty", "presence_penalty", "repetition_penalty", "logit_bias")
CHAT_FIELDS = ("model", "messages", "n", "temperature", "top_p", "top_k", "max_tokens",
               "max_completion_tokens", "stop", "seed", "stream", "stream_options",
               "chat_template_kwargs", "logprobs", "top_logprobs", "response_format", "guided_json",
               "structured_outputs", "tools", "tool_choice", "parallel_tool_calls",
               *SAMPLING_CONTROLS)
COMPLETION_FIELDS = ("model", "prompt", "n", "temperature", "top_p", "top_k", "max_tokens", "stop",
                     "seed", "stream", "stream_options", "logprobs", "response_format",
                     "guided_json", "structured_outputs", "echo", *SAMPLING_CONTROLS)
# bookkeeping (user, metadata, store, ids), scheduling and caching (service_tier, priority,
# prompt_cache_key,
# cache_salt): none changes what is sampled or returned
IGNORED = ("user", "metadata", "store", "service_tier", "request_id", "priority",
           # (the last: read by chat)
           "prompt_cache_key", "safety_identifier", "cache_salt", "parallel_tool_calls")
# field -> the values that change nothing (null always does): any other value is refused
# (tools on the legacy endpoint, echo on chat: each is implemented by the other endpoint only)
NEUTRAL = {
    "min_p": (0,), "length_penalty": (1,), "min_tokens": (0,), "ignore_eos": (False,),
    "tools": ([],), "functions": ([],), "tool_choice": ("none", "auto"),
    "function_call": ("none", "auto"),
    "stop_token_ids": ([],), "bad_words": ([],), "allowed_token_ids": (), "prompt_logprobs": (),
    "guided_regex": (), "guided_choice": (), "guided_grammar": (),
    "use_beam_search": (False,), "best_of": (1,), "echo": (False,), "suffix": ("",),
    "include_stop_str_in_output": (False,), "skip_special_tokens": (True,),
    "spaces_between_special_tokens": (True,), "add_generation_prompt": (True,),
    "continue_final_message": (False,), "chat_template": (), "documents": (),
    "mm_processor_kwargs": (), "truncate_prompt_tokens": (),
    "return_tokens_as_token_ids": (False,), "modalities": (["text"],), "audio": (),
    "prediction": (),
    "reasoning_effort": (), "verbosity": (), "web_search_options": (),
}


def check_fields(payload: dict, implemented: tuple[str, ...], endpoint: str) -> None:
    """Raise a 400 naming the first field of `payload` that is neither implemented, harmless, nor
    neutral."""
    for key, value in payload.items():
        if key in implemented or key in IGNORED or value is None:
            continue
        if key in NEUTRAL:
            if any(_same(value, v) for v in NEUTRAL[key]):
                continue
            raise bad_request(f"'{key}' = {value!r:.100} is not implemented by this server (only "
                              f"{_neutral_text(key)} is accepted, which changes nothing); leave it "
                              f"out",
                              key, "unsupported_field")
        raise bad_request(f"unrecognized request field '{key}' for {endpoint}: this server reads "
                          f"{', '.join(implemented)} (and ignores {', '.join(IGNORED)})", key,
                          "unrecognized_field")


def _same(value, neutral) -> bool:
    """value == neutral, but a boolean only equals a boolean (True is no penalty of 1)."""
    if isinstance(value, bool) or isinstance(neutral, bool):
        return value is neutral
    return value == neutral


def _neutral_text(key: str) -> str:
    return " or ".join(["null", *(repr(v) for v in NEUTRAL[key])])
