"""evolve_masa.py's defaults, written once: its argparse reads them from MasaRunConfig()."""
from dataclasses import dataclass

from minskill.masa.search import MasaConfig


@dataclass
class MasaRunConfig(MasaConfig):
    """The search's knobs are MasaConfig's fields, inherited with their defaults; these are the run's."""
    suite: str = "qa"
    n_train: int = 24             # search tasks (train split)
    n_prelim: int = 4             # preliminary train tasks of the model card
    n_heldout: int = 40           # held-out tasks of the final table
    task_seed: int = 0
    model_spec: str = "smollm2-135m"
    task_concurrency: int = 16
    timeout: float = 600.0
    startup_timeout: float = 600.0
    gate_tasks: int = 24
    sft_copies: int = 1
