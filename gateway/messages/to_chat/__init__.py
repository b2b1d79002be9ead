"""Anthropic Messages request -> OpenAI chat request (pure).

In: a validated request and the route's capabilities. Out: the chat request the upstream
is sent: system prompt and turns, tools and tool choice, per-turn controls.
"""
