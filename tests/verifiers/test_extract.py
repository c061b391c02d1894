"""Final-answer extraction: every rule, in order, and every reasoning-tag variant around every answer form."""

import time

import pytest

from rsgen.verifiers import Extraction, extract_answer, verify_response

REASONING = "Let me count. There are 3 cubes and 2 spheres.\nSo the answer is 5? No wait, one is hidden."

# (response, expected answer) -- None means no answer.
CASES = [
    # whole text, trimmed
    ("5", "5"),
    ("  5  ", "5"),
    ("\n\nYes\n", "Yes"),
    ("New York", "New York"),
    ("**B**", "B"),
    ("`C`", "C"),
    ("_x_", "x"),
    ("", None),
    ("   \n\t ", None),
    ("****", None),
    # reasoning: closed, pre-filled (closing tag only), variants
    ("<think>a</think>b", "b"),
    ("<think>\nreasoning\n</think>\n\n42", "42"),
    ("reasoning only closed\n</think>\n\n42", "42"),
    ("a</thinking>b", "b"),
    ("<thinking>a</thinking> b", "b"),
    ("<reasoning>x</reasoning>y", "y"),
    ("<think>\n\n</think>\n\nB", "B"),  # enable_thinking=False templates emit an empty block
    ("<think>a</think>\n\n<think>b</think>\nc", "c"),
    ("<think>a</think>b</think>c", "c"),  # the LAST closing tag counts
    ("<think>The answer is 7.</think>The answer is 8.", "8."),  # phrases inside reasoning do not count
    ("<think>\\boxed{7}</think>\\boxed{8}", "8"),
    ("<think>7</think>", None),  # reasoning but nothing after it
    ("<think>a</think>   \n", None),
    ("<think>never closed", None),
    ("<think>\nI keep thinking and hit the token limit", None),
    ("x <think>", None),
    ("<think>a</think> more <think>b", None),  # reopened and never closed
    ("<thinking>never closed", None),
    ("<reasoning>never closed", None),
    ("<think>a</think>b<|im_end|>", "b"),
    ("<think>a</think>b<|endoftext|>", "b"),
    ("b</s>", "b"),
    ("b <end_of_turn>\n", "b"),
    ("b<|im_end|><|endoftext|>", "b"),
    ("<THINK>a</THINK>b", "b"),  # tag names match in any case (issue #18)
    # <answer> tags
    ("<answer>C</answer>", "C"),
    ("<answer> yes </answer>", "yes"),
    ("<think>a</think><answer>12</answer>", "12"),
    ("<think>a</think>The answer is <answer>C</answer>", "C"),
    ("<answer>1</answer> then <answer>2</answer>", "2"),
    ("<answer>5", "5"),  # never closed: what follows
    ("5</answer>", "5"),  # only the closing tag: what precedes
    ("<answer></answer>", None),
    ("<answer>\\boxed{9}</answer>", "9"),
    ("<answer>The answer is 4.</answer>", "4."),
    # \boxed
    ("\\boxed{7}", "7"),
    ("\\boxed{ 7 }", "7"),
    ("\\boxed {8}", "8"),
    ("\\fbox{9}", "9"),
    ("so \\boxed{1} then \\fbox{2}", "2"),
    ("\\fbox{1} then \\boxed{2}", "2"),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{\\text{B}}", "\\text{B}"),
    ("\\boxed{a{b{c}}d}", "a{b{c}}d"),
    ("$\\boxed{12}$.", "12"),
    ("First \\boxed{3}, finally \\boxed{4}.", "4"),
    ("\\boxed{a}\\boxed{b", "a"),  # the last box is cut off: the earlier complete one
    ("\\boxed{cut off", "\\boxed{cut off"),  # no complete box: falls through to the whole text
    ("\\boxed{}", None),
    ("\\boxed{  }", None),
    ("The answer is \\boxed{5}. The answer is 6.", "6."),  # the last marker wins, by position (issue #18)
    ("\\boxed", "\\boxed"),
    # final-answer phrases
    ("The answer is 5.", "5."),
    ("The answer is: **12**", "12"),
    ("the answer is yes", "yes"),
    ("THE ANSWER IS NO", "NO"),
    ("Answer: (B) red", "(B) red"),
    ("**Answer:** 7", "7"),
    ("**Final answer:** 12 kg", "12 kg"),
    ("Final Answer: The final answer is 7. I hope it is correct.", "7"),
    ("Final answer: 3", "3"),
    ("The correct answer is (B).", "(B)."),
    ("So my answer would be 3 apples.", "3 apples."),
    ("The answer will be 9", "9"),
    ("Answer：8", "8"),
    ("Answer:", None),
    ("The answer is", None),
    ("The answer is\n\n42", "42"),
    ("Answer:\n\n 42\n", "42"),
    ("Answer: 5\nExplanation: blah", "5"),
    ("The answer is 3! Great", "3"),
    ("The answer is 3. The end.", "3"),
    ("The answer is 3.5 million.", "3.5 million."),
    ("The answer isn't 5, the answer is 6!", "6!"),
    ("The answer isn't obvious.", "The answer isn't obvious."),
    ("answers: 5", "answers: 5"),  # "answers" is not the phrase
    ("In my answer I count 4.", "In my answer I count 4."),
    ("Answer: 1. Answer: 2.", "2."),
    ("We need the answer. Answer: 10", "10"),
    ("Answer: $5$", "$5$"),
    ("The answer is U.S.", "U.S."),
    (f"{REASONING}\nAnswer: 9", "9"),
]


@pytest.mark.parametrize("response,expected", CASES, ids=[repr(c[0])[:40] for c in CASES])
def test_extraction_table(response, expected):
    result = extract_answer(response)
    assert isinstance(result, Extraction)
    assert result.answer == expected
    assert result.reason == (None if expected is not None else "no_answer")


# Every answer form, inside every reasoning wrapper: the answer must come out the same.
ANSWER_FORMS = [
    ("12", "12"),
    ("The answer is 12", "12"),
    ("Answer: 12", "12"),
    ("Final answer: 12", "12"),
    ("\\boxed{12}", "12"),
    ("<answer>12</answer>", "12"),
    ("**12**", "12"),
    ("We computed it.\nThe answer is (B)", "(B)"),
    ("\\boxed{\\frac{3}{4}}", "\\frac{3}{4}"),
    ("yes", "yes"),
]
WRAPPERS = [
    ("plain", "{answer}"),
    ("think", "<think>\n" + REASONING + "\n</think>\n\n{answer}"),
    ("prefilled", REASONING + "\n</think>\n\n{answer}"),
    ("empty-think", "<think>\n\n</think>\n\n{answer}"),
    ("two-blocks", "<think>a</think>\n<think>" + REASONING + "</think>{answer}"),
    ("thinking-tag", "<thinking>" + REASONING + "</thinking>\n{answer}"),
    ("reasoning-tag", "<reasoning>" + REASONING + "</reasoning>\n{answer}"),
    ("end-marker", "<think>" + REASONING + "</think>\n{answer}<|im_end|>"),
    ("boxed-in-reasoning", "<think>maybe \\boxed{{99}}; the answer is 98</think>\n{answer}"),
    ("whitespace", "<think>" + REASONING + "</think>   \n\n  {answer}  \n"),
]


@pytest.mark.parametrize("wrapper_name,wrapper", WRAPPERS, ids=[w[0] for w in WRAPPERS])
@pytest.mark.parametrize("answer_form,expected", ANSWER_FORMS, ids=[a[0][:20] for a in ANSWER_FORMS])
def test_answer_forms_in_reasoning_wrappers(wrapper_name, wrapper, answer_form, expected):
    assert extract_answer(wrapper.format(answer=answer_form)) == Extraction(expected, None)


@pytest.mark.parametrize("answer_form", [a[0] for a in ANSWER_FORMS])
@pytest.mark.parametrize(
    "unclosed",
    ["<think>\n" + REASONING + "\n{answer}", "<think>{answer}", "<think>a</think>{answer}\n<think>more"],
)
def test_unclosed_reasoning_is_no_answer_whatever_it_contains(unclosed, answer_form):
    assert extract_answer(unclosed.format(answer=answer_form)) == Extraction(None, "no_answer")


@pytest.mark.parametrize("bad", [None, 12, 3.5, b"bytes", ["12"], {"content": "12"}, float("nan")])
def test_non_text_is_bad_input(bad):
    assert extract_answer(bad) == Extraction(None, "bad_input")


def test_str_subclass_is_text():
    class Text(str):
        pass

    assert extract_answer(Text("<think>x</think>7")) == Extraction("7", None)


def test_very_long_responses_take_linear_time():
    blob = "word " * 1_000_000  # 5 MB
    cases = [
        blob + "</think>\nThe answer is 5",
        "<think>" + blob,
        blob + "\\boxed{" + "{" * 1000 + "x" + "}" * 1000 + "}",
        "answer " * 500_000 + "Answer: 3",
        "\\boxed{" * 200_000,
        "<answer>" * 100_000 + "7",
        "\\boxed{" + "}" * 1_000_000 + "{" * 1_000_000,
        "\\fbox{\\boxed{" * 100_000 + "}",
        "answer " * 1_000_000,
    ]
    start = time.perf_counter()
    results = [extract_answer(c) for c in cases]
    assert time.perf_counter() - start < 5.0  # quadratic behaviour would take minutes
    assert results[0].answer == "5"
    assert results[1].reason == "no_answer"
    assert results[2].answer == "{" * 1000 + "x" + "}" * 1000
    assert results[3].answer == "3"
    assert results[4].answer == "\\boxed{" * 200_000
    assert results[5].answer == "7"
    assert results[6] == Extraction(None, "no_answer")  # the box closes at once: empty
    assert results[7] == Extraction(None, "no_answer")
    assert results[8].answer.startswith("answer answer")


# Issue #18: response shapes from other projects' test suites (lighteval, Math-Verify, lmms-eval, VLMEvalKit).
# Class 2: tag names match in any case, answer and reasoning tags alike.
UPPER_CASE_TAGS = [
    ("<ANSWER> b </ANSWER>", "b"),
    ("<Answer>12</Answer>", "12"),
    ("<answer>5</ANSWER>", "5"),
    ("<ANSWER>5", "5"),  # never closed: what follows
    ("7</ANSWER>", "7"),  # only the closing tag: what precedes
    ("<ANSWER></ANSWER>", None),
    ("<Think>x</Think>7", "7"),
    ("<THINK>The answer is 3.</THINK><ANSWER>7</ANSWER>", "7"),
    ("<THINKING>x</THINKING>\n7", "7"),
    ("<REASONING>x</REASONING> 7", "7"),
    ("prefilled reasoning</THINK>\n\n7", "7"),
    ("<THINK>never closed", None),
    ("<Reasoning>never closed <ANSWER>7</ANSWER>", None),
    ("<think>a</think>b<THINK>reopened", None),
    ("İstanbul? <ANSWER>B</ANSWER>", "B"),  # "İ" lowercases to two characters: tag positions still hold
    ("<think>İİİ</think><ANSWER>8</ANSWER>", "8"),
]


@pytest.mark.parametrize("response,expected", UPPER_CASE_TAGS, ids=[repr(c[0])[:40] for c in UPPER_CASE_TAGS])
def test_tag_names_match_in_any_case(response, expected):
    assert extract_answer(response).answer == expected
    if not response.startswith("<"):
        return
    # The same inside reasoning of either case: reasoning is dropped first.
    for wrapper in ("<think>" + REASONING + "</think>\n", "<THINK>" + REASONING + "</THINK>\n"):
        if "never closed" in response or "reopened" in response:
            assert extract_answer(wrapper + response).answer is None
        else:
            assert extract_answer(wrapper + response).answer == expected


# Class 4: the marker (answer tag, box, final-answer phrase) that comes last in the text is the final answer.
LAST_MARKER = [
    (
        "We add \\boxed{200} to the next row, \\boxed{255}, and carry.\n"
        "Final Answer: The final answer is $10,455$. I hope it is correct.",
        "$10,455$",
    ),
    ("\\boxed{3}\nThe answer is 4", "4"),
    ("First \\boxed{3}. **Final answer:** 4", "4"),
    ("The answer is 4. On reflection, \\boxed{5}", "5"),
    ("The answer is \\boxed{5}.", "5"),  # a box inside the phrase's answer comes after the phrase
    ("**Answer:** $\\boxed{7}$", "7"),
    ("\\boxed{5}. That is my answer:", "5"),  # a phrase with nothing after it does not replace the box
    ("\\boxed{5}\nAnswer:\n", "5"),
    ("<answer>5</answer> Final answer: 6", "6"),
    ("<answer>5</answer> then \\boxed{6}", "6"),
    ("\\boxed{6} then <answer>5</answer>", "5"),
    ("The answer is 6 <answer>5</answer>", "5"),
    ("<answer>\\boxed{3} Answer: 4</answer>", "4"),
    ("<answer>5</answer> That is my answer.", "5"),  # no phrase after the tag
    ("Answer: 3\n\\boxed{4}", "4"),
    ("\\boxed{\\text{Answer: 5}}", "\\text{Answer: 5}"),  # a phrase inside the box is part of the box
    ("\\boxed{1} \\boxed{2} \\boxed{3", "2"),  # the last complete box, then no phrase
]


@pytest.mark.parametrize("wrapper_name,wrapper", WRAPPERS, ids=[w[0] for w in WRAPPERS])
@pytest.mark.parametrize("response,expected", LAST_MARKER, ids=[repr(c[0])[:40] for c in LAST_MARKER])
def test_the_last_final_answer_marker_wins(response, expected, wrapper_name, wrapper):
    assert extract_answer(wrapper.format(answer=response)) == Extraction(expected, None)


def test_the_last_marker_decides_the_verdict():
    response = LAST_MARKER[0][0]
    assert verify_response("relaxed", response, "10455").match is True
    assert verify_response("relaxed", response, "255").match is False
    assert verify_response("mc", "<ANSWER> b </ANSWER>", "B", options=["x", "y"]).match is True
