"""The model side: a decoder-only transformer, its weights and tokenizer, sampling, LoRA, int8, the
shared-prefix log-probs of a GRPO group, and the learning-rate schedule. Nothing here knows about
skills, tasks or runs."""
