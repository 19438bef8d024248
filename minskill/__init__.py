"""minskill: minimal reference implementations of Skill-R1 (bi-level GRPO skill editor) and MASA
(model-aware skill alignment: teacher-driven skill evolution, then an SFT rewriter).

Modules are small and mostly self-contained; see README.md for the map from equations to files.
"""
