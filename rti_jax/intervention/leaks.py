"""Privileged values and their respellings: the leak check the rule-based Verifiers share.

What is privileged is derived, not listed: the values held by the reward-side evidence
(plus, for Telecom, the backend records the agent can only reach through its tools) minus
every value the visible conversation already shows. Both sides go through the same
normalisation, so a value counts as shown, or as leaked, in any of its spellings:

  * strings (names, cities, ids, phone numbers, e-mails, card digits, street addresses,
    dates) are compared as *folded token runs*: the text is NFKD-normalised, accents,
    Cyrillic / Greek look-alike letters and case folded, and cut into tokens at every separator, at letter/digit changes and at
    lower-to-upper case changes (``"L-1002"``, ``"l 1002"``, ``"L1002"`` all give ``l``,
    ``1002``; an ordinal's suffix is dropped: ``15th`` is ``15``); a value is found where consecutive tokens concatenate to its folded form
    (``"JOHN smith"``, ``"john_smith"`` and ``"JohnSmith"`` all hold ``johnsmith``), never
    inside a longer token (``Xian`` is not found in ``Xiangshan``);
  * numbers are compared as exact decimals, read as the tools read them (``Decimal`` /
    ``float`` syntax: a ``+`` sign, an exponent, ``_`` between digits, any script's digits)
    or written in English words (``fifteen point one``, ``one two three five``); a number
    written with two or more decimals also matches a privileged number it rounds or
    truncates (``121.54`` for ``121.5409``), and an angle in degrees and minutes
    (``121°32'27"``) one it is within a second (a minute) of, unless it equally matches a
    shown one.

Only *distinctive* numbers are checked without a unit (a fractional part, or at least four
digits): a bare ``2`` or ``40`` is too common to call a leak (the Telecom Verifier checks
figures with units separately). Every function runs in time linear in its input and never
raises on any text or JSON value.
"""

from __future__ import annotations

import bisect
import dataclasses
import re
import unicodedata
from decimal import ROUND_DOWN, ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal, InvalidOperation
from typing import Any, Iterable, Iterator, Mapping

#: Common address abbreviations: both sides are folded through this map, so "123 Main Street"
#: and "123 main st." are the same address.
ABBREVIATIONS = {"street": "st", "avenue": "ave", "road": "rd", "drive": "dr", "boulevard": "blvd", "lane": "ln",
                 "court": "ct", "place": "pl", "highway": "hwy", "apartment": "apt", "suite": "ste"}
#: The shortest folded string that is matched (two letters such as a state code are too common).
MIN_FOLDED = 3
#: The longest folded string that is matched (longer values are cut to this many characters).
MAX_FOLDED = 64
#: Number literals longer than this (after dropping insignificant zeros) are not read.
MAX_NUMBER_CHARS = 64

_TOKEN_RE = re.compile(r"[^\W\d_]+|\d+")
_CAMEL_RE = re.compile(r"(?<=[a-z])(?=[A-Z])")
_NUMBER_RE = re.compile(r"\d+(?:_\d+)*(?:\.(?:\d+(?:_\d+)*)?)?(?:[eE][-+]?\d{1,9})?")
_WORD_RE = re.compile(r"[a-z]+")
_ORDINALS = frozenset({"st", "nd", "rd", "th"})
_GAP_RE = re.compile(r"[\s-]*")

_DIGIT_WORDS = {w: i for i, w in enumerate("zero one two three four five six seven eight nine".split())}
_TEEN_WORDS = {w: 10 + i for i, w in enumerate(
  "ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split())}
_TENS_WORDS = {w: 10 * (i + 2) for i, w in enumerate("twenty thirty forty fifty sixty seventy eighty ninety".split())}
_SCALE_WORDS = {"hundred": 100, "thousand": 1000, "million": 10 ** 6, "billion": 10 ** 9}
_NUMBER_WORDS = frozenset(_DIGIT_WORDS) | frozenset(_TEEN_WORDS) | frozenset(_TENS_WORDS) | frozenset(_SCALE_WORDS)


# --------------------------------------------------------------------------- normalisation


#: Cyrillic and Greek letters that look like Latin ones ("Тaipei" with a Cyrillic T)
_LOOKALIKES = str.maketrans(
  "аеорсухіјѕԁԛԝкмнтвАВЕКМНОРСТУХІЈЅαοριυνκτΑΒΕΖΗΙΚΜΝΟΡΤΥΧ",
  "aeopcyxijsdqwkmhtbABEKMHOPCTYXIJSaopiuvktABEZHIKMNOPTYX")


def plain(text: Any) -> str:
  """``text`` as NFKD without combining marks, Cyrillic and Greek look-alikes as Latin letters
  (``"Taipéi"`` -> ``"Taipei"``, full-width digits -> ASCII); a non-string is ``str()``-ed first."""
  s = text if isinstance(text, str) else str(text)
  s = unicodedata.normalize("NFKD", s)
  if s.isascii():
    return s
  return "".join(ch for ch in s if not unicodedata.combining(ch)).translate(_LOOKALIKES)


def tokens(text: Any) -> list[tuple[str, int, int]]:
  """``(folded token, start, end)`` of every token of ``plain(text)`` (see the module docstring)."""
  s = plain(text)
  out = []
  for m in _TOKEN_RE.finditer(s):
    piece, base = m.group(0), m.start()
    if out and out[-1][2] == base and out[-1][0].isdigit() and piece.lower() in _ORDINALS:
      continue  # "15th" is 15
    if piece.islower() or piece.isupper() or piece[1:].islower() or piece[0].isdigit():  # no case change inside
      word = piece.casefold()
      out.append((ABBREVIATIONS.get(word, word), base, m.end()))
      continue
    cuts = [c.start() for c in _CAMEL_RE.finditer(piece)]
    for a, b in zip([0, *cuts], [*cuts, len(piece)]):
      word = piece[a:b].casefold()
      out.append((ABBREVIATIONS.get(word, word), base + a, base + b))
  return out


def fold(value: Any) -> str:
  """The folded form of ``value``: its tokens concatenated (``"L-1002"`` -> ``"l1002"``)."""
  return "".join(t for t, _, _ in tokens(value))[:MAX_FOLDED]


class Matcher:
  """Finds folded targets as runs of consecutive tokens (see the module docstring).

  targets: folded string -> a label naming the value (for diagnoses).
  """

  def __init__(self, targets: Mapping[str, str]) -> None:
    self.targets = {k: v for k, v in targets.items() if MIN_FOLDED <= len(k) <= MAX_FOLDED}
    self._prefixes = {k[:i] for k in self.targets for i in range(1, len(k) + 1)}

  def find(self, text: Any) -> dict[str, str]:
    """folded target -> the text it was found in (first occurrence), for every target ``text`` holds."""
    if not self.targets:
      return {}
    s = plain(text)
    toks = tokens(s)  # plain() of plain text is a no-op check
    found: dict[str, str] = {}
    for i in range(len(toks)):
      acc = ""
      for j in range(i, len(toks)):  # at most MAX_FOLDED tokens: acc must stay a prefix of a target
        acc += toks[j][0]
        if acc not in self._prefixes:
          break
        if acc in self.targets and acc not in found:
          found[acc] = s[toks[i][1]:toks[j][2]]
    return found


def _decimal(literal: str) -> Decimal | None:
  """A number literal as a finite Decimal (what ``Decimal()`` / ``float()`` read), or None."""
  if len(literal) > MAX_NUMBER_CHARS:
    mantissa, e, exp = literal.partition("e") if "e" in literal else literal.partition("E")
    head, dot, frac = mantissa.partition(".")
    literal = (head.lstrip("0") or "0") + dot + frac.rstrip("0") + e + exp
    if len(literal) > MAX_NUMBER_CHARS:
      return None
  try:
    value = Decimal(literal)
  except (InvalidOperation, ValueError):
    return None
  if not value.is_finite() or abs(value.adjusted()) > 30:
    return None
  return value.normalize()


def _word_numbers(words: list[str]) -> list[Decimal]:
  """The values of a run of English number words: as a number ("one hundred twenty one point
  five" -> 121.5), digit by digit ("one two three five" -> 1235), and, without scale words, as
  spoken groups ("twelve thirty-five" -> 1235)."""
  if "point" in words:
    at = words.index("point")
    head, tail = words[:at], words[at + 1:]
    if not tail or any(w not in _DIGIT_WORDS for w in tail):
      return []
  else:
    head, tail = words, []
  wholes = []
  if head and all(w in _DIGIT_WORDS for w in head) and (len(head) > 1 or tail):
    wholes.append("".join(str(_DIGIT_WORDS[w]) for w in head))  # "one two three five" -> 1235
  elif head:
    total = current = 0
    groups: list[int] = []
    for w in head:
      if w in _SCALE_WORDS:
        scale = _SCALE_WORDS[w]
        groups = []  # a scale word: a number, not spoken groups
        if scale == 100:
          current = (current or 1) * 100
        else:
          total += (current or 1) * scale
          current = 0
        continue
      value = _DIGIT_WORDS.get(w, _TEEN_WORDS.get(w, _TENS_WORDS.get(w, 0)))
      current += value
      if groups and groups[-1] % 10 == 0 and groups[-1] >= 20 and w in _DIGIT_WORDS and value:
        groups[-1] += value  # "thirty five" is one group
      else:
        groups.append(value)
    wholes.append(str(total + current))
    if len(groups) > 1 and not any(w in _SCALE_WORDS for w in head):
      wholes.append("".join(str(g) for g in groups))
  else:
    wholes.append("0")
  frac = "".join(str(_DIGIT_WORDS[w]) for w in tail)
  values = (_decimal(whole + ("." + frac if frac else "")) for whole in wholes)
  return [v for v in values if v is not None]


def numbers_in(text: Any) -> list[tuple[Decimal, str]]:
  """``(value, as written)`` of every number in ``text``: digit literals (signs dropped) and runs
  of English number words."""
  s = plain(text)
  out = []
  for m in _NUMBER_RE.finditer(s):
    value = _decimal(m.group(0))
    if value is not None:
      out.append((value, m.group(0)))
  low = s.lower()
  run: list[str] = []
  start = end = 0

  def close() -> None:
    words = run[:-1] if run and run[-1] in ("and", "point") else run
    if words and any(w != "and" for w in words):
      for value in _word_numbers([w for w in words if w != "and"]):
        out.append((value, s[start:end]))

  for m in _WORD_RE.finditer(low):
    w = m.group(0)
    joins = w in _NUMBER_WORDS or (run and (w == "point" or (w == "and" and run[-1] in _SCALE_WORDS)))
    if joins and run and _GAP_RE.fullmatch(low, end, m.start()) is not None:
      run.append(w)
      end = m.end()
    elif w in _NUMBER_WORDS:
      close()
      run, start, end = [w], m.start(), m.end()
    else:
      close()
      run = []
  close()
  return out


_PAIR_NUMBER_RE = re.compile(r"[-+]?[0-9]+(?:_[0-9]+)*\.[0-9]+(?:_[0-9]+)*(?:[eE][-+]?[0-9]{1,9})?")
_PAIR_GAP_RE = re.compile(r"\s*,\s*")


def coordinate_pairs(text: Any) -> set[tuple[Decimal, Decimal]]:
  """Every ``lon,lat`` written in ``text``: two decimal literals (a sign and an exponent allowed, as
  the tools read them) around a comma, longitude within +-180 and latitude within +-90."""
  s = text if isinstance(text, str) else ""
  out = set()
  prev: tuple[Decimal | None, int] = (None, -1)
  for m in _PAIR_NUMBER_RE.finditer(s):
    literal = m.group(0)
    value = _decimal(literal.lstrip("+-"))
    if value is not None and literal.startswith("-"):
      value = -value
    lon, end = prev
    if (lon is not None and value is not None and _PAIR_GAP_RE.fullmatch(s, end, m.start()) is not None
        and abs(lon) <= 180 and abs(value) <= 90):
      out.add((lon, value))
      prev = (None, -1)  # a pair's latitude starts no other pair ("lon,lat,lon,lat")
    else:
      prev = (value, m.end())
  return out


def is_distinctive(value: Decimal) -> bool:
  """Checked without a unit: a fractional part, or at least four digits."""
  return value != value.to_integral_value() or abs(value) >= 1000


def _places(value: Decimal) -> int:
  return max(0, -value.as_tuple().exponent)  # type: ignore[operator]


def roundings(value: Decimal) -> set[Decimal]:
  """``value`` rounded (half-even, half-up) and truncated to 2 .. (its decimals - 1) places, at
  most 10 places."""
  out = set()
  for d in range(2, min(_places(value), 11)):
    q = Decimal(1).scaleb(-d)
    for mode in (ROUND_HALF_EVEN, ROUND_HALF_UP, ROUND_DOWN):
      out.add(value.quantize(q, rounding=mode).normalize())
  return out


# --------------------------------------------------------------------------- values of JSON objects


def leaves(obj: Any, key: str | None = None, depth: int = 0) -> Iterator[tuple[str | None, Any]]:
  """``(key, leaf)`` of every string / number leaf of a JSON value (dict keys too, as leaves
  under their own name), depth-first; a value nested deeper than 64 levels is skipped."""
  if depth > 64:
    return
  if isinstance(obj, dict):
    for k, v in obj.items():
      yield key, str(k)
      yield from leaves(v, str(k), depth + 1)
  elif isinstance(obj, (list, tuple)):
    for v in obj:
      yield from leaves(v, key, depth + 1)
  elif isinstance(obj, bool) or obj is None:
    return
  elif isinstance(obj, (int, float, Decimal, str)):
    yield key, obj
  else:
    yield key, str(obj)


def number_of(leaf: Any) -> Decimal | None:
  """A JSON number as the tools read it (``float``), as an exact Decimal; None for a string or bool."""
  if isinstance(leaf, bool) or not isinstance(leaf, (int, float, Decimal)):
    return None
  if isinstance(leaf, int) and abs(leaf) >= 10 ** 30:
    return None
  return _decimal(repr(float(leaf)) if isinstance(leaf, float) else str(leaf))


# --------------------------------------------------------------------------- the privileged set


@dataclasses.dataclass
class Privileged:
  """Values of the evidence, each with a label naming it.

  strings: folded string -> label; numbers: value -> label (every number here is checked
  bare; add only distinctive ones or ones that are always checked, such as coordinates). The
  label names the value: the forms of one value (``l1002``, ``line1002``) share it.
  """

  strings: dict[str, str] = dataclasses.field(default_factory=dict)
  numbers: dict[Decimal, str] = dataclasses.field(default_factory=dict)

  def add_string(self, value: Any, label: str) -> None:
    folded = fold(value)
    if MIN_FOLDED <= len(folded):
      self.strings.setdefault(folded, label)

  def add_number(self, value: Decimal | None, label: str, always: bool = False) -> None:
    if value is not None and (always or is_distinctive(value)):
      self.numbers.setdefault(abs(value).normalize(), label)
      digits = "".join(c for c in str(abs(value).normalize()) if c.isdigit())
      if value != value.to_integral_value() and len(digits) >= 5 and "E" not in str(value.normalize()):
        self.add_string(digits, label)  # its digits with other separators ("121 5409", "121,5409")

  def update(self, other: "Privileged") -> None:
    for k, v in other.strings.items():
      self.strings.setdefault(k, v)
    for n, v in other.numbers.items():
      self.numbers.setdefault(n, v)

  def minus_visible(self, visible: Iterable[str]) -> "Privileged":
    """The values none of the ``visible`` texts shows (in any spelling)."""
    texts = list(visible)
    matcher = Matcher(self.strings)
    shown_strings: set[str] = set()
    shown_numbers: set[Decimal] = set()
    for text in texts:
      shown_strings.update(matcher.find(text))
      shown_numbers.update(abs(v) for v, _ in numbers_in(text))
    # one value, several forms (an id and "line 1002", digits and the number): shown in one, shown in all
    shown = {self.strings[k] for k in shown_strings} | {self.numbers[n] for n in shown_numbers if n in self.numbers}
    return Privileged({k: v for k, v in self.strings.items() if v not in shown},
                      {n: v for n, v in self.numbers.items() if v not in shown})


@dataclasses.dataclass(frozen=True)
class Leak:
  """One privileged value found in a correction: ``label`` (what it is) and ``written`` (how)."""

  label: str
  written: str

  def __str__(self) -> str:
    return f"{self.label} as {self.written.strip()!r}"


_DMS_RE = re.compile(
  r"(\d{1,3})\s*(?:°|˚|o(?=\s*\d)|deg(?:rees?)?\b)\s*(\d{1,2}(?:\.\d{1,6})?)\s*(?:'|′|’|min(?:utes?)?\b)"
  r"(?:\s*(\d{1,2}(?:\.\d{1,6})?)\s*(?:\"|″|′′|''|”|sec(?:onds?)?\b))?", re.IGNORECASE)


def angles_in(text: Any) -> list[tuple[float, float, str]]:
  """``(degrees, tolerance, as written)`` of every angle written in degrees and minutes, with or
  without seconds (``121°32'27"``: 121.5408, within a second; ``121 deg 32.45 min``)."""
  out = []
  for m in _DMS_RE.finditer(plain(text)):
    minutes, seconds = float(m.group(2)), float(m.group(3)) if m.group(3) else None
    value = int(m.group(1)) + minutes / 60 + (seconds or 0.0) / 3600
    out.append((value, 1 / 3600 if seconds is not None else 1 / 60, m.group(0)))
  return out


class LeakScanner:
  """Searches texts and JSON values for privileged values (``Privileged.minus_visible``).

  visible_numbers: every number the visible conversation shows; a rounded number that is
    also a rounding of one of them is not a leak.
  """

  def __init__(self, privileged: Privileged, visible_numbers: Iterable[Decimal] = ()) -> None:
    self.privileged = privileged
    self._matcher = Matcher(privileged.strings)
    self._exact = dict(privileged.numbers)
    self._rounded: dict[Decimal, str] = {}
    for n, label in privileged.numbers.items():
      for r in roundings(n):
        self._rounded.setdefault(r, label)
    shown = {abs(v).normalize() for v in visible_numbers}
    self._shown = shown | {r for v in shown for r in roundings(v)}
    self._shown_floats = sorted(float(v) for v in shown)
    self._angles = [(float(n), label) for n, label in privileged.numbers.items() if n != n.to_integral_value()]

  def scan_text(self, text: Any) -> list[Leak]:
    out = [Leak(self.privileged.strings[k], written) for k, written in self._matcher.find(text).items()]
    for value, written in numbers_in(text):
      out.extend(self._number(value, written))
    if self._angles:
      for value, tolerance, written in angles_in(text):
        out.extend(self._angle(value, tolerance, written))
    return out

  def _angle(self, value: float, tolerance: float, written: str) -> list[Leak]:
    """A privileged number within ``tolerance`` of an angle, unless a shown number is as close."""
    near = [label for n, label in self._angles if abs(n - value) <= tolerance]
    if not near:
      return []
    at = bisect.bisect_left(self._shown_floats, value - tolerance)
    if at < len(self._shown_floats) and self._shown_floats[at] <= value + tolerance:
      return []
    return [Leak(near[0] + " (in degrees and minutes)", written)]

  def _number(self, value: Decimal, written: str) -> list[Leak]:
    v = abs(value)
    if v in self._exact:
      return [Leak(self._exact[v], written)]
    if _places(v) >= 2 and v in self._rounded and v not in self._shown:
      return [Leak(self._rounded[v] + " (rounded)", written)]
    return []

  def scan_json(self, obj: Any) -> list[Leak]:
    """Every leaf of a JSON value (a tool call's arguments): strings as texts, numbers as read."""
    out = []
    for _, leaf in leaves(obj):
      if isinstance(leaf, str):
        out.extend(self.scan_text(leaf))
      elif (n := number_of(leaf)) is not None:
        out.extend(self._number(n, repr(leaf)))
    return out

  def scan(self, text: Any, arguments: Iterable[Any] = ()) -> list[Leak]:
    """Leaks in ``text`` (the whole reply, reasoning included) and in each decoded argument object,
    one per label and spelling."""
    found = self.scan_text(text if isinstance(text, str) else "")
    for args in arguments:
      found.extend(self.scan_json(args))
    return list(dict.fromkeys(found))
