"""The batch store's reserve: disk held back for the operations that free it.

In WAL mode every SQLite write, even one that shrinks rows (a cancel drops its requests'
params) or deletes them, first appends pages to the ``-wal`` file, so on a full disk cancel and
delete would fail like creates, and nothing could free space. A file store keeps a reserve file
beside it (``<database>.reserve``, :data:`RESERVE_BYTES`): an operation that ends or removes
work and fails on a full disk (:func:`disk_full`) spends it and runs again; a create is refused
while it is spent and cannot be made again (see :mod:`gateway.batches.store`).
"""

from __future__ import annotations

import contextlib
import errno
import os

from sqlalchemy import exc

__all__ = ["RESERVE_BYTES", "Reserve", "disk_full"]

_SQLITE_FULL = 13
_PG_DISK_FULL = "53100"


def disk_full(e: BaseException) -> bool:
    """Whether a database error says the disk (or the database's size cap) is full."""
    orig = e.orig if isinstance(e, exc.DBAPIError) and e.orig is not None else e
    return (
        getattr(orig, "sqlite_errorcode", None) == _SQLITE_FULL
        or getattr(orig, "sqlstate", None) == _PG_DISK_FULL
        or getattr(orig, "errno", None) == errno.ENOSPC
        or "disk is full" in str(orig)
    )


RESERVE_BYTES = 16 * 1024 * 1024  # the reserve file: room for a cancel or delete's WAL pages


class Reserve:
    """``size`` bytes of disk held in a file beside the SQLite database (see the module
    docstring); all its calls run on the store's worker thread."""

    def __init__(self, path: str, size: int) -> None:
        self.path = path
        self.size = size

    def keep(self) -> bool:
        """Whether the reserve is in place: present, or made now (False: no room for it)."""
        with contextlib.suppress(OSError):
            if os.path.getsize(self.path) >= self.size:
                return True
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                _allocate(fd, self.size)
            finally:
                os.close(fd)
            return True
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
            return False

    def spend(self) -> bool:
        """Give the reserve's space back to the disk. -> whether there was one to give."""
        try:
            os.unlink(self.path)
            return True
        except OSError:
            return False


def _allocate(fd: int, size: int) -> None:
    """Allocate ``size`` bytes of ``fd`` on disk (not a sparse file): ENOSPC if no room."""
    try:
        os.posix_fallocate(fd, 0, size)
        return
    except (AttributeError, OSError) as e:  # no fallocate here, or not on this filesystem
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            raise
    chunk = bytes(1 << 20)
    for start in range(0, size, len(chunk)):
        os.pwrite(fd, chunk[: size - start], start)
    os.fsync(fd)
