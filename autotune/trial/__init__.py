"""One trial: the launch config run end to end, scored, and what it stores."""
