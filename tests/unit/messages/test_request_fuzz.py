"""Arbitrary JSON-ish bodies through validate_messages (+ PDFs to text) + to_chat.

The only exception that may escape is InvalidRequest (rendered as a 400). Anything else
(KeyError, TypeError, AttributeError, ...) would be a 500 for a client mistake, or a
translation that trusted something validation did not check. Two generators: pure
JSON noise, and near-valid bodies whose fields are each either plausible or junk, so
that the deep paths (blocks inside tool results, documents, tool choice) are reached.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.errors import InvalidRequest
from gateway.messages.documents import pdf_text as documents
from gateway.messages.request.validate import validate_messages
from gateway.messages.to_chat.translate import to_chat
from gateway.ops.config import ModelRoute, UpstreamConfig
from gateway.text import jsonutil
from tests.fuzzing import EXAMPLES
from tests.pdfs import b64, make_pdf

ROUTE = ModelRoute(
    name="m",
    upstream=UpstreamConfig(name="u", base_url="http://127.0.0.1:9/v1", kind="vllm"),
    upstream_model="org/model",
)
SETTINGS = settings(
    max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-3, max_value=5000)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6)
)
junk = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)


def maybe(plausible: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly plausible, one time in sixteen junk: many bodies get deep before failing."""
    # (sampled_from draws evenly; st.integers would favour its bounds)
    return st.sampled_from(range(16)).flatmap(lambda i: junk if i == 15 else plausible)


def shape(kind: str, required: dict[str, Any], **optional: Any) -> st.SearchStrategy[Any]:
    return st.fixed_dictionaries(
        {"type": st.just(kind), **{k: maybe(v) for k, v in required.items()}},
        optional={k: maybe(v) for k, v in optional.items()},
    )


text = st.text(max_size=8)
ids = st.sampled_from(["toolu_1", "toolu_2"])
small_dicts = st.dictionaries(text, scalars, max_size=2)
text_block = shape("text", {"text": text}, cache_control=junk)
image_source = st.one_of(
    shape("base64", {"media_type": st.sampled_from(["image/png", "image/webp"]), "data": text}),
    shape("url", {"url": text}),
    shape("file", {"file_id": text}),
)
image_block = shape("image", {"source": image_source})
# a readable PDF, one without text, a truncated one, and noise
pdf_data = (
    st.sampled_from(
        [b64(make_pdf([["Hello"]])), b64(make_pdf([None])), b64(make_pdf([["x"]])[:60])]
    )
    | text
)
document_block = shape(
    "document",
    {
        "source": st.one_of(
            shape("text", {"data": text}, media_type=text),
            shape("content", {"content": text | st.lists(text_block | image_block, max_size=2)}),
            shape("base64", {"data": text}),
            shape("base64", {"media_type": st.just("application/pdf"), "data": pdf_data}),
        )
    },
    title=text,
    context=text,
)
search_block = shape(
    "search_result", {"source": text, "title": text, "content": st.lists(text_block, max_size=2)}
)
reference_block = shape("tool_reference", {}, tool_name=text, name=text)
result_item = st.one_of(text_block, image_block, document_block, search_block, reference_block)
tool_result_block = shape(
    "tool_result",
    {"tool_use_id": ids},
    content=text | st.lists(result_item, max_size=3),
    is_error=st.booleans(),
) | shape("tool_result", {"id": ids}, content=text)
tool_use_block = shape("tool_use", {"id": ids, "name": text, "input": small_dicts})
thinking_block = shape("thinking", {"thinking": text}, signature=text)
odd_block = st.fixed_dictionaries(
    {"type": st.sampled_from(["redacted_thinking", "server_tool_use", "audio"])}
)
user_blocks = st.one_of(text_block, image_block, document_block, search_block, tool_result_block)
assistant_blocks = st.one_of(text_block, tool_use_block, thinking_block)
any_block = st.one_of(user_blocks, assistant_blocks, odd_block)


def turn(role: str, blocks: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    # now and then a block of another role, or of a type no role takes
    item = st.sampled_from(range(8)).flatmap(lambda i: any_block if i == 7 else maybe(blocks))
    content = text | st.lists(item, min_size=1, max_size=3)
    return st.fixed_dictionaries({"role": st.just(role), "content": maybe(content)})


turns = st.one_of(
    turn("user", user_blocks), turn("assistant", assistant_blocks), turn("system", text_block)
)
tools = st.one_of(
    shape(
        "custom",
        {
            "name": st.sampled_from(["get_weather", "Bash", "bad name"]),
            "input_schema": st.dictionaries(st.sampled_from(["type", "properties"]), scalars),
        },
        description=text,
        defer_loading=st.booleans(),
    ),
    shape("web_search_20250305", {"name": st.just("web_search")}),
    shape("bash_20250124", {"name": st.sampled_from(["bash", "Bash"])}),
    shape(
        "computer_20251124",
        {"name": st.just("computer"), "display_width_px": scalars, "display_height_px": scalars},
        display_number=scalars,
        enable_zoom=scalars,
    ),
    shape(
        "text_editor_20250728",
        {"name": st.sampled_from(["str_replace_based_edit_tool", "x"])},
        max_characters=scalars,
    ),
    shape("function", {}),
)
bodies = st.fixed_dictionaries(
    {
        "model": maybe(st.just("m")),
        "messages": maybe(st.lists(maybe(turns), min_size=1, max_size=4)),
        "max_tokens": maybe(st.integers(min_value=1, max_value=70000)),
    },
    optional={
        "system": maybe(text | st.lists(text_block | image_block, max_size=2)),
        "tools": maybe(st.lists(tools, max_size=3)),
        "tool_choice": st.one_of(
            shape("tool", {"name": st.sampled_from(["get_weather", "web_search", "bash", "x"])}),
            shape(
                "auto",
                {},
                disable_parallel_tool_use=st.booleans(),
            ),
            shape("any", {}),
            shape("none", {}),
        ),
        "thinking": st.one_of(
            shape("enabled", {"budget_tokens": st.integers(min_value=1000, max_value=9000)}),
            shape("disabled", {}),
            shape("adaptive", {}, display=st.sampled_from(["summarized", "omitted"])),
        ),
        "output_config": maybe(
            st.fixed_dictionaries(
                {},
                optional={
                    "effort": maybe(st.sampled_from(["low", "xhigh", "max", "huge"])),
                    "format": shape("json_schema", {"schema": small_dicts}),
                },
            )
        ),
        "stop_sequences": maybe(text | st.lists(text, max_size=2)),
        "stream": maybe(st.booleans()),
        "temperature": maybe(st.floats(min_value=0, max_value=1)),
        "top_k": maybe(st.integers(min_value=0, max_value=100)),
        "metadata": maybe(st.fixed_dictionaries({}, optional={"user_id": maybe(text)})),
        "chat_template_kwargs": maybe(small_dicts),
        "continue_final_message": maybe(st.booleans()),
        "seed": junk,
    },
)


GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "requests"
GOLDEN_BODIES = [json.loads(p.read_text("utf-8")) for p in sorted(GOLDEN.glob("*/anthropic.json"))]


def _node_paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    paths = [prefix] if prefix else []
    if isinstance(obj, dict):
        for key, value in obj.items():
            paths.extend(_node_paths(value, (*prefix, key)))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            paths.extend(_node_paths(value, (*prefix, i)))
    return paths


def _run(body: Any, count_tokens: bool) -> None:
    dropped: list[str] = []
    try:
        req = validate_messages(body, count_tokens=count_tokens)
        where = documents.find_pdfs(req["messages"])  # as the handler does
        if where:
            req = documents.pdfs_to_text(req, where)
    except InvalidRequest as exc:
        assert exc.status == 400
        return
    out = to_chat(req, ROUTE, count_tokens=count_tokens, on_drop=dropped.append)
    jsonutil.dumpb(out)  # what goes upstream must encode
    assert out["model"] == "org/model"
    assert all(isinstance(name, str) for name in dropped)


@SETTINGS
@given(junk)
def test_noise_only_raises_invalid_request(body: Any) -> None:
    _run(body, count_tokens=False)


@SETTINGS
@given(bodies, st.booleans())
def test_near_valid_bodies_only_raise_invalid_request(body: Any, count_tokens: bool) -> None:
    _run(body, count_tokens)


@SETTINGS
@given(st.data())
def test_one_broken_field_in_a_golden_body_only_raises_invalid_request(data: Any) -> None:
    """A valid body with exactly one node replaced by junk (or removed) gets as deep into
    validation and translation as a body can before the broken field is met."""
    body = copy.deepcopy(data.draw(st.sampled_from(GOLDEN_BODIES)))
    path = data.draw(st.sampled_from(_node_paths(body)))
    parent = body
    for key in path[:-1]:
        parent = parent[key]
    if data.draw(st.booleans()):
        parent[path[-1]] = data.draw(junk)
    elif isinstance(parent, dict):
        del parent[path[-1]]
    else:
        parent.pop(path[-1])
    _run(body, data.draw(st.booleans()))


SINGLE_FAULTS: tuple[Any, ...] = (None, 7, -1, 1.5, True, "x", "", [], [1], {}, {"type": "text"})
_DELETE = object()


def test_every_single_fault_in_every_golden_body() -> None:
    """Deterministic companion to the sampled test above: every node of every golden body,
    replaced by each of a few junk values or removed, one fault at a time."""
    runs = 0
    for pristine in GOLDEN_BODIES:
        for path in _node_paths(pristine):
            for fault in (*SINGLE_FAULTS, _DELETE):
                body = copy.deepcopy(pristine)
                parent = body
                for key in path[:-1]:
                    parent = parent[key]
                if fault is not _DELETE:
                    parent[path[-1]] = copy.deepcopy(fault)
                elif isinstance(parent, dict):
                    del parent[path[-1]]
                else:
                    parent.pop(path[-1])
                for count_tokens in (False, True):
                    try:
                        _run(body, count_tokens)
                    except Exception as exc:  # name the fault that broke it
                        raise AssertionError(f"{path} = {fault!r} ({count_tokens=})") from exc
                runs += 1
    assert runs > 1000


# --- hostile bytes through the decoder (issue 16): surrogates, depth, number sizes ---------
# What a client sends is bytes: each property encodes a body, splices raw JSON text into
# it, and runs what the handler runs (the value bound, the strict decode, then _run). Only
# InvalidRequest or RequestTooLarge may come out, and whatever passes encodes for upstream.

_SLOT = "@@hostile@@"


def _nest(levels: int, inner: bytes = b"0") -> bytes:
    return b"[" * levels + inner + b"]" * levels


HOSTILE: tuple[bytes, ...] = (
    b'"\\ud800"',
    b'"x\\udfffy"',
    b'"\\ude00\\ud83d"',
    b'"\\ud800\\u0041"',
    b'"\xed\xa0\x80"',
    b'"\xed\xbf\xbf tail"',
    b'"\\ud83d\\ude00"',
    b'"\\\\ud800"',
    b'{"\\ud800":1}',
    b"NaN",
    b"-NaN",
    b"Infinity",
    b"-Infinity",
    b"1e400",
    b"-1e400",
    b"5e100",
    b"2e-400",
    b"1" + b"0" * 400 + b".5",
    b"9" * 20,
    b"9" * 400,
    b"-" + b"9" * 639,
    b"9" * 641,
    b"9" * 5000,
    b"0.0" + b"1" * 900,
    _nest(100),
    _nest(127),
    _nest(128),
    _nest(129),
    _nest(980, b"NaN"),
    _nest(980, b"5e100"),
    _nest(1024),
    _nest(1025),
    _nest(5000),
    b'{"a":' * 300 + b"1" + b"}" * 300,
    b'"' + b"\\u0041" * 50 + b'"',
)


def _decode_then_run(raw: bytes, count_tokens: bool) -> None:
    """gateway/http/body.py's decoding, then validation and translation (_run)."""
    if jsonutil.too_many_values(raw):
        return  # a 413
    try:
        body = jsonutil.loads(raw)
    except jsonutil.JSONInputError as exc:
        InvalidRequest(exc.path, exc.why)  # what body.py raises; its message must build
        return
    except ValueError:
        return  # not JSON: "request body is not valid JSON"
    _run(body, count_tokens)


def _splice(body: Any, fragment: bytes, ensure_ascii: bool) -> bytes:
    text = json.dumps(body, ensure_ascii=ensure_ascii)
    return text.encode("utf-8", "surrogatepass").replace(json.dumps(_SLOT).encode(), fragment)


@SETTINGS
@given(st.data())
def test_one_hostile_value_in_a_golden_body_only_raises_invalid_request(data: Any) -> None:
    body = copy.deepcopy(data.draw(st.sampled_from(GOLDEN_BODIES)))
    path = data.draw(st.sampled_from(_node_paths(body)))
    parent = body
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = _SLOT
    raw = _splice(body, data.draw(st.sampled_from(HOSTILE)), data.draw(st.booleans()))
    _decode_then_run(raw, data.draw(st.booleans()))


# Python values a client can only send as JSON text: lone surrogates (json.dumps writes
# them as \ud800 escapes, or, without ensure_ascii, as the bytes ED A0 80), NaN and the
# infinities, integers of any size a JSON text holds.
hostile_text = st.text(alphabet=st.sampled_from("a\ud800\udbff\udc00\udfff\U0001f600"), max_size=4)
hostile_scalars = (
    st.sampled_from(
        [
            "\ud800",
            "a\udfff",
            "\udc00\ud800",
            "\U0001f600",
            float("nan"),
            float("inf"),
            -float("inf"),
            5e100,
            2**64,
            10**400,
            -(10**639),
            10**640,
        ]
    )
    | hostile_text
    | st.floats()
    | st.integers(min_value=-(10**700), max_value=10**700)
)
hostile_junk = st.recursive(
    hostile_scalars | scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(hostile_text, inner, max_size=3),
    max_leaves=8,
)


@SETTINGS
@given(bodies, st.data())
def test_near_valid_bodies_with_hostile_scalars_only_raise_invalid_request(
    body: Any, data: Any
) -> None:
    """A near-valid body with a hostile value at the top level, in a message, or in place of
    a whole turn's content, sent as bytes."""
    where = data.draw(st.sampled_from(["top", "turn", "content", "system", "stop"]))
    value = data.draw(hostile_junk)
    if where == "top":
        body[data.draw(st.sampled_from(["model", "max_tokens", "temperature", "top_k", "x"]))] = (
            value
        )
    elif (
        where in ("turn", "content") and isinstance(body.get("messages"), list) and body["messages"]
    ):
        turn = body["messages"][0]
        if where == "content" and isinstance(turn, dict):
            turn["content"] = value
        else:
            body["messages"][0] = value
    elif where == "system":
        body["system"] = value
    else:
        body["stop_sequences"] = [value]
    raw = json.dumps(body, ensure_ascii=data.draw(st.booleans())).encode("utf-8", "surrogatepass")
    _decode_then_run(raw, data.draw(st.booleans()))


def test_every_depth_decodes_or_is_refused() -> None:
    """No depth raises anything but ValueError, with NaN or 5e100 beside it or not (the
    stdlib re-parse this replaced raised RecursionError at 980 levels)."""
    for depth in (*range(1, 140), 500, 979, 980, 1023, 1024, 1025, 3000, 100_000):
        for extra in (b"", b',"NaN"', b",5e100", b",NaN", b',"\\ud800"'):
            raw = b'{"x":' + _nest(depth) + b',"y":[0' + extra + b"]}"
            try:
                value = jsonutil.loads(raw)
            except jsonutil.JSONInputError as exc:
                assert exc.why.startswith(("nesting", "NaN", "string is not valid"))
                continue
            assert depth < jsonutil.MAX_NESTING
            jsonutil.dumpb(value)


def _count_values(value: Any) -> int:
    stack, n = [value], 0
    while stack:
        node = stack.pop()
        n += 1
        if isinstance(node, dict):
            n += len(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return n


separator_text = st.text(alphabet=st.sampled_from(',:[{}]"\\ ab\n'), max_size=12)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | separator_text,
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(separator_text, inner, max_size=4),
    max_leaves=60,
)


@SETTINGS
@given(json_values, st.integers(min_value=1, max_value=80))
def test_the_value_bound_is_an_upper_bound(value: Any, limit: int) -> None:
    """Whatever the strings hold (separators, quotes, backslashes), a body the bound lets
    through decodes to at most ``limit`` values."""
    raw = json.dumps(value).encode()
    if not jsonutil.too_many_values(raw, limit):
        assert _count_values(jsonutil.loads(raw)) <= limit


@SETTINGS
@given(json_values)
def test_strings_measured_in_place_or_split_out_agree(value: Any) -> None:
    raw = json.dumps(value).encode().replace(b"\\\\", b"").replace(b'\\"', b"")
    quotes = raw.count(b'"')
    in_place = jsonutil._separators_in_strings(raw, quotes)
    assert in_place == jsonutil._separators_in_strings(raw, jsonutil._FEW_QUOTES + 1)
