"""A worked toy environment (docs/adding_an_environment.md): convert a quantity to base units, add a
number, answer. Its tasks, env, fractional reward (a wrong number earns 0.25; success is 1),
evidence l, rule Validator and Verifier, options, and its registration (``register()``, at the end)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from rti_jax.envs import registry
from rti_jax.envs.base import Environment, StepResult, Transcript
from rti_jax.envs.source import TaskSource
from rti_jax.envs.tool_calls import parse_assistant_turn
from rti_jax.intervention.judges import ValidatorJudgement, VerifierJudgement

FACTORS = {"km": 1000, "kg": 1000, "h": 3600}
TOOLS = [{"type": "function", "function": {"name": n, "description": d, "parameters": {
    "type": "object", "properties": {k: {"type": t} for k, t in p.items()}, "required": list(p)}}}
    for n, d, p in (("convert", "a quantity in base units (m, g, s)", {"value": "number", "unit": "string"}),
                    ("add", "a + b", {"a": "number", "b": "number"}),
                    ("answer", "the final answer; ends the episode", {"value": "number"}))]


@dataclasses.dataclass(frozen=True)
class CalcTask:
  task_id: str
  value: int
  unit: str
  plus: int

  @property
  def gold(self) -> list[tuple[str, dict[str, Any]]]:
    base = self.value * FACTORS[self.unit]
    return [("convert", {"value": self.value, "unit": self.unit}), ("add", {"a": base, "b": self.plus}),
            ("answer", {"value": base + self.plus})]


def make_tasks(n: int, offset: int = 0) -> list[CalcTask]:
  units = sorted(FACTORS)
  return [CalcTask(f"calc-{offset + i}", 2 + (offset + i) % 7, units[i % 3], 10 * (offset + i)) for i in range(n)]


class CalculatorEnv(Environment):
  """One task per episode; the system message lists the tools (a tiny policy's layout); tool results
  come back as ``tool`` messages."""

  def __init__(self, max_turns: int = 4) -> None:
    self.max_turns = max_turns

  def reset(self, task: CalcTask) -> list[dict[str, Any]]:
    self.task, self.done_calls = task, []
    self._t = Transcript(task_id=task.task_id, messages=[
        {"role": "system", "content": "Tools: convert(value, unit), add(a, b), answer(value)."},
        {"role": "user", "content": f"Convert {task.value} {task.unit} to base units, add {task.plus}, answer."}])
    return list(self._t.messages)

  def step(self, assistant_text: str) -> StepResult:
    turn, t = parse_assistant_turn(assistant_text), self._t
    t.num_turns += 1
    t.messages.append({"role": "assistant", "content": assistant_text})
    out: list[dict[str, Any]] = []
    for call in turn.tool_calls:
      args = call.arguments
      try:
        if call.name == "answer":
          t.reward = 1.0 if float(args["value"]) == self.task.gold[-1][1]["value"] else 0.25
          return self._end(out)
        result = (float(args["value"]) * FACTORS[args["unit"]] if call.name == "convert"
                  else float(args["a"]) + float(args["b"]) if call.name == "add" else None)
      except (KeyError, TypeError, ValueError) as e:
        result = f"error: bad arguments ({e!r})"
      self.done_calls.append((call.name, args))
      out.append({"role": "tool", "content": json.dumps(result if result is not None else f"error: no tool {call.name}")})
    if not turn.tool_calls or t.num_turns >= self.max_turns:
      return self._end(out)
    t.messages.extend(out)
    return StepResult(messages=out, done=False)

  def _end(self, out: list[dict[str, Any]]) -> StepResult:
    self._t.messages.extend(out)
    self._t.done = True
    return StepResult(out, True, self._t.reward)

  @property
  def transcript(self) -> Transcript:
    return self._t

  def tool_schemas(self) -> list[dict[str, Any]]:
    return TOOLS

  def reward_evidence(self) -> dict[str, Any]:
    return {"gold_calls": [{"name": n, "arguments": a} for n, a in self.task.gold],
            "answer": self.task.gold[-1][1]["value"]}


def _next_gold(ctx: Any) -> dict[str, Any]:
  """The first gold call whose result the visible history does not hold yet."""
  done = sum(1 for m in ctx.history if m.get("role") == "tool" and not str(m.get("content")).startswith('"error'))
  calls = ctx.evidence["gold_calls"]
  return calls[min(done, len(calls) - 1)]


class CalcValidator:
  """A step is valid iff its first tool call is the next gold call."""

  def validate(self, ctxs: list[Any]) -> list[ValidatorJudgement]:
    out = []
    for ctx in ctxs:
      want, calls = _next_gold(ctx), parse_assistant_turn(ctx.draft).tool_calls
      ok = bool(calls) and calls[0].name == want["name"] and calls[0].arguments == want["arguments"]
      out.append(ValidatorJudgement(ok, () if ok else ("WRONG_STEP",), "" if ok else "not the next step",
                                    f"call {want['name']} with {json.dumps(want['arguments'])}",
                                    visible_suggest_next=f"call {want['name']} next"))
    return out


class CalcVerifier:
  """Rejects a correction that writes the final answer before any tool output showed it."""

  def verify(self, ctxs: list[Any], corrected: list[str]) -> list[VerifierJudgement]:
    out = []
    for ctx, text in zip(ctxs, corrected):
      answer = str(ctx.evidence["answer"])
      seen = any(answer in str(m.get("content")) for m in ctx.history if m.get("role") == "tool")
      leak = answer in text and not seen
      out.append(VerifierJudgement(not leak, ("leaked_value",) if leak else ()))
    return out


@dataclasses.dataclass
class CalculatorOptions:
  """``env.calculator.*``."""

  num_train: int = 24

  def validate(self) -> None:
    if self.num_train < 1:
      raise ValueError(f"num_train: expected an integer >= 1, got {self.num_train}")


def calculator_source(cfg: Any) -> TaskSource:
  opts = registry.options_of(cfg)
  return TaskSource(train=make_tasks(opts.num_train), test=make_tasks(6, offset=1000),
                    env_factory=lambda: CalculatorEnv(cfg.env.max_turns), task_id=lambda t: t.task_id,
                    subsets={"kilometres": lambda t: t.unit == "km"}, domain="calculator")


def register() -> registry.EnvSpec:
  return registry.register(registry.EnvSpec(
      name="calculator", source=calculator_source, options=CalculatorOptions,
      rule_roles=lambda options: (CalcValidator(), CalcVerifier()), description="toy unit-conversion agent"),
      replace=True)
