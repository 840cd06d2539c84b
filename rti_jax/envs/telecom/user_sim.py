"""A scripted, offline stand-in for tau2-bench's LLM user on Telecom.

Driven only by the task's user-scenario fields: ``reason_for_call`` (the opening
message), ``known_info`` (name, phone number, location), ``task_instructions``
(goal, how much data it will refuel, whether it changes plans or pays bills) and
``persona`` (Hard personas hold back their location and sound anxious). Given an
agent message it, in this order:

1. ends the call with a transfer when the agent has transferred it (tool call or
   a clear "you are being transferred" message);
2. answers identity questions from ``known_info`` (and only from it);
3. accepts or declines offers (refuel, plan change, roaming, payment) as
   ``task_instructions`` say;
4. performs the device actions the agent asks for, by tool name (with
   ``key="value"`` arguments) or by a clear description ("turn off airplane
   mode"), in the order they are mentioned (at most ``MAX_ACTIONS_PER_TURN``),
   and reports each tool's real output. Direction words are honoured: asked to
   turn off a setting that is already off, it says so instead of toggling;
5. ends the call (``user_stop``) once a tool it ran shows its goal holds
   (MMS sends / speed test excellent / status bar has signal);
6. otherwise asks for clarification.

Sentences in which the agent speaks of its own actions ("I've enabled roaming on
your line") are not read as requests. Unlike the LLM guidelines ("one action at a
time"), several clearly requested actions are done in sequence. Deterministic
given the seed (the seed only picks among phrasings).
"""

from __future__ import annotations

import dataclasses
import random
import re
from typing import Any

from rti_jax.envs.telecom import device_tools as dt
from rti_jax.envs.telecom import state as st
from rti_jax.envs.telecom.evaluation import ToolCallRecord
from rti_jax.envs.telecom.state import TelecomState
from rti_jax.envs.telecom.tasks import TelecomTask
from rti_jax.envs.telecom.user_text import MAX_WORD_CHARS, blank_words, named_calls, sentence_spans  # noqa: F401

MAX_ACTIONS_PER_TURN = 4
#: outdated or alternative names the user maps onto a device tool
TOOL_ALIASES = {"get_status_bar": "check_status_bar"}
#: toggle tool -> the phone setting it flips
TOGGLES = {"toggle_airplane_mode": "airplane_mode", "toggle_data": "data_enabled",
           "toggle_roaming": "roaming_enabled", "toggle_data_saver_mode": "data_saver_mode",
           "toggle_wifi": "wifi_enabled", "toggle_wifi_calling": "wifi_calling_enabled"}
_SETTING_WORDS = {"toggle_airplane_mode": "Airplane mode", "toggle_data": "Mobile data",
                  "toggle_roaming": "Data roaming", "toggle_data_saver_mode": "Data Saver",
                  "toggle_wifi": "Wi-Fi", "toggle_wifi_calling": "Wi-Fi Calling"}
PERMISSIONS = ("sms", "storage", "phone", "network", "camera", "location", "contacts")

_V = r"(?:turn|switch|toggle|enable|disable|activate|deactivate|make sure|ensure|set|put|take)"
# (tool, pattern) for requests by description; matched on one lower-cased sentence.
_DESCRIPTIONS: tuple[tuple[str, str], ...] = (
    ("check_status_bar", r"status bar|status icons?"),
    ("check_network_status", r"network status|network connection|connection status|check (?:your|the) (?:signal|network)"),
    ("set_network_mode_preference",
     r"(?:set|change|switch|select|update|choose)\w*\b[^.;]{0,50}(?:network mode|network type|preferred network|"
     r"network preference|4g_5g_preferred|4g/5g|5g|4g|lte)"),
    ("check_network_mode_preference", r"network mode|network type|preferred network|network preference"),
    ("check_sim_status", r"sim (?:card )?status|check (?:your|the) sim"),
    ("reseat_sim_card", r"re-?seat|re-?insert|remove and (?:re-?)?insert|take out (?:your|the) sim|pop out"),
    ("check_data_restriction_status", r"data restriction|restrict\w* data"),
    ("toggle_data_saver_mode", _V + r"\w*\b[^.;]{0,30}data saver"),
    ("reset_apn_settings", r"reset\w*\b[^.;]{0,30}apn|apn[^.;]{0,30}\breset|restore\w*\b[^.;]{0,30}apn"),
    ("check_apn_settings", r"\bapn\b|mmsc"),
    ("toggle_wifi_calling", _V + r"\w*\b[^.;]{0,30}wi-?fi calling"),
    ("check_wifi_calling_status", r"wi-?fi calling"),
    ("toggle_wifi", _V + r"\w*\b[^.;]{0,30}wi-?fi(?! calling)"),
    ("check_wifi_status", r"wi-?fi(?! calling)"),
    ("disconnect_vpn", r"(?:disconnect|turn off|switch off|disable|deactivate)\w*\b[^.;]{0,30}vpn|vpn[^.;]{0,20}\boff\b"),
    ("connect_vpn", r"\b(?:connect|turn on|switch on|enable|activate)\b[^.;]{0,30}vpn"),
    ("check_vpn_status", r"\bvpn\b"),
    ("check_installed_apps", r"installed apps|apps (?:are )?installed|which apps"),
    ("grant_app_permission", r"(?:grant|give|allow|enable)\w*\b[^.;]{0,50}permission|permission[^.;]{0,40}\b(?:grant|allow)"),
    ("check_app_permissions", r"permission"),
    ("run_speed_test", r"speed ?test|test (?:your|the) (?:internet |data |connection )?speed|check (?:your|the) (?:internet |data )?speed"),
    ("can_send_mms", r"(?:try|attempt|test|check|see|verify)\w*\b[^.;]{0,40}\bsend\w*\b[^.;]{0,25}(?:mms|picture|photo|multimedia)|"
                     r"(?:able to|can you|could you) (?:now )?send[^.;]{0,25}(?:mms|picture|photo)"),
    ("toggle_airplane_mode", _V + r"\w*\b[^.;]{0,30}(?:airplane|flight|aeroplane) mode"),
    ("toggle_roaming", _V + r"\w*\b[^.;]{0,30}roaming"),
    ("toggle_data", _V + r"\w*\b[^.;]{0,30}\b(?:mobile |cellular )?data\b(?! saver| roaming| usage| plan| limit| refuel)"),
    ("reboot_device", r"\breboot|restart\w*\b[^.;]{0,20}(?:phone|device)|power cycle|turn (?:your|the) (?:phone|device) off and"),
    ("make_payment", r"payment request|\bpay\b|make (?:the |a )?payment|complete (?:the )?payment"),
)
# A check pattern is suppressed in a sentence where its fix pattern matched.
_SHADOWS = {"set_network_mode_preference": "check_network_mode_preference",
            "toggle_data_saver_mode": "check_data_restriction_status",
            "reset_apn_settings": "check_apn_settings", "toggle_wifi_calling": "check_wifi_calling_status",
            "toggle_wifi": "check_wifi_status", "disconnect_vpn": "check_vpn_status",
            "connect_vpn": "check_vpn_status", "grant_app_permission": "check_app_permissions"}
# A described request is ignored in a sentence that is about something else.
_EXCLUDE = {"toggle_data": r"\bplan\b|refuel|\bgb\b|usage|allowance|limit|(?:more|extra|additional) data",
            "toggle_roaming": r"\bplan\b|\bcharge|\bfee\b"}
_AGENT_STATEMENT = re.compile(r"^\s*(?:i|we)(?:'ve|'ll| have| will| just| already| can see| see| checked| enabled| "
                              r"refueled| sent| resumed| added)\b")
_AGENT_SIDE = re.compile(r"\bme to\b|\bon (?:your|the) (?:line|account)\b|\bi'll\b|\bi will\b|\blet me\b|\bi can\b|\bour end\b")
_ARG_RE = re.compile(r"""(?<!\w)(\w+)\s*[=:]\s*(?:"([^"]*)"|'([^']*)'|([\w\-./:]+))""")

@dataclasses.dataclass(frozen=True)
class Goal:
  """What resolves the call: ``tools`` whose output the user trusts, and the check."""

  name: str  # "mms" | "speed" | "signal"
  tools: tuple[str, ...]

  def holds(self, state: TelecomState) -> bool:
    if self.name == "mms":
      return dt.can_send_mms_now(state)
    if self.name == "speed":
      return dt.internet_speed(state)[1] == "excellent"
    return state.phone.network_connection_status == "connected"


_STATUS_BAR_TOOLS = ("check_status_bar", "toggle_airplane_mode", "reseat_sim_card", "toggle_data",
                     "set_network_mode_preference", "reboot_device")


def goal_of(task: TelecomTask) -> Goal:
  """The user's success condition, read from the task's instructions."""
  text = task.task_instructions.lower()
  if "speed test returns excellent" in text or "excellent internet speed" in task.reason_for_call.lower():
    return Goal("speed", ("run_speed_test",))
  if "status bar shows that you have signal" in text or "no service" in task.reason_for_call.lower():
    return Goal("signal", _STATUS_BAR_TOOLS)
  if "mms" in task.reason_for_call.lower():
    return Goal("mms", ("can_send_mms",))
  raise ValueError(f"task {task.task_id!r}: cannot read a goal from its instructions")


@dataclasses.dataclass(frozen=True)
class UserProfile:
  """What the user knows and is willing to do, parsed from the task's fields."""

  name: str | None
  phone_number: str | None
  location: str | None  # e.g. "abroad in France"
  refuel_gb: float | None  # the most data it will buy; None: refuses
  accepts_plan_change: bool
  pays_bills: bool


def profile_of(task: TelecomTask) -> UserProfile:
  m = re.search(r"You are (?P<name>[A-Z][\w.' -]+?) with phone number (?P<phone>[\d-]+)", task.known_info)
  loc = re.search(r"You are currently (?P<loc>[^.]+)\.", task.known_info)
  refuel = re.search(r"willing to refuel (?P<gb>[\d.]+) ?GB", task.task_instructions)
  text = task.task_instructions.lower()
  return UserProfile(
      name=m.group("name") if m else None, phone_number=m.group("phone") if m else None,
      location=loc.group("loc") if loc else None,
      refuel_gb=float(refuel.group("gb")) if refuel else None,
      accepts_plan_change="not want to change your mobile data plan" not in text and "change plan" in text,
      pays_bills="asks you to pay a bill, you accept" in text)


@dataclasses.dataclass
class UserReply:
  """The user's turn: text shown to the agent, its device tool calls, and whether it
  ends the call ("user_stop" | "transfer" | None)."""

  content: str
  tool_calls: list[ToolCallRecord]
  stop: str | None = None
  understood: bool = True


def first_person(text: str) -> str:
  """Turns the task's second-person reason for call into the user's own words."""
  out = re.sub(r"\bYou mobile\b", "My mobile", text)
  for pat, rep in ((r"\bYou are\b", "I am"), (r"\byou are\b", "I am"), (r"\bYour\b", "My"),
                   (r"\byour\b", "my"), (r"\bYou\b", "I"), (r"\byou\b", "me")):
    out = re.sub(pat, rep, out)
  return out.strip()


@dataclasses.dataclass(frozen=True)
class Request:
  pos: int
  tool: str
  arguments: dict[str, Any]
  direction: str | None = None  # "on" | "off" for toggles asked with a direction


def _direction(sentence: str) -> str | None:
  s = re.sub(r"\bon (?:your|the|my) (?:phone|device|screen|end|line|account)\b", "", sentence)
  if re.search(r"\b(?:turn|switch|toggle|set|put)\w*\b[^.;]{0,30}?\boff\b|\bdisabl|\bdeactivat|\bis off\b|\bbe off\b", s):
    return "off"
  if re.search(r"\b(?:turn|switch|toggle|set|put)\w*\b[^.;]{0,30}?\bon\b|\benabl|\bactivat|\bis on\b|\bbe on\b", s):
    return "on"
  return None


def _mode_in(sentence: str) -> str | None:
  s = sentence.lower()
  for mode in st.NETWORK_MODES:
    if mode in s:
      return mode
  if re.search(r"4g ?only|lte only|only 4g", s):
    return "4g_only"
  if re.search(r"3g ?only|only 3g", s):
    return "3g_only"
  if re.search(r"5g|4g/5g|4g and 5g|lte|4g", s):
    return "4g_5g_preferred"
  return None


def _args_from_sentence(tool: str, sentence: str, phone: st.PhoneState) -> dict[str, Any] | None:
  """Arguments of a described request; None when they cannot be read."""
  if tool == "set_network_mode_preference":
    mode = _mode_in(sentence)
    return None if mode is None else {"mode": mode}
  if tool in ("grant_app_permission", "check_app_permissions", "check_app_status"):
    app = next((a for a in phone.app_permissions if a in sentence), "messaging")
    if tool != "grant_app_permission":
      return {"app_name": app}
    perm = next((p for p in PERMISSIONS if re.search(rf"\b{p}\b", sentence)), None)
    return None if perm is None else {"app_name": app, "permission": perm}
  return {}


# Settings an agent may later call "it" ("Airplane mode is on. Please turn it off.").
_FEATURES = (("toggle_airplane_mode", r"(?:airplane|flight|aeroplane) mode"), ("toggle_wifi_calling", r"wi-?fi calling"),
             ("toggle_data_saver_mode", r"data saver"), ("toggle_roaming", r"roaming"),
             ("toggle_wifi", r"wi-?fi(?! calling)"), ("toggle_data", r"(?:mobile|cellular) data"), ("vpn", r"\bvpn\b"))
_PRONOUN = re.compile(r"\b(?:turn|switch|toggle)\w*\s+(?:it|that|this)\b|\b(?:disable|enable|deactivate|activate)\w*\s+"
                      r"(?:it|that|this)\b")


def last_feature(text: str, prior: str | None = None) -> str | None:
  """The setting (toggle tool, or "vpn") mentioned last in ``text``, else ``prior``."""
  best, best_pos = prior, -1
  lowered = blank_words(text.lower())
  for feature, pattern in _FEATURES:
    for m in re.finditer(pattern, lowered):
      if m.start() > best_pos:
        best, best_pos = feature, m.start()
  return best


def _pronoun_request(sentence: str, pos: int, feature: str | None) -> Request | None:
  """"Turn it off" about the setting last mentioned."""
  if feature is None or not _PRONOUN.search(sentence):
    return None
  direction = _direction(sentence)
  if feature == "vpn":
    return None if direction is None else Request(pos, "disconnect_vpn" if direction == "off" else "connect_vpn", {})
  return Request(pos, feature, {}, direction)


def find_requests(text: str, phone: st.PhoneState,
                  prior_feature: str | None = None) -> tuple[list[Request], list[str]]:
  """Device actions requested in ``text`` (in order) and descriptions it could not complete.

  prior_feature: the setting the conversation last mentioned, for "turn it off".
  """
  requests: list[Request] = []
  unclear: list[str] = []
  feature = prior_feature
  for start, end in sentence_spans(text):
    sentence = text[start:end].lower()
    base = start
    named: set[str] = set()
    for name_pos, word, arg_text in named_calls(sentence):
      name = TOOL_ALIASES.get(word, word)
      if name not in dt.DEVICE_TOOLS:
        continue
      named.add(name)
      args = {k: a or b or c for k, a, b, c in _ARG_RE.findall(arg_text or "")}
      if dt.DEVICE_TOOLS[name].params and set(args) != set(dt.DEVICE_TOOLS[name].params):
        inferred = _args_from_sentence(name, sentence, phone)
        if inferred is None:
          unclear.append(name)
          continue
        args = {**inferred, **args}
      requests.append(Request(base + name_pos, name, args))
    if _AGENT_STATEMENT.search(sentence):
      feature = last_feature(sentence, feature)
      continue
    # Descriptions are matched on the sentence with identifiers (``toggle_wifi_calling``) and
    # overlong words blanked out, same length so positions still order the requests (a verb
    # pattern such as ``set\w*`` would otherwise rescan a long word from every "set" in it).
    prose = blank_words(sentence, long_words=True)
    claimed = set(named)
    for tool, pattern in _DESCRIPTIONS:
      m = re.search(pattern, prose)
      if m is None or tool in claimed or any(_SHADOWS.get(f) == tool for f in claimed):
        continue
      if tool in ("toggle_roaming", "make_payment") and _AGENT_SIDE.search(sentence):
        continue
      if tool in _EXCLUDE and re.search(_EXCLUDE[tool], prose):
        continue
      claimed.add(tool)
      args = _args_from_sentence(tool, sentence, phone)
      if args is None:
        unclear.append(tool)
        continue
      direction = _direction(sentence) if tool in TOGGLES else None
      requests.append(Request(base + m.start(), tool, args, direction))
    if not claimed & (set(TOGGLES) | {"connect_vpn", "disconnect_vpn"}):
      pronoun = _pronoun_request(prose, base, feature)
      if pronoun is not None:
        requests.append(pronoun)
    feature = last_feature(sentence, feature)
  requests.sort(key=lambda r: r.pos)
  seen: set[tuple[str, str, str | None]] = set()
  unique = []
  for r in requests:
    key = (r.tool, repr(sorted(r.arguments.items())), r.direction)
    if key not in seen:
      seen.add(key)
      unique.append(r)
  return unique, unclear


_OFFER_Q = re.compile(r"would you like|do you want|shall i|should i|may i|can i|is it ok|is that ok|do you agree|"
                      r"do you confirm|confirm|okay with|ok with|proceed|would you be|are you ok|sound good")
_REFUEL = re.compile(r"refuel|top.?up|add (?:more |extra |additional )?(?:\d+(?:\.\d+)? ?gb|data)|additional data|extra data|more data")
_PLAN = re.compile(r"(?:change|switch|upgrade|move)\w*\b[^.;?]{0,30}plan|new plan|different plan|another plan")
_ROAM_OFFER = re.compile(r"enabl\w* (?:international |data )?roaming|roaming (?:on|for) your line")
_PAY_OFFER = re.compile(r"\bpay\b|payment")
_TRANSFER = re.compile(r"transferr?(?:ed|ing)? (?:you )?to (?:a )?human|you are being transferred")


class ScriptedUser:
  """One user for one episode; mutates ``state`` through its device tools."""

  def __init__(self, task: TelecomTask, state: TelecomState, seed: int = 0):
    self.task = task
    self.state = state
    self.goal = goal_of(task)
    self.profile = profile_of(task)
    self.rng = random.Random(seed)
    self.fix_attempts = 0
    self.failed_checks = 0
    self.unmapped = 0
    self.last_feature: str | None = None

  # --------------------------------------------------------------------------- opening

  def opening(self) -> str:
    """The first user message: the problem, in the user's words."""
    greeting = self.rng.choice(("Hi!", "Hello.", "Hi there."))
    parts = [greeting, first_person(self.task.reason_for_call)]
    if self.profile.location and self.task.persona_level != "Hard":
      parts.append(f"I am currently {self.profile.location}.")
    parts.append(self.rng.choice(("Can you help me?", "Can you help me fix this?", "Please help.")))
    if self.task.persona_level == "Hard":
      parts.append(self.rng.choice(("I'm not good with technology.", "This makes me nervous.")))
    return " ".join(parts)

  # --------------------------------------------------------------------------- turns

  def respond(self, agent_message: str, transferred: bool = False) -> UserReply:
    """The user's reply to one agent message."""
    text = agent_message.lower()
    if transferred or _TRANSFER.search(text):
      return UserReply("Okay, thank you. ###TRANSFER###", [], stop="transfer")
    parts: list[str] = []
    parts.extend(self._identity_answers(text))
    parts.extend(self._offer_answers(text))
    requests, unclear = find_requests(agent_message, self.state.phone, self.last_feature)
    self.last_feature = last_feature(agent_message, self.last_feature)
    calls: list[ToolCallRecord] = []
    goal_seen: bool | None = None
    for req in requests[:MAX_ACTIONS_PER_TURN]:
      if req.tool == "make_payment":
        report, new_calls = self._pay()
        parts.append(report)
        calls.extend(new_calls)
        continue
      already = self._already_set(req)
      if already:
        parts.append(already)
        continue
      output, ok = dt.run_device_tool(self.state, req.tool, req.arguments)
      calls.append(ToolCallRecord("user", req.tool, dict(req.arguments), ok, output))
      parts.append(f"I ran {req.tool}: {output}")
      if ok and dt.DEVICE_TOOLS[req.tool].writes:
        self.fix_attempts += 1
      if req.tool in self.goal.tools:
        goal_seen = self.goal.holds(self.state)
    if len(requests) > MAX_ACTIONS_PER_TURN:
      parts.append("That's a lot of steps; I did the first few. What should I do next?")
    if _wants_goal_check(text) and goal_seen is None and not any(c.name in self.goal.tools for c in calls):
      tool = self.goal.tools[0]
      output, ok = dt.run_device_tool(self.state, tool, {})
      calls.append(ToolCallRecord("user", tool, {}, ok, output))
      parts.append(f"I ran {tool}: {output}")
      goal_seen = self.goal.holds(self.state)
    if goal_seen:
      parts.append(self.rng.choice(("Great, it works now. Thank you!", "That fixed it, thanks!")))
      return UserReply(" ".join(parts) + " ###STOP###", calls, stop="user_stop")
    if goal_seen is False and self.fix_attempts > 0:
      self.failed_checks += 1
      parts.append("Hmm, that didn't fix it." if self.failed_checks == 1 else "It's still not working.")
    for tool in unclear:
      parts.append(f"Which settings should I use for {tool}?")
    if not parts:
      self.unmapped += 1
      return UserReply(self._clarify(), calls, understood=False)
    return UserReply(" ".join(parts), calls)

  # --------------------------------------------------------------------------- pieces

  def _clarify(self) -> str:
    return self.rng.choice((
        "Sorry, I'm not sure what you want me to do. What exactly should I check or change on my phone?",
        "I don't understand. Could you tell me exactly what to do on my phone?"))

  def _identity_answers(self, text: str) -> list[str]:
    p = self.profile
    out = []
    asks_phone = re.search(r"phone number|mobile number|your number|number (?:on|associated)", text)
    if asks_phone:
      out.append(f"My phone number is {p.phone_number}." if p.phone_number else "I don't know my number.")
    if re.search(r"\byour (?:full )?name\b|who am i speaking|may i have your name|name on the account", text):
      out.append(f"My name is {p.name}." if p.name else "I'd rather not say.")
    if re.search(r"date of birth|birthday|\bdob\b|born", text):
      out.append("I don't have my date of birth handy" + (f"; my phone number is {p.phone_number}." if p.phone_number else "."))
    if re.search(r"customer id|account (?:id|number)", text) and not asks_phone:
      out.append("I don't know my customer ID" + (f"; my phone number is {p.phone_number}." if p.phone_number else "."))
    if re.search(r"where are you|your (?:current )?location|are you (?:currently )?(?:abroad|travel|overseas|in the|at home|outside)|"
                 r"which country|travell?ing", text):
      out.append(f"I am currently {p.location}." if p.location else "I'm not sure that matters; I'm where I usually am.")
    if re.search(r"describe (?:the|your) (?:issue|problem)|what (?:seems to be|is) the (?:issue|problem)|how can i help|"
                 r"tell me (?:a bit |a little )?more|more (?:details|information)|what happened", text):
      out.append(first_person(self.task.reason_for_call))
    return out

  def _offer_answers(self, text: str) -> list[str]:
    p = self.profile
    out = []
    is_offer = "?" in text or _OFFER_Q.search(text) or re.search(r"anything else", text)
    if not is_offer:
      return out
    reading = blank_words(text, identifiers=False, long_words=True)  # else _PLAN, _ROAM_OFFER rescan long words
    plan = _PLAN.search(reading)
    if plan:
      out.append("Yes, I'd like to change my plan." if p.accepts_plan_change else "No, I don't want to change my plan.")
    if _REFUEL.search(text) and (not plan or re.search(r"refuel|top.?up", text)):
      if p.refuel_gb is None:
        out.append("No, I don't want to buy more data.")
      else:
        out.append(f"Yes, please add {p.refuel_gb:g} GB of data.")
    if _ROAM_OFFER.search(reading) and "me to" in text:
      out.append("Yes, please enable roaming on my line.")
    if _PAY_OFFER.search(text) and not re.search(r"payment request", text) and "me to" in text:
      out.append("Yes, I'll pay the bill." if p.pays_bills else "No, I don't want to pay anything now.")
    if not out and re.search(r"anything else", text):
      out.append("Yes, my problem is not solved yet.")
    if not out and _OFFER_Q.search(text) and "?" in text:
      out.append("Yes, please go ahead.")
    return out

  def _already_set(self, req: Request) -> str | None:
    """A report instead of a toggle when the setting already has the requested value."""
    if req.direction is None or req.tool not in TOGGLES:
      return None
    current = getattr(self.state.phone, TOGGLES[req.tool])
    if current == (req.direction == "on"):
      return f"{_SETTING_WORDS[req.tool]} is already {req.direction.upper()}."
    return None

  def _pay(self) -> tuple[str, list[ToolCallRecord]]:
    """Checks the payment request and pays it when the instructions accept paying bills."""
    st.sync_surroundings(self.state)
    output, ok = dt.run_device_tool(self.state, "check_payment_request", {})
    calls = [ToolCallRecord("user", "check_payment_request", {}, ok, output)]
    if self.state.surroundings.payment_request is None:
      return f"I ran check_payment_request: {output}", calls
    if not self.profile.pays_bills:
      return f"I ran check_payment_request: {output} I don't want to pay it now.", calls
    paid, ok = dt.run_device_tool(self.state, "make_payment", {})
    calls.append(ToolCallRecord("user", "make_payment", {}, ok, paid))
    self.fix_attempts += 1
    return f"I ran check_payment_request: {output} I ran make_payment: {paid}", calls


def _wants_goal_check(text: str) -> bool:
  return bool(re.search(r"is it working|working now|try again|is the (?:issue|problem) (?:resolved|fixed)|"
                        r"does it work|has (?:that|this|it) (?:fixed|resolved|helped)", text))
