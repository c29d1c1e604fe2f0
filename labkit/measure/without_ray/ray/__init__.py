# Put first on an arm worker's path (labkit.measure.worker.hide_ray): vLLM imports Ray whenever it is installed,
# and an arm that does not use Ray as vLLM's executor is better off starting as on a machine without it.
raise ImportError("ray is hidden from this engine by labkit (it does not use Ray as vLLM's executor)")
