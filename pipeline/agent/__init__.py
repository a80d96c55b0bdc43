"""The agent loop (`rollout.generate=agent`): multi-turn generation with tool calls (docs/agent.md).

config.py (settings), loop.py (the per-sample loop), formats.py + chat.py (tool-call formats and
the chat template's tool turns), tools.py (tool registry), calculator.py and sandbox.py (the
built-in tools), stats.py (`agent/*` metrics), preflight.py (the pre-flight rules).
"""
