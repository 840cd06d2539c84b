"""The limited word inventory every name, address and query is built from.

Keeping the world's vocabulary to a few hundred words lets a small word-level
tokenizer cover every text the benchmark can produce (see ``vocab.py``).
"""

from __future__ import annotations

# (city, lon, lat): real city centres, all at least ~200 km apart, so a 50 km
# sampling radius never spans two cities.
CITIES: tuple[tuple[str, float, float], ...] = (
    ("Beijing", 116.40, 39.90),
    ("Taipei", 121.56, 25.04),
    ("Hangzhou", 120.16, 30.27),
    ("Chengdu", 104.07, 30.57),
    ("Xian", 108.94, 34.34),
    ("Wuhan", 114.31, 30.59),
    ("Kunming", 102.83, 24.88),
    ("Qingdao", 120.38, 36.07),
    ("Harbin", 126.53, 45.80),
    ("Xiamen", 118.09, 24.48),
    ("Guilin", 110.29, 25.27),
    ("Dalian", 121.61, 38.91),
    ("Lhasa", 91.17, 29.65),
    ("Sanya", 109.51, 18.25),
    ("Lanzhou", 103.83, 36.06),
    ("Changsha", 112.94, 28.23),
    ("Nanjing", 118.80, 32.06),
    ("Shenyang", 123.43, 41.80),
    ("Urumqi", 87.62, 43.83),
    ("Guiyang", 106.63, 26.65),
)

# First words of POI names (and of street names).
STEMS: tuple[str, ...] = (
    "Dajin", "Lihui", "Yixing", "Baiyun", "Qingshan", "Jinshan", "Longtan", "Huaxi",
    "Donghu", "Nanhu", "Beihai", "Yuelu", "Tianning", "Fuxing", "Zhongshan", "Heping",
    "Wenhua", "Guanghua", "Ruyi", "Baoguo", "Lingyin", "Qixia", "Jiming", "Xuanwu",
    "Taiping", "Changle", "Anle", "Shuangxi", "Yunlong", "Feilai", "Hongqiao", "Longhua",
    "Shimen", "Shuguang", "Xinghai", "Binhai", "Hanshan", "Lanting", "Yuhua", "Wanshou",
    "Qinghua", "Jinhua", "Baita", "Tiantai", "Putuo", "Wutai", "Emei", "Songshan",
    "Luojia", "Moshan", "Zijin", "Cuihu", "Daguan", "Wulong", "Xiangshan", "Yongan",
    "Guiyuan", "Kaiyuan", "Jingshan", "Dongpo", "Meiling", "Shanhai", "Xiling", "Baihe",
)

# Category word (last word of a POI name) -> business type shown by the tools.
SCENIC_CATEGORIES: tuple[str, ...] = (
    "Park", "Temple", "Lake", "Pagoda", "Garden", "Hill", "Museum", "Tower",
    "Bridge", "Falls", "Gorge", "Palace", "Zoo", "Beach", "Cave",
)
OTHER_CATEGORIES: dict[str, str] = {
    "Mall": "shopping",
    "Station": "transport",
    "Hotel": "hotel",
    "Market": "market",
    "Hospital": "hospital",
    "School": "school",
    "Library": "library",
    "Stadium": "sports",
}
SCENIC_TYPE = "scenic spot"

STREET_KINDS: tuple[str, ...] = ("Road", "Street", "Avenue", "Lane")

# Direction modes and the words a query uses for them.
MODES: tuple[str, ...] = ("driving", "walking", "bicycling", "electrobike", "transit")
MODE_VERBS: dict[str, str] = {
    "driving": "drive",
    "walking": "walk",
    "bicycling": "cycle",
    "electrobike": "ride",
    "transit": "travel",
}
