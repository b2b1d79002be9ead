"""Shared text utilities: JSON, ids, SSE framing, scrubbing and redaction.

They import nothing else of the gateway's.
"""
