"""What to measure, as plain data: the model's shape, the knobs of each arm, the workload, the protocol and
the deployment context. Nothing here starts an engine or reads a result."""
