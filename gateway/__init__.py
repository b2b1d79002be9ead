"""LLM gateway: the Anthropic Messages API in front of OpenAI-compatible upstreams."""

__version__ = "0.1.0"
