"""The simulator's in-process face: predictions and sweeps in virtual time."""
