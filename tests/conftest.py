"""Shared pytest fixtures. The scripted OpenAI-compatible server lives in tests/openai_server.py."""

pytest_plugins = ["tests.openai_server"]
