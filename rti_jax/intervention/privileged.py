"""What each benchmark's reward-side evidence holds as values (``leaks.Privileged``).

Read from the evidence itself, by the shape and the field of each value, never from a list of
known values:

* Navigation (``NavigationEnv.reward_evidence()``): every coordinate a stop is given by (a
  ``"lon,lat"`` string read by ``world.parse_location``, as the tools read it: its longitude and
  latitude), every city (``city`` / ``region`` fields) and every place name (``name`` /
  ``names`` / ``places`` fields), whole and each of its words.
* Telecom (``TelecomEnv.reward_evidence()``, the task's initial state named by its ``task_id``,
  and the carrier's backend records, which only the agent's lookups show): person names,
  backend ids (``C1001``, also as ``customer 1001``), phone numbers (digits, with or without the
  country code), e-mail addresses (also as ``x at y dot com``), card digits, street addresses
  (with and without the house number), cities, zip codes, dates of birth (in the usual orders,
  with the month by number or by name), IMEIs, figures with a
  fractional part or four or more digits (usage, amounts; gigabytes also in megabytes), and the capitalised names of the
  free-text fields (``known_info``, ``ticket``: ``France``, ``United States``).
"""

from __future__ import annotations

import functools
import re
from typing import Any

from rti_jax.envs.navigation.tools import TOOL_NAMES
from rti_jax.envs.navigation.world import parse_location
from rti_jax.intervention.leaks import Privileged, leaves, number_of, numbers_in, plain, tokens

_CITY_KEYS = frozenset({"city", "cities", "region"})
_PLACE_KEYS = frozenset({"name", "names", "places"})


def navigation_privileged(evidence: Any) -> Privileged:
  """The coordinates, cities and place names of Navigation evidence (see the module docstring)."""
  out = Privileged()
  for key, leaf in leaves(evidence):
    if not isinstance(leaf, str):
      continue
    for piece in leaf.split(";"):
      loc = parse_location(piece)
      if loc is not None:
        for axis, value in zip(("longitude", "latitude"), loc):
          out.add_number(value.normalize(), f"the {axis} {value} of a reference stop")
    if key in _CITY_KEYS:
      out.add_string(leaf, f"the reference city {leaf!r}")
    elif key in _PLACE_KEYS and parse_location(leaf) is None and leaf not in TOOL_NAMES:  # not the reference call's name
      out.add_string(leaf, f"the reference place {leaf!r}")
      for word in leaf.split():  # a word of it alone finds the place too (a search by a name's first word)
        out.add_string(word, f"the word {word!r} of the reference place {leaf!r}")
  return out


# --------------------------------------------------------------------------- Telecom

_ID_SHAPE = re.compile(r"[A-Za-z]{1,3}-?[0-9]{3,}")
_ID_IN_TEXT = re.compile(r"\b[A-Za-z]{1,3}-?[0-9]{3,}\b")
_ID_WORDS = {"c": "customer", "l": "line", "b": "bill", "p": "plan", "d": "device"}
_PHONE_SHAPE = re.compile(r"\+?1?[\s.-]?\(?[0-9]{3}\)?[\s.-]?[0-9]{3}[\s.-]?[0-9]{4}")
_PHONE_IN_TEXT = re.compile(r"(?<![0-9])(?:\+?1[\s.-]?)?\(?[0-9]{3}\)?[\s.-]?[0-9]{3}[\s.-]?[0-9]{4}(?![0-9])")
_EMAIL_IN_TEXT = re.compile(r"[\w.+-]{1,64}@[\w-]{1,63}(?:\.[\w-]{1,63}){1,8}")
_PERSON_SHAPE = re.compile(r"[A-Z][\w'.-]*(?: [A-Z][\w'.-]*){1,3}")
_PERSON_IN_TEXT = re.compile(r"(?:You are|Customer name:|[Nn]ame is)\s+([A-Z][\w'.-]*(?:\s+[A-Z][\w'.-]*){0,3})")
_CAP_RUN = re.compile(r"(?<![\w'’-])[A-Z][a-z]{2,}(?: [A-Z][a-z]{2,})*")
_SENTENCE_START = frozenset(".!?:>\n-—\"'(")
#: free-text fields whose capitalised names are values (the others are generated descriptions)
_PROSE_KEYS = frozenset({"known_info", "ticket", "task_instructions", "reason_for_call"})
#: fields that hold tool names, labels or the rubric's own wording, not values
_SKIP_KEYS = frozenset({"user_side_tools", "agent_side_tools", "faults", "task_id", "issue_type", "reward_basis",
                        "completion_note", "requestor", "env_type", "func_name"})
_DIGIT_KEYS = {"account_number_last_4": "the card digits", "zip_code": "the zip code", "imei": "the IMEI",
               "date_of_birth": "the date of birth", "dob": "the date of birth", "expiration_date": "the card expiry"}
_DATE_SHAPE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}(?:T[0-9:]+)?")
#: backend tables whose records are the customer's (plans are the public catalogue)
_BACKEND_TABLES = ("customers", "lines", "bills", "devices")


def _digits(text: str) -> str:
  return "".join(t for t, _, _ in tokens(text) if t.isdigit())


def _add_phone(out: Privileged, text: str) -> None:
  digits = _digits(text)[-10:]
  if len(digits) == 10:
    label = f"the phone number {text.strip()!r}"
    out.add_string(digits, label)
    out.add_string("1" + digits, label)
    out.add_number(number_of(int(digits)), label)


def _add_id(out: Privileged, text: str) -> None:
  label = f"the backend id {text!r}"
  out.add_string(text, label)
  word = _ID_WORDS.get(text[:1].lower())
  if word is not None and len(text.rstrip("0123456789-")) == 1:
    out.add_string(word + _digits(text), label)


def _add_email(out: Privileged, text: str) -> None:
  label = f"the e-mail address {text!r}"
  out.add_string(text, label)
  out.add_string(text.replace("@", " at ").replace(".", " dot "), label)


def _add_person(out: Privileged, text: str) -> None:
  label = f"the name {text!r}"
  out.add_string(text, label)
  for word in text.split():
    if len(word) >= 3:
      out.add_string(word, f"the name {word!r}")


_MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
           "november", "december")


def _add_date_forms(out: Privileged, date: str, label: str) -> None:
  """A YYYY-MM-DD date also as month/day/year, day/month/year (padded or not) and with the month's
  name ("June 15, 1985", "15 Jun 1985")."""
  year, month, day = date.split("-")
  if not (month.isdigit() and day.isdigit() and 1 <= int(month) <= 12):
    return
  name = _MONTHS[int(month) - 1]
  for m in {month, str(int(month)), name, name[:3]}:
    for d in {day, str(int(day))}:
      out.add_string(f"{m} {d} {year}", label)
      out.add_string(f"{d} {m} {year}", label)


def _add_prose(out: Privileged, key: str | None, text: str) -> None:
  """Values written inside a free-text field."""
  rest = text
  for pattern, add in ((_PHONE_IN_TEXT, _add_phone), (_EMAIL_IN_TEXT, _add_email), (_ID_IN_TEXT, _add_id)):
    for m in pattern.finditer(rest):
      add(out, m.group(0))
    rest = pattern.sub(" ", rest)
  for value, _ in numbers_in(rest):  # the figures outside phone numbers, e-mails and ids
    out.add_number(value, f"the figure {value}")
  if key not in _PROSE_KEYS:
    return
  for m in _PERSON_IN_TEXT.finditer(text):
    _add_person(out, m.group(1))
  for m in _CAP_RUN.finditer(text):
    at = m.start()  # the last character before the run that is not a space
    while at > 0 and text[at - 1].isspace():
      at -= 1
    if at > 0 and text[at - 1] not in _SENTENCE_START:  # a name, not a sentence's first word
      out.add_string(m.group(0), f"the name {m.group(0)!r}")


def add_telecom_values(out: Privileged, obj: Any) -> Privileged:
  """Adds the values of a Telecom JSON object (evidence, records, action arguments) to ``out``."""
  for key, leaf in leaves(obj):
    if key in _SKIP_KEYS:
      continue
    n = number_of(leaf)
    if n is not None:
      label = f"the figure {n} ({key})" if key else f"the figure {n}"
      out.add_number(n, label)
      if key is not None and key.endswith("_gb") and n:  # the same amount in megabytes
        for factor in (1000, 1024):
          out.add_number((n * factor).normalize(), label)
      continue
    if not isinstance(leaf, str) or not leaf.strip():
      continue
    s = plain(leaf).strip()
    if key in _DIGIT_KEYS:
      out.add_string(s, f"{_DIGIT_KEYS[key]} {s!r}")
      if _DATE_SHAPE.fullmatch(s) is not None:
        _add_date_forms(out, s[:10], f"{_DIGIT_KEYS[key]} {s!r}")
      if digits := _digits(s)[:30]:  # also read as one number ("one two three five")
        out.add_number(number_of(int(digits)), f"{_DIGIT_KEYS[key]} {s!r}")
    elif _DATE_SHAPE.fullmatch(s):  # record dates (activation, billing periods): not personal values
      continue
    elif key == "phone_number" or _PHONE_SHAPE.fullmatch(s):
      _add_phone(out, s)
    elif _ID_SHAPE.fullmatch(s):
      _add_id(out, s)
    elif _EMAIL_IN_TEXT.fullmatch(s):
      _add_email(out, s)
    elif key in ("full_name", "name") and _PERSON_SHAPE.fullmatch(s):
      _add_person(out, s)
    elif key == "street":
      out.add_string(s, f"the street address {s!r}")
      rest = s.split(maxsplit=1)
      if len(rest) == 2 and rest[0].isdigit():
        out.add_string(rest[1], f"the street address {s!r}")
    elif key == "city":
      out.add_string(s, f"the city {s!r}")
    elif " " in s or key in _PROSE_KEYS:
      _add_prose(out, key, s)
    else:
      for value, _ in numbers_in(s):  # a figure written as a string ("15.1")
        out.add_number(value, f"the figure {value} ({key})" if key else f"the figure {value}")
  return out


@functools.lru_cache(maxsize=1)
def telecom_backend_privileged() -> Privileged:
  """The values of the carrier's customer records (customers, lines, bills, devices)."""
  from rti_jax.envs.telecom import state as st

  db = st.load_db()
  out = Privileged()
  for table in _BACKEND_TABLES:
    add_telecom_values(out, db.get(table, []))
  return out


@functools.lru_cache(maxsize=256)
def _initial_state_privileged(task_id: str) -> Privileged:
  from rti_jax.envs.telecom.tasks import load_tasks

  task = load_tasks().get(task_id)
  out = Privileged()
  if task is not None:
    add_telecom_values(out, [a.get("arguments") or {} for a in task.init_actions if isinstance(a, dict)])
  return out


def telecom_privileged(evidence: Any) -> Privileged:
  """The values of Telecom evidence, of the task's initial state, and of the backend records."""
  out = Privileged()
  out.update(telecom_backend_privileged())
  if isinstance(evidence, dict):
    add_telecom_values(out, evidence)
    task_id = evidence.get("task_id")
    if isinstance(task_id, str):
      try:
        out.update(_initial_state_privileged(task_id))
      except (OSError, ValueError, KeyError):  # task files unreadable: the evidence alone
        pass
  return out
