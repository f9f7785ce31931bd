"""Errors the families share (torch-free: the planner raises them too)."""


class MediaGeometryError(ValueError):
    """An image or video that the resize rule cannot take; the message names the item."""
