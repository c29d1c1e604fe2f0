"""Pure functions of stored results: statistics and verdicts, SLO search and goodput, capacity under an SLO and
the replicas a demand needs, the Pareto front, interference, memory, roofline, parallelism, the configuration
audit and profiler traces. Nothing here starts an engine or imports labkit.measure (tests/unit/test_layers.py
holds the rule)."""
