"""Simulator-steered search: the lattice of effective configs, warm start, learning, confirmation.

The study loop (autotune.study) calls into this package through a few hooks;
docs/architecture.md ("How the tuner searches") says what each part does and why.
"""
