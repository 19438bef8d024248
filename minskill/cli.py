"""The command-line flags the three scripts share, written once: the frozen task model the skills
are scored with (--task-*) and the teacher LLM (--teacher-*). One knob has one name in every script;
each script passes its own defaults (from its config dataclass). Where the models run (--device,
--bf16) is minskill/device.py's, which the server reads too."""
import argparse
import json
import math
import os
from pathlib import Path

from minskill.nn.quantize import QUANTIZE_CHOICES
from minskill.serve.client import MAX_REPLY_BYTES, ChatClient
from minskill.serve.embedded import DEFAULT_PREFIX_CACHE_MB
from minskill.skills import MAX_RESOURCE_FILES, set_max_resource_files
from minskill.tasks.alfworld import DATA_ENV as ALFWORLD_DATA_ENV
from minskill.tasks.search_r1 import add_retriever_url_arg


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help shows each flag's default, unless its help already says it or there is none to
    show."""

    def _get_help_string(self, action):
        if "default" in (action.help or "") or action.default in (None, argparse.SUPPRESS):
            return action.help
        return super()._get_help_string(action)


QUANTIZE_HELP = ("the embedded server's weights: none = float (default), int8 (1.6x faster batch-1 "
                 "decode on a CPU, the same accuracy on the held-out qa tasks; greedy replies do "
                 "not depend on the batch: docs/http-api.md), auto = int8 on a CPU")


def add_task_model_args(group, *, concurrency: int | None, max_tokens: int, quantize: str = "none",
                        url_help: str = "", main=None) -> None:
    """--task-url/--task-model/--task-api-key/--task-quantize/--task-concurrency/--task-max-tokens:
    the frozen model that runs the tasks (Skill-R1's task model, MASA's target). `main`: the group
    that shows --task-url and --task-model first in --help (default: `group`)."""
    main = group if main is None else main
    main.add_argument("--task-url", default=None,
                      help="OpenAI-compatible base URL of the frozen task model, e.g. "
                       "http://127.0.0.1:8000/v1 (default: start the embedded server with the "
                       f"offline default model on a free loopback port){url_help}")
    main.add_argument("--task-model", default=None,
                      help="model name sent to --task-url (default: the first one "
                       "the server lists)")
    group.add_argument("--task-api-key", default=None,
                       help="API key for --task-url (default: $OPENAI_API_KEY)")
    group.add_argument("--task-quantize", choices=QUANTIZE_CHOICES, default=quantize,
                       help=QUANTIZE_HELP)
    default = concurrency or ("one generation's requests: K × --tasks-per-instance × "
                              "--instances-per-step")
    group.add_argument("--task-concurrency", type=int, default=concurrency,
                       help="task-model requests the client "
                       f"keeps in flight at most (default {default}); when --task-url is a load "
                       "balancer in front of several vLLM/SGLang replicas, set it to replicas × "
                       "per-replica batch (e.g. 4 × --max-num-seqs 64 = 256)")
    group.add_argument("--task-max-tokens", type=int, default=max_tokens,
                       help=f"longest task-model reply, in tokens (default {max_tokens})")
    add_prefix_cache_arg(group)
    add_extra_body_arg(group, "task")
    add_max_reply_arg(group)
    add_skill_files_arg(group)   # (every script with a task model reads skill sets)
    add_alfworld_data_arg(group)  # (and every one takes --suite, alfworld included)
    add_retriever_url_arg(group)  # (searchqa's retriever)


# --teacher-json-schema's choices (minskill/masa/reply_schema.py)
TEACHER_JSON_SCHEMA = ("auto", "on", "off")


def add_teacher_args(group, *, url_help: str = "the embedded server", main=None) -> None:
    """--teacher-url/--teacher-model/--teacher-api-key: the teacher LLM that writes or rewrites
    skills; `main` as in add_task_model_args. --teacher-json-schema: whether its replies are asked
    in their JSON schema."""
    main = group if main is None else main
    main.add_argument("--teacher-url", default=None,
                      help=f"OpenAI-compatible base URL of the teacher (default: {url_help})")
    main.add_argument("--teacher-model", default=None, help="model name sent to --teacher-url")
    group.add_argument("--teacher-api-key", default=None,
                       help="API key for --teacher-url (default: $OPENAI_API_KEY)")
    add_extra_body_arg(group, "teacher")
    group.add_argument("--teacher-json-schema", choices=TEACHER_JSON_SCHEMA,
                       default=TEACHER_JSON_SCHEMA[0],
                       help="ask the teacher for each reply in the JSON schema it is read in "
                            "(response_format json_schema, served by minskill's server and vLLM): "
                            "auto = until its server refuses the field (then in free text, said "
                            "once), on = always (a refusal is an error), off = never")


# ---- extra request fields of a frozen model (reasoning models) -----------------------------------
EXTRA_BODY_EXAMPLE = '{"chat_template_kwargs": {"enable_thinking": false}}'
LABELLED_EXTRA_BODY_HELP = ("fields merged into every request to the targets (LABEL=JSON: to that "
                            "target alone, merged over an unlabelled JSON), e.g. "
                            f"'{EXTRA_BODY_EXAMPLE}' for a Qwen3 (docs/gpu.md)")


def parse_json_object(text: str, flag: str, error=argparse.ArgumentTypeError) -> dict:
    """`text` as a JSON object of extra request fields, or `error` naming `flag` (not JSON, not an
    object, or a field the scripts set themselves: ChatClient.SETS)."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise error(f"{flag} is not JSON ({e}): {text!r:.200}") from None
    if not isinstance(value, dict):
        raise error(f"{flag} must be a JSON object, e.g. '{EXTRA_BODY_EXAMPLE}', got "
                    f"{type(value).__name__}")
    if clash := sorted(set(value) & set(ChatClient.SETS)):
        raise error(f"{flag} may not set {', '.join(clash)}: the scripts set it themselves")
    return value


def json_object(flag: str):
    """argparse `type` for a flag whose value is a JSON object (parse_json_object)."""
    def parse(text: str) -> dict:
        return parse_json_object(text, flag)
    parse.__name__ = "JSON object"   # argparse's message for a failing type names it
    return parse


def labelled_json_objects(items, labels: list[str], flag: str, error=ValueError) -> dict[str, dict]:
    """[LABEL=]JSON items (one flag for several models, e.g. the transfer matrix's targets) ->
    {label: object}: an unlabelled object goes to every label, a labelled one (merged over it) to
    its label alone."""
    out = {}
    # unlabelled first
    for item in sorted(items or [], key=lambda item: not item.lstrip().startswith("{")):
        label, _, body = ("", "", item) if item.lstrip().startswith("{") else item.partition("=")
        if label and label not in labels:
            raise error(f"{flag} {item!r}: expected JSON or LABEL=JSON with LABEL one of "
                        f"{', '.join(labels)}")
        for name in [label] if label else labels:
            out[name] = {**out.get(name, {}), **parse_json_object(body, f"{flag} {item!r}", error)}
    return out


def add_extra_body_arg(group, role: str) -> None:
    """--{role}-extra-body JSON: fields merged into every chat request to that model (ChatClient's
    extra_body)."""
    group.add_argument(f"--{role}-extra-body", type=json_object(f"--{role}-extra-body"),
                       default=None,
                       metavar="JSON",
                       help=f"a JSON object merged into every request to the {role} model, e.g. "
                       f"'{EXTRA_BODY_EXAMPLE}' for a Qwen3 behind vLLM/SGLang/llama.cpp "
                       "(docs/gpu.md); its reasoning is set apart from the answer either way "
                       "(minskill.serve.client)")


def add_max_reply_arg(group) -> None:
    """--max-reply-mb: the most one reply body of a model endpoint may hold (ChatClient's
    max_reply_bytes; the default is far above any real reply)."""
    group.add_argument("--max-reply-mb", type=reply_megabytes, default=None, metavar="MB",
                       help="most MB (2^20 bytes) of one reply body read from a model endpoint; "
                       "a larger reply is an error naming its size (default "
                       f"{MAX_REPLY_BYTES / 2**20:g})")


def add_skill_files_arg(group) -> None:
    """--skill-max-files N: the most resource files one skill may have, in the whole process (set as
    the flag is parsed: skills.set_max_resource_files), for a skill with more than the default."""
    group.add_argument("--skill-max-files", type=skill_file_cap, action=_SetSkillFileCap,
                       default=None, metavar="N", help="most files a skill's folder may hold "
                       f"besides its SKILL.md (default {MAX_RESOURCE_FILES}); a skill with more is "
                       "refused, naming this flag")


class _SetSkillFileCap(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        set_max_resource_files(values)
        setattr(namespace, self.dest, values)


def add_alfworld_data_arg(group) -> None:
    """--alfworld-data PATH: the alfworld suite plays ALFWorld's own games from PATH (set as the
    flag is parsed, as $MINSKILL_ALFWORLD_DATA, which tasks.alfworld reads: the processes a run
    starts see it too)."""
    group.add_argument("--alfworld-data", action=_SetAlfworldData, default=None, metavar="PATH",
                       help="--suite alfworld plays ALFWorld's own games: PATH is the folder "
                       "alfworld-download fills (or its json_2.1.1/); --split train, heldout (= "
                       "valid_unseen), valid_seen or valid_unseen (default: games generated "
                       "offline; docs/alfworld.md)")


class _SetAlfworldData(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        os.environ[ALFWORLD_DATA_ENV] = str(Path(values).expanduser().resolve())
        setattr(namespace, self.dest, values)


def skill_file_cap(text: str) -> int:
    """argparse `type` of --skill-max-files: an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"--skill-max-files must be an integer >= 1, got "
                                         f"{text!r:.50}")
    return value


def reply_megabytes(text: str) -> float:
    """argparse `type` of --max-reply-mb: a finite number of MB that is at least one byte."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value * 2**20 >= 1):
        raise argparse.ArgumentTypeError(f"--max-reply-mb must be a finite number > 0, got "
                                         f"{text!r:.50}")
    return value


def with_extra_body(client, extra_body):
    """`client` (a ChatClient) when `extra_body` (None: {}) is its own, else a client of the same
    endpoint, model and settings that sends it (one endpoint serving two roles, e.g. a task model
    that is the teacher too)."""
    if dict(extra_body or {}) == client.extra_body:
        return client
    return ChatClient(client.base_url, client.model, client.api_key, extra_body=extra_body,
                      timeout=client.timeout,
                      max_retries=client.max_retries, max_workers=client.max_workers,
                      backoff_base=client.backoff_base,
                      backoff_max=client.backoff_max, attempt_timeout=client.attempt_timeout,
                      max_reply_bytes=client.max_reply_bytes)


def add_prefix_cache_arg(group) -> None:
    """--task-prefix-cache-mb: the embedded task server's prefix cache (its --prefix-cache-mb)."""
    group.add_argument("--task-prefix-cache-mb", type=prefix_cache_mb, default=None, metavar="MB",
                       help="the embedded server's cache of prompt prefixes (their keys and "
                       f"values; default {DEFAULT_PREFIX_CACHE_MB} MB, ~46 MB per 1,000 tokens of "
                       "the default model in float32): a multi-turn suite with many live "
                       "episodes re-reads every prompt when theirs do not all fit, e.g. 3000 for "
                       "ALFWorld's 60 held-out games (docs/alfworld.md); 0: none")


def prefix_cache_mb(text: str) -> float:
    """argparse `type` of --task-prefix-cache-mb: a number of MB >= 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"--task-prefix-cache-mb must be a number of MB >= 0, "
                                         f"got {text!r:.50}")
    return value


def client_args(args, role: str) -> dict:
    """url/model/api_key/extra_body/prefix_cache_mb of --{role}-*, the script's --device (where an
    embedded server runs) and its --max-reply-mb: the keyword arguments of
    serve.embedded.embedded_client."""
    mb, cache = getattr(args, "max_reply_mb", None), getattr(args, f"{role}_prefix_cache_mb", None)
    return {"url": getattr(args, f"{role}_url", None),
            "model": getattr(args, f"{role}_model", None),
            "api_key": getattr(args, f"{role}_api_key", None),
            "extra_body": getattr(args, f"{role}_extra_body", None),
            "device": getattr(args, "device", None),
            "max_reply_bytes": MAX_REPLY_BYTES if mb is None else int(mb * 2**20),
            "prefix_cache_mb": DEFAULT_PREFIX_CACHE_MB if cache is None else cache}
