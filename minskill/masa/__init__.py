"""MASA, model-aware skill alignment: a teacher evolves a skill set for a target model (search.py: the hill climb
and the UCB1 trees of ucb.py), then a rewriter learns the rewrite by SFT (data.py, sft.py, rewriter.py);
transfer.py scores skill libraries on several targets (`python -m minskill.masa.transfer`)."""
