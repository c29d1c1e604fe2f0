"""Pure functions of stored results: statistics and verdicts, SLO search, interference, memory, roofline,
parallelism, the configuration audit and profiler traces. Nothing here starts an engine or imports
labkit.measure (tests/unit/test_layers.py holds the rule)."""
