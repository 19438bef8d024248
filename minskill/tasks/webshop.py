"""`webshop`: a WebShop-like shop (Yao et al., 2022): find, customise and buy the product an
instruction asks for.

Each task has its own generated catalogue (24 products, of the 21 product types in seven categories;
each a title, attributes, bullet-point features, a description, options such as color and size, and
a price) and an instruction in WebShop's words, naming the product type, two attributes, a value of
each of its options and a price bound: "i am looking for a t-shirt that is cotton and machine wash,
with color: navy, and size: large, and price lower than 40.00 dollars". The agent acts with
WebShop's two actions

    search[query]   on the search page (the only page with a search bar): BM25 (tasks/bm25.py) over
                    the products' text; the results, 10 a page, at most 50
    click[value]    a button or link of the page, as WebShop names its clickables (lower case): a
                    product's id (click[b0a1c2d3e4]), an option value (click[navy]), back to search,
                    next >, < prev, description, features, reviews, buy now

and sees each page as WebShop's text observation ("text" mode: the page's visible texts joined by "
[SEP] "; an option already chosen is also said, "You have clicked navy.", as its "text_rich" mode
does). A space before the bracket is read too ("click [buy now]", which is how the agent loop writes
the verb), and so is a plain "search blue shirt". `click[buy now]` on a product page ends the
episode with WebShop's reward (web_agent_site/engine/goal.py, get_reward):

    reward = r_type · (n_att + n_opt + r_price) / (|goal attributes| + |goal options| + 1)

    n_att    goal attributes the product has: in its attribute list, or a phrase of its title,
             features or description (WebShop: token-set ratio > 85 with an attribute, or a
             substring of those texts)
    n_opt    options chosen that are goal options: the same value (WebShop: exact for size, fuzzy
             token-set ratio > 85 otherwise; here equal words in any order) or a phrase of the
             product's texts
    r_price  1 if the price is at most the bound, else 0
    r_type   WebShop's type cascade: 1 when the product is of the goal's type (WebShop's query
             match), or its category path (category › group › type) shares two levels with the
             goal's, or its title holds more than 0.2 of the words of the goal's type name
             (title_score; WebShop takes the nouns of the goal's title with spaCy); else 0.5; then
             0.1 when title_score < 0.1, and 0 when title_score is 0

success = reward 1 (every term matched); `env.reward` keeps the score itself and `env.reward_info`
its terms. Task types are the product categories of MASA's released WebShop skill libraries (its
task_specific_skills keys): apparel, footwear, home_decor, electronics, accessories, beauty_health,
other. The price bound is WebShop's: two of the first four multiples of 10 above the target's price,
drawn, the larger one.

An action that changes nothing (a search without a search bar, a click on something not on the page,
an empty query, anything else) returns exactly "Nothing happens." and is counted. Split: by a stable
hash of the goal (type, attributes, options), so a held-out goal is never trained on whatever the
seed; each task's catalogue is random. `oracle_actions(task)`: search the type and attributes, page
to the target, choose its options, buy it.
"""
from __future__ import annotations

import re

from .base import NOTHING_HAPPENS, Environment, Task, draw_tasks, task_id
from .bm25 import bm25_scores

TASK_TYPES = ("apparel", "footwear", "home_decor", "electronics", "accessories", "beauty_health",
              "other")
DEFAULT_PER_TYPE = 10
MAX_STEPS = 15                  # WebShop agents (ReAct, MASA) are given 15 steps
PER_PAGE, MAX_RESULTS = 10, 50  # WebShop's search results: 10 a page, the top 50
N_PRODUCTS = 24
ACTION_SYNTAX = ("search [query]", "click [button or option]")
# The page's buttons that are not products or options, as WebShop names them.
BACK_TO_SEARCH, NEXT_PAGE, PREV_PAGE, BUY_NOW = "back to search", "next >", "< prev", "buy now"
SUB_PAGES = ("description", "features", "reviews")

# category -> product type -> (group, attributes, options {name: values}, price range). The texts of
# a product (brand, type name, its attributes, the fixed sentences) never hold another attribute of
# its type or an option value of it as a phrase (tests check), so a product lacks exactly what it is
# said to lack.
CATALOGUE = {
    "apparel": {
        "t-shirt": ("tops", ("cotton", "machine wash", "short sleeve", "slim fit", "crew neck"),
                    {"color": ("black", "white", "navy", "heather grey", "olive"),
                     "size": ("small", "medium", "large", "x-large")}, (8, 30)),
        "hoodie": ("tops",
                   ("fleece lined", "machine wash", "zip up", "kangaroo pocket", "relaxed fit"),
                   {"color": ("black", "charcoal", "navy", "burgundy"),
                    "size": ("small", "medium", "large",
                                                                               "x-large")},
                   (20, 60)),
        "jeans": ("bottoms",
                  ("stretch denim", "slim fit", "high waist", "machine wash", "button closure"),
                  {"color": ("dark wash", "light wash", "black"),
                   "size": ("28w x 30l", "30w x 32l", "32w x 32l",
                                                                           "34w x 34l")}, (20, 70)),
    },
    "footwear": {
        "running shoes": ("athletic", ("lightweight", "breathable mesh", "rubber sole",
                                       "arch support", "non slip"),
                          {"color": ("black", "white", "blue", "grey"),
                           "size": ("7", "8", "9", "10", "11")},
                          (30, 120)),
        "hiking boots": ("outdoor",
                         ("waterproof", "ankle support", "rubber sole", "lace up", "insulated"),
                         {"color": ("brown", "black", "khaki"),
                          "size": ("7", "8", "9", "10", "11")}, (50, 150)),
        "slippers": ("indoor", ("memory foam", "faux fur", "non slip", "machine wash", "open toe"),
                     {"color": ("pink", "grey", "beige"), "size": ("small", "medium", "large")},
                     (10, 40)),
    },
    "home_decor": {
        "throw pillow covers": ("textiles",
                                ("velvet", "hidden zipper", "machine wash", "double sided"),
                                {"color": ("sage green", "mustard", "cream", "navy"),
                                 "size": ("18 x 18 inch", "20 x 20 inch", "24 x 24 inch")},
                                (8, 30)),
        "blackout curtains": ("textiles", ("thermal insulated", "grommet top", "noise reducing",
                                           "machine wash"),
                              {"color": ("grey", "navy", "beige", "black"),
                               "size": ("42 x 63 inch", "52 x 84 inch", "52 x 95 inch")}, (15, 60)),
        "table lamp": ("lighting",
                       ("dimmable", "usb port", "linen shade", "touch control", "energy efficient"),
                       {"color": ("black", "brass", "white")}, (20, 80)),
    },
    "electronics": {
        "wireless earbuds": ("audio",
                             ("bluetooth", "noise cancelling", "water resistant", "charging case",
                                       "long battery life"), {"color": ("black", "white", "blue")},
                             (15, 90)),
        "portable charger": ("power",
                             ("fast charging", "usb c", "compact", "led display", "dual output"),
                             {"color": ("black", "white"),
                              "capacity": ("10000mah", "20000mah", "26800mah")},
                             (12, 50)),
        "bluetooth speaker": ("audio", ("waterproof", "deep bass", "long battery life",
                                        "hands free calling"),
                              {"color": ("black", "red", "teal")}, (20, 100)),
    },
    "accessories": {
        "leather wallet": ("small goods",
                           ("genuine leather", "rfid blocking", "slim", "bifold", "gift box"),
                           {"color": ("black", "brown", "tan")}, (10, 50)),
        "backpack": ("bags",
                     ("water resistant", "laptop compartment", "lightweight", "padded straps"),
                     {"color": ("black", "grey", "navy", "olive")}, (20, 80)),
        "sunglasses": ("eyewear", ("polarized", "uv protection", "lightweight", "metal frame"),
                       {"color": ("black", "tortoise", "gold"),
                        "lens color": ("grey lens", "brown lens",
                                                                               "green lens")},
                       (10, 60)),
    },
    "beauty_health": {
        "face moisturizer": ("skin care",
                             ("fragrance free", "hyaluronic acid", "oil free", "sensitive skin",
                                           "non comedogenic"),
                             {"size": ("1.7 fl oz", "3.4 fl oz"),
                              "pack": ("pack of 1", "pack of 2")}, (8, 40)),
        "shampoo": ("hair care", ("sulfate free", "paraben free", "dry hair", "natural ingredients",
                                  "color safe"),
                    {"size": ("8 fl oz", "16 fl oz", "32 fl oz"),
                     "scent": ("lavender", "coconut", "unscented")},
                    (6, 30)),
        "vitamin c serum": ("skin care",
                            ("cruelty free", "anti aging", "vegan", "dark spot", "paraben free"),
                            {"size": ("1 fl oz", "2 fl oz")}, (10, 45)),
    },
    "other": {
        "coffee mug": ("kitchen", ("ceramic", "dishwasher safe", "microwave safe", "gift box"),
                       {"color": ("white", "black", "blue"), "size": ("12 oz", "16 oz")}, (8, 25)),
        "yoga mat": ("fitness", ("non slip", "extra thick", "eco friendly", "carrying strap"),
                     {"color": ("purple", "black", "teal", "pink")}, (15, 50)),
        "dog leash": ("pet supplies", ("reflective", "heavy duty", "padded handle", "nylon"),
                      {"color": ("red", "black", "blue"), "size": ("small", "medium", "large")},
                      (8, 30)),
    },
}
BRANDS = ("Norvik", "Caldera", "Brisa", "Quillon", "Marlowe", "Ardent", "Fennix", "Lumora",
          "Halden", "Orrin",
          "Vesper", "Kaito", "Embrook", "Solvei", "Pardo", "Wrenly")
FEATURE_LINES = ("Satisfaction guaranteed.", "Ships in a recyclable box.")
REVIEW_LINES = ("Great value, would buy again.", "Exactly as described.",
                "Arrived quickly and works well.")
_ACTION = re.compile(r"(search|click)\s*(?:\[(.*)\]|[:\s]\s*(.+))", re.S)
_WORDS = re.compile(r"[a-z0-9]+(?:[-.][a-z0-9]+)*")


def _type_info(product_type: str) -> tuple[str, tuple, dict, tuple]:
    for category, types in CATALOGUE.items():
        if product_type in types:
            group, attributes, options, prices = types[product_type]
            return category, (group, attributes, options, prices)
    raise KeyError(product_type)


def _title_case(text: str) -> str:
    return " ".join(w[:1].upper() + w[1:] for w in text.split())


def _words(text: str) -> set[str]:
    return set(_WORDS.findall(text.lower()))


def _same_words(a: str, b: str) -> bool:
    return sorted(_WORDS.findall(a.lower())) == sorted(_WORDS.findall(b.lower()))


def _texts(product: dict) -> str:
    """The product's title, features and description, lower-cased (where WebShop also looks for
    attributes)."""
    return " | ".join([product["title"], " ".join(product["features"]),
                       product["description"]]).lower()


def _has_phrase(text: str, phrase: str) -> bool:
    """`phrase` occurs in `text` as whole words (WebShop tests a plain substring; whole words keep
    "tan" out of "stand" in a generated text)."""
    return re.search(rf"(?<![a-z0-9]){re.escape(phrase.lower())}(?![a-z0-9])", text) is not None


# --------------------------------------------------------------------------- reward (WebShop's
# get_reward)

def type_reward(product: dict, goal: dict) -> dict:
    """WebShop's get_type_reward: r_type with query_match, category_match and title_score (module
    docstring)."""
    query_match = product["type"] == goal["type"]
    path = lambda p: {p["category"], p["group"], p["type"]}  # noqa: E731 - category › group › type
    category_match = len(path(product) & path(goal)) >= 2
    desired = _words(goal["type"])
    title_score = len(_words(product["title"]) & desired) / len(desired) if desired else 0.2
    r_type = 1.0 if (query_match or category_match or title_score > 0.2) else 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {"r_type": r_type, "query_match": query_match, "category_match": category_match,
            "title_score": title_score}


def attribute_matches(product: dict, goal: dict) -> int:
    """Goal attributes the product has (its attribute list, or a phrase of its texts)."""
    texts = _texts(product)
    return sum(1 for g in goal["attributes"]
               if any(_same_words(g, a) for a in product["attributes"]) or _has_phrase(texts, g))


def option_matches(product: dict, goal: dict, chosen: dict) -> int:
    """Chosen options that are goal options (the same words), or phrases of the product's texts."""
    texts, wanted = _texts(product), list(goal["options"].values())
    return sum(1 for value in chosen.values()
               if any(_same_words(value, g) for g in wanted) or _has_phrase(texts, value))


def webshop_reward(product: dict, goal: dict, price: float, chosen: dict) -> tuple[float, dict]:
    """WebShop's get_reward (module docstring): the score in [0, 1] and its terms."""
    r_type = type_reward(product, goal)
    r_price = 1 if price <= goal["price_upper"] else 0
    n_att = attribute_matches(product, goal)
    n_opt = option_matches(product, goal, chosen)
    total = (n_att + n_opt + r_price) / (len(goal["attributes"]) + len(goal["options"]) + 1)
    info = {**r_type, "n_att": n_att, "n_opt": n_opt, "r_price": r_price}
    return total * r_type["r_type"], info


# --------------------------------------------------------------------------- environment

class WebShopEnv(Environment):
    """One shopping session; `spec` is the task's env_spec (never modified)."""
    action_syntax = ACTION_SYNTAX

    def __init__(self, spec: dict, max_steps: int = MAX_STEPS):
        super().__init__(max_steps)
        self.spec = spec
        self.products = {p["asin"].lower(): p for p in spec["products"]}
        self._documents = [_search_text(p) for p in spec["products"]]

    def _reset(self) -> str:
        self.page = "search"          # search | results | item | sub page name | done
        self.results: list[str] = []  # asins of the last search, best first
        self.page_number = 1
        self.asin: str | None = None
        self.chosen: dict[str, str] = {}
        self.reward = 0.0
        self.reward_info: dict = {}
        return self.render()

    # ---- pages
    def _head(self) -> list[str]:
        return ["Instruction:", self.spec["instruction"]]

    def render(self) -> str:
        if self.page == "search":
            return " [SEP] ".join(["WebShop"] + self._head() + ["Search"])
        parts = self._head() + ["Back to Search"]
        if self.page == "results":
            first = (self.page_number - 1) * PER_PAGE
            if self.page_number > 1:
                parts.append("< Prev")
            parts.append(f"Page {self.page_number} (Total results: {len(self.results)})")
            if first + PER_PAGE < len(self.results):
                parts.append("Next >")
            for asin in self.results[first:first + PER_PAGE]:
                p = self.products[asin]
                parts += [p["asin"], p["title"], f"${p['price']:.2f}"]
            return " [SEP] ".join(parts)
        p = self.products[self.asin]
        parts.append("< Prev")
        if self.page == "item":
            for name, values in p["options"].items():
                parts += [name] + list(values)
            parts += [p["title"], f"Price: ${p['price']:.2f}", "Rating: N.A.", "Description",
                      "Features",
                      "Reviews", "Buy Now"]
            clicked = "".join(f"You have clicked {v}.\n" for v in self.chosen.values())
            return clicked + " [SEP] ".join(parts)
        body = {"description": [p["description"]], "features": list(p["features"]),
                "reviews": list(p["reviews"])}[self.page]
        return " [SEP] ".join(parts + body)

    def clickables(self) -> list[str]:
        """What a click may name on this page, as WebShop lists them (lower case)."""
        if self.page in ("search", "done"):
            return []
        out = [BACK_TO_SEARCH]
        if self.page == "results":
            first = (self.page_number - 1) * PER_PAGE
            if self.page_number > 1:
                out.append(PREV_PAGE)
            if first + PER_PAGE < len(self.results):
                out.append(NEXT_PAGE)
            return out + self.results[first:first + PER_PAGE]
        out.append(PREV_PAGE)
        if self.page == "item":
            out += [v for values in self.products[self.asin]["options"].values() for v in values]
            out += list(SUB_PAGES) + [BUY_NOW]
        return out

    def admissible_actions(self) -> list[str]:
        """Every click of the page (a search, allowed on the search page, takes free text and is not
        listed)."""
        return [f"click [{c}]" for c in self.clickables()]

    # ---- actions
    def _step(self, action: str) -> str:
        m = _ACTION.fullmatch(action)
        if not m:
            return NOTHING_HAPPENS
        verb, argument = m.group(1), (m.group(2) if m.group(2) is not None else m.group(3)).strip()
        if verb == "search":
            if self.page != "search" or not argument:
                return NOTHING_HAPPENS
            scores = bm25_scores(argument, self._documents)
            order = sorted((i for i, s in enumerate(scores) if s > 0),
                           key=lambda i: -scores[i])[:MAX_RESULTS]
            self.results = [self.spec["products"][i]["asin"].lower() for i in order]
            self.page, self.page_number, self.asin, self.chosen = "results", 1, None, {}
            return self.render()
        if argument not in self.clickables():
            return NOTHING_HAPPENS
        return self._click(argument)

    def _click(self, name: str) -> str:
        if name == BACK_TO_SEARCH:
            self.page, self.results, self.asin, self.chosen = "search", [], None, {}
        elif name == NEXT_PAGE:
            self.page_number += 1
        elif name == PREV_PAGE:
            if self.page == "results":
                self.page_number -= 1
            elif self.page == "item":
                self.page, self.asin, self.chosen = "results", None, {}
            else:
                self.page = "item"
        elif self.page == "results":
            self.page, self.asin, self.chosen = "item", name, {}
        elif name in SUB_PAGES:
            self.page = name
        elif name == BUY_NOW:
            return self._buy()
        else:   # an option value: it replaces the value chosen for its option
            option = next(o for o, values in self.products[self.asin]["options"].items()
                          if name in values)
            self.chosen[option] = name
        return self.render()

    def _buy(self) -> str:
        product = self.products[self.asin]
        self.reward, self.reward_info = webshop_reward(product, self.spec["goal"], product["price"],
                                                       self.chosen)
        self.success = self.reward >= 1.0 - 1e-9
        self.done = True
        self.page = "done"
        chosen = ", ".join(f"{k}: {v}" for k, v in self.chosen.items()) or "none"
        return " [SEP] ".join(["Thank you for shopping with us!", "Purchased", product["asin"],
                               product["title"],
                               f"Options: {chosen}", "Your score (min 0.0, max 1.0)",
                               f"{self.reward:.2f}"])


def _search_text(product: dict) -> str:
    """What the search engine indexes of a product: its title, features and attributes."""
    return " ".join([product["title"], " ".join(product["features"]),
                     " ".join(product["attributes"])])


# --------------------------------------------------------------------------- generation

def _asin(rng, taken: set[str]) -> str:
    while True:
        asin = "B0" + "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ0123456789") for _ in range(8))
        if asin not in taken:
            taken.add(asin)
            return asin


def _product(rng, product_type: str, attributes: list[str], options: dict, price: float,
             taken: set[str]) -> dict:
    category, (group, _, _, _) = _type_info(product_type)
    brand = rng.choice(BRANDS)
    shown = attributes[:2]
    title = f"{brand} {_title_case(' '.join(shown))} {_title_case(product_type)}".replace("  ", " ")
    features = [f"{_title_case(a)}." for a in attributes] + list(FEATURE_LINES)
    description = f"A {product_type} by {brand}, made for everyday use."
    return {"asin": _asin(rng, taken), "type": product_type, "category": category, "group": group,
            "title": title, "attributes": list(attributes), "features": features,
            "description": description,
            "reviews": rng.sample(REVIEW_LINES, 2),
            "options": {k: list(v) for k, v in options.items()},
            "price": round(price, 2)}


def _price(rng, low: float, high: float) -> float:
    return round(rng.uniform(low, high), 2)


def price_upper(rng, price: float) -> float:
    """WebShop's bound: two of the first four multiples of 10 above the price, drawn; the larger
    one."""
    above = [10.0 * i for i in range(1, 100) if 10.0 * i > price][:4]
    return max(rng.sample(above, 2))


def _offered(rng, values: tuple, must: str | None, k: int) -> list[str]:
    """k of an option's values (all when fewer), holding `must` when given, in catalogue order."""
    others = [v for v in values if v != must]
    picked = set(rng.sample(others, min(len(others), k - (1 if must else 0))))
    if must:
        picked.add(must)
    return [v for v in values if v in picked]


def instruction_text(goal: dict) -> str:
    attrs = " and ".join(goal["attributes"])
    options = "".join(f", and {name}: {value}" for name, value in goal["options"].items())
    return (f"i am looking for a {goal['type']} that is "
            f"{attrs}{options.replace(', and', ', with', 1)}, and price lower than "
            f"{goal['price_upper']:.2f} dollars")


def _make_catalogue(rng, goal: dict) -> list[dict]:
    """The target, near misses of its type (an attribute short, too dear, an option value not
    offered), other products of its type and category, and products of other categories;
    shuffled."""
    _, (_, attr_pool, option_pool, (low, high)) = _type_info(goal["type"])
    taken: set[str] = set()
    want = goal["attributes"]
    target_price = goal["target_price"]
    extra = [a for a in attr_pool if a not in want]

    def options(must: dict | None = None, drop: str | None = None) -> dict:
        out = {}
        for name, values in option_pool.items():
            if name == drop:
                out[name] = _offered(rng, tuple(v for v in values if v != goal["options"][name]),
                                     None,
                                     min(3, len(values) - 1))
            else:
                out[name] = _offered(rng, values, (must or {}).get(name), min(3, len(values)))
        return out

    products = [_product(rng, goal["type"], list(want) + rng.sample(extra, 1),
                         options(goal["options"]),
                         target_price, taken)]
    short = [rng.choice(want)]
    products.append(_product(rng, goal["type"], [a for a in want if a not in short]
                             + rng.sample(extra, 2),
                             options(goal["options"]),
                             _price(rng, low, min(high, goal["price_upper"])), taken))
    products.append(_product(rng, goal["type"], list(want), options(goal["options"]),
                             round(goal["price_upper"] + rng.uniform(1, 20), 2), taken))
    drop = rng.choice(sorted(option_pool))
    products.append(_product(rng, goal["type"], list(want), options(goal["options"], drop=drop),
                             _price(rng, low, min(high, goal["price_upper"])), taken))
    for _ in range(3):
        products.append(_product(rng, goal["type"], rng.sample(attr_pool, 2), options(),
                                 _price(rng, low, high), taken))
    category = goal["category"]
    for other in [t for t in CATALOGUE[category] if t != goal["type"]]:
        _, (_, pool, opts, (lo, hi)) = _type_info(other)
        shared = [a for a in want if a in pool]
        attrs = shared[:2] + rng.sample([a for a in pool if a not in shared], 2
                                        - min(2, len(shared)))
        products.append(_product(rng, other, attrs, {k: list(v[:3]) for k, v in opts.items()},
                                 _price(rng, lo, hi), taken))
    others = [t for c, types in CATALOGUE.items() if c != category for t in types]
    while len(products) < N_PRODUCTS:
        other = rng.choice(others)
        _, (_, pool, opts, (lo, hi)) = _type_info(other)
        products.append(_product(rng, other, rng.sample(pool, 2),
                                 {k: list(v[:3]) for k, v in opts.items()},
                                 _price(rng, lo, hi), taken))
    products[0]["target"] = True
    rng.shuffle(products)
    return products


def generate_webshop(split: str = "train", seed: int = 0, n: int | None = None,
                     types: tuple[str, ...] = TASK_TYPES) -> list[Task]:
    """`n` shopping tasks (default 10 per category) of one split, categories interleaved
    (base.draw_tasks)."""
    def draw(rng, category):
        product_type = rng.choice(sorted(CATALOGUE[category]))
        _, (group, attr_pool, option_pool, (low, high)) = _type_info(product_type)
        attributes = rng.sample(attr_pool, 2)
        goal_options = {name: rng.choice(values) for name, values in option_pool.items()}
        key = (f"webshop|{category}|{product_type}|{'+'.join(sorted(attributes))}|"
               + "+".join(f"{k}={v}" for k, v in sorted(goal_options.items())))

        def build():   # the price and the catalogue are drawn only for a goal that is kept
            target_price = _price(rng, low, high)
            goal = {"type": product_type, "category": category, "group": group,
                    "attributes": attributes,
                    "options": goal_options, "target_price": target_price,
                    "price_upper": price_upper(rng, target_price)}
            goal["instruction"] = instruction_text(goal)
            spec = {"kind": "webshop", "instruction": goal["instruction"], "goal": goal,
                    "products": _make_catalogue(rng, goal)}
            return Task(id=task_id(f"webshop-{category}", key + f"|{seed}"), type=category,
                        question=goal["instruction"], answer=None, verifier="env", multi_turn=True,
                        max_steps=MAX_STEPS, env_spec=spec,
                        metadata={"suite": "webshop", "split": split, "seed": seed})
        return key, build
    return draw_tasks("webshop", split, seed, types, TASK_TYPES, n, DEFAULT_PER_TYPE, draw)


# --------------------------------------------------------------------------- oracle

def oracle_actions(task: Task) -> list[str]:
    """search[type and attributes], next > until the target shows, click it, choose its goal
    options, buy."""
    spec = task.env_spec
    goal = spec["goal"]
    target = next(p for p in spec["products"] if p.get("target"))
    env = WebShopEnv(spec, max_steps=10 ** 6)
    env.reset()
    plan: list[str] = []

    def do(action: str) -> None:
        if env.step(action)[0] == NOTHING_HAPPENS:
            raise RuntimeError(f"oracle for {task.id}: {action!r} did nothing")
        plan.append(action)

    do(f"search[{goal['type']} {' '.join(goal['attributes'])}]")
    asin = target["asin"].lower()
    while asin not in env.clickables():
        if NEXT_PAGE not in env.clickables():
            raise RuntimeError(f"oracle for {task.id}: the target is not among the search results")
        do(f"click[{NEXT_PAGE}]")
    do(f"click[{asin}]")
    for value in goal["options"].values():
        do(f"click[{value}]")
    do(f"click[{BUY_NOW}]")
    if not env.success:
        raise RuntimeError(f"oracle for {task.id}: bought with reward {env.reward}, not 1")
    return plan
