"""Exceptions of the package. Every message says what went wrong and what the user can do."""

from __future__ import annotations


class Sapiens2Error(Exception):
    """Base class: anything the package raises on purpose."""


class WeightsUnavailableError(Sapiens2Error):
    """The checkpoint file could not be found locally nor downloaded (offline, missing, timeout)."""


class CheckpointError(Sapiens2Error):
    """A checkpoint file exists but is unusable: corrupt, another task or size, wrong keys."""


class InputImageError(Sapiens2Error, ValueError):
    """An input image cannot be read or used (empty, corrupt, too large, wrong type)."""


class OptionError(Sapiens2Error, ValueError):
    """An option has a value that is not allowed; the message lists the allowed values."""


class OutOfMemoryError(Sapiens2Error, MemoryError):
    """The accelerator ran out of memory; the message suggests a smaller size."""


class NotResidentError(Sapiens2Error):
    """A GPU function needed a model the server process had not loaded first (it never loads)."""


class InputVideoError(InputImageError):
    """An input video cannot be read or used (not a video, corrupt, too long, too large).

    A subclass of InputImageError so that code handling bad uploads in general catches it too.
    """


class VideoEncodeError(Sapiens2Error):
    """This installation cannot write a video that browsers play (no usable encoder)."""
