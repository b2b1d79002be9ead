"""Thinking-block signatures that carry the reasoning, sealed, the way Anthropic's do.

Anthropic's ``signature`` holds the block's reasoning, encrypted: a client may replay a
thinking block with its text left out (``thinking.display`` ``"omitted"`` returns it empty,
and Claude Code replays ``{"thinking": "", "signature": ...}``), and the model still sees
its earlier reasoning. This gateway's signature does the same for OpenAI-compatible
upstreams, which take prior reasoning back as ``reasoning_content``:

Where the block's text is hidden from the client (``thinking.display`` ``"omitted"`` or
``"updates"``), its signature is sealed, :func:`seal`: the reasoning encrypted.

    signature = base64( 0x01 | nonce (12 bytes) | AES-256-GCM( zlib(reasoning) ) )
    signature = base64( 0x02 | nonce (12 bytes) | AES-256-GCM( reasoning ) )

Where the block shows its text (the default), the client already holds the reasoning, and
encrypting it again would hide nothing: its signature is signed, :func:`sign`, a keyed hash
(BLAKE2b, 16 bytes) over the reasoning it carries, as protocol.md's decision puts it (an
HMAC of the thinking text under a per-deployment key):

    signature = base64( 0x03 | tag (16 bytes) | reasoning )
    signature = base64( 0x04 | tag (16 bytes) | zlib(reasoning) )

(``0x02`` and ``0x03`` for reasoning under :data:`_PLAIN_BELOW` bytes, which deflate barely
shrinks: a deflate stream's set-up was most of a short block's sealing cost.) Signing costs a
quarter of sealing where it counts, one request at a time, where every library a reply
touches comes back to a cold cache: sealing a short block took 18-19 µs (OpenSSL's AES-GCM
and HMAC behind ``cryptography`` and ``hashlib``; 2.3 µs when warm), signing it 5 µs, and
the process's CPU per reply fell by 16-30 µs (docs/performance.md).

Both under keys derived (HKDF-SHA256) from ``server.signing_key_env``. A sealed signature's
nonce is a keyed hash of the sealed bytes (the synthetic-IV construction): the same
reasoning always gets the same signature (golden files stay exact, a replayed history stays
byte-identical for the upstream's prefix cache), and a nonce repeats only with its
plaintext, which reveals nothing but that equality. GCM authenticates it, the tag a signed
one: a signature that was not made under this key, or was altered, does not open, and the
request is refused as the API refuses an invalid signature. A signature is made once per
thinking block (at its end), never per token.

Opening one is bounded by the request that replays it (:func:`restore_reasoning`): a
signature restores at most :data:`MAX_EXPANSION` bytes per character of itself (:func:`seal`
pads a looping model's reasoning so its own signatures always do), a request at most
``server.max_restored_reasoning_bytes``, and what is restored counts in the process-wide
memory budget (:mod:`gateway.ops.budget`), reserved before the signature is opened.
Nothing is inflated past the bound left.

Library: ``cryptography`` (AES-GCM from OpenSSL): an authenticated cipher is not something
to write here.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from gateway.errors import InvalidRequest, Overloaded, RequestTooLarge

__all__ = [
    "MAX_EXPANSION",
    "MAX_REASONING_BYTES",
    "MAX_RESTORED_BYTES",
    "MAX_RESTORED_CHARS",
    "Restorable",
    "TooMuchReasoning",
    "for_block",
    "open_signature",
    "restorable",
    "restore_reasoning",
    "seal",
    "sign",
]

_VERSION = b"\x01"  # zlib-compressed reasoning, sealed
_PLAIN = b"\x02"  # the reasoning as is, sealed
_SIGNED_PACKED = b"\x04"  # zlib-compressed reasoning, signed
_SIGNED_PLAIN = b"\x03"  # the reasoning as is, signed
_TAG = 16
_PLAIN_BELOW = 512
_NONCE = 12
_AAD = b"llm-gateway thinking block"
# Reasoning restored from one signature, at most: far above any real block (a 128k-token
# budget is ~512 KB of text), a bound on inflating whatever a signature holds.
MAX_REASONING_BYTES = 8 * 1024 * 1024
# Bytes of reasoning one signature restores per character of itself, at most. Measured with
# this module's deflate settings, natural text restores 1.5-2.2 bytes per signature character
# (English prose, source code), JSON event streams ~10; a model looping on one paragraph
# ~200, a run of one letter ~730. 32 leaves real reasoning 15x headroom and bounds what a
# small signature can expand into; :func:`seal` pads the compressed reasoning of a looping
# model up to it, so no signature this gateway makes is ever refused for its ratio.
MAX_EXPANSION = 32
# Reasoning restored for one request, at most, unless the caller passes its own (the
# ``server.max_restored_reasoning_bytes`` knob): one signature may be replayed in every
# block of a body, so the bound is per request, well below the body limit.
MAX_RESTORED_BYTES = 4 * 1024 * 1024
MAX_RESTORED_CHARS = MAX_RESTORED_BYTES  # the name before the bound was counted in bytes

# (signing key, purpose) -> (its cipher, a keyed hash to copy for nonces); a few per process
_KEYS: dict[tuple[bytes, bytes], tuple[AESGCM, Any]] = {}
_THINKING = b"llm-gateway thinking signature v1"


def derived_keys(key: bytes, purpose: bytes) -> tuple[AESGCM, Any]:
    """The cipher and the nonce hash that ``key`` gives for ``purpose`` (HKDF-SHA256: one
    signing key seals thinking signatures and web search results with keys of their own)."""
    keys = _KEYS.get((key, purpose))
    if keys is None:
        if len(_KEYS) > 8:
            _KEYS.clear()
        derived = HKDF(algorithm=hashes.SHA256(), length=64, salt=None, info=purpose).derive(key)
        keys = _KEYS[key, purpose] = (
            AESGCM(derived[:32]),
            hmac.new(derived[32:], digestmod=hashlib.sha256),
        )
    return keys


def _keys(key: bytes) -> tuple[AESGCM, Any]:
    return derived_keys(key, _THINKING)


# signing key -> the keyed BLAKE2b that signs shown thinking (its own HKDF purpose)
_MACS: dict[bytes, Any] = {}
_SIGNING = b"llm-gateway thinking signature v2 (signed)"


def _mac(key: bytes) -> Any:
    mac = _MACS.get(key)
    if mac is None:
        if len(_MACS) > 8:
            _MACS.clear()
        derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_SIGNING).derive(key)
        mac = _MACS[key] = hashlib.blake2b(key=derived, digest_size=_TAG)
    return mac


def _cipher(key: bytes) -> AESGCM:
    return _keys(key)[0]


def for_block(key: bytes, reasoning: str, hidden: bool) -> str:
    """A thinking block's signature: :func:`seal` when its text is ``hidden`` from the
    client, else :func:`sign`."""
    return seal(key, reasoning) if hidden else sign(key, reasoning)


def _pack(text: bytes) -> bytes:
    # a 4 KiB window and memLevel 4: zlib.compress's defaults set up ~256 KiB of state
    # per call, for about the same size on reasoning-sized text; any zlib stream opens
    # with the default decompressor
    deflate = zlib.compressobj(6, zlib.DEFLATED, 12, 4)
    packed = deflate.compress(text) + deflate.flush()
    # a looping model's reasoning deflates past MAX_EXPANSION: zeros after the stream
    # (an opener reads to the stream's end and ignores them) keep the signature at least
    # len(text) / MAX_EXPANSION characters, so it opens wherever the ratio is checked
    floor = -(-len(text) // MAX_EXPANSION)
    if len(packed) < floor:
        packed += bytes(floor - len(packed))
    return packed


def sign(key: bytes, reasoning: str) -> str:
    """The signature of a thinking block whose text the client sees: its reasoning (compressed
    when long) under a keyed hash, not encrypted."""
    text = reasoning.encode("utf-8")
    if len(text) < _PLAIN_BELOW:
        version, packed = _SIGNED_PLAIN, text
    else:
        version, packed = _SIGNED_PACKED, _pack(text)
    tag = _mac(key).copy()
    tag.update(version)
    tag.update(packed)
    return base64.b64encode(version + tag.digest() + packed).decode("ascii")


def seal(key: bytes, reasoning: str) -> str:
    """The signature of a thinking block whose text is hidden: its reasoning, compressed and
    sealed."""
    cipher, mac = _keys(key)
    text = reasoning.encode("utf-8")
    if len(text) < _PLAIN_BELOW:
        version, packed = _PLAIN, text
    else:
        version, packed = _VERSION, _pack(text)
    nonce_mac = mac.copy()
    nonce_mac.update(version + packed)  # the version is sealed with it: never swapped
    nonce = nonce_mac.digest()[:_NONCE]
    sealed = cipher.encrypt(nonce, packed, _AAD if version == _VERSION else _AAD + version)
    return base64.b64encode(version + nonce + sealed).decode("ascii")


class TooMuchReasoning(Exception):
    """A signature holds more reasoning than it was allowed to restore (``limit`` bytes)."""


def open_signature(
    keys: bytes | Sequence[bytes], signature: str, limit: int = MAX_REASONING_BYTES
) -> str | None:
    """The reasoning a signature of ours holds; None when it is not one (or was altered, or
    holds more than ``limit`` bytes; :func:`open_bounded` tells that case apart).

    ``keys``: the signing key, or the keys in force (the current one first, then those it
    replaced: a signature made before a key rotation still opens)."""
    try:
        return open_bounded(keys, signature, limit)
    except TooMuchReasoning:
        return None


def open_bounded(keys: bytes | Sequence[bytes], signature: str, limit: int) -> str | None:
    """:func:`open_signature`, raising :class:`TooMuchReasoning` past ``limit`` bytes (or past
    :data:`MAX_EXPANSION` times the signature's length); never inflates more than that."""
    try:
        raw = base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        return None
    version = raw[:1]
    if version in (_SIGNED_PLAIN, _SIGNED_PACKED):
        packed = _verified(keys, raw) if len(raw) >= 1 + _TAG else None
    elif version in (_VERSION, _PLAIN) and len(raw) >= 1 + _NONCE + 16:
        packed = _decrypted(keys, raw)
    else:
        return None
    if packed is None:
        return None
    limit = min(limit, MAX_REASONING_BYTES, MAX_EXPANSION * len(signature))
    if version in (_PLAIN, _SIGNED_PLAIN):
        if len(packed) > limit:
            raise TooMuchReasoning
        try:
            return packed.decode("utf-8")
        except UnicodeDecodeError:
            return None
    inflate = zlib.decompressobj()
    try:  # one byte past the limit tells "more" from "exactly"; 0 would mean no limit
        text = inflate.decompress(packed, limit + 1)
    except zlib.error:
        return None
    if len(text) > limit:
        raise TooMuchReasoning
    if not inflate.eof:  # cut short
        return None
    try:
        return text.decode("utf-8")
    except UnicodeDecodeError:
        return None


def _decrypted(keys: bytes | Sequence[bytes], raw: bytes) -> bytes | None:
    """A sealed signature's packed reasoning, under the first key that opens it."""
    version = raw[:1]
    aad = _AAD if version == _VERSION else _AAD + version  # 0x01 predates the version in it
    for key in (keys,) if isinstance(keys, bytes) else keys:
        try:
            return _cipher(key).decrypt(raw[1 : 1 + _NONCE], raw[1 + _NONCE :], aad)
        except InvalidTag:
            continue
    return None


def _verified(keys: bytes | Sequence[bytes], raw: bytes) -> bytes | None:
    """A signed signature's packed reasoning, when one key's tag is the one it carries."""
    version, tag, packed = raw[:1], raw[1 : 1 + _TAG], raw[1 + _TAG :]
    for key in (keys,) if isinstance(keys, bytes) else keys:
        mac = _mac(key).copy()
        mac.update(version)
        mac.update(packed)
        if hmac.compare_digest(mac.digest(), tag):
            return packed
    return None


# (message index, block index, the block) of a thinking block to restore
Restorable = tuple[int, int, dict[str, Any]]


def restorable(req: Mapping[str, Any]) -> list[Restorable]:
    """The replayed thinking blocks that left their text out and carry a signature."""
    found: list[Restorable] = []
    for i, turn in enumerate(req["messages"]):
        if turn["role"] != "assistant" or isinstance(turn["content"], str):
            continue
        for j, block in enumerate(turn["content"]):
            if block["type"] == "thinking" and not block["thinking"] and block.get("signature"):
                found.append((i, j, block))
    return found


def restore_reasoning(
    req: Mapping[str, Any],
    keys: bytes | Sequence[bytes],
    *,
    max_bytes: int = MAX_RESTORED_BYTES,
    take: Callable[[int], bool] | None = None,
    give: Callable[[int], None] | None = None,
    blocks: Sequence[Restorable] | None = None,
) -> int:
    """Put back the reasoning of every replayed thinking block that left its text out; the
    bytes restored.

    A block with an empty ``thinking`` and a signature gets the reasoning its signature
    holds (in place: the request is the gateway's own parse of the body); a signature that
    does not open is refused as the API refuses one (400 naming the block's signature). A
    block that carries its text keeps it, whatever its signature: clients replay histories
    recorded elsewhere, and the text is what the model is shown.

    Every expansion is bounded by the request (each refusal names the block's signature):
    one signature restores at most :data:`MAX_EXPANSION` times its length (400); all of a
    request's at most ``max_bytes`` (413). Before a signature is opened, the most it may
    restore is offered to ``take`` (a lease of the process-wide memory budget), whose False
    is a 529 ``overloaded_error``; once it is open, what it did not use goes to ``give``.
    No signature is inflated past what is left of either bound.
    """
    restored = 0
    for i, j, block in restorable(req) if blocks is None else blocks:
        path = f"messages.{i}.content.{j}.signature"
        signature = block["signature"]
        left = max_bytes - restored
        bound = min(left, MAX_REASONING_BYTES, MAX_EXPANSION * len(signature))
        if take is not None and not take(bound):
            raise Overloaded(RESTORE_BUSY)
        try:
            reasoning = _open_one(keys, signature, left, path, max_bytes)
        except BaseException:
            if give is not None:
                give(bound)
            raise
        size = len(reasoning.encode("utf-8")) if not reasoning.isascii() else len(reasoning)
        if give is not None:
            give(bound - size)
        restored += size
        block["thinking"] = reasoning
    return restored


def _open_one(
    keys: bytes | Sequence[bytes], signature: str, left: int, path: str, max_bytes: int
) -> str:
    """One replayed block's reasoning, or the error that refuses it (see
    :func:`restore_reasoning`)."""
    try:
        reasoning = open_bounded(keys, signature, left)
    except TooMuchReasoning:
        one = min(MAX_REASONING_BYTES, MAX_EXPANSION * len(signature))
        if one < left:
            raise InvalidRequest(
                path,
                f"`signature` in `thinking` block holds more "
                f"reasoning than one signature may restore ({one} "
                f"bytes: at most {MAX_EXPANSION} per character of "
                "it)",
            ) from None
        raise RequestTooLarge(
            f"{path}: reasoning restored from `thinking` block "
            f"signatures exceeds {max_bytes} bytes in this request"
        ) from None
    if reasoning is None:
        raise InvalidRequest(path, "Invalid `signature` in `thinking` block")
    return reasoning


RESTORE_BUSY = (
    "Overloaded: too much reasoning is being restored from thinking signatures "
    "at once; retry shortly"
)
