"""Fallbacks across upstreams (``[[models]] fallbacks``): checked at load, and taken by the
Messages call (gateway/messages/call.py) only when every replica of the model's upstream
failed before replying."""

from __future__ import annotations

import json
import tomllib
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from gateway import errors
from gateway.messages import call as messages_call
from gateway.messages.call import falls_over
from gateway.messages.deps import MessagesDeps
from gateway.ops import config
from gateway.ops.metrics import Metrics
from gateway.text.redact import NO_SECRETS
from gateway.upstream.client import UpstreamClient
from gateway.upstream.send import Upstreams

UPSTREAMS = """
[upstreams.main]
base_urls = ["http://127.0.0.1:9/v1", "http://127.0.0.2:9/v1"]
kind = "vllm"

[upstreams.spare]
base_url = "http://127.0.0.1:10/v1"
kind = "llamacpp"
"""


def _models(*fallbacks: str, other: str = "") -> str:
    listed = ", ".join(json.dumps(f) for f in fallbacks)
    return (
        UPSTREAMS
        + f"""
[[models]]
name = "big"
upstream = "main"
upstream_model = "org/big"
fallbacks = [{listed}]

[[models]]
name = "small"
upstream = "spare"
upstream_model = "small.gguf"
{other}

[[models]]
name = "tiny"
upstream = "spare"
upstream_model = "tiny.gguf"
"""
    )


def _parse(text: str) -> config.Config:
    return config.parse(tomllib.loads(text), "f.toml", {})


def test_fallbacks_resolve_to_routes_in_order_and_default_to_none() -> None:
    cfg = _parse(_models("small", "tiny", other='fallbacks = ["big"]'))
    big = cfg.models["big"]
    assert big.fallbacks == ("small", "tiny")
    assert [r.name for r in big.fallback_routes] == ["small", "tiny"]
    assert big.fallback_routes[0].upstream.name == "spare"
    # a cycle is no loop: only a model's own list is followed
    assert [r.name for r in cfg.models["small"].fallback_routes] == ["big"]
    assert cfg.models["tiny"].fallbacks == () and cfg.models["tiny"].fallback_routes == ()
    hash(big)  # still a frozen, hashable route


@pytest.mark.parametrize(
    ("fallbacks", "error"),
    [
        (("nope",), "models[0].fallbacks[0]: unknown model 'nope'"),
        (("small", "big"), "models[0].fallbacks[1]: a model cannot fall back to itself"),
        (("small", "small"), "models[0].fallbacks: names a model twice"),
    ],
)
def test_bad_fallbacks_are_refused_naming_the_key(fallbacks: tuple[str, ...], error: str) -> None:
    with pytest.raises(config.ConfigError, match=error.replace("[", r"\[").replace("]", r"\]")):
        _parse(_models(*fallbacks))


def test_a_fallback_that_is_not_a_list_of_names_is_refused() -> None:
    with pytest.raises(config.ConfigError, match=r"models\[0\].fallbacks"):
        _parse(_models().replace("fallbacks = []", 'fallbacks = "small"'))
    with pytest.raises(config.ConfigError, match=r"models\[0\].fallbacks\[0\]"):
        _parse(_models().replace("fallbacks = []", "fallbacks = [3]"))


@pytest.mark.parametrize(
    ("err", "falls"),
    [
        (errors.UpstreamUnavailable(), True),  # refused, reset before the head
        (errors.UpstreamTimeout(), True),
        (errors.StreamProcessingError(), False),  # an unreadable reply: another would be too
        (errors.InvalidRequest("x", "bad"), False),
    ],
)
def test_falls_over_on_gone_or_overloaded_upstreams(err: errors.GatewayError, falls: bool) -> None:
    assert falls_over(err) is falls


def _status(code: int) -> errors.GatewayError:
    err = errors.from_upstream(code, b'{"error": {"message": "x"}}')
    assert err.upstream_status == code
    return err


@pytest.mark.parametrize(
    ("code", "falls"),
    [
        (502, True),
        (503, True),
        (504, True),
        (529, True),
        (500, False),
        (400, False),
        (404, False),
        (429, False),
        (413, False),
    ],
)
def test_which_upstream_statuses_fall_over(code: int, falls: bool) -> None:
    assert falls_over(_status(code)) is falls


# --- the Messages call ------------------------------------------------------------------


def _deps(cfg: config.Config) -> tuple[MessagesDeps, CollectorRegistry]:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    clients = {name: UpstreamClient(up) for name, up in cfg.upstreams.items()}
    ups = Upstreams(clients=clients, metrics=metrics, secrets=NO_SECRETS)
    return MessagesDeps(upstreams=ups, signing_key=b"k" * 32), registry


def _count(registry: CollectorRegistry, **labels: str) -> float:
    return registry.get_sample_value("llm_gateway_fallbacks_total", labels) or 0.0


REQ = {"model": "big", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}


async def _send(
    monkeypatch: pytest.MonkeyPatch, cfg: config.Config, outcomes: dict[str, Any]
) -> tuple[Any, list[tuple[str, dict[str, Any]]], Any, CollectorRegistry]:
    """Send REQ to ``big``; each upstream answers its ``outcomes`` entry (an error raised, or
    a reply returned). -> (what send returned or raised, [(upstream, body sent)], the call,
    the registry)"""
    deps, registry = _deps(cfg)
    sent: list[tuple[str, dict[str, Any]]] = []

    async def fake_send(ups: Any, route: Any, path: str, payload: bytes, **kw: Any) -> Any:
        sent.append((route.upstream.name, json.loads(payload)))
        outcome = outcomes[route.upstream.name]
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    monkeypatch.setattr(messages_call, "send", fake_send)
    the_call = messages_call.Call(deps, dict(REQ), cfg.models["big"])
    try:
        got: Any = await the_call.send("req_1")
    except errors.GatewayError as err:
        got = err
    return got, sent, the_call, registry


@pytest.mark.parametrize(
    "failure", [errors.UpstreamUnavailable(), errors.UpstreamTimeout(), _status(503), _status(529)]
)
async def test_a_failed_upstream_sends_the_request_to_the_fallback(
    failure: errors.GatewayError, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _parse(_models("small"))
    got, sent, the_call, registry = await _send(
        monkeypatch, cfg, {"main": failure, "spare": "reply"}
    )
    assert got == "reply"
    assert [up for up, _ in sent] == ["main", "spare"]
    # translated for the fallback: its upstream_model, its kind's request shape
    assert sent[0][1]["model"] == "org/big" and sent[1][1]["model"] == "small.gguf"
    assert the_call.route.name == "small" and the_call.client.name == "spare"
    assert the_call.req["model"] == "big"  # the reply's model: what the client asked for
    assert _count(registry, model="big", fallback="small") == 1


async def test_fallbacks_are_tried_in_order_and_the_last_failure_is_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    cfg = _parse(_models("small", "tiny"))
    last = _status(502)
    got, sent, _, registry = await _send(
        monkeypatch, cfg, {"main": errors.UpstreamTimeout(), "spare": last}
    )
    assert got is last
    assert [body["model"] for _, body in sent] == ["org/big", "small.gguf", "tiny.gguf"]
    assert _count(registry, model="big", fallback="small") == 1
    assert _count(registry, model="big", fallback="tiny") == 1


@pytest.mark.parametrize("failure", [_status(500), _status(400), _status(429)])
async def test_other_failures_are_the_clients_without_a_fallback(
    failure: errors.GatewayError, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _parse(_models("small"))
    got, sent, the_call, registry = await _send(
        monkeypatch, cfg, {"main": failure, "spare": "reply"}
    )
    assert got is failure and len(sent) == 1 and the_call.route.name == "big"
    assert _count(registry, model="big", fallback="small") == 0


async def test_without_fallbacks_nothing_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _parse(_models())
    failure = errors.UpstreamUnavailable()
    got, sent, the_call, _ = await _send(monkeypatch, cfg, {"main": failure, "spare": "x"})
    assert got is failure and [up for up, _ in sent] == ["main"]
    assert the_call.route.name == "big"


def test_a_models_fallback_series_exist_at_zero_and_no_others() -> None:
    registry = CollectorRegistry()
    metrics = Metrics(registry)
    metrics.add_model("big", "main", "org/big", ("small", "tiny"))
    metrics.add_model("small", "spare", "small.gguf")
    assert _count(registry, model="big", fallback="small") == 0
    assert (
        registry.get_sample_value(
            "llm_gateway_fallbacks_total", {"model": "big", "fallback": "tiny"}
        )
        == 0
    )
    assert (
        registry.get_sample_value(
            "llm_gateway_fallbacks_total", {"model": "small", "fallback": "big"}
        )
        is None
    )


async def test_the_fallback_gets_the_request_as_its_kind_takes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """vLLM is sent the stop sequences; llama.cpp is not (the gateway matches them in a
    stream, even for a buffered reply): the fallback's translation is its own."""
    cfg = _parse(_models("small"))
    deps, _ = _deps(cfg)
    sent: list[dict[str, Any]] = []

    async def fake_send(ups: Any, route: Any, path: str, payload: bytes, **kw: Any) -> Any:
        sent.append(json.loads(payload))
        if route.upstream.name == "main":
            raise errors.UpstreamUnavailable()
        return "reply"

    monkeypatch.setattr(messages_call, "send", fake_send)
    the_call = messages_call.Call(deps, {**REQ, "stop_sequences": ["END"]}, cfg.models["big"])
    assert await the_call.send("req_1") == "reply"
    assert sent[0]["stop"] == ["END"] and sent[0].get("stream") is not True
    assert "stop" not in sent[1] and sent[1]["stream"] is True
    assert the_call.match_stops and the_call.upstream_stream and not the_call.stream
