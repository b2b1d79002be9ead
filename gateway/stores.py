"""The state stores start-up opens: the Message Batches store, and the usage report's and the
sign-in's tables in the same database (SQLite in the state directory by default, or the
database the operator names).

Where the operator named the database (``batches.database`` or ``database_env``), one that
cannot be opened stops the start (exit 1); the default one, in the state directory, turns the
feature off with a warning that says how to fix it (:data:`STATE_FIX`) instead.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

import structlog

from gateway.ops import config
from gateway.ops.config_schema import BatchesConfig

if TYPE_CHECKING:
    from gateway.auth.signin_store import AuthStore
    from gateway.batches.store import BatchStore
    from gateway.batches.usage_store import UsageStore

__all__ = [
    "STATE_FIX",
    "open_auth_store",
    "open_batch_store",
    "open_usage_store",
    "start_batch_store",
]

STATE_FIX = (
    "set STATE_DIRECTORY to a writable folder (a volume mounted there in a "
    "container), or set batches.database"
)


def start_batch_store(cfg: config.Config) -> BatchStore | None:
    """The Message Batches store, or None when batches are off. Where the operator named the
    database (batches.database or database_env), one that cannot be opened stops the start;
    the default one, in the state directory, turns batches off with a warning instead."""
    logger = structlog.get_logger("gateway")
    from gateway.batches.store import StoreError

    try:
        store, off = open_batch_store(cfg.batches)
    except StoreError as exc:
        logger.error("batch_store_failed", detail=str(exc))
        raise SystemExit(1) from None
    if off is not None:
        folder, why = off
        logger.warning("batches_disabled", folder=folder, detail=why, fix=STATE_FIX)
    return store


_Store = TypeVar("_Store")


def open_usage_store(cfg: config.Config) -> UsageStore | None:
    """The usage report's table (only with admin keys, the report's only readers); off:
    its route answers 404 saying so."""
    if not cfg.server.admin_keys:
        return None
    from gateway.batches.usage_store import UsageStore

    return _open_side_store(cfg, UsageStore.open, off="usage_disabled", failed="usage_store_failed")


def open_auth_store(cfg: config.Config) -> AuthStore | None:
    """The sign-in's tables (``[auth] enabled``); off: its routes are 404."""
    if not cfg.auth.enabled:
        return None
    from gateway.auth.signin_store import AuthStore

    return _open_side_store(cfg, AuthStore.open, off="signin_disabled", failed="auth_store_failed")


def _open_side_store(
    cfg: config.Config, opener: Callable[[str], _Store], *, off: str, failed: str
) -> _Store | None:
    """A feature's tables in the batches' database (opened for the feature alone when batches
    are off). A database the operator named that cannot be opened stops the start (``failed``
    logged); the default one turns the feature off with the warning ``off``."""
    logger = structlog.get_logger("gateway")
    from gateway.batches.schema import StoreError

    b = cfg.batches
    if not b.database_url:
        logger.warning(off, detail="no state directory", fix=STATE_FIX)
        return None
    if not b.database_explicit:
        folder = os.path.dirname(b.database_url.removeprefix("sqlite:///"))
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
        except OSError as exc:
            logger.warning(off, folder=folder, detail=exc.strerror, fix=STATE_FIX)
            return None
    try:
        return opener(b.database_url)
    except StoreError as exc:
        if b.database_explicit:
            logger.error(failed, detail=str(exc))
            raise SystemExit(1) from None
        logger.warning(off, detail=str(exc), fix=STATE_FIX)
        return None


def open_batch_store(
    batches: BatchesConfig,
) -> tuple[BatchStore | None, tuple[str | None, str] | None]:
    """(the store or None, None or (the state directory, why batches are off there)).

    Off by config: (None, None). An explicit location is opened as it is and its failure
    raises StoreError. The default location's folder is made if absent (mode 0700, parents
    too); if it cannot be made, or the store cannot be opened there, batches are off."""
    if not batches.enabled:
        return None, None
    from gateway.batches.store import BatchStore, StoreError

    if batches.database_explicit:
        return BatchStore.open(batches.database_url), None
    if not batches.database_url:
        return None, (
            None,
            "no state directory: STATE_DIRECTORY, XDG_STATE_HOME and HOME are unset",
        )
    folder = os.path.dirname(batches.database_url.removeprefix("sqlite:///"))
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    except OSError as exc:
        return None, (
            folder,
            f"cannot create the state directory {folder}: {exc.strerror or type(exc).__name__}",
        )
    try:
        return BatchStore.open(batches.database_url), None
    except StoreError as exc:
        return None, (folder, str(exc))
