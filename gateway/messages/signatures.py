"""Thinking-block signatures that carry the reasoning, sealed, the way Anthropic's do.

Anthropic's ``signature`` holds the block's reasoning, encrypted: a client may replay a
thinking block with its text left out (``thinking.display`` ``"omitted"`` returns it empty,
and Claude Code replays ``{"thinking": "", "signature": ...}``), and the model still sees
its earlier reasoning. This gateway's signature does the same for OpenAI-compatible
upstreams, which take prior reasoning back as ``reasoning_content``:

    signature = base64( 0x01 | nonce (12 bytes) | AES-256-GCM( zlib(reasoning) ) )
    signature = base64( 0x02 | nonce (12 bytes) | AES-256-GCM( reasoning ) )

(``0x02`` for reasoning under :data:`_PLAIN_BELOW` bytes, which deflate barely shrinks: a
deflate stream's set-up was most of a short block's sealing cost.)

under keys derived (HKDF-SHA256) from ``server.signing_key_env``. The nonce is a keyed
hash of the sealed bytes (the synthetic-IV construction): the same reasoning always gets
the same signature (golden files stay exact, a replayed history stays byte-identical for
the upstream's prefix cache), and a nonce repeats only with its plaintext, which reveals
nothing but that equality. GCM authenticates it:
a signature that was not made under this key, or was altered, does not open, and the
request is refused as the API refuses an invalid signature. A signature is made once per
thinking block (at its end), never per token.

Library: ``cryptography`` (AES-GCM from OpenSSL): an authenticated cipher is not something
to write here.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from gateway.errors import InvalidRequest, RequestTooLarge

__all__ = ["MAX_REASONING_BYTES", "MAX_RESTORED_CHARS", "open_signature", "restore_reasoning",
           "seal"]

_VERSION = b"\x01"  # zlib-compressed reasoning
_PLAIN = b"\x02"  # the reasoning as is
_PLAIN_BELOW = 512
_NONCE = 12
_AAD = b"llm-gateway thinking block"
# Reasoning restored from one signature, at most: far above any real block (a 128k-token
# budget is ~512 KB of text), a bound on inflating whatever a signature holds.
MAX_REASONING_BYTES = 8 * 1024 * 1024
# Reasoning restored for one request, at most: one signature may be replayed in every block
# of a body, and a model's repetitive reasoning seals 1 MiB into 1.4 KB (a 32 MiB body of
# copies would restore some 23 GiB). As much text as the largest body could carry itself.
MAX_RESTORED_CHARS = 32 * 1024 * 1024

# signing key -> (its cipher, a keyed hash to copy for nonces); one key per process
_KEYS: dict[bytes, tuple[AESGCM, Any]] = {}


def _keys(key: bytes) -> tuple[AESGCM, Any]:
    keys = _KEYS.get(key)
    if keys is None:
        if len(_KEYS) > 8:
            _KEYS.clear()
        derived = HKDF(algorithm=hashes.SHA256(), length=64, salt=None,
                       info=b"llm-gateway thinking signature v1").derive(key)
        keys = _KEYS[key] = (AESGCM(derived[:32]),
                             hmac.new(derived[32:], digestmod=hashlib.sha256))
    return keys


def _cipher(key: bytes) -> AESGCM:
    return _keys(key)[0]


def seal(key: bytes, reasoning: str) -> str:
    """The signature of a thinking block: its reasoning, compressed and sealed."""
    cipher, mac = _keys(key)
    text = reasoning.encode("utf-8")
    if len(text) < _PLAIN_BELOW:
        version, packed = _PLAIN, text
    else:
        # a 4 KiB window and memLevel 4: zlib.compress's defaults set up ~256 KiB of state
        # per call, for about the same size on reasoning-sized text; any zlib stream opens
        # with the default decompressor
        deflate = zlib.compressobj(6, zlib.DEFLATED, 12, 4)
        version, packed = _VERSION, deflate.compress(text) + deflate.flush()
    nonce_mac = mac.copy()
    nonce_mac.update(version + packed)  # the version is sealed with it: never swapped
    nonce = nonce_mac.digest()[:_NONCE]
    sealed = cipher.encrypt(nonce, packed, _AAD if version == _VERSION else _AAD + version)
    return base64.b64encode(version + nonce + sealed).decode("ascii")


def open_signature(keys: bytes | Sequence[bytes], signature: str) -> str | None:
    """The reasoning a signature of ours holds; None when it is not one (or was altered).

    ``keys``: the signing key, or the keys in force (the current one first, then those it
    replaced: a signature made before a key rotation still opens)."""
    try:
        raw = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        return None
    version = raw[:1]
    if len(raw) < 1 + _NONCE + 16 or version not in (_VERSION, _PLAIN):
        return None
    aad = _AAD if version == _VERSION else _AAD + version  # 0x01 predates the version in it
    packed = None
    for key in (keys,) if isinstance(keys, bytes) else keys:
        try:
            packed = _cipher(key).decrypt(raw[1:1 + _NONCE], raw[1 + _NONCE:], aad)
            break
        except InvalidTag:
            continue
    if packed is None:
        return None
    if version == _PLAIN:
        try:
            return packed.decode("utf-8")
        except UnicodeDecodeError:
            return None
    inflate = zlib.decompressobj()
    try:
        text = inflate.decompress(packed, MAX_REASONING_BYTES)
    except zlib.error:
        return None
    if inflate.unconsumed_tail or not inflate.eof:
        return None
    try:
        return text.decode("utf-8")
    except UnicodeDecodeError:
        return None


def restore_reasoning(req: Mapping[str, Any], keys: bytes | Sequence[bytes]) -> None:
    """Put back the reasoning of every replayed thinking block that left its text out.

    A block with an empty ``thinking`` and a signature gets the reasoning its signature
    holds (in place: the request is the gateway's own parse of the body); a signature that
    does not open is refused as the API refuses one (400 naming the block's signature). A
    block that carries its text keeps it, whatever its signature: clients replay histories
    recorded elsewhere, and the text is what the model is shown. Past
    :data:`MAX_RESTORED_CHARS` restored in all, the request is refused (413).
    """
    restored = 0
    for i, turn in enumerate(req["messages"]):
        if turn["role"] != "assistant" or isinstance(turn["content"], str):
            continue
        for j, block in enumerate(turn["content"]):
            if block["type"] != "thinking" or block["thinking"] or not block.get("signature"):
                continue
            reasoning = open_signature(keys, block["signature"])
            if reasoning is None:
                raise InvalidRequest(f"messages.{i}.content.{j}.signature",
                                     "Invalid `signature` in `thinking` block")
            restored += len(reasoning)
            if restored > MAX_RESTORED_CHARS:
                raise RequestTooLarge(f"Reasoning restored from `thinking` block signatures "
                                      f"exceeds {MAX_RESTORED_CHARS} characters")
            block["thinking"] = reasoning
