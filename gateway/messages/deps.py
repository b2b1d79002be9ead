"""What a Messages call needs from the process, passed in: nothing in ``gateway.messages``
knows HTTP or the application (the layer test holds it to that)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from gateway.local.capabilities import LEARNED, Learned
from gateway.messages.documents.pdf_pool import PdfPool
from gateway.ops.budget import Budget
from gateway.ops.metrics import Metrics
from gateway.upstream.send import Upstreams

__all__ = ["MessagesDeps"]


@dataclass(frozen=True, slots=True)
class MessagesDeps:
    """What a Messages call needs from the process: upstreams (clients, metrics, secrets), the
    key that seals and opens thinking signatures, and the billing-header switch."""

    upstreams: Upstreams
    signing_key: bytes
    keep_billing_header: bool = False
    # keys replaced by signing_key: signatures made under them still open (a key rotation)
    previous_signing_keys: tuple[bytes, ...] = ()
    # what routes' upstreams refused (process-wide by default)
    learned: Learned = LEARNED
    # request bodies being decoded (server.max_decoding_bytes, gateway/http/body.py), within
    # memory (server.memory_budget_mb): what requests in flight hold, the reasoning they
    # restore from signatures among it (gateway/ops/budget.py)
    decoding: Budget = field(default_factory=lambda: Budget(64 * 1024 * 1024))
    memory: Budget = field(default_factory=lambda: Budget(512 * 1024 * 1024))
    max_restored_bytes: int = 4 * 1024 * 1024  # server.max_restored_reasoning_bytes
    # the worker processes that read PDFs (server.pdf_workers and its CPU budgets)
    pdfs: PdfPool = field(default_factory=PdfPool)
    # a buffered upstream reply past decode_offload_bytes is decoded by loads_off_loop (the
    # decoder child, gateway/http/decoder.py); None: every reply on the loop
    decode_offload_bytes: int = 0
    loads_off_loop: Callable[[bytes], Awaitable[Any]] | None = None
    # fn(*args) in the decoder child: count_tokens' JSON past decode_offload_bytes
    run_off_loop: Callable[..., Awaitable[Any]] | None = None

    @property
    def opening_keys(self) -> tuple[bytes, ...]:
        return (self.signing_key, *self.previous_signing_keys)

    @property
    def metrics(self) -> Metrics:
        return self.upstreams.metrics
