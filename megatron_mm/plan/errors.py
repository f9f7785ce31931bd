"""The planner's error type.

A ``ConfigError`` subclass, so code that already reports bad flags (the training arguments)
reports a plan that cannot work the same way: one message naming the limit or flag to change.
"""

from ..config import ConfigError


class PlanError(ConfigError):
    """A pipeline plan that cannot be built; the message says which setting to change."""
