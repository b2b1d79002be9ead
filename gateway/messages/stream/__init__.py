"""The stream translator: OpenAI chat-completion chunks in, Anthropic SSE events out.

In: upstream SSE payloads, one at a time. Out: pre-encoded Anthropic events; the pump
is the hot loop that feeds it and writes to the client. Cost is per chunk: see each module.
"""
