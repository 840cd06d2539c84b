"""Agent environments: a generic multi-turn tool-use interface and its benchmarks."""

from rti_jax.envs.base import Environment, StepResult, Transcript
from rti_jax.envs.tool_calls import ParsedTurn, ToolCall, parse_assistant_turn

__all__ = ["Environment", "StepResult", "Transcript", "ParsedTurn", "ToolCall", "parse_assistant_turn"]
