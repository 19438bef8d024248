"""The command-line flags the three scripts share, written once: the frozen task model the skills are scored
with (--task-*) and the teacher LLM (--teacher-*). One knob has one name in every script; each script passes its
own defaults (from its config dataclass)."""
from minskill.nn.quantize import QUANTIZE_CHOICES

QUANTIZE_HELP = ("the embedded server's weights: none = float (default), int8 (1.6x faster batch-1 decode on a "
                 "CPU, the same accuracy on the held-out qa tasks, but greedy replies then depend on the batch a "
                 "request shares: README), auto = int8 on a CPU")


def add_task_model_args(group, *, concurrency: int, max_tokens: int, quantize: str = "none",
                        url_help: str = "", main=None) -> None:
    """--task-url/--task-model/--task-api-key/--task-quantize/--task-concurrency/--task-max-tokens: the frozen
    model that runs the tasks (Skill-R1's task model, MASA's target). `main`: the group that shows --task-url
    and --task-model first in --help (default: `group`)."""
    main = group if main is None else main
    main.add_argument("--task-url", default=None, help="OpenAI-compatible base URL of the frozen task model, e.g. "
                       "http://127.0.0.1:8000/v1 (default: start the embedded server with the offline default "
                       f"model on a free loopback port){url_help}")
    main.add_argument("--task-model", default=None, help="model name sent to --task-url (default: the first one "
                       "the server lists)")
    group.add_argument("--task-api-key", default=None, help="API key for --task-url (default: $OPENAI_API_KEY)")
    group.add_argument("--task-quantize", choices=QUANTIZE_CHOICES, default=quantize, help=QUANTIZE_HELP)
    group.add_argument("--task-concurrency", type=int, default=concurrency, help="task-model requests the client "
                       f"keeps in flight (default {concurrency}); when --task-url is a load balancer in front of "
                       "several vLLM/SGLang replicas, set it to replicas × per-replica batch (e.g. 4 × "
                       "--max-num-seqs 64 = 256)")
    group.add_argument("--task-max-tokens", type=int, default=max_tokens,
                       help=f"longest task-model reply, in tokens (default {max_tokens})")


def add_teacher_args(group, *, url_help: str = "the embedded server", main=None) -> None:
    """--teacher-url/--teacher-model/--teacher-api-key: the teacher LLM that writes or rewrites skills; `main`
    as in add_task_model_args."""
    main = group if main is None else main
    main.add_argument("--teacher-url", default=None,
                      help=f"OpenAI-compatible base URL of the teacher (default: {url_help})")
    main.add_argument("--teacher-model", default=None, help="model name sent to --teacher-url")
    group.add_argument("--teacher-api-key", default=None, help="API key for --teacher-url (default: $OPENAI_API_KEY)")
