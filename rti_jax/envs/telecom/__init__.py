"""tau2-Telecom, offline: agent and device tools, a scripted user and a programmatic reward."""

from rti_jax.envs.telecom.env import AGENT_STOP, MAX_TURNS, TRANSFER_MESSAGE, TelecomEnv, policy_text, system_prompt
from rti_jax.envs.telecom.evaluation import RewardInfo, ToolCallRecord, evaluate
from rti_jax.envs.telecom.tasks import ISSUE_TYPES, TelecomTask, get_task, load_split, load_tasks, rl_train_split
from rti_jax.envs.telecom.scripted_agents import (DescribedGoldAgent, DoNothingAgent, GoldAgent, ScriptAgent,
                                                  pass_rate, run_episode)
from rti_jax.envs.telecom.user_sim import ScriptedUser

__all__ = ["AGENT_STOP", "MAX_TURNS", "TRANSFER_MESSAGE", "TelecomEnv", "policy_text", "system_prompt", "RewardInfo",
           "ToolCallRecord", "evaluate", "ISSUE_TYPES", "TelecomTask", "get_task", "load_split", "load_tasks",
           "rl_train_split", "DescribedGoldAgent", "DoNothingAgent", "GoldAgent", "ScriptAgent", "pass_rate",
           "run_episode", "ScriptedUser"]
