"""The command line: the parser made from the typed groups, the flags a checkpoint fixes,
one error line per job."""
