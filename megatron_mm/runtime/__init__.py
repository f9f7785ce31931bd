"""Executing plans: the schedule executor and the messages between pipeline ranks."""

from .executor import ScheduleExecutor

__all__ = ["ScheduleExecutor"]
