"""What local engines really emit, normalised before translation.

vLLM, SGLang, llama.cpp and Ollama serve open models whose output is not always the clean
chat-completion shape the translators expect: tool-call arguments that are almost JSON
(Python literals, trailing commas, cut off by ``max_tokens``), and tool calls written as text
in the model's native format when the engine runs without its tool parser. The modules here
are pure (text in, values out, no I/O) and turn that output into the exact shape, so the
translators stay strict and testable with golden files.
"""
