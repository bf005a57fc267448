"""Exceptions of the package. Every message says what went wrong and what the user can do."""

from __future__ import annotations

from typing import Any


class Sapiens2Error(Exception):
    """Base class: anything the package raises on purpose.

    ``str(err)`` is the whole message, for whoever can act on it (a library or CLI user, a
    server's operator). ``plain`` is None, or one plain sentence for a visitor of a public page
    where the message holds operator details (paths, environment variables): :func:`for_visitor`."""

    plain: str | None = None


def for_visitor(err: BaseException) -> str:
    """What a visitor of a public server is told about ``err``: its plain sentence, or its message."""
    return getattr(err, "plain", None) or str(err)


class WeightsUnavailableError(Sapiens2Error):
    """The checkpoint file could not be found locally nor downloaded (offline, missing, timeout).

    The message names files, folders and settings for the operator; ``plain`` says it for a visitor."""

    plain: str | None = (
        "This model's weights are not available on this server right now, so it cannot run. "
        "Other tabs may still work."
    )

    def __init__(self, message: str, *, plain: str | None = None) -> None:
        super().__init__(message)
        if plain is not None:
            self.plain = plain  # kept by pickling (the instance's __dict__ travels with it)


class CheckpointError(Sapiens2Error):
    """A checkpoint file exists but is unusable: corrupt, another task or size, wrong keys."""

    plain = "This server's copy of the model's weights cannot be used, so it cannot run. Other tabs may still work."


class InputImageError(Sapiens2Error, ValueError):
    """An input image cannot be read or used (empty, corrupt, too large, wrong type)."""


class OptionError(Sapiens2Error, ValueError):
    """An option has a value that is not allowed; the message lists the allowed values."""


class ResultNotFoundError(Sapiens2Error, ValueError):
    """A request names an earlier result (e.g. to make its full-resolution mesh) that this server
    does not hold: a malformed id, one it never made, or one already deleted as too old."""


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

    plain = "The server's disk is full, so this cannot run now. Please try again later."


class DeviceError(Sapiens2Error, RuntimeError):
    """The weights read fine but the device could not take them (no CUDA, an emulated device ...)."""


class ResidencyError(WeightsUnavailableError):
    """Device work (a GPU function, a ZeroGPU worker) needed weights the server had not loaded
    first: it never loads them itself. A kind of unavailability, so that the fallbacks for missing
    optional weights (the person detector, a borrowed segmentation) apply, with this message."""

    plain = "The server was not ready for this request (its model was not loaded). Please try again."


class GpuUnavailableError(Sapiens2Error, RuntimeError):
    """ZeroGPU did not run (or did not finish) a GPU call: the visitor's quota is short
    (``requested_s`` and ``left_s`` as spaces reports them, seconds of quota), no GPU was free, or
    the worker was aborted. The message says which, and what helps."""

    def __init__(self, message: str, *, requested_s: int | None = None, left_s: int | None = None,
                 wait: str | None = None, quota: bool = False) -> None:  # fmt: skip
        super().__init__(message)
        self.requested_s, self.left_s, self.wait, self.quota = requested_s, left_s, wait, quota

    def __reduce__(self) -> tuple[Any, ...]:
        kw = {"requested_s": self.requested_s, "left_s": self.left_s, "wait": self.wait, "quota": self.quota}
        return (_rebuild_gpu_error, (str(self), kw))


def _rebuild_gpu_error(message: str, kw: dict[str, Any]) -> GpuUnavailableError:
    return GpuUnavailableError(message, **kw)
