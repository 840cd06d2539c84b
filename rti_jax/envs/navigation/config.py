"""Benchmark settings: the paper's Navigation setting and a tiny CPU setting.

``paper`` follows Appendix C.2.1 (3-9 stops per route, 600 train / 150 test, 6-turn
episodes, 50 km scenic-spot sampling radius). ``tiny`` keeps every difficulty
(name collisions, order levels, exact coordinate matching) but shortens routes,
candidate lists and coordinates so that a few-M-parameter policy with a word-level
tokenizer can be trained on 2 CPU cores.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class NavConfig:
  """Everything that determines a Navigation world, its tasks and its episodes.

  A "stop" is one place of the route: origin, waypoint or destination, so a route
  of ``n`` stops has ``n - 2`` waypoints (the paper's n in 3..9 counts stops).
  """

  name: str
  seed: int = 0
  # World.
  num_cities: int = 20
  pois_per_city: int = 48  # of which about 70% are scenic spots
  shared_names: int = 40  # literal names placed in 2..4 cities each (D.4's "Yixing Temple")
  decimals: int = 6  # coordinates are "lon,lat" with exactly this many decimals
  # Tools.
  max_results: int = 3  # candidates returned by poi_search / around_search
  terse: bool = False  # candidates show name, city, location, type only; schemas without descriptions
  condensed_prompt: bool = False  # system message: env.CONDENSED_PROMPT (tool signatures, not JSON schemas)
  # Tasks (inverse construction, Stages 1-3).
  min_stops: int = 3
  max_stops: int = 9
  num_train: int = 600
  num_test: int = 150
  sample_radius_m: int = 50_000
  hint_prob: float = 0.07  # chance that a stop is mentioned with its city ("X in Taipei")
  noise_prob: float = 0.1  # chance that Stage 2 yields a flawed pair for Stage 3 to reject
  # Share of each split built as hidden-city tasks (``hidden.py``): no visible evidence tells which
  # city the stops are in, the user does (the ``ask_user`` tool, offered only when the share is > 0).
  # 0 keeps the world, the tasks and the tools exactly as without the option.
  hidden_city_share: float = 0.0
  # Episodes.
  max_turns: int = 6
  end_on_direction: bool = False  # end the episode right after a direction call (saves tokens)

  def __post_init__(self) -> None:
    if not 2 <= self.min_stops <= self.max_stops <= 18:
      raise ValueError(f"need 2 <= min_stops <= max_stops <= 18 (at most 16 waypoints), got "
                       f"min_stops={self.min_stops}, max_stops={self.max_stops}")
    if not 2 <= self.num_cities <= 20:
      raise ValueError(f"num_cities must lie in [2, 20] (the city inventory), got {self.num_cities}")
    if not 1 <= self.decimals <= 8:
      raise ValueError(f"decimals must lie in [1, 8], got {self.decimals}")
    if self.max_results < 1:
      raise ValueError(f"max_results must be >= 1, got {self.max_results}")
    if self.max_turns < 1:
      raise ValueError(f"max_turns must be >= 1, got {self.max_turns}")
    if not 0.0 <= self.hidden_city_share <= 1.0:
      raise ValueError(f"hidden_city_share must lie in [0, 1], got {self.hidden_city_share}")
    if self.hidden_city_share > 0 and self.num_cities < self.max_results + 1:
      raise ValueError(f"hidden_city_share > 0 needs num_cities >= max_results + 1 = {self.max_results + 1} "
                       f"(a hidden city hides behind max_results namesakes), got {self.num_cities}")
    if self.pois_per_city < self.max_stops + 4:
      raise ValueError(f"pois_per_city must be >= max_stops + 4 = {self.max_stops + 4}, got {self.pois_per_city}")


PAPER = NavConfig(name="paper")

TINY = NavConfig(
    name="tiny",
    num_cities=10,
    pois_per_city=16,
    shared_names=14,
    decimals=4,
    max_results=2,
    terse=True,
    condensed_prompt=True,
    min_stops=2,
    max_stops=4,
    hint_prob=0.1,
)

PRESETS: dict[str, NavConfig] = {"paper": PAPER, "tiny": TINY}


def get_config(name: str = "tiny", **overrides: Any) -> NavConfig:
  """A preset (``"tiny"`` or ``"paper"``) with optional field overrides."""
  if name not in PRESETS:
    raise ValueError(f"config name must be one of {sorted(PRESETS)}, got {name!r}")
  return dataclasses.replace(PRESETS[name], **overrides)
