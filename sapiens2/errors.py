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


class InputVideoError(InputImageError):
    """An input video cannot be read or used (not a video, corrupt, too long, too large).

    A subclass of InputImageError so that code handling bad uploads in general catches it too.
    """


class VideoEncodeError(Sapiens2Error):
    """This installation cannot write a video that browsers play (no usable encoder)."""


class DiskFullError(WeightsUnavailableError):
    """A download or write failed because the disk is full (ENOSPC); the message names the folder."""


class DeviceError(Sapiens2Error, RuntimeError):
    """The weights read fine but the device could not take them (no CUDA, an emulated device ...)."""


class ResidencyError(WeightsUnavailableError):
    """Device work (a GPU function, a ZeroGPU worker) needed weights the server had not loaded
    first: it never loads them itself. A kind of unavailability, so that the fallbacks for missing
    optional weights (the person detector, a borrowed segmentation) apply, with this message."""
