"""Answer verifiers: turn (model reply, reference answer) into a 0/1 reward.

* `gaia_match` — GAIA's official quasi-exact-match scorer (`question_scorer` of the GAIA
  leaderboard's `scorer.py`), reproduced branch for branch, without its prints and warnings. The
  `gaia` verifier (`gaia_score`) scores `gaia_final_answer(reply)` with it: the bare answer after
  the last "FINAL ANSWER:" (GAIA's answer template) in the styles instruct models write it
  ("**FINAL ANSWER:** 17", "**Final Answer**: 17", "Final answer: `17`", a heading "### Final
  Answer" above it, a line of explanation below it, quotes, bold, brackets, \\boxed{17}, a
  trailing full stop), else the last \\boxed{...}, else the whole reply. A reference answer with
  nothing to compare (blank, or the "?" of GAIA's test split) is refused (ValueError): the scorer
  would call a blank answer right. The scorer's rules:
    - the ground truth parses as a float  -> number: drop `$`, `%`, `,` from the prediction, parse
      it as a float (a failed parse is +inf, i.e. wrong) and compare with `==`;
    - else the ground truth contains `,` or `;` -> list: split both on `,`/`;`; different lengths
      are wrong; element i is compared as a number (same rule) when the ground-truth element parses
      as a float, else as a string lower-cased with all whitespace removed (punctuation kept);
    - else -> string: lower-case, remove all whitespace and all `string.punctuation`, compare.
* `exact_match` — SQuAD / Search-R1 `normalize_answer`: lower-case, remove punctuation, remove the
  articles a/an/the, collapse whitespace; equal to any of the golden answers.
* `token_f1` — SQuAD's F1 (the search-QA benchmarks' second score): the normalised prediction's and
  golden answer's tokens, c = how many they share (with multiplicity), P = c / |prediction|, R = c /
  |golden|, F1 = 2PR / (P + R) (0 when c = 0); the best over the golden answers.
* `numeric_match` — the final number of a free-form reply ("The answer is 42." -> 42; `1,234` ->
  1234, `-3.5` -> -3.5) equals the reference within |a - b| <= 1e-6 * max(1, |b|).
* `final_answer_match` — the lenient check of the built-in `qa` suite. The reply is cut where the
  model starts inventing a new question (a line "Q:" / "Question:"); the candidate answer is what
  follows the *first* "answer is" / "answer:" / "final answer is" (small models state their answer,
  then ramble), else what follows the *last* "=", else the whole reply. Numeric references: the
  first number of the candidate after a marker, the last number of a reply without one. Text
  references: the normalised reference occurs as whole words in the candidate and, when the task
  lists its distractors (`choices`), no other choice does.
"""
from __future__ import annotations

import re
import string
from collections import Counter

__all__ = ["gaia_match", "gaia_final_answer", "gaia_score", "exact_match", "normalize_answer",
           "numeric_match", "extract_final_number", "extract_numbers", "final_answer_match",
           "contains_match", "token_f1", "VERIFIERS", "verify"]


# --------------------------------------------------------------------------- GAIA quasi exact match

def _gaia_is_float(element) -> bool:
    try:
        float(element)
        return True
    except ValueError:
        return False


def _gaia_normalize_number_str(number_str: str) -> float:
    # The official scorer removes these "units" and thousands separators before float().
    for char in ["$", "%", ","]:
        number_str = number_str.replace(char, "")
    try:
        return float(number_str)
    except ValueError:
        return float("inf")  # never equal to a finite ground truth


def _gaia_split_string(s: str, char_list=(",", ";")) -> list[str]:
    pattern = f"[{''.join(char_list)}]"
    return re.split(pattern, s)


def _gaia_normalize_str(input_str: str, remove_punct: bool = True) -> str:
    no_spaces = re.sub(r"\s", "", input_str)  # "sea gull" == "seagull"
    if remove_punct:
        return no_spaces.lower().translate(str.maketrans("", "", string.punctuation))
    return no_spaces.lower()


def gaia_match(prediction: str | None, ground_truth: str) -> bool:
    """GAIA's `question_scorer(model_answer, ground_truth)`; see the module docstring for the
    rules."""
    if prediction is None:
        prediction = "None"  # as the official scorer does
    if _gaia_is_float(ground_truth):
        return _gaia_normalize_number_str(prediction) == float(ground_truth)
    if any(char in ground_truth for char in [",", ";"]):
        gt_elems = _gaia_split_string(ground_truth)
        ma_elems = _gaia_split_string(prediction)
        if len(gt_elems) != len(ma_elems):
            return False
        comparisons = []
        for ma_elem, gt_elem in zip(ma_elems, gt_elems):
            if _gaia_is_float(gt_elem):
                comparisons.append(_gaia_normalize_number_str(ma_elem) == float(gt_elem))
            else:
                # punctuation is kept inside list elements (it can be part of the answer)
                comparisons.append(_gaia_normalize_str(ma_elem, remove_punct=False)
                                   == _gaia_normalize_str(gt_elem, remove_punct=False))
        return all(comparisons)
    return _gaia_normalize_str(prediction) == _gaia_normalize_str(ground_truth)


def gaia_score(reply: str, answer: str) -> bool:
    """The `gaia` verifier: GAIA's scorer on the reply's final answer. A reference answer with
    nothing to compare (blank, or punctuation only: the "?" of GAIA's test split, whose answers
    are hidden) is a ValueError, since GAIA's scorer would call a blank answer right."""
    if not _gaia_normalize_str(str(answer)):
        raise ValueError(f"reference answer {answer!r} has nothing to compare a reply with (a "
                         f"hidden answer, as in GAIA's test split, cannot be scored)")
    return gaia_match(gaia_final_answer(reply), answer)


# "FINAL ANSWER:" as instruct models write it (any case): plain, in bold or italics with the
# colon inside or outside ("**FINAL ANSWER:** 17", "**Final Answer**: 17"), or a heading or bold
# line of its own with the answer below ("### Final Answer", "**Final answer**"). A match ends
# where the answer starts. (No two runs of spaces meet: a reply is untrusted text, and their
# backtracking would take time squared.)
_GAIA_TEMPLATE = re.compile(
    r"final[ \t]+answer(?:\*{1,2}|_{1,2})?[ \t]*[:：](?:[ \t]*(?:\*{1,2}|_{1,2})(?=\s))?"
    r"|^[ \t]*(?:#{1,6}[ \t]+)?(?:\*{1,2}|_{1,2})?final[ \t]+answer(?:\*{1,2}|_{1,2})?[ \t]*$",
    re.I | re.M)
_FENCE = re.compile(r"\s*(?:```|~~~)[\w+-]*\s*")          # a code fence line ("```", "```text")
_BOXED = re.compile(r"\\boxed\s*\{")
_LATEX_TEXT = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox)\s*\{")
# Pairs that wrap an answer as a whole: markdown emphasis and code, quotes, brackets, LaTeX math.
_WRAPPERS = (("**", "**"), ("*", "*"), ("`", "`"), ('"', '"'), ("'", "'"), ("“", "”"),
             ("‘", "’"), ("«", "»"), ("[", "]"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
_MAX_LAYERS = 8   # wrappers taken off one answer at most; \boxed{} tried at most


def gaia_final_answer(reply: str) -> str:
    """What GAIA scores of a reply, as GAIA's leaderboard takes it (`model_answer`): the bare
    answer of its last "FINAL ANSWER:" (GAIA's system prompt asks the model to finish with
    "FINAL ANSWER: [YOUR FINAL ANSWER]"), in the styles instruct models write it; else its last
    \\boxed{...}; else the whole reply. The answer is the first line after the template (a line of
    explanation below it is not part of it), without what wraps it as a whole (bold, italics,
    backticks or a code fence, quotes, square brackets, $...$, \\boxed{}, \\text{}) and without a
    trailing full stop."""
    matches = list(_GAIA_TEMPLATE.finditer(reply))
    if matches:
        lines = reply[matches[-1].end():].splitlines()
        answer = next((line for line in lines if line.strip() and not _FENCE.fullmatch(line)), "")
    else:
        answer = reply   # (_unwrap takes its last \boxed{...}, where it has one)
    return _unwrap(answer)


def _unwrap(answer: str) -> str:
    """The answer without what wraps it as a whole, its trailing full stop and outer spaces."""
    for _ in range(_MAX_LAYERS):   # (bounded: a reply is untrusted text, "*" * 100_000 included)
        previous, answer = answer, answer.strip()
        boxed = _last_boxed(answer)
        if boxed is not None:
            answer = boxed
        latex = _LATEX_TEXT.match(answer)
        if latex and _braced(answer, latex.end()) == len(answer):
            answer = answer[latex.end():-1]
        if answer.endswith(".") and not answer.endswith(".."):
            answer = answer[:-1]
        if answer.count("**") == 1 and (answer.startswith("**") or answer.endswith("**")):
            answer = answer.replace("**", "")   # bold opened before "FINAL ANSWER:"
        for opening, closing in _WRAPPERS:
            inner = answer[len(opening):len(answer) - len(closing)]
            if (len(answer) >= len(opening) + len(closing) and answer.startswith(opening)
                    and answer.endswith(closing) and opening not in inner and closing not in inner):
                answer = inner
                break
        if answer == previous:
            break
    return answer


def _last_boxed(text: str) -> str | None:
    """What the last \\boxed{...} of `text` holds (its braces balanced), or None when none."""
    for match in list(_BOXED.finditer(text))[-_MAX_LAYERS:][::-1]:   # (each try reads to the end)
        end = _braced(text, match.end())
        if end is not None:
            return text[match.end():end - 1]
    return None


def _braced(text: str, start: int) -> int | None:
    """The index after the brace closing the one opened just before `start`; None when none does."""
    depth = 1
    for index in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth == 0:
            return index + 1
    return None


# --------------------------------------------------------------------------- SQuAD / Search-R1
# exact match

def normalize_answer(s: str) -> str:
    """SQuAD's normalize_answer: lower, drop punctuation, drop articles, collapse whitespace."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in set(string.punctuation))
    s = re.sub(r"\b(a|an|the)\b", " ", s)
    return " ".join(s.split())


def exact_match(prediction: str, golden_answers: str | list[str]) -> bool:
    """Search-R1's em_check: normalised prediction equals any normalised golden answer."""
    if isinstance(golden_answers, str):
        golden_answers = [golden_answers]
    normalized = normalize_answer(prediction)
    return any(normalize_answer(g) == normalized for g in golden_answers)


def token_f1(prediction: str, golden_answers: str | list[str]) -> float:
    """SQuAD's token F1 of the prediction against the best golden answer (module docstring)."""
    if isinstance(golden_answers, str):
        golden_answers = [golden_answers]
    predicted = normalize_answer(prediction).split()
    best = 0.0
    for golden in golden_answers:
        reference = normalize_answer(golden).split()
        common = sum((Counter(predicted) & Counter(reference)).values())
        if common:
            precision, recall = common / len(predicted), common / len(reference)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def contains_match(prediction: str, golden_answers: str | list[str]) -> bool:
    """The normalised golden answer occurs as whole words inside the normalised prediction."""
    if isinstance(golden_answers, str):
        golden_answers = [golden_answers]
    text = f" {normalize_answer(prediction)} "
    return any(normalize_answer(g) and f" {normalize_answer(g)} " in text for g in golden_answers)


# --------------------------------------------------------------------------- numbers in free text

# A number: optional sign, digits with optional thousands separators, optional decimals; or ".5".
# The lookarounds keep "v2" or "3rd" parts from being read as signs or separators of a bigger
# number.
_NUMBER = re.compile(
    r"(?<![\w.])[-+−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?![\d])|(?<![\w.])[-+]?\.\d+")


def extract_numbers(text: str) -> list[float]:
    """All numbers of a free-form text, in order ("1,234" -> 1234.0; "−2" with a Unicode minus ->
    -2.0)."""
    values = []
    for match in _NUMBER.finditer(text):
        token = match.group(0).replace(",", "").replace("−", "-")
        try:
            values.append(float(token))
        except ValueError:  # pragma: no cover - the pattern only matches float syntax
            continue
    return values


def extract_final_number(text: str) -> float | None:
    """The last number of a reply ("The answer is 42." -> 42.0), or None when there is none."""
    numbers = extract_numbers(text)
    return numbers[-1] if numbers else None


def _numbers_equal(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-6 * max(1.0, abs(b))


def _reference_number(answer: str) -> float | None:
    try:
        return float(str(answer).replace(",", "").strip())
    except ValueError:
        return None


def numeric_match(prediction: str, answer: str | float) -> bool:
    """The final number of the prediction equals the numeric reference answer."""
    reference = _reference_number(str(answer))
    if reference is None:
        raise ValueError(f"numeric_match: reference answer {answer!r} is not a number")
    value = extract_final_number(prediction)
    return value is not None and _numbers_equal(value, reference)


# --------------------------------------------------------------------------- the lenient qa check

_STRONG_MARKER = re.compile(r"(?:final answer|answer)\s*(?:is|:|=|would be|will be)", re.I)
_NEW_QUESTION = re.compile(r"\n\s*(?:Q|Question)\s*[:.]", re.I)


def _candidate(reply: str) -> tuple[str, bool]:
    """Where the reply commits to an answer (see the module docstring) and whether a marker was
    found."""
    new_question = _NEW_QUESTION.search(reply)
    if new_question and reply[:new_question.start()].strip():
        reply = reply[:new_question.start()]  # the model went on to invent questions of its own
    strong = _STRONG_MARKER.search(reply)
    if strong:
        return reply[strong.end():], True
    equals = reply.rfind("=")
    if equals >= 0:
        return reply[equals + 1:], True
    return reply, False


def final_answer_match(prediction: str, answer: str, choices: list[str] | None = None) -> bool:
    """Lenient final-answer check used by the built-in qa suite (rules in the module docstring)."""
    candidate, has_marker = _candidate(prediction)
    reference = _reference_number(answer)
    if reference is not None:
        numbers = extract_numbers(candidate)
        if not numbers:
            return False
        value = numbers[0] if has_marker else numbers[-1]
        return _numbers_equal(value, reference)
    if not contains_match(candidate, answer):
        return False
    others = [c for c in (choices or []) if normalize_answer(c) != normalize_answer(answer)]
    return not any(contains_match(candidate, other) for other in others)


# --------------------------------------------------------------------------- dispatch by name

VERIFIERS = {
    "gaia": lambda reply, answer, spec: gaia_score(reply, answer),
    "exact": lambda reply, answer, spec: exact_match(reply, answer),
    "numeric": lambda reply, answer, spec: numeric_match(reply, answer),
    "contains": lambda reply, answer, spec: contains_match(reply, answer),
    "final": lambda reply, answer, spec: final_answer_match(reply, answer, spec.get("choices")),
}


def verify(verifier: str, reply: str, answer: str, spec: dict | None = None) -> bool:
    """Score `reply` against `answer` with the verifier called `verifier` (a key of VERIFIERS)."""
    if verifier not in VERIFIERS:
        raise ValueError(f"unknown verifier {verifier!r}; known: {', '.join(sorted(VERIFIERS))}")
    return bool(VERIFIERS[verifier](reply if reply is not None else "", answer, spec or {}))
