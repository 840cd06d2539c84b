"""The customer side of a tau2 Retail / Airline conversation: a scripted user (offline) or tau2's own
LLM user simulator pointed at an OpenAI-compatible server.

``ScriptedUser`` is built from one task: its ``user_scenario`` (reason for the call, what the user
knows and does not know, its instructions) and its gold write calls, which stand for what the user
wants done (the scenario says it in words; the gold calls say it exactly). Given an agent message
it, in this order:

1. ends the call with tau2's ``###TRANSFER###`` when the agent says it is transferring the call;
2. answers a proposal to change something (a question asking to go ahead with a cancel, return,
   exchange, modification, booking, ...): "yes" when the message names every value of a write the
   user still wants (its order / reservation id, item ids, payment method, flights, passengers,
   amounts, in any spelling ``intervention.leaks`` folds together), else "no" (with its request
   again when the target was right but the details were not);
3. answers identity and detail questions from its scenario only: e-mail, name, zip code, user id,
   order and reservation ids (or says it does not remember them, as the scenario's unknown info
   says), payment method, cancellation reason, address;
4. follows the scenario's "if the agent asks / says X, say Y" instructions (once each);
5. ends the call with tau2's ``###STOP###`` when nothing it wants is left (every wanted write done,
   every fact it asked for told) and the agent wraps up, declines, or reports a result; while
   something is left, it asks again (at most ``MAX_PUSHES`` times without progress, then gives up);
6. otherwise restates its request, one part of the scenario at a time, and gives up after
   ``MAX_IDLE`` turns in a row that it could not read.

The scripted user never calls tools (neither domain has user-side tools). It is deterministic.
``LLMUser`` is tau2's user-simulator prompt (its guidelines and the task's scenario) answered by a
chat model over HTTP (``generation.openai_chat``), with deadlines and bounded retries.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterable

from rti_jax.envs.tau2.bridge import OUT_OF_SCOPE, STOP, TRANSFER, tau2_modules
from rti_jax.intervention.leaks import Matcher, fold, numbers_in

MAX_PUSHES = 3  # asks for what is still missing at most this many times in a row without progress
MAX_IDLE = 4  # turns in a row it could not read before it gives up

# --------------------------------------------------------------------------- reading the scenario

_USER_ID_RE = re.compile(r"\b[a-z]+_[a-z]+_\d{3,5}\b")
_EMAIL_RE = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_ZIP_RE = re.compile(r"(?<![\d-])\d{5}(?![\d-])")
_NAME_RE = re.compile(r"\b(?:[Yy]ou are|[Yy]our? name is|[Yy]ou're|called)\s+(?:user\s+)?"
                      r"([A-Z][a-z]+(?:[ -][A-Z][a-z]+){1,2})\b")
_ORDER_RE = re.compile(r"#W\d{7}\b")
_RESERVATION_RE = re.compile(r"\b(?!HAT\d{3}\b)(?=[A-Z0-9]*\d)(?=[A-Z0-9]*[A-Z])[A-Z0-9]{6}\b")
_NOT_KNOWN = r"(?:do not|don't|dont|can't|cannot|do n't) (?:remember|know|recall|have)"


@dataclasses.dataclass(frozen=True)
class UserFacts:
  """What the user can say about itself, read from its scenario (nothing else)."""

  first_name: str | None
  last_name: str | None
  zip_code: str | None
  emails: tuple[str, ...]
  user_id: str | None
  order_ids: tuple[str, ...]
  reservation_ids: tuple[str, ...]
  knows_email: bool
  knows_ids: bool


def _instructions(scenario: Any) -> Any:
  return getattr(scenario, "instructions", scenario)


def scenario_text(scenario: Any, *fields: str) -> str:
  """The named fields of a tau2 ``UserScenario``'s instructions (all four when none), joined."""
  ins = _instructions(scenario)
  if isinstance(ins, str):
    return ins
  fields = fields or ("reason_for_call", "known_info", "unknown_info", "task_instructions")
  return "\n".join(str(getattr(ins, f, "") or "") for f in fields)


def facts_of(scenario: Any) -> UserFacts:
  """The user's name, zip code, e-mails, user id and order / reservation ids, as its scenario gives them."""
  known = scenario_text(scenario, "known_info")
  everything = scenario_text(scenario, "known_info", "reason_for_call", "task_instructions")
  unknown = scenario_text(scenario, "unknown_info").lower()
  name = _NAME_RE.search(known) or _NAME_RE.search(everything)
  parts = name.group(1).replace("-", " ").split() if name else []
  zips = _ZIP_RE.findall(known) or _ZIP_RE.findall(everything)
  user_id = _USER_ID_RE.search(known) or _USER_ID_RE.search(everything)
  if len(parts) < 2 and user_id:  # "You are mei_kovacs_8020": the user knows its own name
    parts = [w.capitalize() for w in user_id.group(0).split("_")[:2]]
  return UserFacts(
      first_name=parts[0] if parts else None, last_name=parts[-1] if len(parts) > 1 else None,
      zip_code=zips[0] if zips else None,
      emails=tuple(dict.fromkeys(_EMAIL_RE.findall(known) or _EMAIL_RE.findall(everything))),
      user_id=user_id.group(0) if user_id else None,
      order_ids=tuple(dict.fromkeys(_ORDER_RE.findall(everything))),
      reservation_ids=tuple(dict.fromkeys(_RESERVATION_RE.findall(everything))),
      knows_email=not re.search(_NOT_KNOWN + r"[^.]*\bemail", unknown),
      knows_ids=not re.search(_NOT_KNOWN + r"[^.]*\b(?:order|reservation)", unknown + " " + everything.lower()))


_SUBJECT_VERBS = (r"want|wish|would|will|'d|have|had|do|did|don't|dont|need|think|just|can|can't|cannot|"
                  r"prefer|also|only|still|might|may|should|like|live|moved|bought|ordered|made|booked|plan|"
                  r"realize|remember|forgot|know|recently|received|are|were|go|get|got|feel|love|hate|"
                  r"believe|thought|mean|used|paid|recall|expect|say|mention|ask|insist|accept|agree|"
                  r"decide|end|reside|own|value|suspect|intend|used|never|always|already|really|lost")
_FIRST_PERSON = (
    (re.compile(r"\b[Yy]ou are\b"), "I am"), (re.compile(r"\b[Yy]ou were\b"), "I was"),
    (re.compile(r"\b[Yy]ou're\b"), "I'm"), (re.compile(r"\b[Yy]ou'd\b"), "I'd"), (re.compile(r"\b[Yy]ou've\b"), "I've"),
    (re.compile(r"\b[Yy]ou'll\b"), "I'll"), (re.compile(r"\b[Yy]ourself\b"), "myself"),
    (re.compile(r"\b[Yy]ours\b"), "mine"), (re.compile(r"\bYour\b"), "My"), (re.compile(r"\byour\b"), "my"),
    (re.compile(r"\bYou name\b"), "My name"),
    (re.compile(r"\b[Yy]ou(?=\s+(?:\w+ed\b|" + _SUBJECT_VERBS + r")\b)"), "I"),
    (re.compile(r"(?:(?<=^)|(?<=[.!?:;]\s)|(?<=\n))[Yy]ou\b"), "I"),
    (re.compile(r"\bYou\b"), "I"), (re.compile(r"\byou\b"), "me"),
)


def first_person(text: str) -> str:
  """The scenario's second-person text in the user's own voice ("You want your order" -> "I want my order")."""
  out = text.strip()
  for pattern, repl in _FIRST_PERSON:
    out = pattern.sub(repl, out)
  return out


def sentences(text: str) -> list[str]:
  """``text`` cut into sentences (on . ! ? and line breaks), stripped, empty ones dropped."""
  return [s.strip() for s in re.split(r"(?<=[.!?])\s+|\n+", text or "") if s.strip()]


_WISH_RE = re.compile(r"\b(want|would like|wish|prefer|need|willing|ok with|okay with|fine with|happy with|"
                      r"like to|go for|rather|only)\b", re.IGNORECASE)
_META_RE = re.compile(r"\b(agent|if and only if|do not volunteer|don't volunteer|this is incorrect|meant to test|"
                      r"persona|you are (?:a |an )?(?:\w+ )?(?:person|customer|guy)|reactive|polite|"
                      r"terse|impatient|persistent|calm|emotional|upset|stressed)\b", re.IGNORECASE)


def restatements(scenario: Any) -> list[str]:
  """What the user says when it repeats its request: its reason for calling, then each wish of its
  instructions (sentences that say what it wants, without the ones about the agent or its manner)."""
  out = [first_person(scenario_text(scenario, "reason_for_call")).replace("\n", " ")]
  for s in sentences(scenario_text(scenario, "task_instructions")):
    if _WISH_RE.search(s) and not _META_RE.search(s) and not s.lower().startswith(("if ", "you are ", "you're ")):
      out.append(first_person(s))
  return [re.sub(r"\s+", " ", s) for s in out if s.strip()]


_COND_RE = re.compile(r"^if (?:the )?(?:service )?agent (asks|says|tells you|mentions|insists|denies|cannot|can't|"
                      r"offers|gives you)\b(.*?),\s*(?:then\s+)?(.+)$", re.IGNORECASE | re.DOTALL)
_STOPWORDS = frozenset("the a an you your yours for of to that this is it if and or be are was were with about "
                       "on in at by from as any some how many much what which who asks says tells".split())


@dataclasses.dataclass(frozen=True)
class Conditional:
  """One "if the agent asks / says X, say Y" instruction: the words of X and the reply Y."""

  asks: bool
  words: tuple[str, ...]
  reply: str

  def fires(self, text_lower: str) -> bool:
    if self.asks and "?" not in text_lower:
      return False
    hits = sum(1 for w in self.words if re.search(rf"\b{re.escape(w)}", text_lower))
    return bool(self.words) and hits * 3 >= 2 * len(self.words)


def conditionals(scenario: Any) -> list[Conditional]:
  """The scenario's "if the agent ..., say ..." instructions that the scripted user follows (the ones
  about a confirmation are left to its proposal rule)."""
  out = []
  for s in sentences(scenario_text(scenario, "reason_for_call", "task_instructions")):
    m = _COND_RE.match(s)
    if not m or "confirm" in m.group(2).lower():
      continue
    words = tuple(w for w in re.findall(r"[a-z]{3,}", m.group(2).lower()) if w not in _STOPWORDS)
    reply = re.sub(r"^(?:say|mention|tell (?:them|the agent)|explain|respond)(?: that)?\s+", "", m.group(3).strip(),
                   flags=re.IGNORECASE)
    out.append(Conditional(asks=m.group(1).lower() == "asks", words=words[:6],
                           reply=first_person(reply[:1].upper() + reply[1:])))
  return out


# --------------------------------------------------------------------------- what the user wants done

#: argument keys whose value names the call's target (in this order)
TARGET_KEYS = ("order_id", "reservation_id", "user_id")
#: argument keys whose values a proposal need not name (free text)
_FREE_KEYS = frozenset({"summary", "expression"})
#: argument keys whose numbers a proposal must name (counts of bags, amounts)
_NUMBER_KEYS = frozenset({"amount", "total_baggages", "nonfree_baggages"})


@dataclasses.dataclass(frozen=True)
class Wish:
  """A write call the user wants made (a gold call): the values a proposal of it must name.

  strings: folded string values (ids, names, dates, options); a payment id may also be named by its
    digits alone. numbers: non-zero counts and amounts.
  """

  name: str
  arguments: dict[str, Any]
  strings: tuple[str, ...]
  alternatives: dict[str, str]
  numbers: tuple[float, ...]

  @property
  def target(self) -> str | None:
    for key in TARGET_KEYS:
      if isinstance(self.arguments.get(key), str):
        return self.arguments[key]
    return None


def _leaves(obj: Any, key: str | None = None) -> Iterable[tuple[str | None, Any]]:
  if isinstance(obj, dict):
    for k, v in obj.items():
      yield from _leaves(v, str(k))
  elif isinstance(obj, (list, tuple)):
    for v in obj:
      yield from _leaves(v, key)
  else:
    yield key, obj


def wish_of(name: str, arguments: dict[str, Any]) -> Wish:
  strings: list[str] = []
  alternatives: dict[str, str] = {}
  numbers: list[float] = []
  for key, leaf in _leaves(arguments):
    if key in _FREE_KEYS or isinstance(leaf, bool) or leaf is None:
      continue
    if isinstance(leaf, (int, float)):
      if key in _NUMBER_KEYS and leaf != 0:
        numbers.append(float(leaf))
      continue
    folded = fold(leaf)
    if len(folded) < 3:
      continue  # "no", "TX": too short to look for
    strings.append(folded)
    m = re.fullmatch(r"[a-z_]+_(\d{4,})", str(leaf))
    if m:  # a payment id: its digits alone name it too
      alternatives[folded] = m.group(1)
  return Wish(name=name, arguments=dict(arguments), strings=tuple(dict.fromkeys(strings)), alternatives=alternatives,
              numbers=tuple(numbers))


def named(wish: Wish, text: str) -> tuple[int, int]:
  """(how many of ``wish``'s values ``text`` names, how many it has)."""
  targets = {s: s for s in wish.strings}
  targets.update({alt: s for s, alt in wish.alternatives.items()})
  found = {targets[k] for k in Matcher(targets).find(text)}
  said = {float(v) for v, _ in numbers_in(text)}
  hits = len(found) + sum(1 for n in wish.numbers if n in said)
  return hits, len(wish.strings) + len(wish.numbers)


# --------------------------------------------------------------------------- reading the agent

_CONFIRM_RE = re.compile(
    r"\b(confirm|proceed|go ahead|shall i|should i|would you like (?:me )?to|do you want (?:me )?to|want me to|"
    r"ok(?:ay)? (?:to|with)|is (?:that|this) (?:correct|right|ok|okay)|yes or no|yes/no|agree|sound good|"
    r"can i (?:go ahead|process|submit))\b", re.IGNORECASE)
_WRITE_WORD_RE = re.compile(
    r"\b(cancel\w*|return\w*|exchang\w*|modif\w*|chang\w*|updat\w*|upgrad\w*|downgrad\w*|book\w*|add\w*|remov\w*|"
    r"switch\w*|refund\w*|compensat\w*|certificate|voucher|replac\w*|swap\w*|process\w*|submit\w*)\b", re.IGNORECASE)
_TRANSFER_RE = re.compile(r"being transferred|transferring you|transfer(?:red)? you to|will transfer|"
                          r"connect(?:ing)? you (?:to|with) a human|hand(?:ing)? you over", re.IGNORECASE)
_CLOSING_RE = re.compile(r"anything else|something else|any other (?:question|request|thing)|have a (?:great|nice|"
                         r"good|wonderful|lovely)|goodbye|good bye|take care|glad i could help|happy to help|"
                         r"further assistance", re.IGNORECASE)
_DONE_RE = re.compile(r"\b(?:has|have) (?:now )?been\b|\bsuccessfully\b|\bis now\b|\bare now\b|\ball set\b|\bdone\b|"
                      r"\bcompleted?\b|\bprocessed\b|\bconfirmed\b", re.IGNORECASE)
_DECLINE_RE = re.compile(r"\b(cannot|can't|can not|unable|not able|not possible|not allowed|not eligible|"
                         r"unfortunately|sorry|won't be able|doesn't allow|does not allow|isn't possible|"
                         r"is not possible|against (?:our|the) policy)\b", re.IGNORECASE)
_WAIT_RE = re.compile(r"\b(let me|one moment|just a moment|please wait|bear with me|i(?:'ll| will) (?:now )?"
                      r"(?:check|look|find|search|pull|review|verify))\b", re.IGNORECASE)
_ASK_RE = re.compile(r"\?|\b(?:please (?:provide|share|give|tell|let me know|confirm|specify)|could you|can you|"
                     r"may i (?:have|get|ask)|what is|what's|which)\b", re.IGNORECASE)

# (topic, pattern) of detail questions, matched on the lower-cased agent text
_TOPICS = (
    ("email", r"e-?mail"),
    ("user_id", r"user ?id|user name|username|account id|customer id"),
    ("name", r"\bname\b"),
    ("zip", r"\bzip|postal code|post code"),
    ("order_id", r"order (?:id|number|#)|which order|order ids|the order you"),
    ("reservation_id", r"reservation (?:id|number|code)|confirmation (?:number|code)|booking (?:id|number|"
                       r"reference|code)|which reservation|which booking"),
    ("payment", r"payment method|pay with|pay for|which card|refund (?:to|it to|go)|method of payment|"
                r"how would you like to pay|gift card or|credit card or|paypal or"),
    ("reason", r"\breason\b|\bwhy\b"),
    ("address", r"\baddress\b"),
)


#: kinds of change, as words in a text, and the write tools of each kind
_KIND_RES = (
    ("cancel", re.compile(r"\bcancel", re.IGNORECASE)),
    ("return", re.compile(r"\breturn", re.IGNORECASE)),
    ("exchange", re.compile(r"\b(?:exchang|swap)", re.IGNORECASE)),
    ("modify", re.compile(r"\b(?:modif|chang|updat|switch|replac|upgrad|downgrad)", re.IGNORECASE)),
    ("address", re.compile(r"\baddress", re.IGNORECASE)),
    ("book", re.compile(r"\bbook(?!ing (?:id|number|code|reference))", re.IGNORECASE)),
    ("baggage", re.compile(r"\b(?:bag|luggage|suitcase)", re.IGNORECASE)),
    ("passenger", re.compile(r"\bpassenger", re.IGNORECASE)),
    ("compensation", re.compile(r"\b(?:certificate|voucher|compensat)", re.IGNORECASE)),
)
WRITE_KINDS: dict[str, frozenset[str]] = {
    "cancel_pending_order": frozenset({"cancel"}),
    "return_delivered_order_items": frozenset({"return"}),
    "exchange_delivered_order_items": frozenset({"exchange"}),
    "modify_pending_order_items": frozenset({"modify", "exchange"}),
    "modify_pending_order_address": frozenset({"modify", "address"}),
    "modify_pending_order_payment": frozenset({"modify"}),
    "modify_user_address": frozenset({"modify", "address"}),
    "book_reservation": frozenset({"book"}),
    "cancel_reservation": frozenset({"cancel"}),
    "update_reservation_flights": frozenset({"modify"}),
    "update_reservation_baggages": frozenset({"modify", "baggage"}),
    "update_reservation_passengers": frozenset({"modify", "passenger"}),
    "send_certificate": frozenset({"compensation"}),
}


def kinds_in(text: str) -> set[str]:
  """The kinds of change ``text`` speaks of (cancel, return, exchange, modify, address, book, ...)."""
  return {kind for kind, pattern in _KIND_RES if pattern.search(text)}


@dataclasses.dataclass
class UserReply:
  """The user's turn: its text, whether it ends the call (``"stop"``, ``"transfer"`` or None), and
  whether the scripted user could read the agent's message."""

  content: str
  stop: str | None = None
  understood: bool = True


class ScriptedUser:
  """The offline customer of one task (see the module docstring).

  scenario: the task's tau2 ``UserScenario``.
  wishes: the write calls the user wants made, in order (the gold writes that do not fail on purpose).
  communicate: facts the agent must tell the user (the task's ``communicate_info``).
  """

  def __init__(self, scenario: Any, wishes: Iterable[Wish], communicate: Iterable[str] = ()) -> None:
    self.scenario = scenario
    self.facts = facts_of(scenario)
    self.wishes = list(wishes)
    self.communicate = [str(c) for c in communicate]
    self.restatements = restatements(scenario)
    self.conditionals = conditionals(scenario)
    self._fired: set[int] = set()
    self._said: list[str] = []  # every agent text so far (for the communicate check)
    self._next_restatement = 1  # the opening already said the first one
    self._pushes = 0
    self._idle = 0
    self._left_before = len(self.wishes)

  # -------------------------------------------------------------------------- turns

  def opening(self) -> str:
    """The user's first message: its reason for calling, in its own words."""
    return "Hi! " + (self.restatements[0] if self.restatements else "I need some help with my account.")

  def remaining(self, done_calls: Iterable[tuple[str, dict[str, Any]]]) -> list[Wish]:
    """The wishes not yet met by a successful write in ``done_calls`` (same tool, same target)."""
    done = [(name, _target(args)) for name, args in done_calls]
    left = []
    for wish in self.wishes:
      key = (wish.name, wish.target)
      if key in done:
        done.remove(key)
      else:
        left.append(wish)
    return left

  def untold(self) -> list[str]:
    """The facts the agent has not told yet (tau2's rule: a substring of an agent text, commas dropped)."""
    said = [t.lower().replace(",", "") for t in self._said]
    return [c for c in self.communicate if not any(c.lower() in t for t in said)]

  def respond(self, text: str, done_calls: Iterable[tuple[str, dict[str, Any]]] = ()) -> UserReply:
    """The user's answer to the agent message ``text``; ``done_calls``: every successful write so far."""
    self._said.append(text)
    low = text.lower()
    left = self.remaining(done_calls)
    if len(left) < self._left_before:
      self._pushes = 0
    self._left_before = len(left)
    if _TRANSFER_RE.search(text):
      return UserReply(TRANSFER, stop="transfer")
    asks = bool(_ASK_RE.search(text))
    parts: list[str] = []
    topics = [t for t, pat in _TOPICS if re.search(pat, low)]
    if _CONFIRM_RE.search(text) and (any(named(w, text)[0] for w in left) or (_WRITE_WORD_RE.search(text)
                                                                              and not topics)):
      parts.append(self._proposal(text, left))
    else:
      for i, cond in enumerate(self.conditionals):
        if i not in self._fired and cond.fires(low):
          self._fired.add(i)
          parts.append(cond.reply)
          break
      if asks:
        parts.extend(self._answers(topics, left))
    if parts:
      self._idle = 0
      return UserReply(" ".join(parts))
    untold = self.untold()
    wrapping_up = bool(_CLOSING_RE.search(text) or _DECLINE_RE.search(text) or _DONE_RE.search(text))
    if not left and (not untold or _CLOSING_RE.search(text) or _DECLINE_RE.search(text)):
      if wrapping_up or not asks:
        if _WAIT_RE.search(text) and not wrapping_up:
          return UserReply("Okay, thank you.")
        return UserReply(f"Thank you, that's all I needed. {STOP}", stop="stop")
    if left and wrapping_up:
      self._pushes += 1
      if self._pushes > MAX_PUSHES:
        return UserReply(f"I see. I'll leave it there for now. {STOP}", stop="stop")
      return UserReply("But that is not everything I asked for. " + self._restate())
    if untold and not left and wrapping_up:
      return UserReply("Could you answer my question? " + self._restate())
    if _WAIT_RE.search(text) and not asks:
      return UserReply("Okay, thank you.")
    self._idle += 1
    if self._idle >= MAX_IDLE:
      return UserReply(f"I don't think we are getting anywhere. {STOP}", stop="stop", understood=False)
    return UserReply(("I'm not sure what you mean. " if asks else "") + self._restate(), understood=False)

  # -------------------------------------------------------------------------- pieces

  def _restate(self, main: bool = False) -> str:
    """The next part of the request (with ``main``, its reason for calling)."""
    if not self.restatements:
      return "Can you help me with my request?"
    if main:
      return self.restatements[0]
    s = self.restatements[self._next_restatement % len(self.restatements)]
    self._next_restatement += 1
    return s

  def _proposal(self, text: str, left: list[Wish]) -> str:
    """Yes to a proposal that names every value of a wanted write; no (with the request again) to one
    about a wanted write's target or kind that gets its details wrong; yes to one of a kind the
    scenario asks for that no wanted write has (the user asked for it: declining is the agent's
    part); no otherwise."""
    for wish in left:
      hits, total = named(wish, text)
      if total and hits == total:
        return "Yes, please go ahead."
    proposed = kinds_in(text)
    for wish in left:
      same_kind = not proposed or bool(WRITE_KINDS.get(wish.name, frozenset()) & proposed)
      if same_kind and wish.target and Matcher({fold(wish.target): wish.target}).find(text):
        return "No, that is not exactly what I want. " + self._restate(main=True)
    wanted = set().union(*(WRITE_KINDS.get(w.name, frozenset()) for w in left)) if left else set()
    asked = kinds_in(scenario_text(self.scenario, "reason_for_call", "task_instructions"))
    if proposed & asked and not proposed & wanted:
      return "Yes, please go ahead."
    if left:
      return "No, that is not what I want. " + self._restate(main=True)
    return "No, please don't do that."

  def _answers(self, topics: list[str], left: list[Wish]) -> list[str]:
    f = self.facts
    out: list[str] = []
    if "email" in topics:
      out.append(f"My email is {f.emails[0]}." if f.emails and f.knows_email else "I don't remember my email address.")
    if "user_id" in topics:
      out.append(f"My user id is {f.user_id}." if f.user_id else "I don't know my user id.")
    if "name" in topics and "user_id" not in topics and f.first_name:
      full = f"{f.first_name} {f.last_name}" if f.last_name else f.first_name
      out.append(f"My name is {full}.")
    if "zip" in topics:
      out.append(f"My zip code is {f.zip_code}." if f.zip_code else "I'm not sure about my zip code.")
    if "order_id" in topics:
      out.append(f"The order id is {', '.join(f.order_ids)}." if f.order_ids and f.knows_ids
                 else "I don't remember the order id. Can you look it up?")
    if "reservation_id" in topics:
      out.append(f"The reservation id is {', '.join(f.reservation_ids)}." if f.reservation_ids and f.knows_ids
                 else "I don't remember the reservation id. Can you look it up?")
    if "payment" in topics:
      out.append(self._payment(left))
    if "reason" in topics:
      out.append(self._reason(left))
    if "address" in topics and "email" not in topics:
      out.append(self._address(left))
    return [s for s in out if s]

  def _payment(self, left: list[Wish]) -> str:
    said = [s for s in sentences(scenario_text(self.scenario)) if re.search(
        r"\b(pay|paypal|gift ?card|credit card|card ending|certificate|refund|original payment)", s, re.IGNORECASE)]
    if said:
      return first_person(said[0])
    for wish in left:
      for key in ("payment_method_id", "payment_id"):
        if isinstance(wish.arguments.get(key), str):
          kind = wish.arguments[key].rsplit("_", 1)[0].replace("_", " ")
          return f"Please use my {kind} ({wish.arguments[key]})."
    return "Please use the original payment method."

  def _reason(self, left: list[Wish]) -> str:
    for wish in left:
      if isinstance(wish.arguments.get("reason"), str):
        return f"The reason is: {wish.arguments['reason']}."
    said = [s for s in sentences(scenario_text(self.scenario, "reason_for_call", "task_instructions"))
            if re.search(r"\b(because|since|reason|due to|change of plan|no longer|mistake)\b", s, re.IGNORECASE)]
    return first_person(said[0]) if said else ""

  def _address(self, left: list[Wish]) -> str:
    for wish in left:
      a = wish.arguments
      if "address1" in a:
        line = ", ".join(str(a[k]) for k in ("address1", "address2", "city", "state", "country", "zip") if a.get(k))
        return f"The address is {line}."
    said = [s for s in sentences(scenario_text(self.scenario)) if re.search(r"\baddress|\blive in|\bmoved", s,
                                                                               re.IGNORECASE)]
    return first_person(said[0]) if said else ""


def _target(arguments: dict[str, Any]) -> str | None:
  for key in TARGET_KEYS:
    if isinstance(arguments.get(key), str):
      return arguments[key]
  return None


# --------------------------------------------------------------------------- tau2's LLM user


class LLMUser:
  """tau2's user simulator prompt (its global guidelines and the task's scenario, formatted exactly
  as tau2's ``UserSimulator`` does) answered by a chat model behind an OpenAI-compatible server
  (``client``: ``generation.openai_chat.OpenAIChatClient``, e.g. an SGLang server's
  ``http://127.0.0.1:30001/v1``).

  As in tau2, the roles are flipped for the simulator: the agent's turns are ``user`` messages and
  the simulator's own are ``assistant`` messages, after the agent's greeting. tau2's
  ``###STOP###``, ``###TRANSFER###`` and out-of-scope markers end the call. The simulator sees only
  the conversation (never the tool calls). A server that cannot be reached or does not answer in
  time raises ``BackendUnavailableError`` naming it (after the client's bounded retries); an answer
  that is not a chat completion raises ``ChatProtocolError`` naming the URL and field: either ends
  the run (its iteration is discarded) rather than scoring a conversation the user never had. An
  empty reply is kept as it is (the environment counts it: ``empty_user_replies``).
  """

  GREETING = "Hi! How can I help you today?"

  def __init__(self, scenario: Any, client: Any, temperature: float = 0.0, max_tokens: int | None = 1024) -> None:
    if not callable(getattr(client, "complete", None)):
      raise TypeError(f"client: expected a chat client with complete(messages), got {type(client).__name__}")
    tau2_modules()  # tau2 installed (else the install command), litellm kept offline
    from tau2.user.user_simulator import SYSTEM_PROMPT, get_global_user_sim_guidelines

    self.system_prompt = SYSTEM_PROMPT.format(global_user_sim_guidelines=get_global_user_sim_guidelines(False),
                                              instructions=str(scenario))
    self.client, self.temperature, self.max_tokens = client, temperature, max_tokens
    self.history: list[dict[str, str]] = []
    self._first: str | None = None

  def _reply(self, agent_text: str) -> str:
    self.history.append({"role": "user", "content": agent_text or " "})
    text = self.client.complete([{"role": "system", "content": self.system_prompt}, *self.history],
                                temperature=self.temperature, max_tokens=self.max_tokens)
    self.history.append({"role": "assistant", "content": text or " "})
    return text

  def opening(self) -> str:
    if self._first is None:
      self._first = self._reply(self.GREETING)
    return self._first

  def respond(self, text: str, done_calls: Iterable[tuple[str, dict[str, Any]]] = ()) -> UserReply:
    del done_calls  # the simulator sees only the conversation
    content = self._reply(text)
    if TRANSFER in content:
      return UserReply(content, stop="transfer")
    if STOP in content or OUT_OF_SCOPE in content:
      return UserReply(content, stop="stop")
    return UserReply(content)
