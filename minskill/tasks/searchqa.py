"""`searchqa`: search-based question answering (Search-R1 style) over a generated corpus, with a
real retrieval tool.

Each task has its own small world of fictional entities (countries and their cities, people,
companies, films, rivers) written as short documents, one an entity, plus distractor documents that
name the same entities without answering (a biography's author, a company's rival, people who share
a surname). The agent acts with

    search[query]   the top TOP_K documents of the corpus by BM25 (tasks/bm25.py) over each
                    document's title and text, shown as Search-R1 shows them: <information>Doc
                    1(Title: T) text\\nDoc 2(Title: ...) ...</information>
    answer[text]    ends the episode

(a space before the bracket, or none and no bracket — "answer 1987", as the agent loop writes a verb
— is read too). The answer is scored as search-QA benchmarks do (SQuAD normalisation: lower case, no
punctuation, no articles a/an/the, single spaces): exact match against the golden answers (`env.em`;
success = EM, Search-R1's reward) and token F1 (`env.f1`, verifiers.token_f1: the harmonic mean of
the precision and recall of the normalised tokens shared with the best golden answer).

Task types, as MASA's released search skill libraries name their query types (their
query_type_skills keys; "compare", another name of comparison there, is read as it: TYPE_NAMES):

    direct_retrieval         one document states the answer to a who/when question (NQ, TriviaQA)
    entity_attribute_lookup  one attribute of a named entity: occupation, birthplace, language,
                             country (PopQA)
    multi_hop_reasoning      a bridge entity first (the founder of a company, the director of a
                             film), then its attribute (HotpotQA's bridge questions)
    comparison               the same attribute of two entities compared (born earlier, founded
                             first, longer)

An action that is neither (or an empty query or answer) returns exactly "Nothing happens." and is
counted. Split: by a stable hash of (type, question, answer); each world is random, so the splits
share no task. Every task is checked when drawn: the search an oracle would make for each document
the answer needs (the entity's name) finds it among the top TOP_K, so every task is solvable by
reading; `oracle_actions(task)` is that plan.

A real retriever: with --retriever-url URL ($MINSKILL_RETRIEVER_URL) search[query] asks that
retriever in Search-R1's protocol (tasks/search_r1.py) instead; a failed search (no answer, a bad
reply) shows the agent "Tool error (search): why" and is counted in `env.tool_errors`.
`python -m minskill.tasks.retriever_server --corpus FILE` serves a corpus so (BM25, the same
ranking as in-process). Question files in Search-R1's layout load as a suite (searchqa:PATH.jsonl,
or a .jsonl whose first line has golden_answers): JSONL, one question a line, with `question` and
`golden_answers` (a list; EM/F1 against the best of them); `type` (default direct_retrieval) and
`split` (train/heldout; default by a hash of the question) are read; `id`, `data_source` and
`metadata` are kept in the task's metadata["source"]; other fields are ignored. Their search needs
the retriever (the suite does not load without one), and they have no oracle.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from .base import (NOTHING_HAPPENS, Environment, Task, check_split, check_task_type, draw_tasks,
                   task_id)
from .bm25 import BM25Index, top_documents
from .qa import _lines, tasks_from_jsonl
from .search_r1 import RETRIEVER_URL_ENV, RetrieverError, retrieve, retriever_url
from .verifiers import exact_match, token_f1

TASK_TYPES = ("direct_retrieval", "multi_hop_reasoning", "entity_attribute_lookup", "comparison")
# Other names of the types: "compare" is comparison's key in some of MASA's/SkillRL's released
# search files.
TYPE_NAMES = {"comparison": ("compare",)}
DEFAULT_PER_TYPE = 10
MAX_STEPS = 6          # a few searches and the answer (Search-R1 allows 4 turns of search)
TOP_K = 3              # documents a search returns (Search-R1's top-k)
ACTION_SYNTAX = ("search [query]", "answer [text]")
QUESTION_PREFIX = "searchqa:"   # searchqa:PATH.jsonl: a Search-R1 question file (is_question_file)

_SYLLABLES = ["bra", "dor", "vel", "ka", "mir", "tos", "len", "qua", "sil", "ro", "zan", "per",
              "ul", "fen", "gri",
              "hal", "jo", "mek", "nor", "ost", "pax", "ril", "sev", "tam", "wyn", "ix", "cal",
              "dre", "lun", "vor"]
_OCCUPATIONS = ["architect", "botanist", "painter", "novelist", "chemist", "cartographer",
                "violinist",
                "engineer", "historian", "photographer", "sculptor", "astronomer"]
_LANGUAGES = ["Velorian", "Kastic", "Ombrese", "Tilvan", "Sarnish", "Quell"]
_COMPANY_KINDS = ["Records", "Motors", "Textiles", "Foods", "Optics", "Press"]
_ACTION = re.compile(r"(search|answer)\s*(?:\[(.*)\]|[:\s]\s*(.+))", re.S)


def _name(rng, used: set[str], parts: int = 2) -> str:
    while True:
        name = "".join(rng.sample(_SYLLABLES, parts)).capitalize()
        if name not in used:
            used.add(name)
            return name


def _make_world(rng) -> dict:
    """Entities and their documents: {"docs": [{"title", "text"}], and each kind of entity's
    facts}."""
    used: set[str] = set()
    countries = [_name(rng, used) + "ia" for _ in range(3)]
    cities = [{"name": _name(rng, used), "country": countries[i % 3]} for i in range(6)]
    capitals = {c: next(city["name"] for city in cities if city["country"] == c) for c in countries}
    surnames = [_name(rng, used, 3) for _ in range(4)]      # shared by several people: distractors
    years = rng.sample(range(1900, 1990), 8)
    people = []
    for i in range(8):
        first = _name(rng, used)
        people.append({"name": f"{first} {surnames[i % 4]}", "born": years[i],
                       "birthplace": rng.choice(cities)["name"],
                       "occupation": rng.choice(_OCCUPATIONS)})
    city_country = {c["name"]: c["country"] for c in cities}
    founders = rng.sample(people, 4)
    company_years = rng.sample(range(1920, 2015), 4)
    companies = [{"name": f"{_name(rng, used)} {kind}", "founded": company_years[i],
                  "founder": founders[i]["name"],
                  "hq": rng.choice(cities)["name"]}
                 for i, kind in enumerate(rng.sample(_COMPANY_KINDS, 4))]
    directors = rng.sample([p for p in people if p not in founders], 3)
    films = [{"name": f"The {_name(rng, used)} "
              f"{rng.choice(['Road', 'Winter', 'Garden', 'Letter', 'Harbor'])}",
              "released": rng.randint(1950, 2020), "director": directors[i]["name"],
              "language": rng.choice(_LANGUAGES)} for i in range(3)]
    lengths = rng.sample(range(80, 2400), 3)
    rivers = [{"name": f"{_name(rng, used)} River", "length": lengths[i], "country": countries[i]}
              for i in range(3)]
    docs = []
    for c in countries:
        docs.append({"title": c, "text": f"{c} is a country. Its capital is {capitals[c]}."})
    for city in cities:
        docs.append({"title": city["name"],
                     "text": f"{city['name']} is a city in {city['country']}."})
    for p in people:
        docs.append({"title": p["name"],
                     "text": f"{p['name']} is a {p['occupation']}, born in {p['born']} in "
                                                 f"{p['birthplace']}, "
                     f"{city_country[p['birthplace']]}."})
    for co in companies:
        docs.append({"title": co["name"],
                     "text": f"{co['name']} is a company founded in {co['founded']} by "
                                                  f"{co['founder']}. Its headquarters are in "
                     f"{co['hq']}."})
    for f in films:
        docs.append({"title": f["name"],
                     "text": f"{f['name']} is a {f['language']}-language film released in "
                                                 f"{f['released']}, directed by {f['director']}."})
    for r in rivers:
        docs.append({"title": r["name"],
                     "text": f"The {r['name']} flows through {r['country']}. It is "
                                                 f"{r['length']} kilometres long."})
    # distractors: they name the entities, answer nothing asked
    for p in rng.sample(people, 3):
        author = rng.choice([q for q in people if q is not p])
        docs.append({"title": f"Life of {p['name']}",
                     "text": f"Life of {p['name']} is a biography written by "
                                                              f"{author['name']}. It was praised "
                     "by critics."})
    for co in rng.sample(companies, 2):
        rival = rng.choice([c for c in companies if c is not co])
        docs.append({"title": f"{co['name']} and {rival['name']}",
                     "text": f"{co['name']} and {rival['name']} "
                     f"have been rivals for decades, competing for the same customers."})
    for f in rng.sample(films, 1):
        docs.append({"title": f"Reviews of {f['name']}",
                     "text": f"Critics praised {f['name']} for its music "
                     f"and its long final scene."})
    rng.shuffle(docs)
    return {"docs": docs, "people": people, "companies": companies, "films": films,
            "rivers": rivers,
            "capitals": capitals, "city_country": city_country}


def _doc(world: dict, title: str) -> int:
    return next(i for i, d in enumerate(world["docs"]) if d["title"] == title)


def _question(rng, task_type: str, w: dict) -> tuple[str, str, list[str]]:
    """(question, answer, the names searched for, in order: each the title of a document the answer
    needs)."""
    person = {p["name"]: p for p in w["people"]}
    if task_type == "direct_retrieval":
        kind = rng.randrange(4)
        if kind == 0:
            co = rng.choice(w["companies"])
            return f"who founded {co['name']}?", co["founder"], [co["name"]]
        if kind == 1:
            f = rng.choice(w["films"])
            return f"who directed the film {f['name']}?", f["director"], [f["name"]]
        if kind == 2:
            country = rng.choice(sorted(w["capitals"]))
            return f"what is the capital of {country}?", w["capitals"][country], [country]
        co = rng.choice(w["companies"])
        return f"when was {co['name']} founded?", str(co["founded"]), [co["name"]]
    if task_type == "entity_attribute_lookup":
        kind = rng.randrange(4)
        if kind == 0:
            p = rng.choice(w["people"])
            return f"what is {p['name']}'s occupation?", p["occupation"], [p["name"]]
        if kind == 1:
            p = rng.choice(w["people"])
            return f"in what city was {p['name']} born?", p["birthplace"], [p["name"]]
        if kind == 2:
            f = rng.choice(w["films"])
            return f"what language is the film {f['name']} in?", f["language"], [f["name"]]
        r = rng.choice(w["rivers"])
        return f"in what country is the {r['name']}?", r["country"], [r["name"]]
    if task_type == "multi_hop_reasoning":
        kind = rng.randrange(4)
        if kind == 0:
            co = rng.choice(w["companies"])
            return (f"in what city was the founder of {co['name']} born?",
                    person[co["founder"]]["birthplace"],
                    [co["name"], co["founder"]])
        if kind == 1:
            f = rng.choice(w["films"])
            return (f"what is the occupation of the director of the film {f['name']}?",
                    person[f["director"]]["occupation"], [f["name"], f["director"]])
        if kind == 2:
            f = rng.choice(w["films"])
            return (f"in what year was the director of the film {f['name']} born?",
                    str(person[f["director"]]["born"]),
                    [f["name"], f["director"]])
        co = rng.choice(w["companies"])
        return (f"in what country is the city where {co['name']} has its headquarters?",
                w["city_country"][co["hq"]],
                [co["name"], co["hq"]])
    kind = rng.randrange(3)
    if kind == 0:
        a, b = rng.sample(w["people"], 2)
        return (f"who was born earlier, {a['name']} or {b['name']}?", a["name"]
                if a["born"] < b["born"] else b["name"],
                [a["name"], b["name"]])
    if kind == 1:
        a, b = rng.sample(w["companies"], 2)
        return (f"which company was founded first, {a['name']} or {b['name']}?",
                a["name"] if a["founded"] < b["founded"] else b["name"], [a["name"], b["name"]])
    a, b = rng.sample(w["rivers"], 2)
    return (f"which river is longer, the {a['name']} or the {b['name']}?",
            a["name"] if a["length"] > b["length"] else b["name"], [a["name"], b["name"]])


def _solvable(world: dict, answer: str, searches: list[str], task_type: str) -> bool:
    """Each searched name finds its document among the top TOP_K, and the last one states the answer
    (a comparison's answer is one of the two names: both documents are needed)."""
    texts = [f"{d['title']} {d['text']}" for d in world["docs"]]
    for name in searches:
        if _doc(world, name) not in top_documents(name, texts, TOP_K):
            return False
    return task_type == "comparison" or answer in world["docs"][_doc(world, searches[-1])]["text"]


# --------------------------------------------------------------------------- environment

class SearchQAEnv(Environment):
    action_syntax = ACTION_SYNTAX

    def __init__(self, spec: dict, max_steps: int = MAX_STEPS):
        super().__init__(max_steps)
        self.spec = spec
        self.retriever = retriever_url()   # None: BM25 over the task's own documents
        self._index = BM25Index([f"{d['title']} {d['text']}" for d in spec.get("docs") or ()])

    def _reset(self) -> str:
        self.answer: str | None = None
        self.em, self.f1, self.reward = False, 0.0, 0.0
        self.tool_calls, self.tool_errors = {"search": 0}, 0
        return (f"Question: {self.spec['question']}\nYou can search[query] (the top {TOP_K} "
                f"documents of the corpus come back) and answer[text] (ends the episode).")

    def search(self, query: str) -> str:
        """The top TOP_K documents as Search-R1 shows them, or "Tool error (search): why"
        (counted)."""
        self.tool_calls["search"] += 1
        try:
            docs = self._hits(query)
        except RetrieverError as error:
            self.tool_errors += 1
            return f"Tool error (search): {error}"
        if not docs:
            return "<information>No documents found.</information>"
        return ("<information>" + "\n".join(f"Doc {k}(Title: {d['title']}) {d['text']}"
                                            for k, d in enumerate(docs, start=1))
                + "</information>")

    def _hits(self, query: str) -> list[dict]:
        if self.retriever is not None:
            return retrieve(self.retriever, [query], TOP_K)[0]
        if self.spec.get("docs") is None:
            raise RetrieverError(f"no retriever is set for a question file's task (--retriever-url "
                                 f"URL, ${RETRIEVER_URL_ENV})")
        return [self.spec["docs"][i] for i, _ in self._index.top(query, TOP_K)]

    def _step(self, action: str) -> str:
        m = _ACTION.fullmatch(action)
        if not m:
            return NOTHING_HAPPENS
        verb, argument = m.group(1), (m.group(2) if m.group(2) is not None else m.group(3)).strip()
        if not argument:
            return NOTHING_HAPPENS
        if verb == "search":
            return self.search(argument)
        golden = self.spec["golden_answers"]
        self.answer = argument
        self.em = exact_match(argument, golden)
        self.f1 = token_f1(argument, golden)
        self.reward = 1.0 if self.em else 0.0
        self.success = self.em
        self.done = True
        return f"You answered: {argument}"


# --------------------------------------------------------------------------- generation

def generate_searchqa(split: str = "train", seed: int = 0, n: int | None = None,
                      types: tuple[str, ...] = TASK_TYPES) -> list[Task]:
    """`n` search-QA tasks (default 10 per type) of one split, types interleaved
    (base.draw_tasks)."""
    def draw(rng, task_type):
        world = _make_world(rng)
        question, answer, searches = _question(rng, task_type, world)
        question = question[0].upper() + question[1:]
        if not _solvable(world, answer, searches, task_type):
            return None
        key = f"searchqa|{task_type}|{question}|{answer}"
        spec = {"kind": "searchqa", "question": question, "golden_answers": [answer],
                "searches": searches,
                "docs": world["docs"]}
        return key, lambda: Task(id=task_id(f"searchqa-{task_type}", key), type=task_type,
                                 question=question,
                                 answer=answer, verifier="exact", multi_turn=True,
                                 max_steps=MAX_STEPS, env_spec=spec,
                                 metadata={"suite": "searchqa", "split": split, "seed": seed,
                                           "hops": len(searches)})
    return draw_tasks("searchqa", split, seed, types, TASK_TYPES, n, DEFAULT_PER_TYPE, draw)


def oracle_actions(task: Task) -> list[str]:
    """A search for each document the answer needs (by its name), then answer[the golden answer]."""
    spec = task.env_spec
    if "searches" not in spec:
        raise ValueError(f"task {task.id} has no scripted solution (a question file's task: which "
                         "documents answer it is the retriever's)")
    return [f"search[{name}]"
            for name in spec["searches"]] + [f"answer[{spec['golden_answers'][0]}]"]


# --------------------------------------------------------------------------- question files

def is_question_file(name) -> bool:
    """Whether a suite name is a Search-R1 question file: searchqa:PATH.jsonl, or a .jsonl whose
    first line has golden_answers."""
    name = str(name)
    if name.startswith(QUESTION_PREFIX):
        return True
    try:
        if not name.endswith(".jsonl"):
            return False
        first = next((line for _, line in _lines(Path(name))), "")
        return '"golden_answers"' in first and "golden_answers" in json.loads(first)
    except (OSError, ValueError, TypeError):   # (not readable here: the loader that runs says why)
        return False


def load_question_file(name: str, split: str = "all", seed: int = 0,
                       n: int | None = None) -> list[Task]:
    """The tasks of a question file in Search-R1's layout (module docstring), searched through the
    retriever that $MINSKILL_RETRIEVER_URL names (--retriever-url), which must be set."""
    check_split(split)
    path = Path(name[len(QUESTION_PREFIX):] if name.startswith(QUESTION_PREFIX) else name)
    if not path.is_file():
        raise FileNotFoundError(f"task file not found: {path}")
    if retriever_url() is None:
        raise ValueError(f"{path}: a Search-R1 question file's tasks are searched through a "
                         f"retriever: set one with --retriever-url URL (${RETRIEVER_URL_ENV}); "
                         "`python -m minskill.tasks.retriever_server` serves a corpus")

    def question_task(record, where: str) -> Task:
        task = _question_task(record, where)
        if isinstance(record, dict) and "split" in record:
            task.metadata["split"] = record["split"]
        return task
    return tasks_from_jsonl(path, split, seed, n, "searchqa-file", question_task)


def _question_task(record, where: str) -> Task:
    """One line's task: question (a '?' added where it has none, as Search-R1's data scripts do),
    golden_answers, type (default direct_retrieval); id, data_source, metadata kept."""
    if not isinstance(record, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(record).__name__}")
    question = record.get("question")
    if not isinstance(question, str) or not question.strip():
        raise ValueError(f"{where}: field 'question' must be a non-empty string, got "
                         f"{question!r:.80}")
    question = question.strip() if question.strip().endswith("?") else question.strip() + "?"
    golden = record.get("golden_answers")
    golden = [golden] if isinstance(golden, str | int | float) and not isinstance(golden,
                                                                                  bool) else golden
    if (not isinstance(golden, list) or not golden
            or not all(isinstance(a, str | int | float) and not isinstance(a, bool)
                       and str(a).strip() for a in golden)):
        raise ValueError(f"{where}: field 'golden_answers' must be a non-empty list of answers "
                         f"(strings), got {record.get('golden_answers')!r:.80}")
    golden = [str(a).strip() for a in golden]
    task_type = check_task_type(record.get("type", TASK_TYPES[0]), where)
    key = f"searchqa-file|{question}|{json.dumps(golden)}"
    kept = {k: record[k] for k in ("id", "data_source", "metadata") if k in record}
    spec = {"kind": "searchqa", "question": question, "golden_answers": golden, "docs": None}
    return Task(id=task_id(f"searchqa-{task_type}", key), type=task_type, question=question,
                answer=golden[0], verifier="exact", multi_turn=True, max_steps=MAX_STEPS,
                env_spec=spec, metadata={"source": kept} if kept else {})
