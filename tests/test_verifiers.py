"""Verifiers: GAIA's quasi-exact match (every branch), SQuAD/Search-R1 exact match, numbers in free text,
and the lenient final-answer check of the qa suite."""
import warnings

import pytest

from minskill.tasks.verifiers import (exact_match, extract_final_number, extract_numbers, final_answer_match,
                                      gaia_final_answer, gaia_match, normalize_answer, numeric_match, verify)


# --------------------------------------------------------------------------- GAIA

@pytest.mark.parametrize("prediction, truth, expected", [
    # number branch: the ground truth parses as a float
    ("42", "42", True),
    ("$42", "42", True),             # '$' removed
    ("42%", "42", True),             # '%' removed
    ("1,000", "1000", True),         # thousands separator removed
    ("42.0", "42", True),            # compared as floats
    ("1000", "1e3", True),           # float() accepts exponent notation in the ground truth
    (" 7 ", "7", True),              # float() ignores surrounding whitespace
    ("42 apples", "42", False),      # not a float after removing $ % , -> inf
    ("forty-two", "42", False),
    ("41.9", "42", False),
    (None, "42", False),             # None is scored as the string "None"
    ("", "0", False),
    ("anything", "inf", True),       # quirk of the official scorer: a failed parse is +inf
    # list branch: the ground truth contains ',' or ';'
    ("a, b, c", "a,b,c", True),      # whitespace removed
    ("A; b , C", "a,b,c", True),     # ';' splits too, case ignored
    ("a, b", "a, b, c", False),      # different lengths
    ("a, b, c, d", "a, b, c", False),
    ("apple, 3, $4", "apple, 3, 4", True),     # mixed: numeric elements compared as numbers
    ("apple, 3.5, 4", "apple, 3, 4", False),
    ("apple, three, 4", "apple, 3, 4", False),  # a numeric element that does not parse
    ("St. Louis, Paris", "St Louis, Paris", False),  # punctuation is kept inside list elements
    ("st.louis,paris", "St. Louis, Paris", True),
    ("1;2", "1, 2", True),
    # string branch: lower-case, no whitespace, no punctuation
    ("Paris.", "paris", True),
    ("sea gull", "seagull", True),
    ("New-York", "new york", True),
    ("'Hello', world!", "hello world", True),
    ("Pari", "Paris", False),
    (None, "None", True),
])
def test_gaia_match_branches(prediction, truth, expected):
    assert gaia_match(prediction, truth) is expected


def test_gaia_match_prints_and_warns_nothing(capsys):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the official scorer warns on list-length mismatches; we must not
        assert gaia_match("a, b", "a, b, c") is False
        assert gaia_match("x", "42") is False
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("reply, extracted", [
    ("Thinking it over.\nFINAL ANSWER: 17", "17"),
    ("FINAL ANSWER: 2 \nFINAL ANSWER:  3, 5 \n", "3, 5"),    # the last template, stripped
    ("Final answer: Paris", "Paris"),                          # any case
    ("FINAL ANSWER : 4", "4"),
    ("The answer is 17.", "The answer is 17"),                 # none: the whole reply, no full stop
    ("  42\n", "42"),
])
def test_gaia_final_answer_is_the_text_after_the_last_template(reply, extracted):
    assert gaia_final_answer(reply) == extracted


@pytest.mark.parametrize("reply, truth, expected", [
    ("I count the legs: 4 * 8 + 6.\nFINAL ANSWER: 38", "38", True),    # was scored on the whole reply: False
    ("FINAL ANSWER: $1,200", "1200", True),
    ("FINAL ANSWER: 2, 3, 5", "2,3,5", True),
    ("FINAL ANSWER: Saint Petersburg.", "saint petersburg", True),
    ("The answer is 17.", "17", False),                               # GAIA's scorer on a reply with no template
    ("17", "17", True),
    ("FINAL ANSWER: 18\nor maybe 17", "17", False),
])
def test_the_gaia_verifier_scores_the_final_answer(reply, truth, expected):
    assert verify("gaia", reply, truth) is expected



# How instruct models end a reply (GAIA's template, written their way); {} is the bare answer.
INSTRUCT_STYLES = [
    "FINAL ANSWER: {}",                                   # GAIA's own (the control)
    "**FINAL ANSWER:** {}",
    "**Final Answer**: {}",
    "**FINAL ANSWER: {}**",
    "*Final answer:* {}",
    "Final answer: `{}`",
    "FINAL ANSWER: {}\nThis is because the question asks for it.",
    "FINAL ANSWER:\n{}",
    "### Final Answer\n\n{}",
    "**Final Answer**\n\n**{}**",
    'FINAL ANSWER: "{}"',
    "FINAL ANSWER: {}.",
    "FINAL ANSWER: **{}**.",
    "FINAL ANSWER: [{}]",
    "FINAL ANSWER:\n```\n{}\n```",
    "Working.\n\\boxed{{{}}}",
    "The final answer is: $\\boxed{{{}}}$",
    "FINAL ANSWER: $\\boxed{{\\text{{{}}}}}$",
    "final answer: a guess\n\nFINAL ANSWER: {}",
]
# (truth, a wrong bare answer): a number, a string, lists of numbers and of strings
ANSWERS = [("17", "18"), ("Saint Petersburg", "Moscow"), ("2, 3, 5", "2, 3, 7"),
           ("apple; pear", "apple; plum")]


@pytest.mark.parametrize("style", INSTRUCT_STYLES)
@pytest.mark.parametrize("truth, wrong", ANSWERS)
def test_every_instruct_style_scores_as_gaia_s_scorer_on_the_bare_answer(style, truth, wrong):
    for bare in (truth, wrong):
        reply = style.format(bare)
        assert gaia_final_answer(reply) == bare
        assert verify("gaia", reply, truth) is gaia_match(bare, truth)
    assert verify("gaia", style.format(truth), truth)   # (was 0: "** 17", "`17`", "17\nThis is")


@pytest.mark.parametrize("reply, extracted", [
    ('FINAL ANSWER: "a", "b"', '"a", "b"'),            # quotes of each element stay (not one pair)
    ("FINAL ANSWER: **a** and **b**", "**a** and **b**"),
    ("FINAL ANSWER: ", ""),                              # nothing after the template: nothing
    ("**FINAL ANSWER:**", ""),
    ("FINAL ANSWER: 18\n\\boxed{17}", "18"),             # the template outranks a \boxed{} below it
    ("\\boxed{\\frac{1}{2}} then \\boxed{3", "\\frac{1}{2}"),   # the last \boxed{} that closes
])
def test_gaia_final_answer_takes_off_only_what_wraps_the_whole_answer(reply, extracted):
    assert gaia_final_answer(reply) == extracted


@pytest.mark.parametrize("truth", ["?", "", "  ", "...", "-"])
@pytest.mark.parametrize("reply", ["", "FINAL ANSWER:", "FINAL ANSWER: ?", "FINAL ANSWER: 17"])
def test_a_reference_with_nothing_to_compare_is_refused_not_scored(reply, truth):
    with pytest.raises(ValueError, match="nothing to compare"):   # GAIA's scorer: "" is right
        verify("gaia", reply, truth)


# --------------------------------------------------------------------------- exact match

def test_normalize_answer_is_squad_normalisation():
    assert normalize_answer("  The Eiffel   Tower! ") == "eiffel tower"
    assert normalize_answer("An apple, a pear and THE plum.") == "apple pear and plum"
    assert normalize_answer("theory") == "theory"  # articles only as whole words


@pytest.mark.parametrize("prediction, golden, expected", [
    ("The Eiffel Tower!", "eiffel tower", True),
    ("an apple", "Apple", True),
    ("Paris, France", "Paris", False),
    ("1987", ["1986", "1987"], True),
    ("B-4", "b4", True),
    ("", "", True),
    ("x", [], False),
])
def test_exact_match(prediction, golden, expected):
    assert exact_match(prediction, golden) is expected


# --------------------------------------------------------------------------- numbers

@pytest.mark.parametrize("text, value", [
    ("The answer is 42.", 42.0),
    ("There are 1,234 apples.", 1234.0),
    ("It is -3.5 degrees.", -3.5),
    ("It is −4 degrees (Unicode minus).", -4.0),
    ("From 3 to 7, then 12", 12.0),
    ("5-3 = 2", 2.0),
    ("0.5 and .25", 0.25),
    ("The 3rd one", 3.0),
    ("no number here", None),
    ("version v2", None),  # a digit glued to a word is not a number
])
def test_extract_final_number(text, value):
    assert extract_final_number(text) == value


def test_extract_numbers_keeps_lists_apart():
    assert extract_numbers("1,2,3 and 1,000") == [1.0, 2.0, 3.0, 1000.0]
    assert extract_numbers("5-3") == [5.0, 3.0]


def test_numeric_match():
    assert numeric_match("The answer is 42.", "42")
    assert numeric_match("so 1,000", 1000)
    assert numeric_match("about 0.30000000001", "0.3")
    assert not numeric_match("42.5", "42")
    assert not numeric_match("none", "42")
    with pytest.raises(ValueError, match="not a number"):
        numeric_match("42", "forty-two")


# --------------------------------------------------------------------------- the lenient qa check

@pytest.mark.parametrize("reply, answer, expected", [
    ("The answer is 7.", "7", True),
    ("3 + 4 = 7", "7", True),
    ("The answer is 7, since there are 3 red and 4 blue.", "7", True),   # first number after the marker
    ("Answer: 180 minutes", "180", True),
    ("3 hours = 3 x 60 = 180 minutes.", "180", True),
    ("There are 3 cows.", "3", True),                                   # no marker: the last number
    ("The answer is 9. Later: the answer is 12.", "9", True),            # the first stated answer counts
    ("2 + 7 = 9. The answer is 9.\n\nQ: What is 2 + 10?\nA: The answer is 12.", "9", True),  # invented Q cut
    ("10 - 2 = 8\nQuestion: what is 9?\n9", "8", True),
    ("Q: What is 2 + 2?\nA: The answer is 4.", "4", True),              # a leading 'Q:' is not cut
    ("There are 3 cows and 2 pigs.", "3", False),
    ("The answer is 8.", "7", False),
    ("I do not know.", "7", False),
    ("", "7", False),
])
def test_final_answer_match_numbers(reply, answer, expected):
    assert final_answer_match(reply, answer) is expected


def test_final_answer_match_text_with_choices():
    choices = ["Paris", "London"]
    assert final_answer_match("The answer is Paris.", "Paris", choices)
    assert final_answer_match("It is paris", "Paris", choices)
    assert not final_answer_match("Paris or London", "Paris", choices)   # both choices named
    assert not final_answer_match("The answer is London.", "Paris", choices)
    assert not final_answer_match("Parisian food", "Paris")              # whole words only


def test_verify_dispatch():
    assert verify("gaia", "Paris", "paris")
    assert verify("exact", "the paris", "Paris")
    assert verify("numeric", "it is 4", "4")
    assert verify("final", "The answer is 4.", "4")
    assert verify("contains", "I think Paris is right", "Paris")
    assert not verify("final", None, "4")
    with pytest.raises(ValueError, match="unknown verifier 'nope'"):
        verify("nope", "x", "y")
