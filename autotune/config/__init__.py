"""How a config becomes argv: the search space, the derived flags, the launch config."""
