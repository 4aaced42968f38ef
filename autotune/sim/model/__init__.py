"""The simulator's model of vLLM: catalogs, memory, speed and the scheduler core."""
