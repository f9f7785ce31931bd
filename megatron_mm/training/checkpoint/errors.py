"""A checkpoint that cannot be read or written as asked: the user's error (a missing or
damaged checkpoint, a flag it disagrees with), reported in one line."""


class CheckpointError(RuntimeError):
    pass
