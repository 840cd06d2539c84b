"""Linear-time reading of an agent message for the scripted Telecom user: its sentences, the tool
calls it names, and identifiers and over-long words blanked out before phrase matching."""

from __future__ import annotations

import re

_SENTENCE_SPECIAL_RE = re.compile(r"[.!?;\n()]")
_SENTENCE_ENDS = ".!?;\n"
# A key starts a word ((?<!\w) changes no match: findall resumes after a value, never inside a word).
_NAME_RE = re.compile(r"\b[a-z_]{4,}\b")
_CALL_OPEN_RE = re.compile(r"\s*\(")
_WORD_RE = re.compile(r"\w+")
#: Longer words are not read (blanked like identifiers) when matching requests by description.
MAX_WORD_CHARS = 40


def sentence_spans(text: str) -> list[tuple[int, int]]:
  """``(start, end)`` of each sentence of ``text``: it ends at . ! ? ; or a newline, never inside
  a call's parentheses.

  The matches of ``(?:[^.!?;\\n()]|\\([^)]*\\)?)+(?:[.!?;]+|\\n|$)`` (``finditer``), found in one
  pass: that regex backtracks cubically on a stray ``)``. A sentence runs over plain characters and
  whole ``(...)`` groups (an unclosed ``(`` runs to the end) to its end mark; where a stray ``)``
  comes first, it ends after the last end mark inside its last group that has one, and without
  such a group no sentence starts before that ``)``.
  """
  spans: list[tuple[int, int]] = []
  pos, n = 0, len(text)
  while pos < n:
    if text[pos] in ".!?;\n)":
      pos += 1
      continue
    at, end, groups = pos, None, []
    while True:
      m = _SENTENCE_SPECIAL_RE.search(text, at)
      if m is None:
        end = n
        break
      stop = m.start()
      ch = text[stop]
      if ch in _SENTENCE_ENDS:
        end = stop + 1
        while ch != "\n" and end < n and text[end] in ".!?;":
          end += 1
        break
      if ch == ")":
        break
      close = text.find(")", stop + 1)
      if close < 0:
        end = n
        break
      groups.append((stop, close))
      at = close + 1
    if end is None:
      for opened, close in reversed(groups):
        last = max(text.rfind(c, opened + 1, close) for c in _SENTENCE_ENDS)
        if last >= 0:
          end = last + 1
          break
    if end is None:
      pos = stop + 1
      continue
    spans.append((pos, end))
    pos = end
  return spans


def blank_words(text: str, identifiers: bool = True, long_words: bool = False) -> str:
  """``text`` with ``identifiers`` (words holding ``_``, e.g. ``toggle_wifi``) blanked, and with
  ``long_words`` the words over ``MAX_WORD_CHARS``; the same length, so positions still order
  requests. (``re.sub(r"\\w*_\\w*", ...)`` blanks the same identifiers in quadratic time.)"""
  def blank(m: re.Match[str]) -> str:
    word = m.group(0)
    hide = (identifiers and "_" in word) or (long_words and len(word) > MAX_WORD_CHARS)
    return " " * len(word) if hide else word

  return _WORD_RE.sub(blank, text)


def named_calls(sentence: str) -> list[tuple[int, str, str | None]]:
  """``(position, name, argument text or None)`` of each word of 4+ letters or ``_`` in
  ``sentence``, with its ``(...)`` right after it: the matches of
  ``\\b([a-z_]{4,})\\b(\\s*\\(([^)]*)\\))?``, without rescanning for a ``)`` after every word."""
  out: list[tuple[int, str, str | None]] = []
  pos, n, close = 0, len(sentence), -1
  while (m := _NAME_RE.search(sentence, pos)) is not None:
    pos = m.end()
    args = None
    opened = _CALL_OPEN_RE.match(sentence, pos)
    if opened is not None:
      if close < opened.end():
        close = sentence.find(")", opened.end())
        close = n if close < 0 else close
      if close < n:
        args, pos = sentence[opened.end():close], close + 1
    out.append((m.start(), m.group(0), args))
  return out
