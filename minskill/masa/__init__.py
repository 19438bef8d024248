"""MASA, model-aware skill alignment: a teacher evolves a skill set for a target model (search.py:
the hill climb and the UCB1 trees of ucb.py; teacher.py: what is said to the teacher and read from
it), then a rewriter learns the rewrite by SFT (data.py, rewriter_sft.py, rewriter.py);
`python -m minskill.measure.transfer` scores skill libraries on several targets."""
