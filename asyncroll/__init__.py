"""asyncroll: an asyncio runtime and measurement harness for agentic rollouts."""

__version__ = "0.1.0"
