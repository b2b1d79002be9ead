"""The OpenAI pass-through surface: chat, completions, embeddings, responses.

``apis`` is the table of routes, ``relay`` the byte work (pure: the model
rewrite, the stream relay, what each stream dialect's events say), and
``passthrough`` the one handler every route shares.
"""
