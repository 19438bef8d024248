"""The edit-provenance report of a run folder as one HTML page: `python -m minskill.report RUN_DIR`
(__main__.py; provenance.py reads the run, one renderer per kind of run draws it)."""
