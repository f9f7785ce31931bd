"""Assembling a run: the process groups, the model, the data, the attention and optimizer
settings."""
