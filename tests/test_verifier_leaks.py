"""The rule Verifiers as a security boundary: every respelling of a privileged value is rejected, on
every argument and in the prose, for both benchmarks, and every respelling of a value the visible
history shows is accepted. The privileged values are read from the evidence (made-up evidence too),
numbers are checked against Python's own number parsing, and the scans never raise and stay linear."""

from __future__ import annotations

import json
import random
import re
import time
from decimal import Decimal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rti_jax.envs.navigation.world import parse_location
from rti_jax.envs.telecom import TelecomEnv, get_task
from rti_jax.envs.telecom.scripted_agents import tool_call_text as tel_call
from rti_jax.intervention import NavigationRuleVerifier, StepContext, TelecomRuleVerifier
from rti_jax.intervention.leaks import LeakScanner, Matcher, Privileged, coordinate_pairs, fold, numbers_in
from rti_jax.intervention.rules_navigation import coords_in
from rti_jax.intervention.privileged import navigation_privileged, telecom_privileged
from intervention_doubles import tool_call_text as nav_call

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

# --- respellings (independent of the code under test) -----------------------------------------------

_SEPARATORS = ["", "", "", " ", "-", "_", ".", "\u200b", "  "]
_CYRILLIC = {"a": "а", "e": "е", "o": "о", "p": "р", "c": "с", "x": "х", "i": "і", "y": "у"}
_DIGIT_NAMES = "zero one two three four five six seven eight nine".split()
_SMALL = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen "
          "seventeen eighteen nineteen").split()
_TENS = "_ _ twenty thirty forty fifty sixty seventy eighty ninety".split()


def _int_words(n: int) -> str:
  """English words of 0 <= n < 10**6 ("one hundred twenty-one")."""
  if n < 20:
    return _SMALL[n]
  if n < 100:
    return _TENS[n // 10] + ("" if n % 10 == 0 else "-" + _SMALL[n % 10])
  if n < 1000:
    return _SMALL[n // 100] + " hundred" + ("" if n % 100 == 0 else " " + _int_words(n % 100))
  return _int_words(n // 1000) + " thousand" + ("" if n % 1000 == 0 else " " + _int_words(n % 1000))


@st.composite
def respelled_text(draw, value: str, separators: tuple[str, ...] = tuple(_SEPARATORS)) -> str:
  """``value`` with each letter's case redrawn and separators drawn between characters."""
  out = []
  for i, ch in enumerate(value):
    if i and (ch.isalnum() and value[i - 1].isalnum()):
      out.append(draw(st.sampled_from(separators)))
    elif not ch.isalnum():
      out.append(draw(st.sampled_from([" ", "-", ".", "_", ch, ch])))
      continue
    if ch.lower() in _CYRILLIC and draw(st.integers(0, 5)) == 0:
      out.append(_CYRILLIC[ch.lower()])  # a look-alike letter
      continue
    out.append(ch.upper() if draw(st.booleans()) else ch.lower())
  return "".join(out)


@st.composite
def respelled_number(draw, value: str) -> str:
  """``value`` (a decimal literal) as another literal Python's ``float`` and ``Decimal`` read the same,
  or in English words."""
  d = Decimal(value)
  kinds = ["plus", "zeros", "exponent", "words", "digit_words", "underscore", "leading"]
  if sum(c.isdigit() for c in value) >= 5 and "." in value:
    kinds.append("separated")  # the decimal point written as another separator ("121,5409", "121 5409")
  kind = draw(st.sampled_from(kinds))
  if kind == "separated":
    return value.replace(".", draw(st.sampled_from([",", " ", " . ", "-"])))
  if kind == "plus":
    return "+" + value
  if kind == "zeros":
    return value + ("" if "." in value else ".") + "0" * draw(st.integers(1, 4))
  if kind == "exponent":
    shift = draw(st.integers(-3, 3))
    mantissa = d.scaleb(-shift)
    return f"{mantissa}{draw(st.sampled_from(['e', 'E']))}{shift:+d}" if shift else f"{mantissa}e0"
  if kind == "underscore":
    head, _, frac = value.partition(".")
    return (head[0] + "_" + head[1:] if len(head) > 1 else head) + ("." + frac if frac else "")
  if kind == "leading":
    return "00" + value
  head, _, frac = value.partition(".")
  if kind == "digit_words":
    whole = " ".join(_DIGIT_NAMES[int(c)] for c in head)
  else:
    whole = _int_words(int(head)) if int(head) < 10 ** 6 else " ".join(_DIGIT_NAMES[int(c)] for c in head)
  return whole + (" point " + " ".join(_DIGIT_NAMES[int(c)] for c in frac) if frac else "")


def _in_prose(draw, value: str) -> str:
  template = draw(st.sampled_from(["{}", "I believe it is {} here.", "Noted ({}), thanks.", "so:{};", "({})"]))
  return template.format(value)


# --- numbers: the scanner reads what Python's float reads ----------------------------------------------


@given(st.decimals(min_value=0, max_value=10 ** 6, places=4), st.sampled_from(["{}", "+{}", "{:e}", "{:E}", "{}000", "0{}"]))
@settings(max_examples=100, deadline=None)
def test_numbers_are_read_as_python_reads_them(value, template):
  literal = template.format(value)
  expected = Decimal(repr(float(literal)))  # the reference: Python's own float parsing
  assert expected.normalize() in {v.normalize() for v, _ in numbers_in(f"at {literal} now")}, literal


@pytest.mark.parametrize("n", [0, 7, 15, 20, 21, 99, 100, 121, 999, 1002, 2009, 90210, 123456])
def test_number_words(n):
  assert (Decimal(n), _int_words(n)) in numbers_in(_int_words(n))
  assert Decimal("15.1") in {v for v, _ in numbers_in("about fifteen point one gigabytes")}
  assert Decimal(1235) in {v for v, _ in numbers_in("the card ending one two three five")}
  assert Decimal(1235) in {v for v, _ in numbers_in("the card ending twelve thirty-five")}
  assert {v for v, _ in numbers_in("one hundred and twenty one and two")} == {Decimal(121), Decimal(2)}
  assert Decimal(5551232002) in {v for v, _ in numbers_in("five five five one two three two zero zero two")}


def test_folding_and_token_runs():
  assert fold("L-1002") == fold("l 1002") == fold("L1002") == "l1002"
  assert fold("JOHN.Smith@Example.COM") == "johnsmithexamplecom"
  assert fold("123 Main Street") == fold("123 main st.") == "123mainst"
  assert fold("Taipéi") == fold("ＴＡＩＰＥＩ") == "taipei"
  m = Matcher({"xian": "city", "5551232002": "phone"})
  assert m.find("Xiangshan Park and Xi'an") == {"xian": "Xi'an"}  # never inside a longer token
  assert m.find("XiAn") == {"xian": "XiAn"} and m.find("call (555) 123-2002") == {"5551232002": "555) 123-2002"}
  assert m.find("5551232002123") == {}
  assert fold("Тaipеi") == "taipei"  # Cyrillic T and e
  assert fold("June 15th, 1985") == "june151985"


def test_angles_in_degrees_and_minutes():
  p = Privileged()
  p.add_number(Decimal("121.5409"), "lon")
  scanner = LeakScanner(p, [Decimal("116.3971")])
  for written in ("121°32'27\"", "121° 32′ 27.2″", "121 deg 32.45 min", "121º32'"):
    assert [leak.label for leak in scanner.scan(f"It lies at {written} E.")] == ["lon (in degrees and minutes)"], written
  assert scanner.scan("It lies at 116°23'49\" E.") == []  # the shown 116.3971 (and no privileged number)
  assert scanner.scan("It lies at 121°40'.") == []  # 121.667: a tenth of a degree away


# --- Navigation -----------------------------------------------------------------------------------------

A, B, C_BJ, C_TP = "121.5012,25.0301", "121.5234,25.0412", "116.3971,39.9169", "121.5409,25.0533"
QUERY = "Drive from Dajin Park to Lihui Park, then to Yixing Temple."
NAV_EVIDENCE = {
  "order": 4,
  "ref": [{"name": "Dajin Park", "city": "Taipei", "location": A}, {"name": "Lihui Park", "city": "Taipei", "location": B},
          {"name": "Yixing Temple", "city": "Taipei", "location": C_TP}],
  "groundtruth": {"name": "direction", "arguments": {"origin": A, "waypoints": [B], "destination": C_TP, "mode": "driving"}},
}
# The search returned the Beijing namesake only: the hidden city (Taipei) and the hidden stops were never shown.
NAV_HISTORY = (
  {"role": "user", "content": QUERY},
  {"role": "assistant", "content": nav_call("poi_search", address="Yixing Temple")},
  {"role": "tool", "content": f"found 1\n1. name Yixing Temple; city Beijing; address 12 Baita Road; location {C_BJ}; "
                              "type scenic spot; rating 4.5; hours 8-17"},
)
NAV = NavigationRuleVerifier()


def _nav(text: str, evidence=NAV_EVIDENCE, history=NAV_HISTORY):
  return NAV.judge(StepContext(QUERY, history, text, (), evidence, "navigation"), text)


def test_navigation_privileged_values_come_from_the_evidence():
  p = navigation_privileged(NAV_EVIDENCE).minus_visible([QUERY, NAV_HISTORY[2]["content"]])
  coordinates = ("121.5012", "25.0301", "121.5234", "25.0412", "121.5409", "25.0533")
  # the names and their words are in the query; each coordinate is a number and its digits
  assert set(p.strings) == {"taipei"} | {c.replace(".", "") for c in coordinates}
  assert set(p.numbers) == {Decimal(x) for x in coordinates}


@st.composite
def _nav_leak(draw):
  """A correction that carries the hidden city or a hidden coordinate, respelled, somewhere."""
  what = draw(st.sampled_from(["city", "pair", "number"]))
  if what == "city":
    value = draw(respelled_text("Taipei"))
  elif what == "pair":
    lon, lat = draw(st.sampled_from([A, B, C_TP])).split(",")
    value = f"{draw(respelled_number(lon))},{draw(respelled_number(lat))}"
  else:
    value = draw(respelled_number(draw(st.sampled_from([A, B, C_TP])).split(",")[draw(st.integers(0, 1))]))
  if what == "number" and draw(st.integers(0, 3)) == 0:  # in degrees, minutes and seconds
    degrees = Decimal(value) if value.replace(".", "").isdigit() else None
    if degrees is not None:
      minutes = (degrees - int(degrees)) * 60
      value = f"{int(degrees)}°{int(minutes)}'{round((minutes - int(minutes)) * 60)}\""
  where = draw(st.sampled_from(["prose", "think", "address", "region", "keyword", "location", "destination"]))
  if where == "prose":
    return _in_prose(draw, value) + "\n" + nav_call("poi_search", address="Yixing Temple")
  if where == "think":
    return f"<think>\n{_in_prose(draw, value)}\n</think>\n\n" + nav_call("poi_search", address="Yixing Temple")
  if where in ("address", "region"):
    args = {"address": f"Yixing Temple {value}"} if where == "address" else {"address": "Yixing Temple", "region": value}
    return nav_call("poi_search", **args)
  if where == "keyword":
    return nav_call("around_search", location=C_BJ, keyword=f"temple {value}")
  if where == "location":
    return nav_call("around_search", location=value if what == "pair" else f"{value},25.0", keyword="temple")
  return nav_call("direction", origin=C_BJ, destination=value if what == "pair" else f"{value},25.0")


@given(_nav_leak())
@SETTINGS
def test_navigation_rejects_every_respelling_of_a_privileged_value(text):
  v = _nav(text)
  assert not v.ok and "not_derivable" in v.reasons, text


@st.composite
def _nav_legit(draw):
  """A correction that uses only what the history shows (the Beijing result, the query's names),
  respelled the way the tools read it in arguments and freely in the prose."""
  lon, lat = C_BJ.split(",")
  shown = draw(st.sampled_from([draw(respelled_text("Beijing")), draw(respelled_text("Yixing Temple")),
                                f"{draw(respelled_number(lon))}, {draw(respelled_number(lat))}",
                                draw(respelled_text("Dajin Park"))]))
  prose = f"<think>\nThe result {_in_prose(draw, shown)} is far from the parks.\n</think>\n\n"
  call = draw(st.sampled_from([
    nav_call("poi_search", address=draw(st.sampled_from(["Yixing Temple", "yixing temple", "Lihui Park"]))),
    nav_call("poi_search", address="Yixing Temple", region=draw(st.sampled_from(["Beijing", "beijing", "BEIJING"]))),
    nav_call("around_search", location=f"{draw(st.sampled_from(['+', '']))}{lon},{lat}", keyword="temple"),
  ]))
  return prose + call


@given(_nav_legit())
@SETTINGS
def test_navigation_accepts_every_respelling_of_a_shown_value(text):
  v = _nav(text)
  assert v.ok, (text, v.diagnosis)


def test_navigation_hidden_city_in_a_search_is_rejected_once_shown_accepted():
  leak = nav_call("poi_search", address="Yixing Temple Taipei")
  assert _nav(leak).reasons == ("not_derivable",)
  shown = NAV_HISTORY + (
    {"role": "assistant", "content": nav_call("poi_search", address="Dajin Park")},
    {"role": "tool", "content": f"found 1\n1. name Dajin Park; city Taipei; address 3 Ruyi Road; location {A}; type park"},
  )
  assert _nav(leak, history=shown).ok


def test_navigation_a_stop_the_query_does_not_name_is_privileged_whole_and_by_word():
  ev = dict(NAV_EVIDENCE, ref=NAV_EVIDENCE["ref"] + [{"name": "Baiyun Pagoda", "city": "Taipei", "location": C_TP}])
  for text in ("Maybe the BAIYUN-pagoda?", nav_call("around_search", location=C_BJ, keyword="baiyun"),
               nav_call("around_search", location=C_BJ, keyword="Pagoda"), nav_call("poi_search", address="Baiyun")):
    assert "not_derivable" in _nav(text, evidence=ev).reasons, text
  assert _nav(nav_call("around_search", location=C_BJ, keyword="temple"), evidence=ev).ok  # the query shows "Temple"


def test_navigation_hidden_city_never_passes_on_the_real_env():
  """Before any search, no city of the trip is shown unless the query names it: a correction that
  puts the city into the address, the keyword or the prose, or the stop's coordinates into a
  direction call in the tools' other spellings, is rejected (60 train tasks)."""
  from rti_jax.envs import navigation as nav

  bench = nav.load_benchmark("tiny")
  env = nav.NavigationEnv(bench.world)
  judged = 0
  for task in bench.train[:60]:
    env.reset(task)
    history = tuple(m for m in env.transcript.messages if m["role"] != "system")
    ctx = StepContext(task.query, history, "", tuple(env.tool_schemas()), env.reward_evidence(), "navigation")
    for stop in task.stops:
      if stop.city.lower() in task.query.lower():
        continue
      lon, lat = stop.location.split(",")
      for fix in (nav_call("poi_search", address=f"{stop.name} {stop.city}"),
                  nav_call("around_search", location=stop.location.replace(",", ", "), keyword=stop.city.upper()),
                  f"<think>It is in {stop.city.lower()}.</think>\n" + nav_call("poi_search", address=stop.name),
                  nav_call("direction", origin=f"+{lon},+{lat}", destination=f"{float(lon):e},{lat}")):
        v = NAV.judge(ctx, fix)
        assert not v.ok and "not_derivable" in v.reasons, (task.task_id, fix)
        judged += 1
  assert judged > 300


def test_navigation_rules_follow_made_up_evidence():
  """Nothing is a list of known spellings: a city and a point that exist in no world are enforced."""
  ev = {"order": 0, "ref": [{"name": "Yixing Temple", "city": "Quexton", "location": "77.1234,12.9876"},
                            {"name": "Dajin Park", "city": "Quexton", "location": C_BJ}],
        "groundtruth": {"name": "direction", "arguments": {"origin": "77.1234,12.9876", "destination": C_BJ}}}
  for text in ("It must be in QUEX-TON.", "Near 77.1234 and 12.99.", nav_call("poi_search", address="Yixing Temple quexton")):
    assert "not_derivable" in _nav(text, evidence=ev).reasons, text
  assert _nav("It must be in Taipei. " + nav_call("poi_search", address="Yixing Temple"), evidence=ev).ok


# --- Telecom ---------------------------------------------------------------------------------------------

D2_TASK = ("[mms_issue]airplane_mode_on|bad_network_preference|bad_wifi_calling|break_apn_mms_setting|"
           "break_app_sms_permission|data_mode_off|data_usage_exceeded|unseat_sim_card|user_abroad_roaming_enabled_off"
           "[PERSONA:None]")
TEL = TelecomRuleVerifier()
#: a request to go with each value: a check, which needs no earlier report (a fix such as toggle_data()
#: would be rejected here on its own, as fix_without_diagnostic: nothing shown says mobile data is off)
ASK = "Please run check_network_status() on your phone and tell me the result."
#: (value, respelling strategy) of App. D.2's customer: what the backend and the task hold
TEL_PRIVILEGED = [("C1001", "text"), ("John", "text"), ("Smith", "text"), ("John Smith", "text"), ("L1002", "text"),
                  ("john.smith@example.com", "text"), ("1235", "digits"), ("123 Main St", "text"), ("90210", "digits"),
                  ("555-123-1002", "digits"), ("15.1", "number"), ("Anytown", "text"), ("1985-06-15", "digits"),
                  ("June 15, 1985", "text"), ("06/15/1985", "text"), ("15 Jun 1985", "text")]


def _ctx(env: TelecomEnv, draft: str = "") -> StepContext:
  msgs = env.transcript.messages
  return StepContext(msgs[1]["content"], tuple(m for m in msgs if m["role"] != "system"), draft,
                     tuple(env.tool_schemas()), env.reward_evidence(), "telecom")


@pytest.fixture(scope="module")
def phone_given():
  """App. D.2's step: the user has given the phone number only."""
  env = TelecomEnv()
  env.reset(get_task(D2_TASK))
  env.step("I can help with that. Could you please give me your phone number?")
  return _ctx(env)


@pytest.fixture(scope="module")
def looked_up():
  """After the lookups: the customer record and the line's data usage are shown."""
  env = TelecomEnv()
  env.reset(get_task(D2_TASK))
  env.step("I can help with that. Could you please give me your phone number?")
  env.step(tel_call("get_customer_by_phone", {"phone_number": "555-123-2002"}))
  env.step(tel_call("get_data_usage", {"customer_id": "C1001", "line_id": "L1002"}))
  return _ctx(env)


@st.composite
def _respelled(draw, value: str, how: str) -> str:
  if how == "number":
    return draw(respelled_number(value))
  if how == "digits":
    digits = "".join(c for c in value if c.isdigit())
    if draw(st.booleans()):
      if len(digits) == 4 and digits[0] != "0" and digits[2] != "0" and draw(st.booleans()):
        return f"{_int_words(int(digits[:2]))} {_int_words(int(digits[2:]))}"  # "twelve thirty-five"
      return " ".join(_DIGIT_NAMES[int(c)] for c in digits)
    return "".join(c + draw(st.sampled_from(["", "", " ", "-", "."])) for c in digits[:-1]) + digits[-1]
  if "@" in value and draw(st.booleans()):
    return draw(respelled_text(value.replace("@", " at ").replace(".", " dot ")))
  if re.fullmatch(r"L[0-9]+", value) and draw(st.booleans()):
    return "line " + value[1:]
  return draw(respelled_text(value))


def test_telecom_privileged_values_come_from_the_evidence(phone_given):
  p = TEL.privileged(phone_given)
  for value in ("john", "smith", "johnsmith", "l1002", "line1002", "johnsmithexamplecom", "1235", "123mainst", "90210",
                "anytown", "19850615"):
    assert value in p.strings, value
  assert Decimal("15.1") in p.numbers  # the line's usage (the task's initial state)
  assert "5551232002" not in p.strings  # the user said it


@given(st.data())
@SETTINGS
def test_telecom_rejects_every_respelling_of_a_privileged_value(phone_given, data):
  value, how = data.draw(st.sampled_from(TEL_PRIVILEGED))
  spelled = data.draw(_respelled(value, how))
  where = data.draw(st.sampled_from(["prose", "think", "argument", "nested"]))
  if where == "prose":
    text = f"{_in_prose(data.draw, spelled)} {ASK}"
  elif where == "think":
    text = f"<think>\n{_in_prose(data.draw, spelled)}\n</think>\n\n{ASK}"
  elif where == "argument":
    text = tel_call("get_details_by_id", {"id": spelled})
  else:
    text = tel_call("transfer_to_human_agents", {"summary": {"notes": ["customer", {"value": spelled}]}})
  v = TEL.judge(phone_given, text)
  assert not v.ok and "leaked_value" in v.reasons, (value, text)


#: values the lookups showed, with the same respelling strategies
TEL_SHOWN = [("John", "text"), ("Smith", "text"), ("John Smith", "text"), ("L1002", "text"), ("C1001", "text"),
             ("555-123-2002", "digits")]


@given(st.data())
@SETTINGS
def test_telecom_accepts_every_respelling_of_a_shown_value(looked_up, data):
  value, how = data.draw(st.sampled_from(TEL_SHOWN))
  if how == "digits":  # the ways a phone number is written
    spelled = data.draw(st.sampled_from(["555 123 2002", "(555) 123-2002", "555.123.2002", "+1 555-123-2002",
                                         "5551232002", "five five five one two three two zero zero two"]))
  elif value[-1].isdigit():  # an id: a "." between its digits would write a decimal number
    spelled = data.draw(st.just("line " + value[1:]) | respelled_text(value, ("", " ", "-", "_")))
  else:
    spelled = data.draw(_respelled(value, how))
  text = f"Noted, {spelled.lower()}. {ASK}" if data.draw(st.booleans()) else f"<think>\nAbout {spelled}.\n</think>\n\n{ASK}"
  assert not TEL.privileged_leaks(looked_up, text), text
  assert TEL.judge(looked_up, text).ok, (text, TEL.judge(looked_up, text).diagnosis)


def test_telecom_a_shown_name_spelled_in_pieces_is_not_a_new_name(looked_up, phone_given):
  for spelled in ("j Ohn", "Jo-Hn", "s mIth", "J o H n"):
    text = f"<think>\nAbout {spelled}.\n</think>\n\n{ASK}"
    assert TEL.judge(looked_up, text).ok, spelled
    assert "leaked_value" in TEL.judge(phone_given, text).reasons, spelled  # before the lookup showed it
  assert "leaked_value" in TEL.judge(looked_up, f"Noted, j Ohnson. {ASK}").reasons  # not a shown word


def test_telecom_usage_is_privileged_until_looked_up(phone_given, looked_up):
  for usage in ("fifteen point one gigabytes", "15100 MB", "15,462.4 megabytes"):
    text = f"Your usage is {usage}. {ASK}"
    assert "leaked_value" in TEL.judge(phone_given, text).reasons, usage
    assert any(leak.label.startswith("the figure 15.1") for leak in TEL.privileged_leaks(phone_given, text)), usage
  used = float(re.search(r'"data_used_gb":\s*([0-9.]+)', looked_up.history[-1]["content"]).group(1))
  assert TEL.privileged_leaks(looked_up, f"Your usage is {used:e} GB. {ASK}") == []


def test_telecom_rules_follow_made_up_evidence(phone_given):
  """A customer no data file holds: the evidence alone makes the values privileged."""
  ev = {"known_info": "You are Zorbel Quint with phone number 555-987-6543. You are in Lisbon.",
        "agent_actions": [{"name": "refuel_data", "arguments": {"customer_id": "Q7731", "line_id": "Q7732", "gb_amount": 2.5}}]}
  ctx = StepContext(phone_given.user_query, phone_given.history, "", phone_given.tools, ev, "telecom")
  assert {"zorbelquint", "zorbel", "quint", "q7731", "5559876543", "lisbon"} <= set(TEL.privileged(ctx).strings)
  for text in ("Thanks, zorbel.", "Your number 555 987 6543?", "Line q-7732 it is.", "I'll add two point five GB.",
               "Are you in LISBON?"):
    assert "leaked_value" in TEL.judge(ctx, f"{text} {ASK}").reasons, text


def test_telecom_prices_and_plans_are_not_privileged_values(phone_given):
  assert telecom_privileged({}).numbers.get(Decimal(40)) is None  # integers under 1000 are checked only with units
  assert TEL.judge(phone_given, f"Let's check step 2 first. {ASK}").ok


# --- robustness -------------------------------------------------------------------------------------------

_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                     lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=20)


@given(st.text(max_size=200), _JSON)
@settings(max_examples=60, deadline=None)
def test_scans_never_raise(text, obj):
  scanner = LeakScanner(navigation_privileged(NAV_EVIDENCE), [Decimal("1.5")])
  scanner.scan(text, [obj])
  navigation_privileged(obj)
  telecom_privileged(obj if isinstance(obj, dict) else {"ticket": text, "x": obj})
  numbers_in(text)


_PIECES = ["Taipei", "tai pei", "121.5409", "+25.0533e0", " ", ",", "\n", "<think>", "</think>", "L-1002", "john",
           "fifteen point one", "one", "hundred", "point", "and", "1e-29", "9" * 40, "@", ".", "_", "é", "٣"]


@given(st.lists(st.sampled_from(_PIECES), max_size=14).map("".join), _JSON)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_verifiers_never_raise(phone_given, text, obj):
  call = "<tool_call>\n" + json.dumps({"name": "poi_search", "arguments": {"address": text, "x": obj}}) + "\n</tool_call>"
  for reply in (text, call):
    _nav(reply)
    TEL.judge(phone_given, reply)
    NAV.judge(StepContext(text, NAV_HISTORY, reply, ({"odd": object()},), {"route": [A, B], "x": obj}, "navigation"), reply)


def _seconds(fn, text):
  """CPU seconds of ``fn(text)`` in this process (other processes on the cores do not count)."""
  t = time.process_time()
  fn(text)
  return time.process_time() - t


@pytest.mark.parametrize("make", [
  lambda n: "t a i p " * (n // 8),  # a run of tokens that prefixes a target
  lambda n: "1" * n,
  lambda n: "5 " * (n // 2),
  lambda n: "one two three " * (n // 14),
  lambda n: "1.1e1," * (n // 6),
  lambda n: "12°3'4\" " * (n // 8),
  lambda n: "".join(random.Random(0).choice("aB1 .-_") for _ in range(n)),
], ids=["prefix_run", "digits", "digit_tokens", "digit_words", "exponents", "angles", "mixed"])
def test_scans_are_linear(make):
  p = Privileged()
  p.add_string("t a i p e i" * 5, "long")
  p.add_string("Taipei", "city")
  p.add_number(Decimal("121.5409"), "lon")
  scanner = LeakScanner(p, [Decimal("11")])
  fn = lambda text: (scanner.scan(text, [{"a": text}]), p.minus_visible([text]))  # noqa: E731
  fn(make(2_000))
  small = min(_seconds(fn, make(2_500)) for _ in range(3))
  large = min(_seconds(fn, make(20_000)) for _ in range(3))
  # 8x the text: linear ~8x, quadratic ~64x (the floor absorbs cache effects on the small input)
  assert large < 3.0 and large < 24 * max(small, 2e-2), (small, large)


@given(st.decimals(min_value=-180, max_value=180, places=4), st.decimals(min_value=-90, max_value=90, places=4))
@settings(max_examples=100, deadline=None)
def test_coordinate_pairs_agree_with_the_literal_reading(lon, lat):
  text = f"at {lon},{lat} and {lon} , {lat}."
  assert coordinate_pairs(text) == coords_in(text)  # the reference: the rules' literal "lon,lat" pattern


def test_coordinate_pairs_read_what_the_tool_reads():
  for spelled in ("121.5409,25.0533", " +121.5409 , +25.0533", "1.215409e2,2.50533E1", "121.54_09,25.0533"):
    lon, lat = parse_location(spelled)
    assert coordinate_pairs(f"at {spelled}.") == {(lon.normalize(), lat.normalize())}, spelled
  assert coordinate_pairs("steps 2, 3 and 1.5, 200.5 or 181.5,2.5") == set()  # integers, a latitude over 90
  assert coordinate_pairs("1.5,2.5,3.5,4.5") == {(Decimal("1.5"), Decimal("2.5")), (Decimal("3.5"), Decimal("4.5"))}


def test_coordinates_the_tool_reads_are_the_ones_checked():
  for spelled in ("+121.5409,+25.0533", "1.215409e2,2.50533E1", "121.54_09,25.0533", "Yixing Temple 121.54090,25.05330"):
    assert parse_location(spelled) is not None  # the tool reads it ...
    assert "not_derivable" in _nav(nav_call("direction", origin=C_BJ, destination=spelled)).reasons  # ... so it is checked
