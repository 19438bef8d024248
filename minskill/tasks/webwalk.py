"""`webwalk`: WebWalker-like multi-hop navigation over a generated local website.

Each task has its own small website of a fictional institute: a home page, an about page, a news
page, an index of departments, a page per department, pages for its people and its labs, and a page
per project of a lab. Every page has a title, some text and links (by label). The agent starts on
the home page with a question whose answer is written on one page (one source) or needs two pages
(two sources), and acts with

    click <link label> | back | answer <text>

`answer` ends the episode; success = `exact_match(text, reference)` (SQuAD normalisation). A click
on a label that is not on the page, or `back` on the first page, returns "Nothing happens."
(counted).

Levels (by how deep the answer lies; the home page is depth 0):
    easy    one source at depth 2 (a department's founding year or building)
    medium  one source at depth 3 (a person's office room, a lab's founding year)
    hard    one source at depth 4 (a project's start year), or two sources at depth 2-3 compared
            ("which was founded earlier, X or Y?")
Split: by a stable hash of (level, question, answer) — each site is random, so the two splits never
share a task. `oracle_actions(task)` finds the clicks by breadth-first search over the links.
"""
from __future__ import annotations

from collections import deque

from .base import (NOTHING_HAPPENS, Environment, Task, check_split, counts_per_type, interleave,
                   rng_for,
                   split_of, task_id)
from .verifiers import exact_match

LEVELS = ("easy", "medium", "hard")
DEFAULT_PER_TYPE = 10
MAX_STEPS = 12
ACTION_SYNTAX = ("click <link>", "back", "answer <text>")

_FIELDS = ["Optics", "Geology", "Botany", "Linguistics", "Robotics", "Music", "History",
           "Chemistry",
           "Astronomy", "Economics", "Zoology", "Oceanography"]
_SYLLABLES = ["mar", "lo", "ven", "tis", "ka", "dor", "ri", "sel", "bu", "nam", "e", "quin", "ha",
              "vel",
              "ta", "mo", "zer", "li", "an", "cor"]
_LAB_WORDS = ["Kestrel", "Aurora", "Granite", "Willow", "Comet", "Harbor", "Falcon", "Ember",
              "Juniper",
              "Summit", "Lantern", "Meadow", "Orchid", "Quartz", "Tundra", "Vertex"]
_PROJECT_WORDS = ["Atlas", "Beacon", "Cascade", "Delta", "Echo", "Fjord", "Gale", "Helix", "Iris",
                  "Jade",
                  "Keel", "Lumen", "Mosaic", "Nimbus", "Onyx", "Prism"]


def _person(rng) -> str:
    first = "".join(rng.sample(_SYLLABLES, 2)).capitalize()
    last = "".join(rng.sample(_SYLLABLES, 3)).capitalize()
    return f"{first} {last}"


def _make_site(rng) -> dict:
    """pages: id -> {"title", "text", "links": [[label, page id], ...]}; facts for the questions."""
    institute = "".join(rng.sample(_SYLLABLES, 2)).capitalize() + " Institute"
    pages: dict[str, dict] = {}
    facts: dict[str, dict] = {"departments": {}, "people": {}, "labs": {}, "projects": {}}
    departments = rng.sample(_FIELDS, 4)
    labs_words = rng.sample(_LAB_WORDS, 8)
    project_words = rng.sample(_PROJECT_WORDS, 8)
    used_years: set[int] = set()

    def year(low: int, high: int) -> int:
        while True:
            y = rng.randint(low, high)
            if y not in used_years:
                used_years.add(y)
                return y

    home = lambda: ["Home", "home"]  # noqa: E731 - a link every page carries
    pages["home"] = {"title": f"{institute} - Home",
                     "text": f"Welcome to the {institute}. We study many things in "
                     f"{len(departments)} departments.",
                     "links": [["About", "about"], ["News", "news"],
                               ["Departments", "departments"]]}
    pages["about"] = {"title": "About",
                      "text": f"The {institute} is an independent research institute. "
                      f"Visitors are welcome on weekdays.", "links": [home()]}
    pages["news"] = {"title": "News", "text": "The annual open day will be announced soon. "
                     "Our library has new opening hours.", "links": [home()]}
    pages["departments"] = {"title": "Departments", "text": "Our departments:", "links": [home()]}
    for d_index, field in enumerate(departments):
        d_id = f"dept-{field.lower()}"
        founded, building = year(1900, 1990), f"{rng.choice('ABCDEFGH')}{rng.randint(1, 9)}"
        head = _person(rng)
        pages["departments"]["links"].append([f"Department of {field}", d_id])
        lab_names = [f"{labs_words[2 * d_index + k]} Lab" for k in range(2)]
        people = [head] + [_person(rng) for _ in range(2)]
        pages[d_id] = {"title": f"Department of {field}",
                       "text": f"The Department of {field} was founded in {founded}. It is housed "
                               f"in building {building}. The head of the department is {head}.",
                       "links": [home(), ["People", f"{d_id}-people"], ["Labs", f"{d_id}-labs"]]}
        facts["departments"][field] = {"page": d_id, "founded": founded, "building": building}
        pages[f"{d_id}-people"] = {"title": f"People of the Department of {field}",
                                   "text": "Staff members:", "links": [home()]}
        for person in people:
            p_id = f"person-{person.lower().replace(' ', '-')}"
            room = f"{rng.randint(1, 4)}{rng.randint(0, 2)}{rng.randint(1, 9)}"
            pages[f"{d_id}-people"]["links"].append([person, p_id])
            pages[p_id] = {"title": person, "text": f"{person} works in the Department of {field}. "
                           f"Office: room {room}.", "links": [home()]}
            facts["people"][person] = {"page": p_id, "room": room, "department": field}
        pages[f"{d_id}-labs"] = {"title": f"Labs of the Department of {field}", "text": "Our labs:",
                                 "links": [home()]}
        for k, lab in enumerate(lab_names):
            l_id = f"lab-{lab.lower().replace(' ', '-')}"
            lab_year = year(1950, 2015)
            project = f"Project {project_words[2 * d_index + k]}"
            pr_id = f"project-{project_words[2 * d_index + k].lower()}"
            pages[f"{d_id}-labs"]["links"].append([lab, l_id])
            pages[l_id] = {"title": lab,
                           "text": f"The {lab} was founded in {lab_year}. It runs one project.",
                           "links": [home(), [project, pr_id]]}
            start = year(2016, 2024)
            pages[pr_id] = {"title": project, "text": f"{project} of the {lab} started in {start}.",
                            "links": [home()]}
            facts["labs"][lab] = {"page": l_id, "founded": lab_year, "department": field}
            facts["projects"][project] = {"page": pr_id, "start": start, "lab": lab}
    return {"institute": institute, "pages": pages, "facts": facts}


def _question(rng, level: str, site: dict) -> tuple[str, str, list[str]]:
    """(question, answer, pages holding the answer) for a level."""
    facts = site["facts"]
    if level == "easy":
        field = rng.choice(sorted(facts["departments"]))
        d = facts["departments"][field]
        if rng.random() < 0.5:
            return f"In which year was the Department of {field} founded?", str(
                d["founded"]), [d["page"]]
        return f"In which building is the Department of {field} housed?", d["building"], [d["page"]]
    if level == "medium":
        if rng.random() < 0.5:
            person = rng.choice(sorted(facts["people"]))
            p = facts["people"][person]
            return f"What is the office room number of {person}?", p["room"], [p["page"]]
        lab = rng.choice(sorted(facts["labs"]))
        return f"In which year was the {lab} founded?", str(
            facts["labs"][lab]["founded"]), [facts["labs"][lab]["page"]]
    if rng.random() < 0.5:
        project = rng.choice(sorted(facts["projects"]))
        pr = facts["projects"][project]
        return f"In which year did {project} start?", str(pr["start"]), [pr["page"]]
    if rng.random() < 0.5:
        a, b = rng.sample(sorted(facts["departments"]), 2)
        da, db = facts["departments"][a], facts["departments"][b]
        answer = a if da["founded"] < db["founded"] else b
        return (f"Which department was founded earlier, the Department of {a} or the Department of "
                f"{b}? Answer with the field name only.", answer, [da["page"], db["page"]])
    a, b = rng.sample(sorted(facts["labs"]), 2)
    la, lb = facts["labs"][a], facts["labs"][b]
    answer = a if la["founded"] < lb["founded"] else b
    return f"Which lab was founded earlier, the {a} or the {b}?", answer, [la["page"], lb["page"]]


# --------------------------------------------------------------------------- environment

class WebWalkEnv(Environment):
    action_syntax = ACTION_SYNTAX

    def __init__(self, spec: dict, max_steps: int = MAX_STEPS):
        super().__init__(max_steps)
        self.spec = spec
        self.pages = spec["pages"]

    def _reset(self) -> str:
        self.page = "home"
        self.history: list[str] = []
        self.answer: str | None = None
        return (f"Question: {self.spec['question']}\nYou can `click <link>`, go `back`, or `answer "
                "<text>`.\n\n"
                + self.render(self.page))

    def render(self, page_id: str) -> str:
        page = self.pages[page_id]
        links = " ".join(f"[{label}]" for label, _ in page["links"])
        return f"Page: {page['title']}\n{page['text']}\nLinks: {links}"

    def _step(self, action: str) -> str:
        if action.startswith("answer"):
            text = action[len("answer"):].strip().lstrip(":").strip()
            if not text:
                return NOTHING_HAPPENS
            self.answer = text
            self.success = exact_match(text, self.spec["answer"])
            self.done = True
            return f"You answered: {text}"
        if action == "back":
            if not self.history:
                return NOTHING_HAPPENS
            self.page = self.history.pop()
            return self.render(self.page)
        if action.startswith("click"):
            label = action[len("click"):].strip().strip("[]").strip()
            for link_label, target in self.pages[self.page]["links"]:
                if link_label.lower() == label:
                    self.history.append(self.page)
                    self.page = target
                    return self.render(target)
        return NOTHING_HAPPENS

    def admissible_actions(self) -> list[str]:
        """The clicks on this page, `back` when there is a page to go back to; `answer <text>` is
        always allowed and not listed."""
        actions = [f"click {label}" for label, _ in self.pages[self.page]["links"]]
        return actions + (["back"] if self.history else [])


# --------------------------------------------------------------------------- generation

def generate_webwalk(split: str = "train", seed: int = 0, n: int | None = None,
                     types: tuple[str, ...] = LEVELS) -> list[Task]:
    """`n` navigation tasks (default 10 per level) of one split, levels interleaved."""
    check_split(split, allow_all=False)
    per_level = counts_per_type(types, LEVELS, n, DEFAULT_PER_TYPE, "webwalk levels")
    by_level = {}
    for level in types:
        count = per_level[level]
        rng = rng_for("webwalk", split, seed, level)
        tasks, seen = [], set()
        while len(tasks) < count:
            site = _make_site(rng)
            question, answer, sources = _question(rng, level, site)
            question = f"On the website of the {site['institute']}: {question}"
            key = f"webwalk|{level}|{site['institute']}|{question}|{answer}"
            if key in seen or split_of(key) != split:
                continue
            seen.add(key)
            spec = {"kind": "webwalk", "question": question, "answer": answer, "sources": sources,
                    "pages": site["pages"]}
            tasks.append(Task(id=task_id(f"webwalk-{level}", key), type=level, question=question,
                              answer=answer, verifier="exact", multi_turn=True, max_steps=MAX_STEPS,
                              env_spec=spec,
                              metadata={"suite": "webwalk", "split": split, "seed": seed,
                                                       "sources": len(sources)}))
        by_level[level] = tasks
    return interleave(by_level, types)


def _path(pages: dict, start: str, goal: str) -> list[str]:
    """Link labels of a shortest click path from `start` to `goal` (breadth-first search)."""
    previous: dict[str, tuple[str, str] | None] = {start: None}
    queue = deque([start])
    while queue:
        page = queue.popleft()
        if page == goal:
            labels = []
            while previous[page] is not None:
                page, label = previous[page]
                labels.append(label)
            return labels[::-1]
        for label, target in pages[page]["links"]:
            if target not in previous:
                previous[target] = (page, label)
                queue.append(target)
    raise RuntimeError(f"page {goal!r} cannot be reached from {start!r}")


def oracle_actions(task: Task) -> list[str]:
    """Clicks to each source page in turn, then `answer <reference>`."""
    spec = task.env_spec
    actions, page = [], "home"
    for source in spec["sources"]:
        actions += [f"click {label}" for label in _path(spec["pages"], page, source)]
        page = source
    return actions + [f"answer {spec['answer']}"]
