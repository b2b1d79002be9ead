"""The Anthropic Messages surface: validation, translation both ways, streaming."""
