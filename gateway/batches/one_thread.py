"""One database behind one worker thread: the plumbing the batch, usage and sign-in stores
share.

Every statement runs on the store's one thread (SQLAlchemy's engines are blocking; a thread of
its own keeps the event loop free and the statements of one store in order), each call in one
transaction; a failure becomes a :class:`~gateway.batches.schema.StoreError` naming the store,
the operation and the file or server, with the driver's first line and never the password.
A subclass names itself (:attr:`OneThreadStore.NAME`), says what its tables are
(``_setup``, run once by :meth:`OneThreadStore._start`) and calls :meth:`OneThreadStore._run`.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ClassVar, TypeVar

from sqlalchemy import exc
from sqlalchemy.engine import Connection, Engine

from gateway.batches.schema import StoreError

__all__ = ["DB_ERRORS", "OneThreadStore"]

T = TypeVar("T")

DB_ERRORS = (exc.SQLAlchemyError, sqlite3.Error, OSError)


class OneThreadStore:
    """A database's engine, its one thread, and how failures are told (module docstring)."""

    NAME: ClassVar[str] = "store"  # in messages and the thread's name: "usage store"

    def __init__(self, engine: Engine, where: str, password: str | None) -> None:
        self._engine = engine
        self._reader = engine.execution_options(gateway_read=True)
        self._pg = engine.dialect.name == "postgresql"
        self._where = where  # for messages: a file path or "postgresql database DB at HOST"
        self._password = password
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=self.NAME.replace(" ", "-")
        )
        self._closed = False

    def _setup(self, conn: Connection) -> None:
        """Create the tables if absent and check them with a cheap query."""
        raise NotImplementedError

    def _start(self) -> None:
        """Run ``_setup`` on the thread, at open; a failure closes the store and raises."""
        try:
            self._executor.submit(self._call, "open", self._setup, True).result()
        except BaseException:
            self._shutdown()
            raise

    def _call(self, op: str, fn: Callable[[Connection], T], write: bool) -> T:
        """Run ``fn`` in one transaction, on the thread (a subclass may wrap it)."""
        return self._transaction(op, fn, write)

    def _transaction(self, op: str, fn: Callable[[Connection], T], write: bool) -> T:
        try:
            with (self._engine if write else self._reader).begin() as conn:
                return fn(conn)
        except DB_ERRORS as e:
            raise self._failure(op, e) from None

    def _failure(self, op: str, e: BaseException) -> StoreError:
        return StoreError(self._describe(op, e))

    def _describe(self, op: str, e: BaseException) -> str:
        orig = e.orig if isinstance(e, exc.DBAPIError) and e.orig is not None else e
        first = (str(orig).strip().splitlines() or [""])[0][:200]
        if self._password:
            first = first.replace(self._password, "***")
        return f"{self.NAME} {op} failed ({self._where}): {type(orig).__name__}: {first}"

    async def _run(self, op: str, fn: Callable[[Connection], T], write: bool = True) -> T:
        try:
            return await asyncio.get_running_loop().run_in_executor(
                self._executor, self._call, op, fn, write
            )
        except RuntimeError as e:  # the executor was shut down
            raise StoreError(f"{self.NAME} {op} failed: the store is closed") from e

    def _shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._executor.submit(self._engine.dispose).result()
        self._executor.shutdown(wait=True)

    async def close(self) -> None:
        """Dispose of the engine (its connections) and stop the worker thread."""
        await asyncio.get_running_loop().run_in_executor(None, self._shutdown)
