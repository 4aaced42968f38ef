"""Calibrating the simulator's speed: points measured, read from studies, fitted."""
