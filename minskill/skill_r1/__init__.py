"""Skill-R1: a skill editor trained with bi-level GRPO (grpo.py: the advantages and the loss;
loop.py: the multi-generation evolution of skills; evaluate.py: `train_grpo.py --eval` and the
held-out probes)."""
