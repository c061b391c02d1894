"""`mc`: one option letter from the answer, against the reference letter."""

import pytest

from rsgen.verifiers import compare, verify_response
from rsgen.verifiers.mc import option_letter

OPTIONS = ["red", "blue", "green", "yellow"]

# (answer, letter found or None, reason when no letter) -- with OPTIONS given
WITH_OPTIONS = [
    ("B", "B", None),
    ("b", "B", None),
    ("(B)", "B", None),
    ("(b)", "B", None),
    ("[B]", "B", None),
    ("B.", "B", None),
    ("B)", "B", None),
    ("B:", "B", None),
    ("**B**", "B", None),
    ("**(B)**", "B", None),
    ("$B$", "B", None),
    ("\\text{B}", "B", None),
    ("\\textbf{(B)}", "B", None),
    ("B) blue", "B", None),
    ("(B) blue", "B", None),
    ("B. blue", "B", None),
    ("B: blue", "B", None),
    ("b) blue", "B", None),
    ("(B) Vitamin C", "B", None),  # the option's own text may contain a capital
    ("B) A red ball", "B", None),
    ("C) I don't know", "C", None),
    ("option B", "B", None),
    ("Option (B)", "B", None),
    ("choice b", "B", None),
    ("answer is B", "B", None),
    ("The answer is B", "B", None),
    ("The correct answer is (B).", "B", None),
    ("letter B", "B", None),
    ("So the answer is (C)", "C", None),
    ("**Answer: C**", "C", None),
    ("It is B.", "B", None),
    ("I think B", "B", None),
    ("I'd pick B here", "B", None),
    ("B, I think", "B", None),
    ("B is correct", "B", None),
    ("object(s) B", "B", None),
    ("The cube is (D)", "D", None),
    ("E", "E", None),  # a letter beyond the options is still a letter (a wrong one)
    ("(E)", "E", None),
    ("I", "I", None),
    ("A", "A", None),
    # option texts
    ("blue", "B", None),
    ("Blue.", "B", None),
    ("  BLUE ", "B", None),
    ("**green**", "C", None),
    ("light blue", "B", None),  # contains exactly one option's text
    ("the blue one", "B", None),
    ("A red ball", "A", None),  # "A" here is the article; "red" is option A's text
    # ambiguous: two different letters or options
    ("A or B", None, "mc_ambiguous"),
    ("A, B", None, "mc_ambiguous"),
    ("B and C", None, "mc_ambiguous"),
    ("(B) and (C)", None, "mc_ambiguous"),
    ("A) red B) blue", None, "mc_ambiguous"),
    ("B) The answer is C", None, "mc_ambiguous"),
    ("Plan B. Then A.", None, "mc_ambiguous"),
    ("The answer is B, not A", None, "mc_ambiguous"),
    ("red or blue", None, "mc_ambiguous"),
    # no letter
    ("Neither", None, "mc_no_letter"),
    ("A cube", None, "mc_no_letter"),
    ("I don't know", None, "mc_no_letter"),
    ("purple", None, "mc_no_letter"),
    ("42", None, "mc_no_letter"),
    ("?", None, "mc_no_letter"),
]


@pytest.mark.parametrize("answer,letter,reason", WITH_OPTIONS, ids=[repr(c[0]) for c in WITH_OPTIONS])
def test_option_letter_with_options(answer, letter, reason):
    assert option_letter(answer, OPTIONS) == (letter, reason)


# Without options: no option texts, and bare letters may be any of A..Z.
WITHOUT_OPTIONS = [
    ("B", "B", None),
    ("(C)", "C", None),
    ("D. something", "D", None),
    ("I think F", "F", None),
    ("blue", None, "mc_no_letter"),
    ("A cube", None, "mc_no_letter"),
    ("A or B", None, "mc_ambiguous"),
    ("X", "X", None),
]


@pytest.mark.parametrize("answer,letter,reason", WITHOUT_OPTIONS, ids=[repr(c[0]) for c in WITHOUT_OPTIONS])
def test_option_letter_without_options(answer, letter, reason):
    assert option_letter(answer, None) == (letter, reason)
    assert option_letter(answer, []) == (letter, reason)


@pytest.mark.parametrize("answer,letter,reason", WITH_OPTIONS, ids=[repr(c[0]) for c in WITH_OPTIONS])
def test_mc_decision_against_reference_b(answer, letter, reason):
    decision = compare("mc", answer, "B", options=OPTIONS)
    assert decision.match is (letter == "B")
    if letter is None:
        assert (decision.reason, decision.extracted) == (reason, answer)
    elif letter == "B":
        assert (decision.reason, decision.extracted) == (None, "B")
    else:
        assert (decision.reason, decision.extracted) == ("wrong_answer", letter)


@pytest.mark.parametrize(
    "reference,match",
    [
        ("B", True),
        ("b", True),
        ("(B)", True),
        ("B.", True),
        (" B ", True),
        ("blue", True),  # a reference equal to an option's text is that option's letter
        (["A", "B"], True),
        (["A", "C"], False),
        ("C", False),
    ],
)
def test_reference_forms(reference, match):
    assert compare("mc", "(B)", reference, options=OPTIONS).match is match


@pytest.mark.parametrize("reference", ["purple", "B or C", "", "nan"])
def test_unreadable_reference_is_bad_input(reference):
    assert compare("mc", "B", reference, options=OPTIONS).reason == "bad_input"


@pytest.mark.parametrize("options", ["red,blue", [1, 2], [None, "x"], 5])
def test_bad_options_are_bad_input(options):
    assert compare("mc", "B", "B", options=options).reason == "bad_input"


@pytest.mark.parametrize(
    "response,match,reason",
    [
        ("<think>It could be A or C... </think>\n\nThe answer is (B).", True, None),
        ("<think>(A) is wrong</think>B", True, None),
        ("I compared the colours.\nAnswer: B) blue", True, None),
        ("\\boxed{B}", True, None),
        ("<answer>B</answer>", True, None),
        ("<think>hmm (B)", False, "no_answer"),
        ("<think>x</think>Either A or B.", False, "mc_ambiguous"),
        ("<think>x</think>None of them.", False, "mc_no_letter"),
        ("<think>x</think>The answer is C", False, "wrong_answer"),
    ],
)
def test_mc_from_raw_responses(response, match, reason):
    decision = verify_response("mc", response, "B", options=OPTIONS)
    assert (decision.match, decision.reason) == (match, reason)


# Issue #18: response shapes from other projects' test suites, each checked bare and inside reasoning.
REASONING_WRAPPERS = [
    "{answer}",
    "<think>\nIt could be A or B, let me check (C) too.\n</think>\n\n{answer}",
    "Let me compare the options one by one.\n</think>\n{answer}",  # template pre-filled <think>
    "<THINK>A? B?</THINK>{answer}<|im_end|>",
]

# Class 1: a one-character option text that is not a letter. Options 1, 5, 9, 10; the reference is B ("5").
NUMBER_OPTIONS = ["1", "5", "9", "10"]
ONE_CHARACTER_OPTION = [
    ("\\boxed{5}", True, None, "B"),
    ("5", True, None, "B"),
    ("The answer is 5", True, None, "B"),
    ("<answer>5</answer>", True, None, "B"),
    ("**5**", True, None, "B"),
    ("\\boxed{9}", False, "wrong_answer", "C"),
    ("\\boxed{1}", False, "wrong_answer", "A"),
    ("\\boxed{10}", False, "wrong_answer", "D"),
    ("\\boxed{7}", False, "mc_no_letter", "7"),  # not an option
    ("\\boxed{?}", False, "mc_no_letter", "?"),
]


@pytest.mark.parametrize("wrapper", REASONING_WRAPPERS)
@pytest.mark.parametrize("response,match,reason,extracted", ONE_CHARACTER_OPTION)
def test_one_character_option_text(response, match, reason, extracted, wrapper):
    decision = verify_response("mc", wrapper.format(answer=response), "B", options=NUMBER_OPTIONS)
    assert tuple(decision) == (match, reason, extracted)


def test_one_character_non_letter_without_options_is_no_letter():
    assert option_letter("5", None) == (None, "mc_no_letter")
    assert option_letter("+", ["+", "-"]) == ("A", None)
    assert option_letter("-", ["+", "-"]) == ("B", None)


# Class 3: a leading letter followed by a comma or semicolon and a comment. Reference D, four options.
LEADING_COMMA = [
    ("The answer: D, it doesn't make sense for it to be A or B", "D", None),
    ("D, because the red bar is the tallest", "D", None),
    ("D; the others are too small", "D", None),
    ("Answer: D, not A", "D", None),
    ("D, which is yellow", "D", None),
    ("A, B", None, "mc_ambiguous"),  # a list of letters, not a comment
    ("A, and B", None, "mc_ambiguous"),
    ("D, or maybe B", None, "mc_ambiguous"),
    ("A, B, or C", None, "mc_ambiguous"),
    ("D, (A) also fits", None, "mc_ambiguous"),  # another explicit letter form in the comment
    ("B, I think", "B", None),  # a capital after the comma: the bare-letter rule (I is the pronoun)
]


@pytest.mark.parametrize("wrapper", REASONING_WRAPPERS)
@pytest.mark.parametrize("response,letter,reason", LEADING_COMMA, ids=[c[0][:30] for c in LEADING_COMMA])
def test_leading_letter_with_a_comma(response, letter, reason, wrapper):
    decision = verify_response("mc", wrapper.format(answer=response), "D", options=OPTIONS)
    assert decision.match is (letter == "D")
    assert decision.reason == (None if letter == "D" else reason or "wrong_answer")
    assert decision.extracted == (letter or decision.extracted)


# Class 5: negation is not read. Several letters are mc_ambiguous (a rejection the judge can read) unless a
# leading letter form or a final-answer phrase isolates one. Reference C, four options.
NEGATED_MENTION = [
    ("It can't be A or B, so C.", False, "mc_ambiguous"),
    ("Not A or B; C.", False, "mc_ambiguous"),
    ("A and B are wrong, C is right", False, "mc_ambiguous"),
    ("C, it can't be A or B", True, None),
    ("C. It can't be A or B.", True, None),
    ("(C) - it cannot be A or B", True, None),
    ("It can't be A or B, so the answer is C.", True, None),
    ("The answer is C; it can't be A or B", True, None),
    ("It can't be A or B.\nAnswer: C", True, None),
    ("It can't be A or B. \\boxed{C}", True, None),
]


@pytest.mark.parametrize("wrapper", REASONING_WRAPPERS)
@pytest.mark.parametrize("response,match,reason", NEGATED_MENTION, ids=[c[0][:30] for c in NEGATED_MENTION])
def test_negated_mentions_are_not_read(response, match, reason, wrapper):
    decision = verify_response("mc", wrapper.format(answer=response), "C", options=OPTIONS)
    assert (decision.match, decision.reason) == (match, reason)
