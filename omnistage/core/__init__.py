"""Engine core of one stage: requests, KV cache, scheduler and the step loop."""
