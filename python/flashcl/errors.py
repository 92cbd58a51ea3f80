"""The exceptions of flashcl: one class per fcl_status, each carrying the status and the library's message."""

from __future__ import annotations

import enum
from typing import Dict, Type


class Status(enum.IntEnum):
    """fcl_status values, as in include/flashcl.h."""

    SUCCESS = 0
    INVALID_ARGUMENT = 1
    UNSUPPORTED = 2
    OPENCL = 3
    BUILD = 4
    OUT_OF_RESOURCES = 5
    CLBLAST = 6


class FlashclError(Exception):
    """Base of every flashcl error.

    ``status`` is the :class:`Status` (``None`` for errors that do not come from a library status, such
    as :class:`LibraryNotFoundError`); ``message`` is ``fcl_last_error()``'s text for a library failure,
    or the check that failed when the bindings refused the arguments before calling the library.
    """

    status: "Status | None" = None

    def __init__(self, message: str, status: "Status | int | None" = None) -> None:
        if status is not None:
            try:
                status = Status(status)
            except ValueError:
                pass
            self.status = status  # type: ignore[assignment]
        self.message = message
        super().__init__(message)

    def __str__(self) -> str:
        name = self.status.name if isinstance(self.status, Status) else self.status
        return f"[{name}] {self.message}" if name is not None else self.message


class InvalidArgumentError(FlashclError, ValueError):
    """FCL_ERROR_INVALID_ARGUMENT: a wrong shape, dtype, layout, stride, size or buffer.

    The bindings raise it themselves for arrays they can see are wrong, before anything is enqueued.
    """

    status = Status.INVALID_ARGUMENT


class UnsupportedError(FlashclError, NotImplementedError):
    """FCL_ERROR_UNSUPPORTED: valid, but not on this device or build (or not expressible in flashcl)."""

    status = Status.UNSUPPORTED


class OpenCLError(FlashclError, RuntimeError):
    """FCL_ERROR_OPENCL: an OpenCL call failed; the message names it and its error code."""

    status = Status.OPENCL


class BuildError(FlashclError, RuntimeError):
    """FCL_ERROR_BUILD: a kernel did not compile; the message holds the build log."""

    status = Status.BUILD


class OutOfResourcesError(FlashclError, MemoryError):
    """FCL_ERROR_OUT_OF_RESOURCES: a host or device allocation failed."""

    status = Status.OUT_OF_RESOURCES


class CLBlastError(FlashclError, RuntimeError):
    """FCL_ERROR_CLBLAST: CLBlast returned an error (reference path)."""

    status = Status.CLBLAST


class LibraryNotFoundError(FlashclError, OSError):
    """libflashcl could not be loaded (see :func:`flashcl.library_path` and ``FLASHCL_LIBRARY``)."""


_BY_STATUS: Dict[int, Type[FlashclError]] = {
    Status.INVALID_ARGUMENT: InvalidArgumentError,
    Status.UNSUPPORTED: UnsupportedError,
    Status.OPENCL: OpenCLError,
    Status.BUILD: BuildError,
    Status.OUT_OF_RESOURCES: OutOfResourcesError,
    Status.CLBLAST: CLBlastError,
}


def error_for_status(status: int, message: str) -> FlashclError:
    """The exception for a non-zero fcl_status (the base class for a status this version does not know)."""
    cls = _BY_STATUS.get(int(status), FlashclError)
    return cls(message, status)
