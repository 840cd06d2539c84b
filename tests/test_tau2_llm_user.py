"""The LLM user of the tau2 domains against a stand-in OpenAI-compatible server (``chat_server``):
the prompt is tau2's own user simulator's (checked against tau2's ``UserSimulator`` itself), a gold
agent reaches tau2's reward 1 with it, and a server that hangs, dies, fails or answers garbage
gives an error naming it within a bounded time."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("tau2", reason='tau2-bench is not installed (the tau2 extra: pip install -e ".[tau2]")')

from chat_server import ChatServer  # noqa: E402
from rti_jax.config import ConfigError, load_config  # noqa: E402
from rti_jax.envs.tau2 import bridge  # noqa: E402
from rti_jax.envs.tau2.agents import GoldAgent, run_episode  # noqa: E402
from rti_jax.envs.tau2.env import Tau2Env  # noqa: E402
from rti_jax.envs.tau2.tasks import find_task  # noqa: E402
from rti_jax.envs.tau2.user import LLMUser  # noqa: E402
from rti_jax.generation.openai_chat import (BackendUnavailableError, ChatProtocolError,  # noqa: E402
                                            OpenAIChatClient, strip_thinking)

pytestmark = pytest.mark.xdist_group("tau2")

AGENT_TURNS = ["Could you tell me your user id?", "Your reservation is cancelled. Anything else?"]
USER_TURNS = ["Hi, I need to cancel my reservation.", "It is mia_li_3668.", "No, thanks. ###STOP###"]


@pytest.fixture
def server():
  replies = iter(USER_TURNS * 10)
  srv = ChatServer(lambda messages: next(replies))
  yield srv
  srv.stop()


def _as_dicts(messages) -> list[dict[str, str]]:
  return [{"role": m.role, "content": m.content} for m in messages]


def test_the_prompt_and_roles_are_taus_user_simulators(server, monkeypatch):
  """The same conversation through tau2's own ``UserSimulator`` (its LLM call captured) and through
  ``LLMUser`` over HTTP sends the same messages, turn by turn."""
  msg = bridge.tau2_modules()["message"]  # first: keeps litellm from looking for its price table online
  import tau2.user.user_simulator as sim

  task = find_task("airline", "0")
  sent, replies = [], iter(USER_TURNS)

  def fake_generate(model, messages, tools=None, **kwargs):
    sent.append(_as_dicts(messages))
    return msg.AssistantMessage(role="assistant", content=next(replies))

  monkeypatch.setattr(sim, "generate", fake_generate)
  ref = sim.UserSimulator(instructions=task.scenario, llm="openai/x")
  state = ref.get_init_state(message_history=[])
  for text in [LLMUser.GREETING, *AGENT_TURNS]:
    _, state = ref.generate_next_message(msg.AssistantMessage(role="assistant", content=text), state)

  user = LLMUser(task.scenario, OpenAIChatClient(server.url, "user-model"))
  assert user.opening() == USER_TURNS[0]
  assert user.respond(AGENT_TURNS[0]).stop is None
  last = user.respond(AGENT_TURNS[1])
  assert last.stop == "stop" and last.content == USER_TURNS[2]
  assert [r["messages"] for r in server.requests] == sent
  assert all(r["model"] == "user-model" and r["temperature"] == 0.0 for r in server.requests)
  assert sent[0][0]["role"] == "system" and "EHGLP3" in sent[0][0]["content"]  # the scenario's reservation


def test_an_episode_with_the_llm_user_is_scored_by_tau2(server):
  env = Tau2Env("airline", user="llm", user_url=server.url, user_model="qwen", reward="tau2")
  first = env.reset(find_task("airline", "0"))
  assert first[1] == {"role": "user", "content": USER_TURNS[0]}
  assert not env.step(AGENT_TURNS[0]).done
  result = env.step("I am sorry, this reservation cannot be cancelled.")
  assert result.done and env.transcript.info["termination"] == "user_stop"
  assert env.result.reward == 1.0  # task 0 is a refusal: tau2 wants the reservation left as it is


@pytest.mark.parametrize("domain,task_id", [("retail", "0"), ("airline", "8")])
def test_a_gold_agent_reaches_reward_one_with_an_agreeable_llm_user(domain, task_id):
  """A user model that agrees to every proposal, then ends the call: the gold calls go through tau2's
  tools and tau2's evaluator gives 1.0, as with the scripted user."""
  def agree(messages):
    return "Yes, please. ###STOP###" if "anything else" in messages[-1]["content"] else "Yes, go ahead."

  srv = ChatServer(agree)
  try:
    task = find_task(domain, task_id)
    env = Tau2Env(domain, user="llm", user_url=srv.url, reward="tau2")
    run_episode(env, GoldAgent(task), task)
    assert env.result.reward == 1.0, env.result
    assert len(srv.requests) >= 3
  finally:
    srv.stop()


def test_thinking_is_removed_and_an_empty_reply_is_counted():
  assert strip_thinking("<think>plan: be terse</think>\nHello.") == "Hello."
  assert strip_thinking("the template opened it</think> Hello.") == "Hello."
  assert strip_thinking("<think>never closes ...") == ""
  srv = ChatServer(lambda m: "<think>hmm, what do I want")
  try:
    user = LLMUser(find_task("retail", "0").scenario, OpenAIChatClient(srv.url))
    assert user.opening() == ""
    env = Tau2Env("retail", user="llm", user_url=srv.url)
    env.reset(find_task("retail", "0"))
    assert env.transcript.info["empty_user_replies"] == 1
    assert env.step("How can I help?").info["empty_user_replies"] == 2
  finally:
    srv.stop()


def test_a_hanging_server_is_cut_off_at_its_deadline_and_named(server):
  server.hang_s = 3.0
  env = Tau2Env("retail", user="llm", user_url=server.url, user_timeout_s=0.5, user_max_retries=2)
  t0 = time.monotonic()
  with pytest.raises(BackendUnavailableError, match=r"user simulator at http://127\.0\.0\.1:\d+/v1/chat/completions "
                                                    r"did not answer within 0\.5 s"):
    env.reset(find_task("retail", "0"))
  assert time.monotonic() - t0 < 2.5
  assert len(server.requests) == 1  # a POST that timed out is not sent again


def test_failures_are_retried_a_bounded_number_of_times(server):
  client = OpenAIChatClient(server.url, label="user simulator", max_retries=2, backoff_s=0.01)
  server.fail_next = 2
  assert client.complete([{"role": "user", "content": "hi"}]) == USER_TURNS[0]
  server.fail_next = 3
  with pytest.raises(BackendUnavailableError, match=r"user simulator at .* failed after 2 retries; last: HTTP 503"):
    client.complete([{"role": "user", "content": "hi"}])
  server.stop()
  with pytest.raises(BackendUnavailableError, match="unreachable"):
    client.complete([{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("garbage,field", [
    (b"<html>502 Bad Gateway</html>", "body is not JSON"),
    ([1, 2, 3], "answer: expected a JSON object"),
    ({"choices": []}, "choices: expected a non-empty list"),
    ({"choices": [{"message": "hello"}]}, r"choices\[0\]\.message: expected an object"),
    ({"choices": [{"message": {"content": 5}}]}, r"choices\[0\]\.message\.content: expected a string, got int"),
    ({"choices": [{"message": {"content": None, "tool_calls": [{"id": "1"}]}}]}, "tool_calls: expected none"),
    ({"error": {"message": "model not found"}}, "answered with an error: .*model not found"),
    ({"choices": [{"message": {"content": "[" * 100_000}}]}, None),  # a huge literal is just text
])
def test_garbage_answers_name_the_url_and_field(server, garbage, field):
  server.garbage = garbage
  user_env = Tau2Env("retail", user="llm", user_url=server.url)
  if field is None:
    assert user_env.reset(find_task("retail", "0"))[1]["content"] == "[" * 100_000
    return
  with pytest.raises(ChatProtocolError, match=rf"http://127\.0\.0\.1:\d+/v1/chat/completions: .*{field}"):
    user_env.reset(find_task("retail", "0"))


@pytest.mark.parametrize("key,value", [("user_timeout_s", "0"), ("user_timeout_s", "inf"),
                                       ("user_max_retries", "-1"), ("user_max_retries", "1.5")])
def test_bad_user_settings_name_their_key(key, value):
  with pytest.raises(ConfigError, match=rf"^env\.retail\.{key}"):
    load_config(None, ["env.name=retail", "policy.path=x", f"env.retail.{key}={value}"])
