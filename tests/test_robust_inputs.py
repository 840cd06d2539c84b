"""Any assistant text is safe: environments and judge parsers never raise and run in linear time.

Each known failure has its own test (deep JSON, an over-long integer literal, a wrong JSON type,
non-ASCII digits, super-linear regexes); property tests drive both environments with generated
``<tool_call>`` turns; timing tests compare 2,500 and 10,000 characters of adversarial text.
"""

from __future__ import annotations

import functools
import json
import re
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rti_jax.envs.navigation import NavigationEnv, load_benchmark
from rti_jax.envs.navigation import tools as nav_tools
from rti_jax.envs.navigation import vocab as nav_vocab
from rti_jax.envs.navigation.world import normalize_location, parse_location, without_label
from rti_jax.envs.tool_calls import MAX_JSON_DEPTH, ToolCall, parse_assistant_turn, strip_think


@functools.lru_cache(maxsize=1)
def _bench():
  return load_benchmark("tiny")


def _nav_env() -> NavigationEnv:
  bench = _bench()
  env = NavigationEnv(bench.world)
  env.reset(bench.train[0])
  return env


def _call(name: str, arguments: object) -> str:
  return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"


def _raw_call(body: str) -> str:
  return f"<tool_call>\n{body}\n</tool_call>"


def _seconds(fn, text: str) -> float:
  """CPU seconds of ``fn(text)`` in this process (other processes on the cores do not count)."""
  t = time.process_time()
  fn(text)
  return time.process_time() - t


def assert_linear(fn, make, small: int = 2_500, large: int = 20_000, ratio: float = 24.0, limit_s: float = 3.0) -> None:
  """``fn(make(large))`` takes under ``limit_s`` and under ``ratio`` times ``fn(make(small))``
  (8x the length: a linear function takes ~8x, a quadratic one ~64x; the margin absorbs a busy
  machine's noise). Best of three runs each."""
  fn(make(small))  # warm caches (compiled regexes, the benchmark)
  t_small = min(_seconds(fn, make(small)) for _ in range(3))
  t_large = min(_seconds(fn, make(large)) for _ in range(3))
  assert t_large < limit_s, f"{t_large:.3f} s on {large} characters"
  assert t_large < ratio * max(t_small, 5e-3), f"{t_small:.4f} s -> {t_large:.4f} s for 8x the text"


# --- tool-call parsing -------------------------------------------------------------------------


def test_deeply_nested_call_is_a_parse_error_not_a_recursion_error():
  deep = '{"name": "poi_search", "arguments": {"address": ' + "[" * 100_000 + "]" * 100_000 + "}}"
  turn = parse_assistant_turn(_raw_call(deep))
  assert not turn.tool_calls and len(turn.errors) == 1
  assert f"more than {MAX_JSON_DEPTH} array or object one within another" in turn.errors[0]
  # Nesting within the limit still parses; brackets inside strings do not count.
  ok = {"name": "poi_search", "arguments": {"address": "[" * 5_000, "x": [[[[1]]]]}}
  assert parse_assistant_turn(_raw_call(json.dumps(ok))).tool_calls == (ToolCall("poi_search", ok["arguments"]),)
  # A string-encoded arguments object is bounded the same way.
  nested_args = json.dumps({"name": "poi_search", "arguments": "[" * 10_000})
  assert "not JSON" in parse_assistant_turn(_raw_call(nested_args)).errors[0]


def test_huge_integer_literal_is_a_parse_error_not_a_value_error():
  turn = parse_assistant_turn(_raw_call('{"name": "around_search", "arguments": {"radius": ' + "9" * 5_000 + "}}"))
  assert not turn.tool_calls and "an integer not within the int limit" in turn.errors[0]
  big_in_string = json.dumps({"name": "x", "arguments": '{"radius": ' + "9" * 5_000 + "}"})
  assert "not JSON" in parse_assistant_turn(_raw_call(big_in_string)).errors[0]


def test_parse_errors_use_navigation_words():
  vocabulary = set(nav_vocab.vocabulary())
  for body in ['{"name": "x", "arguments": ' + "[" * 40, '{"name": "x", "arguments": {"a": ' + "9" * 5_000 + "}}"]:
    error = parse_assistant_turn(_raw_call(body)).errors[0]
    assert set(nav_vocab.tokenize_words(f"error: malformed tool call: {error}")) <= vocabulary


def test_strip_think_matches_the_lazy_regex():
  lazy = re.compile(r"<think>.*?</think>", re.DOTALL)

  @given(st.lists(st.sampled_from(["<think>", "</think>", "a", "<", "think>", "</", "\n"]), max_size=12))
  @settings(max_examples=150, deadline=None)
  def same(pieces):
    text = "".join(pieces)
    assert strip_think(text) == lazy.sub("", text)

  same()


def test_valid_calls_parse_as_before():
  text = ("<think>plan</think>Searching.\n" + _call("poi_search", {"address": "Dajin Park", "region": "Wuhan"})
          + _call("direction", {"origin": "1.5,2.5", "destination": "A 1,2", "waypoints": ["3,4"], "mode": "walking"}))
  turn = parse_assistant_turn(text)
  assert turn.content == "Searching." and not turn.errors
  assert [c.name for c in turn.tool_calls] == ["poi_search", "direction"]
  assert turn.tool_calls[1].arguments["waypoints"] == ["3,4"]
  bad = parse_assistant_turn(_raw_call('{"name": "poi_search", "arguments": {'))
  assert bad.errors[0].startswith("tool call is not valid JSON (Expecting property name enclosed in double quotes")


# --- Navigation tools ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [["driving"], {"driving": 1}, 3, True, 1.5])
def test_direction_mode_of_a_wrong_json_type_is_an_error_observation(mode):
  out = nav_tools.execute(_bench().world, ToolCall("direction", {"origin": "1,1", "destination": "1,2", "mode": mode}))
  assert out.error and out.text.startswith("error: mode of direction must be one of driving")


def _short(value: object) -> str:
  return repr(value)[:16]


@pytest.mark.parametrize("radius", ["²", "٣", "３", "9" * 5_000, "1" + "0" * 6, True, [1], {"r": 1}, "1e3", -1, 50_001],
                         ids=_short)
def test_radius_needs_ascii_digits_in_range(radius):
  out = nav_tools.execute(_bench().world, ToolCall("around_search", {"location": "116.4,39.9", "radius": radius}))
  assert out.error and "radius of around_search must be an integer from 0 to 50000" in out.text


@pytest.mark.parametrize("radius", [3, 3.0, "3", " 0003 ", "50000", 0, "0" * 5_000], ids=_short)
def test_radius_accepts_integers_as_before(radius):
  out = nav_tools.execute(_bench().world, ToolCall("around_search", {"location": "116.4,39.9", "radius": radius}))
  assert not out.error


def test_locations_need_ascii_digits():
  assert parse_location("1.5,2.5") is not None and parse_location("Café Lake 1.5,2.5") is not None
  for text in ("١.٥,٢.٥", "1.5,٢", "１,２", "Lake ٣,٣"):
    assert parse_location(text) is None and normalize_location(text, 4) is None


_LABELLED_STOP = re.compile(r"^\s*[^,]*?[A-Za-z][^,]*?\s+(?P<coords>[-+0-9.]+\s*,\s*[-+0-9.]+)\s*$")


def test_without_label_matches_the_labelled_stop_regex():
  @given(st.text(st.sampled_from(list("aZé \t\n\u3000,1-+.٣_x")), max_size=14))
  @settings(max_examples=150, deadline=None)
  def same(text):
    m = _LABELLED_STOP.match(text)
    assert without_label(text) == (m.group("coords") if m else text)

  same()
  assert without_label("Shimen Hill 109.0145 , 34.4338 ") == "109.0145 , 34.4338"
  assert without_label("109.0145,34.4338") == "109.0145,34.4338"


def test_labelled_stop_is_linear():
  # The regex took about 13 s on this 2,000-character argument.
  assert_linear(without_label, lambda n: "a" * (n // 2) + " " * (n // 2))
  assert_linear(parse_location, lambda n: "a" * (n // 3) + " " * (n // 3) + "1" * (n // 3))


# --- judge parsers ---------------------------------------------------------------------------------

from rti_jax.intervention import judges  # noqa: E402

_JUDGE_PARSERS = (judges.parse_json_object, judges.parse_validator, judges.parse_corrector, judges.parse_verifier)


def _old_parse_json_object(text: str):
  """The parser before the linear rewrite (exhaustive raw_decode from every "{"), with the rule for
  reasoning that the generation prompt opened: text up to a ``</think>`` that nothing opened goes."""
  close = text.find("</think>")
  if close >= 0 and "<think>" not in text[:close]:
    text = text[close + len("</think>"):]
  body = re.sub(r"<think>.*?</think>", "", text, flags=re.DOTALL)
  if "<think>" in body and "</think>" not in body:
    body = body.split("<think>", 1)[0] or body.split("<think>", 1)[1]
  candidates = [m.group(1) for m in re.finditer(r"```(?:json|JSON)?\s*(.*?)```", body, re.DOTALL)] + [body]
  decoder = json.JSONDecoder()
  for cand in candidates:
    for variant in (cand, judges._pythonish_to_json(cand)):
      for start in (i for i, ch in enumerate(variant) if ch == "{"):
        try:
          obj, _ = decoder.raw_decode(variant, start)
        except json.JSONDecodeError:
          continue
        if isinstance(obj, dict):
          return obj
  return None


_JSONISH = st.lists(st.sampled_from(['{', '}', '"', ':', ',', '[', ']', ' ', '\n', 'a', '1', 'True', '\\', '{"ok": true}',
                                     '"is_valid"', '```json', '```', '<think>', '</think>', '{"a": {"b": 1} x', 'None']),
                    max_size=14).map("".join)


@given(_JSONISH)
@settings(max_examples=150, deadline=None)
def test_parse_json_object_finds_the_same_object_as_before(text):
  assert judges.parse_json_object(text) == _old_parse_json_object(text)


ADVERSARIAL = [
  "{" * 20_000, '{"a":' * 4_000, "[" * 20_000, '{"a": ' + "9" * 5_000 + "}", "<think>" * 3_000, "```" * 3_000,
  '{"a' * 5_000, '"' * 10_000, "{\n" * 10_000, "True " * 4_000, '{"tool_calls": [{"name": "x", "arguments": "' +
  "[" * 5_000 + '"}]}', '{"is_valid": false, "diagnosis": ' + "[" * 40 + "]" * 40 + "}", "\x00\ud800\uffff" * 100,
]


@pytest.mark.parametrize("parse", _JUDGE_PARSERS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("text", ADVERSARIAL, ids=_short)
def test_judge_parsers_never_raise(parse, text):
  parse(text)


@given(st.text(max_size=300) | _JSONISH)
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_judge_parsers_never_raise_on_any_text(text):
  for parse in _JUDGE_PARSERS:
    parse(text)


def test_judge_parsers_default_on_malformed_json():
  deep = '{"is_valid": false, "diagnosis": ' + "[" * 40 + "]" * 40 + "}"
  assert judges.parse_json_object(deep) is None
  assert judges.parse_validator(deep).malformed and judges.parse_validator(deep).is_valid
  assert judges.parse_verifier('{"ok": true, "reasons": ' + "[" * 40 + "]" * 40 + "}").malformed
  assert judges.parse_corrector('{"tool_calls": [{"name": "x", "arguments": "' + "[" * 50 + '"}]}') is None
  assert judges.parse_json_object('{"ok": true, "n": ' + "9" * 5_000 + "}") == {"ok": True, "n": float("inf")}
  # A valid object after failed starts is still found.
  assert judges.parse_json_object('{"a": ' * 20 + '{"ok": true}') == {"ok": True}
  assert judges.parse_json_object("{y} " * 2_000 + '{"ok": true}') == {"ok": True}
  assert judges.parse_json_object('{"a' * 2_000 + ' {"ok": true}') == {"ok": True}
  assert judges.parse_json_object('{"a":' * 4_000 + ' {"ok": true}') == {"ok": True}
  assert judges.parse_verifier("x " * 100 + '{"ok": true, "reasons": []}').ok


_JUDGE_INPUTS = {
  "open_braces": lambda n: "{" * n,
  "open_keys": lambda n: ('{"a":' * (n // 5 + 1))[:n],
  "open_strings": lambda n: ('{"a' * (n // 3 + 1))[:n],
  "brackets": lambda n: "[" * n,
  "newline_braces": lambda n: "{\n" * (n // 2),
  "thinks": lambda n: ("<think>" * (n // 7 + 1))[:n],
  "fences": lambda n: "```" * (n // 3),
  "quotes": lambda n: '"' * n,
  "digits": lambda n: '{"a": ' + "1" * n,
}


@pytest.mark.parametrize("parse", _JUDGE_PARSERS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("make", _JUDGE_INPUTS.values(), ids=_JUDGE_INPUTS.keys())
def test_judge_parsers_are_linear(parse, make):
  assert_linear(parse, make)


# --- Navigation rule Validator / Verifier ------------------------------------------------------------

from rti_jax.intervention import rules_navigation as rn  # noqa: E402
from rti_jax.intervention.judges import StepContext  # noqa: E402

_OLD_FOUND = re.compile(r"([^\W\d][^.,;:\n]*?) was found in ([^\W\d][^.,;:\n]*?), far from the other places in "
                        r"([^\W\d][^.,;:\n]*?)\.")
_OLD_CHECK_ITEM = re.compile(r"(.+?) in ([^,]+)")
_OLD_FIELD = {f: re.compile(rf"\b{f}\W{{1,4}}([^\W\d][^;,\"\n}}]*?)\s*(?:[;,\"\n}}]|$)") for f in ("city", "name")}


@given(st.lists(st.sampled_from([" was found in ", ", far from the other places in ", "A", "b", "1", ".", ",", ";", ":",
                                 "\n", " ", "_", "é", "٣"]), max_size=10).map("".join))
@settings(max_examples=150, deadline=None)
def test_found_claims_match_the_regex(text):
  assert rn.found_claims(text) == [m.group(0, 1, 2, 3) for m in _OLD_FOUND.finditer(text)]


@given(st.lists(st.sampled_from([" in ", "a", ",", ", ", "\n", " ", "i", "n", "in"]), max_size=9).map("".join))
@settings(max_examples=150, deadline=None)
def test_check_item_matches_the_regex(item):
  m = _OLD_CHECK_ITEM.fullmatch(item)
  assert rn.check_item(item) == (m.groups() if m else None)


@given(st.lists(st.sampled_from(["city", "name", " ", ":", "=", "a", "B", "1", ";", ",", '"', "}", "\n", "\t", "é", "\x85"]),
                max_size=10).map("".join))
@settings(max_examples=150, deadline=None)
def test_field_pattern_reads_the_same_value(text):
  for field, old in _OLD_FIELD.items():
    a, b = old.search(text), rn._FIELD_RE[field].search(text)
    assert (a.group(1).strip() if a else None) == (b.group(1).strip() if b else None)


def test_rule_coordinates_need_ascii_digits():
  assert rn.coord_key("Lake 116.4012,39.9123") is not None
  assert rn.coord_key("١١٦.٤٠١٢,٣٩.٩١٢٣") is None and not rn.coords_in("at ١١٦.٤٠١٢,٣٩.٩١٢٣")
  assert rn.is_failed_result('{"pois": ' + "[" * 5_000 + "]" * 5_000 + "}") is False
  assert rn.is_failed_result('{"status": ' + "1" * 5_000 + "}") is False


def _nav_context(draft: str, history_turn: str | None = None) -> StepContext:
  """Step k after a turn that searched every stop (so the claim checks read results) and ``history_turn``."""
  bench = _bench()
  env = NavigationEnv(bench.world, max_turns=4)
  env.reset(bench.train[0])
  env.step("".join(_call("poi_search", {"address": stop.name}) for stop in bench.train[0].stops))
  if history_turn is not None and not env.transcript.done:
    env.step(history_turn)
  return StepContext(user_query=bench.train[0].query, history=tuple(env.transcript.messages[1:]), draft=draft,
                     tools=tuple(env.tool_schemas()), evidence=env.reward_evidence(), domain="navigation")


def _nav_judges(text: str) -> None:
  ctx = _nav_context(text, history_turn=text)
  rn.NavigationRuleValidator().judge(ctx)
  rn.NavigationRuleVerifier().judge(ctx, text)


_RULE_INPUTS = {
  "letters_then_spaces": lambda n: "a" * (n // 2) + " " * (n // 2),
  "found_clause": lambda n: ("A was found in B " * (n // 17 + 1))[:n],
  "check_line": lambda n: "Check: " + ("a in " * (n // 5 + 1))[:n] + ",x.",
  "city_fields": lambda n: ("city " + " " * n + "x"),
  "coordinates": lambda n: ("1.1," * (n // 4 + 1))[:n],
}


@pytest.mark.parametrize("make", _RULE_INPUTS.values(), ids=_RULE_INPUTS.keys())
@pytest.mark.parametrize("where", ["content", *(pytest.param(w, marks=pytest.mark.slow) for w in ("direction", "poi_search"))])
def test_navigation_rules_are_linear(make, where):
  wrap = {"content": lambda s: s,
          "direction": lambda s: _call("direction", {"origin": s, "destination": "Lake 1.5,2.5", "waypoints": [s]}),
          "poi_search": lambda s: _call("poi_search", {"address": s, "region": s})}[where]
  assert_linear(lambda text: _nav_judges(wrap(text)), make)


# --- Telecom: scripted user, rule Validator / Verifier -------------------------------------------------

from rti_jax.envs.telecom import user_sim  # noqa: E402
from rti_jax.envs.telecom.env import TelecomEnv  # noqa: E402
from rti_jax.envs.telecom.tasks import load_split  # noqa: E402
from rti_jax.intervention import telecom_evidence as te  # noqa: E402
from rti_jax.intervention.rules_telecom import TelecomRuleValidator, TelecomRuleVerifier  # noqa: E402

_OLD_SENTENCE = re.compile(r"(?:[^.!?;\n()]|\([^)]*\)?)+(?:[.!?;]+|\n|$)")
_OLD_NAMED = re.compile(r"\b([a-z_]{4,})\b(\s*\(([^)]*)\))?")
_OLD_ARG = re.compile(r"""(\w+)\s*[=:]\s*(?:"([^"]*)"|'([^']*)'|([\w\-./:]+))""")
_OLD_USER_RAN = re.compile(r"\bI ran (\w+):\s*(.*?)(?=\s*\bI ran \w+:|$)", re.DOTALL)


def _texts(pieces: list[str], size: int = 12):
  return st.lists(st.sampled_from(pieces), max_size=size).map("".join)


@given(_texts(list("a.!?;\n() ") + ["ab", ").", "(a;"]))
@settings(max_examples=150, deadline=None)
def test_sentence_spans_match_the_regex(text):
  assert user_sim.sentence_spans(text) == [m.span() for m in _OLD_SENTENCE.finditer(text)]


@given(_texts(["abcd", "toggle_wifi", " ", "(", ")", "x", "_", "1", "\n", "é", 'a="b"', "k=v"], size=8))
@settings(max_examples=150, deadline=None)
def test_named_calls_arguments_and_blanking_match_the_regexes(text):
  assert user_sim.named_calls(text) == [(m.start(), m.group(1), m.group(3)) for m in _OLD_NAMED.finditer(text)]
  assert user_sim.blank_words(text) == re.sub(r"\w*_\w*", lambda m: " " * len(m.group(0)), text)
  assert user_sim._ARG_RE.findall(text) == _OLD_ARG.findall(text)


@given(_texts(["I ran ", "I ran x:", "x", ":", " ", "\n", "a", "I", "_", "\t"]))
@settings(max_examples=150, deadline=None)
def test_user_reports_match_the_regex(text):
  assert te.user_reports(text) == [m.groups() for m in _OLD_USER_RAN.finditer(text)]


def test_user_ignores_overlong_words_only():
  phone = user_sim.st.fresh_state().phone
  assert [r.tool for r in user_sim.find_requests("Please reset the data saver.", phone)[0]] == ["toggle_data_saver_mode"]
  assert not user_sim.find_requests("Please " + "x" * 50 + "set the data saver.", phone)[0]


@functools.lru_cache(maxsize=1)
def _telecom_tasks():
  return load_split("train")


def _tel_env() -> TelecomEnv:
  env = TelecomEnv()
  env.reset(_telecom_tasks()[0])
  return env


def test_huge_integer_arguments_do_not_overflow_floats():
  assert te.norm_value(10 ** 400) == "inf" and te.norm_value(-(10 ** 400)) == "-inf"
  assert te.visible_value(10 ** 400, "1 2 3") is False
  env = _tel_env()
  draft = _raw_call('{"name": "refuel_data", "arguments": {"customer_id": "C1", "line_id": "L1", "gb_amount": '
                    + "9" * 400 + "}}")
  result = env.step(draft)
  assert "must be a finite number, got an integer of 400 digits" in result.messages[0]["content"]
  ctx = _tel_context(draft, env)
  TelecomRuleValidator().judge(ctx)
  TelecomRuleVerifier().judge(ctx, draft)


def _tel_context(draft: str, env: TelecomEnv) -> StepContext:
  messages = env.transcript.messages
  return StepContext(user_query=messages[1]["content"], history=tuple(messages[1:]), draft=draft,
                     tools=tuple(env.tool_schemas()), evidence=env.reward_evidence(), domain="telecom")


@functools.lru_cache(maxsize=1)
def _tel_judges_pair():
  return TelecomRuleValidator(), TelecomRuleVerifier()


def _tel_run(text: str) -> None:
  env = _tel_env()
  env.step(text)
  ctx = _tel_context(text, env)
  validator, verifier = _tel_judges_pair()
  validator.judge(ctx)
  verifier.judge(ctx, text)


_TELECOM_INPUTS = {
  "verbs_in_one_word": lambda n: ("set" * (n // 3 + 1))[:n],
  "open_paren": lambda n: "(" + "a" * n + "))",
  "stray_paren": lambda n: "a" * n + ")",
  "identifier_letters": lambda n: "1" * n,
  "spaces_in_a_report": lambda n: "I ran x: " + " " * n + "y",
  "figures": lambda n: ("$1" * (n // 2 + 1))[:n],
  "capitals": lambda n: ("Abc " * (n // 4 + 1))[:n],
  "call_args": lambda n: "check_app_status(" + "a" * n + ")",
}


@pytest.mark.parametrize("make", _TELECOM_INPUTS.values(), ids=_TELECOM_INPUTS.keys())
@pytest.mark.parametrize("where", ["message", *(pytest.param(w, marks=pytest.mark.slow) for w in ("phone_number", "name"))])
def test_telecom_step_and_rules_are_linear(make, where):
  wrap = {"message": lambda s: s, "phone_number": lambda s: _call("get_customer_by_phone", {"phone_number": s}),
          "name": lambda s: _call(s, {})}[where]
  assert_linear(lambda text: _tel_run(wrap(text)), make)


# --- property tests: any assistant turn gets an observation -----------------------------------------

from rti_jax.envs.telecom import agent_tools, device_tools  # noqa: E402

_NAV_PARAMS = {"poi_search": ("address", "region"), "around_search": ("location", "radius", "keyword", "region"),
               "direction": ("origin", "destination", "mode", "waypoints")}
_TEL_PARAMS = {**{n: tuple(t.properties) for n, t in agent_tools.AGENT_TOOLS.items()},
               **{n: t.params for n, t in device_tools.DEVICE_TOOLS.items()}}
_ODD_TEXT = st.text(st.sampled_from(list("aZ 1.,-+_()[]{}\"'\\:;\n\t") + ["٣", "²", "５", "\u3000", "\u00a0", "\u2028",
                                                                          "é", "\ud800", "\x00"]), max_size=40)
_ATOMS = st.one_of(
  st.none(), st.booleans(), st.integers(-10 ** 6, 10 ** 6), st.integers(10 ** 300, 10 ** 320),
  st.floats(allow_nan=True, allow_infinity=True), _ODD_TEXT,
  st.sampled_from(["116.4012,39.9123", "Lake 116.4012,39.9123", "١١٦.٤,٣٩.٩", "²", "５０００", "\u3000 5000 ", "driving",
                   "C1001", "L1001", "555-123-2002", "4g_5g_preferred", "messaging"]),
  st.builds(lambda s, k: s * k, st.text(min_size=1, max_size=4), st.integers(50, 800)),
)
_VALUES = st.recursive(_ATOMS, lambda kids: st.lists(kids, max_size=3) | st.dictionaries(_ODD_TEXT, kids, max_size=3),
                       max_leaves=6)


@st.composite
def _tool_body(draw, params: dict[str, tuple[str, ...]]) -> str:
  name = draw(st.sampled_from(sorted(params)) | _ODD_TEXT)
  args = {p: draw(_VALUES) for p in params.get(name, ()) if draw(st.booleans()) or draw(st.booleans())}
  if draw(st.integers(0, 5)) == 0:
    args[draw(_ODD_TEXT)] = draw(_VALUES)
  arguments = json.dumps(args, ensure_ascii=False) if draw(st.integers(0, 4)) == 0 else args
  body = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=draw(st.booleans()))
  mutation = draw(st.integers(0, 7))
  if mutation == 0:  # nesting far past the limit
    depth = draw(st.integers(1, 3_000))
    body = body.replace('"arguments": ', '"arguments": ' + "[" * depth, 1) + "]" * draw(st.integers(0, depth))
  elif mutation == 1:  # an integer literal past the int-string limit
    body = body.replace('"arguments": {', '"arguments": {"radius": ' + "7" * draw(st.integers(4_000, 6_000)) + ", ", 1)
  elif mutation == 2:  # cut anywhere
    body = body[: draw(st.integers(0, len(body)))]
  elif mutation == 3:  # a non-ASCII digit anywhere
    at = draw(st.integers(0, len(body)))
    body = body[:at] + draw(st.sampled_from(["٣", "²", "５"])) + body[at:]
  return body


@st.composite
def _assistant_turn(draw, params: dict[str, tuple[str, ...]]) -> str:
  parts = []
  for _ in range(draw(st.integers(0, 4))):
    kind = draw(st.integers(0, 5))
    if kind == 0:
      parts.append(draw(_ODD_TEXT))
    elif kind == 1:
      parts.append("<think>" + draw(_ODD_TEXT) + draw(st.sampled_from(["</think>", ""])))
    elif kind == 2:
      parts.append(draw(st.sampled_from(["Please run ", "Could you ", "I ran x: ", "Check: a in b, ", "###STOP### "]))
                   + draw(st.sampled_from(sorted(_TEL_PARAMS))) + "(" + draw(_ODD_TEXT) + ")")
    else:
      body = draw(_tool_body(params))
      parts.extend([f"<tool_call>\n{body}\n" + draw(st.sampled_from(["</tool_call>", ""]))] * draw(st.integers(1, 3)))
  return "".join(parts)


def _play(env, turns: list[str]) -> None:
  for text in turns:
    result = env.step(text)
    assert isinstance(result.messages, list) and isinstance(result.reward, float)
    assert all(isinstance(m["content"], str) and m["role"] in ("tool", "user") for m in result.messages)
    if result.done:
      return


@given(st.lists(_assistant_turn(_NAV_PARAMS), min_size=1, max_size=4))
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
def test_navigation_step_answers_any_turn(turns):
  _play(_nav_env(), turns)


@given(st.lists(_assistant_turn(_TEL_PARAMS), min_size=1, max_size=4))
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
def test_telecom_step_answers_any_turn(turns):
  _play(_tel_env(), turns)


@given(_assistant_turn(_NAV_PARAMS), _assistant_turn(_NAV_PARAMS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
def test_navigation_rules_judge_any_turn(first, draft):
  ctx = _nav_context(draft, history_turn=first)
  rn.NavigationRuleValidator().judge(ctx)
  rn.NavigationRuleVerifier().judge(ctx, draft)


@given(_assistant_turn(_TEL_PARAMS), _assistant_turn(_TEL_PARAMS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
def test_telecom_rules_judge_any_turn(first, draft):
  env = _tel_env()
  env.step(first)
  validator, verifier = _tel_judges_pair()
  ctx = _tel_context(draft, env)
  validator.judge(ctx)
  verifier.judge(ctx, draft)


_STEP_INPUTS = {
  "thinks": lambda n: ("<think>" * (n // 7 + 1))[:n],
  "tool_call_openers": lambda n: ("<tool_call>" * (n // 11 + 1))[:n],
  "letters_then_spaces": lambda n: "a" * (n // 2) + " " * (n // 2),
  "deep_brackets": lambda n: "[" * n,
}


@pytest.mark.parametrize("make", _STEP_INPUTS.values(), ids=_STEP_INPUTS.keys())
@pytest.mark.parametrize("where", ["content", "tool_call", "origin", "location", "address"])
def test_navigation_step_is_linear(make, where):
  wrap = {"content": lambda s: s, "tool_call": _raw_call,
          "origin": lambda s: _call("direction", {"origin": s, "destination": s, "waypoints": [s] * 3}),
          "location": lambda s: _call("around_search", {"location": s, "radius": s, "keyword": s}),
          "address": lambda s: _call("poi_search", {"address": s, "region": s})}[where]
  assert_linear(lambda text: _nav_env().step(wrap(text)), make)
