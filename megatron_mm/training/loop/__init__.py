"""The training loop: the step, evaluation, logging and its checks."""
