"""The OpenAI routes passed through, one row each: the table the handler is built from.

Every route takes a JSON object with a string ``model`` (an alias, as on chat) and
passes the rest through. The streaming routes' dialects differ in what marks the
output, the usage and the end; embeddings never stream.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.openai.relay import CHAT_CHUNKS, COMPLETION_CHUNKS, RESPONSE_EVENTS, Dialect


@dataclass(frozen=True, slots=True)
class OpenAIApi:
    name: str  # the route's name and its ``api`` metrics label
    path: str  # after ``{prefix}/v1`` on the gateway and after the upstream's base_url
    streams: bool  # does ``stream: true`` ask for a stream?
    dialect: Dialect  # what the replies' bytes say (usage; and, streamed, tokens and the end)


CHAT = OpenAIApi("chat", "/chat/completions", True, CHAT_CHUNKS)
COMPLETIONS = OpenAIApi("completions", "/completions", True, COMPLETION_CHUNKS)
# usage as completions report it: prompt_tokens (and no completion_tokens)
EMBEDDINGS = OpenAIApi("embeddings", "/embeddings", False, COMPLETION_CHUNKS)
RESPONSES = OpenAIApi("responses", "/responses", True, RESPONSE_EVENTS)

APIS = (CHAT, COMPLETIONS, EMBEDDINGS, RESPONSES)
