"""Provider-compatible HTTP adapters: OpenAI Chat Completions and Anthropic Messages."""

from slime.agent.adapters.app import AdapterConfig, build_app, serve_adapter

__all__ = ["AdapterConfig", "build_app", "serve_adapter"]
