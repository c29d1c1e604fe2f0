"""Measuring: the arm's worker process and its supervisor, the in-worker driver that times every token,
what vLLM resolved, and the machine (platform, GPUs, environment, host load, measured peaks)."""
