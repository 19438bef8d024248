"""What measures rather than implements: the tables that join runs (combine.py, group_stats.py),
the transfer matrix (transfer.py, transfer_flags.py, transfer_record.py) and the benchmarks
(bench.py, bench_server.py, bench_profile.py, bench_schema.py). Each is a `python -m
minskill.measure.NAME` entry point or a helper of one; nothing in the two papers' wings imports
from here."""
