"""minskill: minimal reference implementations of Skill-R1 (bi-level GRPO skill editor) and MASA
(model-aware skill alignment: teacher-driven skill evolution, then an SFT rewriter).

Grouped by concern, from the bottom up (tests/test_layout.py keeps every import pointing down or
sideways): files, skills, skillsets, replies, gates, paired, plot and tasks/, shared by both papers;
nn/ (the model); serve/ (the task model over HTTP); runs, retrieval and rollout; the two papers,
skill_r1/ and masa/, apart from each other; report/; bench. See README.md for the map from equations
to files.
"""
