"""The `--demo` upstream: a tiny generated llama model served by an embedded llama.cpp.

`tinymodel` writes the model (needs the optional `demo` extra: gguf, numpy); `llama` runs
llama.cpp's server from the `xllamacpp` wheel in a child process. Neither third-party package is
imported until a function needs it, so `import gateway.demo` works without the extra.
"""
