"""The command line and the run's typed configuration: flags, their validation, the model config
they make."""
