"""Where the models run: --device and --bf16 (`add_device_args`), resolved at parse time, so that
`cuda` without a GPU stops a script before it loads anything; TF32 on CUDA (`set_up_device`) and the
plan line's precision (`precision_label`). Every script and the server read it."""
import argparse

import torch


DEVICE_HELP = ("auto (default: cuda when torch sees a GPU, else cpu) | cpu | cuda | cuda:N; cuda "
               "without a GPU is an error, never a silent fall-back to the CPU")


def resolve_device(spec: str) -> str:
    """--device's value -> "cpu", "cuda" or "cuda:N" (argparse's `type`, so a bad value stops the
    script at parse time, before any model is loaded). auto: cuda when torch sees a GPU, else
    cpu."""
    spec = str(spec).strip().lower()
    if spec == "auto":
        return "cuda" if _cuda_available() else "cpu"
    if spec == "cpu":
        return spec
    kind, _, index = spec.partition(":")
    if kind != "cuda" or (index and not index.isdigit()):
        raise argparse.ArgumentTypeError(f"{spec!r} is not a device: auto | cpu | cuda | cuda:N")
    if not _cuda_available():
        raise argparse.ArgumentTypeError(f"{spec!r} asked for, but torch sees no CUDA GPU (torch "
                                         f"{torch.__version__}); use --device cpu, or install a "
                                         "CUDA build")
    if index and int(index) >= torch.cuda.device_count():
        raise argparse.ArgumentTypeError(f"{spec!r}: torch sees {torch.cuda.device_count()} CUDA "
                                         "device(s)")
    return spec


def add_device_args(group, *, bf16: bool = True, default: str = "auto",
                    what: str = "the model runs") -> None:
    """--device (resolved at parse time: resolve_device) and, with bf16=True, --bf16/--no-bf16
    (default None: resolve_bf16 turns it on for CUDA, off for the CPU)."""
    group.add_argument("--device", type=resolve_device, default=default,
                       help=f"where {what}: {DEVICE_HELP}"
                       + ("" if default == "auto" else f" (default {default})"))
    if bf16:
        group.add_argument("--bf16", action=argparse.BooleanOptionalAction, default=None,
                           help="bfloat16 autocast compute, float32 master weights and optimizer "
                                "state (default: on for CUDA, off for the CPU; docs/gpu.md)")


def check_resumed_device(parser, args) -> None:
    """After --resume restored a run's flags: the --device it saved (when none is given anew) must
    exist here too."""
    try:
        args.device = resolve_device(args.device)
    except argparse.ArgumentTypeError as e:
        parser.error(f"--device: the run saved {args.device!r} ({e}); give --device to go on "
                     "elsewhere")


def resolve_bf16(args) -> bool:
    """--bf16 left unset follows the device: on for CUDA, off for the CPU (whose printed rewards
    stay as they were)."""
    if getattr(args, "bf16", None) is None:
        args.bf16 = is_cuda(args.device)
    return args.bf16


def is_cuda(device) -> bool:
    return str(device).startswith("cuda")


def set_up_device(device) -> None:
    """Once at set-up, on CUDA: TF32 matmuls and convolutions for what stays float32 (outside bf16
    autocast; the error of a TF32 matmul is ~1e-3 relative, far below what a policy-gradient step
    notices). The CPU: nothing."""
    if is_cuda(device):
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def precision_label(device, bf16: bool) -> str:
    """What a plan line prints: the device and the compute/weights dtypes."""
    return f"device {device}, " + ("bf16 autocast compute, float32 weights" if bf16
                                   else "float32") + \
        (" + TF32" if is_cuda(device) else "")


def _cuda_available() -> bool:
    return torch.cuda.is_available()
