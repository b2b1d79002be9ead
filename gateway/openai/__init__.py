"""The OpenAI pass-through surface: chat, completions, embeddings, responses.

``apis`` is the table of routes, ``relay`` the byte work (pure: the model rewrite, the
stream relay, what each stream dialect's events say), ``inband`` in-band errors,
``responses_index`` the indices llama.cpp's Responses stream leaves out. The one handler
every route shares is :mod:`gateway.http.passthrough`.
"""
