"""ZeroGPU mechanics: the GPU entry, quotas and durations, the load guard."""
