"""The reply side: a buffered chat completion -> an Anthropic message, and what both
reply paths share (stop reasons, usage, thinking shown or hidden, signatures, the
reply's figures).

In: an upstream completion or the translator's events. Out: the client's message.
"""
