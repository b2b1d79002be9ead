"""The built-in default config, loaded when neither ``--config`` nor ``$GATEWAY_CONFIG``
names a file: its routes only (every key's default is its dataclass field's,
gateway/ops/config_schema.py)."""

DEFAULT_TOML = """
[upstreams.local-vllm]
base_url = "http://127.0.0.1:8000/v1"
kind = "vllm"

[upstreams.local-ollama]
base_url = "http://127.0.0.1:11434/v1"
kind = "ollama"

[[models]]
name = "reasoning"
upstream = "local-vllm"
upstream_model = "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B"

[[models]]
name = "qwen2.5:3b-instruct"
upstream = "local-ollama"
upstream_model = "qwen2.5:3b-instruct"

# Claude Code names Claude models it was never told about (its default, its subagents'
# haiku tier): every claude-* name goes to the main model.
[[models]]
name = "claude-*"
upstream = "local-vllm"
upstream_model = "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B"
"""
