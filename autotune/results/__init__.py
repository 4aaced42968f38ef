"""Results people act on, read back from a stored study."""
