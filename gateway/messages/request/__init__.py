"""Validation of an Anthropic Messages request, as strict as the real API (pure).

In: a decoded JSON body. Out: the same dict, checked, or an ``invalid_request_error``
naming the JSON path and the reason.
"""
