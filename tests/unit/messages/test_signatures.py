"""Thinking signatures carry the reasoning, sealed (hidden thinking) or signed (shown): what
opens, what does not, what is restored."""

from __future__ import annotations

import base64
import copy
import zlib
from typing import Any

import pytest

from gateway.errors import InvalidRequest, Overloaded, RequestTooLarge
from gateway.messages.from_chat import signatures
from gateway.messages.from_chat.signatures import (
    MAX_EXPANSION,
    open_signature,
    restore_reasoning,
    seal,
    sign,
)
from gateway.ops.budget import Budget

KEY = b"k" * 32
MAKERS = pytest.mark.parametrize("make", [seal, sign], ids=["sealed", "signed"])


@MAKERS
@pytest.mark.parametrize(
    "text", ["", "Think.", "ünïcødé ✓ 思考", "x" * 200_000, "line\nbreaks\r\nand \u2028 separators"]
)
def test_a_signature_opens_to_the_same_text(make: Any, text: str) -> None:
    sig = make(KEY, text)
    assert open_signature(KEY, sig) == text
    assert sig == make(KEY, text)  # deterministic: golden files and prefix caches stay exact
    assert make(KEY, text + ".") != sig


@MAKERS
def test_long_reasoning_is_compressed(make: Any) -> None:
    text = "The user wants the weather, so I call the tool. " * 400
    assert len(make(KEY, text)) < len(text) // 10


@pytest.mark.parametrize(("hidden", "versions"), [(True, b"\x02\x01"), (False, b"\x03\x04")])
def test_hidden_thinking_is_sealed_and_shown_thinking_signed(hidden: bool, versions: bytes) -> None:
    """The client sees a shown block's text: its signature carries it under a keyed hash only
    (what protocol.md decides). A hidden block's (display "omitted" or "updates") is
    encrypted: the client cannot read the reasoning out of it."""
    short, long = "the secret plan", "the secret plan, at length. " * 40
    for text, version in ((short, versions[:1]), (long, versions[1:])):
        raw = base64.b64decode(signatures.for_block(KEY, text, hidden))
        assert raw[:1] == version
        assert open_signature(KEY, base64.b64encode(raw).decode()) == text
        readable = raw + (zlib.decompressobj().decompress(raw[17:]) if version == b"\x04" else b"")
        assert (b"secret plan" in readable) is not hidden


def test_short_shown_reasoning_is_signed_as_is_and_its_version_cannot_be_swapped() -> None:
    short, long = "Think briefly.", "Think at length. " * 100
    raw_short = base64.b64decode(sign(KEY, short))
    raw_long = base64.b64decode(sign(KEY, long))
    assert raw_short[:1] == b"\x03" and raw_long[:1] == b"\x04"
    assert raw_short == b"\x03" + raw_short[1:17] + short.encode()  # tag, then the text
    for raw in (raw_short, raw_long):  # the version is under the tag with the text
        for other in (b"\x01", b"\x02", b"\x03", b"\x04"):
            if other != raw[:1]:
                swapped = base64.b64encode(other + raw[1:]).decode()
                assert open_signature(KEY, swapped) is None


def test_short_reasoning_is_sealed_as_is_and_its_version_cannot_be_swapped() -> None:
    short, long = "Think briefly.", "Think at length. " * 100
    raw_short = base64.b64decode(seal(KEY, short))
    raw_long = base64.b64decode(seal(KEY, long))
    assert raw_short[:1] == b"\x02" and raw_long[:1] == b"\x01"
    assert len(raw_short) == 1 + 12 + len(short) + 16  # no deflate stream around it
    for raw in (raw_short, raw_long):  # the version is authenticated with the text
        swapped = (b"\x03" if raw[:1] == b"\x02" else b"\x02") + raw[1:]
        flipped = (b"\x01" if raw[:1] == b"\x02" else b"\x02") + raw[1:]
        assert open_signature(KEY, base64.b64encode(swapped).decode()) is None
        assert open_signature(KEY, base64.b64encode(flipped).decode()) is None


def test_signatures_of_the_first_format_still_open() -> None:
    """Clients replay signatures for a whole session: one sealed before short reasoning
    went as is (zlib.compress's defaults, version 0x01) opens to its text."""
    import zlib

    cipher, _ = signatures._keys(KEY)
    text = "Reasoning sealed by an older gateway."
    packed = zlib.compress(text.encode(), 6)
    nonce = b"\x07" * 12  # opening never recomputes the nonce
    old = base64.b64encode(b"\x01" + nonce + cipher.encrypt(nonce, packed, signatures._AAD))
    assert open_signature(KEY, old.decode()) == text


def _tampered(sig: str, at: int) -> str:
    raw = bytearray(base64.b64decode(sig))
    raw[at] ^= 1
    return base64.b64encode(bytes(raw)).decode()


GOOD = seal(KEY, "secret reasoning")
SIGNED = sign(KEY, "secret reasoning")
NOT_OURS = [
    ("signed under another key", sign(b"another key", "secret reasoning"), KEY),
    ("signed: version byte", _tampered(SIGNED, 0), KEY),
    ("signed: tag", _tampered(SIGNED, 3), KEY),
    ("signed: text", _tampered(SIGNED, -1), KEY),
    ("signed: text cut", base64.b64encode(base64.b64decode(SIGNED)[:-1]).decode(), KEY),
    ("signed: tag cut", base64.b64encode(base64.b64decode(SIGNED)[:10]).decode(), KEY),
    ("other key", seal(b"another key", "secret reasoning"), KEY),
    ("version byte", _tampered(GOOD, 0), KEY),
    ("nonce", _tampered(GOOD, 5), KEY),
    ("ciphertext", _tampered(GOOD, 20), KEY),
    ("tag", _tampered(GOOD, -1), KEY),
    ("truncated", base64.b64encode(base64.b64decode(GOOD)[:20]).decode(), KEY),
    ("not base64", "not base64!", KEY),
    ("empty", "", KEY),
    ("an HMAC signature of the old format", base64.b64encode(b"h" * 32).decode(), KEY),
    ("Anthropic-looking", "EqQBCkgIARABGAIiQL" + "A" * 100, KEY),
]


@pytest.mark.parametrize(("sig", "key"), [c[1:] for c in NOT_OURS], ids=[c[0] for c in NOT_OURS])
def test_what_is_not_ours_does_not_open(sig: str, key: bytes) -> None:
    assert open_signature(key, sig) is None


@MAKERS
def test_inflation_is_bounded(make: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Even a validly sealed bomb (it would take the key) inflates only so far."""
    monkeypatch.setattr(signatures, "MAX_REASONING_BYTES", 1000)
    assert open_signature(KEY, make(KEY, "a" * 5000)) is None
    assert open_signature(KEY, make(KEY, "a" * 999)) == "a" * 999


def _history(*assistant_blocks: dict[str, Any]) -> dict[str, Any]:
    return {
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": list(assistant_blocks)},
            {"role": "user", "content": "go on"},
        ]
    }


def test_empty_thinking_gets_its_reasoning_back() -> None:
    req = _history(
        {"type": "thinking", "thinking": "", "signature": seal(KEY, "plan A")},
        {"type": "text", "text": "hi"},
    )
    restore_reasoning(req, KEY)
    assert req["messages"][1]["content"][0]["thinking"] == "plan A"


def test_a_signature_that_does_not_open_is_refused_naming_it() -> None:
    req = _history(
        {"type": "text", "text": "hi"},
        {"type": "thinking", "thinking": "", "signature": seal(b"old key", "p")},
    )
    with pytest.raises(InvalidRequest) as info:
        restore_reasoning(req, KEY)
    assert info.value.status == 400
    assert info.value.message == (
        "messages.1.content.1.signature: Invalid `signature` in `thinking` block"
    )


UNTOUCHED = [
    (
        "text kept whatever the signature",
        {"type": "thinking", "thinking": "mine", "signature": "Zm9yZWlnbg=="},
    ),
    ("no signature", {"type": "thinking", "thinking": ""}),
    ("empty signature", {"type": "thinking", "thinking": "", "signature": ""}),
    ("text block", {"type": "text", "text": ""}),
]


@pytest.mark.parametrize("block", [c[1] for c in UNTOUCHED], ids=[c[0] for c in UNTOUCHED])
def test_blocks_left_as_they_are(block: dict[str, Any]) -> None:
    req = _history(block)
    before = copy.deepcopy(req)
    restore_reasoning(req, KEY)
    assert req == before


def test_string_content_and_user_turns_are_skipped() -> None:
    req = {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "x"}]},
            {"role": "assistant", "content": "plain"},
        ]
    }
    restore_reasoning(req, KEY)
    assert req["messages"][1]["content"] == "plain"


def _bomb(key: bytes, text: str) -> str:
    """A signature sealed as :func:`seal` did before it padded: ``text`` deflated as far as it
    goes (a looping model's 8 MiB of reasoning into some 42 KB), under the real key."""
    cipher, mac = signatures._keys(key)
    deflate = zlib.compressobj(6, zlib.DEFLATED, 12, 4)
    packed = deflate.compress(text.encode()) + deflate.flush()
    nonce_mac = mac.copy()
    nonce_mac.update(b"\x01" + packed)
    nonce = nonce_mac.digest()[:12]
    sealed = cipher.encrypt(nonce, packed, b"llm-gateway thinking block")
    return base64.b64encode(b"\x01" + nonce + sealed).decode("ascii")


LOOP = "Wait, let me reconsider. The user wants the sum of the list. Let me check again.\n"


def test_deflate_ratios_behind_the_expansion_bound() -> None:
    """MAX_EXPANSION is chosen from what reasoning compresses to under seal()'s settings:
    prose and code restore about 2 bytes per signature character; a model looping on one
    paragraph about 200, one letter repeated about 700. 32 passes the first, not the rest."""
    prose = " ".join(
        f"step {i}: the request names model {i % 7} so route {i * 31 % 101} "
        f"applies, unless its {chr(97 + i % 26)}-flag says otherwise."
        for i in range(3000)
    )
    assert len(prose) / len(_bomb(KEY, prose)) < 8
    assert len(LOOP * 20_000) / len(_bomb(KEY, LOOP * 20_000)) > 100


@MAKERS
def test_signatures_stay_within_the_expansion_bound(make: Any) -> None:
    """A looping model's reasoning deflates past MAX_EXPANSION: its signature is padded (zeros
    after the deflate stream), so it opens wherever the bound is checked."""
    for text in ("a" * (1 << 20), LOOP * 20_000, "x" * 600):
        sig = make(KEY, text)
        assert len(text) <= signatures.MAX_EXPANSION * len(sig)
        assert open_signature(KEY, sig) == text
    prose = "Find the file, read it, then answer. " * 3  # short: no padding needed or added
    assert len(make(KEY, prose)) < 4 * len(prose)


def test_a_small_signature_cannot_restore_megabytes() -> None:
    """42 KB of signature held 8 MiB of reasoning; three of them in a 126 KB request restored
    24 MiB. One signature now restores at most MAX_EXPANSION bytes per character of itself
    (and is never inflated past that): 400 naming the block's signature."""
    bomb = _bomb(KEY, LOOP * (8 * 1024 * 1024 // len(LOOP)))
    assert len(bomb) < 64 * 1024
    assert open_signature(KEY, bomb) is None
    req = _history(
        {"type": "text", "text": "hi"},
        *({"type": "thinking", "thinking": "", "signature": bomb} for _ in range(3)),
    )
    with pytest.raises(InvalidRequest) as info:
        restore_reasoning(req, KEY)
    assert info.value.status == 400
    assert info.value.message.startswith(
        "messages.1.content.1.signature: `signature` in "
        "`thinking` block holds more reasoning than one"
    )
    assert all(b["thinking"] == "" for b in req["messages"][1]["content"][1:])


def test_restored_reasoning_is_bounded_per_request() -> None:
    """One signature may be replayed in as many blocks as the body holds: the reasoning
    restored for one request is bounded as a whole (server.max_restored_reasoning_bytes),
    413 naming the block that passed it, and no signature inflates past what is left."""
    sig = seal(KEY, "a" * (1 << 20))
    copies = signatures.MAX_RESTORED_BYTES // (1 << 20) + 1
    req = _history(*({"type": "thinking", "thinking": "", "signature": sig} for _ in range(copies)))
    with pytest.raises(RequestTooLarge) as info:
        restore_reasoning(req, KEY)
    assert info.value.status == 413
    assert info.value.message.startswith(f"messages.1.content.{copies - 1}.signature: ")
    fits = _history(
        *({"type": "thinking", "thinking": "", "signature": sig} for _ in range(copies - 1))
    )
    assert restore_reasoning(fits, KEY) == (copies - 1) << 20  # up to the bound, as before
    assert fits["messages"][1]["content"][-1]["thinking"] == "a" * (1 << 20)
    small = _history({"type": "thinking", "thinking": "", "signature": sig})
    with pytest.raises(RequestTooLarge, match="exceeds 1000 bytes"):
        restore_reasoning(small, KEY, max_bytes=1000)


def test_restored_reasoning_is_reserved_before_it_is_inflated() -> None:
    """Each block's bound (MAX_EXPANSION times its signature) is offered to the budget before
    the signature is opened, and what it did not use given back; a refusal is a 529 the
    SDKs retry, and nothing more is opened. A block that fails gives its reservation back."""
    budget = Budget(3 << 20)
    other = budget.lease()
    assert other.take(1 << 20)  # another request's body, being decoded
    sig = seal(KEY, "b" * (1 << 20))
    bound = MAX_EXPANSION * len(sig)
    assert (1 << 20) < bound < (3 << 19)  # the reservation is more than what it restores
    offered: list[int] = []

    def take(size: int) -> bool:
        offered.append(size)
        return lease.take(size)

    req = _history(*({"type": "thinking", "thinking": "", "signature": sig} for _ in range(3)))
    with budget.lease() as lease:
        with pytest.raises(Overloaded) as info:
            restore_reasoning(req, KEY, take=take, give=lease.give)
        assert offered == [bound, bound]  # the second did not fit beside the first's 1 MiB
        assert lease.held == 1 << 20 and budget.held == 2 << 20
        assert req["messages"][1]["content"][1]["thinking"] == ""  # never opened
    assert info.value.status == 529 and "retry-after" in info.value.headers
    assert budget.held == 1 << 20  # the lease gave back what it took
    bad = _history({"type": "thinking", "thinking": "", "signature": sig[:-8] + "AAAAAAA="})
    with budget.lease() as lease:
        with pytest.raises(InvalidRequest):
            restore_reasoning(bad, KEY, take=lease.take, give=lease.give)
        assert lease.held == 0
    other.release()
    assert budget.held == 0


def test_a_lease_alone_takes_any_size_and_a_released_one_nothing() -> None:
    budget = Budget(100)
    with budget.lease() as alone:
        assert alone.take(1000)  # alone: a body larger than the budget gets through
        second = budget.lease()
        assert not second.take(1) and budget.held == 1000
    assert budget.held == 0 and second.take(100) and second.take(1)  # alone again
    second.release()
    assert not second.take(1) and budget.held == 0  # a thread that outlived its request


async def test_prepare_counts_the_restored_reasoning_in_the_callers_lease(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Messages call's prepare: restored bytes count twice (the text and its copy in
    the upstream payload) in the memory budget, in the caller's lease until the caller
    releases it (the reply has ended), or in prepare's own until the call is built; a
    529 when they do not fit; large signature sets are opened in a thread, same bounds."""
    from gateway.messages import call, ready
    from gateway.messages.deps import MessagesDeps

    seen: list[int] = []
    budget = Budget(10 << 20)
    deps = MessagesDeps(
        upstreams=None,
        signing_key=KEY,
        memory=budget,  # type: ignore[arg-type]
        max_restored_bytes=3 << 20,
    )

    class _Call:
        def __init__(self, deps: Any, req: Any, route: Any, weight: Any = None) -> None:
            seen.append(budget.held)

    monkeypatch.setattr(call, "Call", _Call)
    monkeypatch.setattr(ready, "_OFF_LOOP_SIGNATURES", 0)  # through the thread
    sig = seal(KEY, "c" * (1 << 20))

    def req() -> dict[str, Any]:
        return _history(*({"type": "thinking", "thinking": "", "signature": sig} for _ in range(2)))

    await call.prepare(deps, req(), None)  # type: ignore[arg-type]
    assert seen == [ready.RESTORED_COPIES * (2 << 20)] and budget.held == 0
    with budget.lease() as lease:
        await call.prepare(deps, req(), None, lease)  # type: ignore[arg-type]
        assert budget.held == lease.held == ready.RESTORED_COPIES * (2 << 20)
    assert budget.held == 0
    with budget.lease() as other:
        assert other.take(7 << 20)
        with pytest.raises(Overloaded):
            await call.prepare(deps, req(), None)  # type: ignore[arg-type]
        assert budget.held == 7 << 20
    assert budget.held == 0


# --- key rotation: a new key signs, the keys it replaced still open ------------------------

OLD, NEW = b"o" * 32, b"n" * 32


@MAKERS
@pytest.mark.parametrize(
    ("made_under", "keys", "opens"),
    [
        (OLD, (NEW, OLD), True),  # a session signed before the rotation goes on after it
        (NEW, (NEW, OLD), True),
        (OLD, (NEW,), False),  # the old key retired: its signatures no longer open
        (b"x" * 32, (NEW, OLD), False),
    ],
)
def test_signatures_open_under_any_key_in_force(
    make: Any, made_under: bytes, keys: tuple[bytes, ...], opens: bool
) -> None:
    sig = make(made_under, "step one")
    assert open_signature(keys, sig) == ("step one" if opens else None)
    req = {
        "messages": [
            {
                "role": "assistant",
                "content": [{"type": "thinking", "thinking": "", "signature": sig}],
            }
        ]
    }
    if opens:
        restore_reasoning(req, keys)
        assert req["messages"][0]["content"][0]["thinking"] == "step one"
    else:
        with pytest.raises(InvalidRequest):
            restore_reasoning(req, keys)


def test_previous_signing_keys_come_from_their_env_var() -> None:
    from gateway.ops import config

    cfg = config.parse(
        {
            "server": {"signing_key_env": "SK", "previous_signing_keys_env": "OLD_SK"},
            "upstreams": {"u": {"base_url": "http://127.0.0.1:9/v1"}},
            "models": [{"name": "m", "upstream": "u", "upstream_model": "x"}],
        },
        "t.toml",
        {"SK": "new-key", "OLD_SK": " old-1, ,old-2,new-key,old-1"},
    )
    assert cfg.server.signing_key == b"new-key"
    # the current key and repeats left out, order kept
    assert cfg.server.previous_signing_keys == (b"old-1", b"old-2")
    with pytest.raises(config.ConfigError, match="previous_signing_keys_env"):
        config.parse(
            {
                "server": {"previous_signing_keys_env": "MISSING"},
                "upstreams": {"u": {"base_url": "http://127.0.0.1:9/v1"}},
                "models": [],
            },
            "t.toml",
            {"HOME": "/nonexistent"},
        )
