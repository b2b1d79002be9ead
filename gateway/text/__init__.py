"""Shared text utilities: JSON, ids, SSE framing, scrubbing and redaction, the wording of
context overflows and of upstream refusals.

They import nothing else of the gateway's.
"""
