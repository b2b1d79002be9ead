"""A buffered reply's translation finds decoded JSON objects (dicts) and absent fields without
``collections.abc.Mapping``'s instance check (a Python-level ABC call each, a dozen a request),
and still takes any other Mapping."""

from __future__ import annotations

import abc
from collections.abc import Callable
from types import MappingProxyType
from typing import Any

import pytest

from gateway.messages.from_chat import tables
from gateway.messages.from_chat.message import from_chat

COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Hello."}}
    ],
    "usage": {"prompt_tokens": 12, "completion_tokens": 3},
}
REQUEST = {"model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": "Hi"}]}


def _reply(completion: Any) -> dict[str, Any]:
    return from_chat(completion, model="m", signing_key=b"k", message_id="msg_1")


# (sealing reasoning into a signature is the cryptography package's, and checks its own ABCs)
CASES: list[tuple[str, Callable[[], Any]]] = [
    ("from_chat", lambda: _reply(COMPLETION)),
    ("hides_thinking", lambda: tables.hides_thinking(REQUEST)),
    ("shows_thinking", lambda: tables.shows_thinking(REQUEST)),
    ("usage_from_chat", lambda: tables.usage_from_chat(COMPLETION["usage"], None)),
]


@pytest.mark.parametrize(("name", "call"), CASES)
def test_no_abc_instance_check(
    name: str, call: Callable[[], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    checks: list[str] = []
    real = abc.ABCMeta.__instancecheck__

    def counted(cls: abc.ABCMeta, instance: Any) -> bool:
        checks.append(cls.__name__)
        return real(cls, instance)

    monkeypatch.setattr(abc.ABCMeta, "__instancecheck__", counted)
    call()
    monkeypatch.undo()
    assert checks == [], name


def test_any_mapping_is_still_read() -> None:
    proxied = MappingProxyType(
        {
            **COMPLETION,
            "choices": [
                MappingProxyType(
                    {"finish_reason": "stop", "message": MappingProxyType({"content": "Hello."})}
                )
            ],
        }
    )
    assert _reply(proxied)["content"] == [{"type": "text", "text": "Hello."}]
    assert tables.hides_thinking({"thinking": MappingProxyType({"display": "omitted"})})
    assert tables.shows_thinking({"chat_template_kwargs": MappingProxyType({"thinking": True})})
