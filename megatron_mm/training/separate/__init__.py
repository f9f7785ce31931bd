"""Encoders on ranks of their own: the world, the run, generation."""
