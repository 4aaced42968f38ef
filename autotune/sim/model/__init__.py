"""The simulator's model of vLLM: memory, speed and the scheduler core (over autotune/catalog)."""
