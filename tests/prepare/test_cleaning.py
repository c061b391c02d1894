import pytest

from rsgen.config import RecipeError, SourceConfig
from rsgen.prepare.cleaning import (
    CleanQA,
    Rejected,
    SourceRules,
    SpilledQA,
    check_image_ref,
    check_qa,
    find_special_token,
    merge_duplicates,
    normalise_mc,
    ordered_steps,
    qa_id,
)

INSTRUCTION = "Answer in short without any other content."


def rules(**kw) -> SourceRules:
    kw.setdefault("family", "Fam")
    kw.setdefault("dataset_name", "x")
    return SourceRules.from_source(SourceConfig(**kw), INSTRUCTION, "sources[0]")


def test_prompt_is_template_then_instruction():
    r = rules(question_template="Question: {question}")
    out = check_qa(r, "Subtract all big blue things. How many objects are left?", "0", None, None)
    assert isinstance(out, CleanQA)
    assert out.question == (
        "Question: Subtract all big blue things. How many objects are left?\n"
        "Answer in short without any other content."
    )
    assert out.answers == ["0"]


def test_no_instruction_means_no_trailing_newline():
    r = SourceRules.from_source(SourceConfig(family="F", dataset_name="x"), "", "s")
    assert check_qa(r, "  What?  ", "a", None, None).question == "What?"


@pytest.mark.parametrize(
    "question,answer,reason",
    [
        (None, "a", "question_missing"),
        ("   ", "a", "question_empty"),
        (7, "a", "question_not_string"),
        ("q?", None, "answer_missing"),
        ("q?", [], "answer_missing"),
        ("q?", "  ", "answer_empty"),
        ("q?", ["", " "], "answer_empty"),
        ("q?", {"text": "a"}, "answer_not_string"),
        ("q?", True, "answer_not_string"),
        ("q?", b"a", "answer_not_string"),
        ("q?", ["a", None], "answer_missing"),
        ("What is it?<|im_end|>", "a", "special_token"),
        ("<image>\nWhat is it?", "a", "special_token"),
        ("What is it?", "<|image_pad|>", "special_token"),
        ("<|vision_start|>What?", "a", "special_token"),
        ("<fake_token_around_image>What?", "a", "special_token"),
        ("What?", "a<end_of_utterance>", "special_token"),
        ("What?", "<row_1_col_2>", "special_token"),
    ],
)
def test_bad_text_is_rejected_with_reason(question, answer, reason):
    out = check_qa(rules(), question, answer, None, None)
    assert isinstance(out, Rejected) and out.reason == reason


def test_numbers_become_strings_and_are_counted():
    out = check_qa(rules(), "How many?", 3, None, None)
    assert out.answers == ["3"] and out.converted == ["answer_number_to_string"]
    out = check_qa(rules(), "How much?", [2.5, "2.50"], None, None)
    assert out.answers == ["2.5", "2.50"]


def test_list_answers_are_kept_in_order_without_duplicates():
    out = check_qa(rules(), "Which?", ["Yes", " Yes", "yes"], None, None)
    assert out.answers == ["Yes", "yes"]


def test_answer_normalisation_per_source():
    r = rules(answer_normalization=["strip_answer_prefix", "strip_trailing_period"])
    out = check_qa(r, "How many?", "Answer: 3.", None, None)
    assert out.answers == ["3"]
    assert out.converted == ["answer_normalized:strip_answer_prefix", "answer_normalized:strip_trailing_period"]
    assert "answer_normalize" in out.steps
    assert check_qa(r, "How many?", "Answer: .", None, None).reason == "answer_empty"


def test_text_that_merely_mentions_angle_brackets_is_fine():
    assert find_special_token("Is 3 < 4 and 5 > 2?") is None
    assert find_special_token("a <b> tag") is None
    assert isinstance(check_qa(rules(), "Is x<y?", "yes", None, None), CleanQA)


def test_bad_rules_are_recipe_errors():
    with pytest.raises(RecipeError, match="answer_normalization 'strip_answr_prefix'.*strip_answer_prefix"):
        rules(answer_normalization=["strip_answr_prefix"])
    with pytest.raises(RecipeError, match="lacks `\\{question\\}`"):
        rules(question_template="Question:")
    with pytest.raises(RecipeError, match="not a valid format string"):
        rules(question_template="{question} {other}")
    with pytest.raises(RecipeError, match="not a regex"):
        rules(keep_question_patterns=["("])
    with pytest.raises(RecipeError, match="source_id_column"):
        rules(source_allowlist=["chartqa"])
    with pytest.raises(RecipeError, match="family"):
        rules(family="Bad Family/1")


def test_task_purity_question_patterns():
    r = rules(keep_question_patterns=[r"^Subtract ", r"How many .* left\?$"])
    assert isinstance(check_qa(r, "Subtract all red cubes. How many?", "1", None, None), CleanQA)
    assert isinstance(check_qa(r, "Count them. How many objects are left?", "1", None, None), CleanQA)
    assert check_qa(r, "What is the man wearing?", "hat", None, None).reason == "purity_question_pattern"
    assert "task_purity" in check_qa(r, "Subtract all.", "1", None, None).steps


def test_task_purity_source_allowlist():
    r = rules(source_allowlist=["clevr_math", "chartqa*"], source_id_column="sid")
    assert isinstance(check_qa(r, "q?", "a", None, "clevr_math/train/12"), CleanQA)
    assert isinstance(check_qa(r, "q?", "a", None, "clevr_math:12"), CleanQA)
    assert isinstance(check_qa(r, "q?", "a", None, "chartqa_human/5"), CleanQA)
    assert check_qa(r, "q?", "a", None, "clevr_mathx/1").reason == "purity_source"
    assert check_qa(r, "q?", "a", None, "infinitymm/general_vqa/7").reason == "purity_source"
    assert check_qa(r, "q?", "a", None, None).reason == "purity_no_source"


# ---------------------------------------------------------------------------------------- multiple choice


def test_mc_prose_options_become_a_lettered_block_and_the_answer_a_letter():
    q, answers, options, conv = normalise_mc("What color is the cube? Options: red, blue, green.", ["blue"], [])
    assert q == "What color is the cube?\nA. red\nB. blue\nC. green"
    assert answers == ["B"] and options == ["red", "blue", "green"]
    assert conv == ["mc_options_rendered", "mc_answer_to_letter"]


def test_mc_choices_with_or():
    q, answers, options, _ = normalise_mc("Which is bigger? Choices: the cube or the sphere", ["the sphere"], [])
    assert options == ["the cube", "the sphere"] and answers == ["B"]


def test_mc_lettered_block_already_canonical_is_unchanged():
    question = "What shape is the red thing?\nA. cube\nB. sphere\nC. cylinder"
    q, answers, options, conv = normalise_mc(question, ["C"], [])
    assert q == question and answers == ["C"] and options == ["cube", "sphere", "cylinder"] and conv == []


def test_mc_inline_letters():
    q, answers, options, _ = normalise_mc("Which animal is shown? (A) a cat (B) a dog (C) a bird", ["(B)"], [])
    assert q == "Which animal is shown?\nA. a cat\nB. a dog\nC. a bird"
    assert answers == ["B"] and options == ["a cat", "a dog", "a bird"]


def test_mc_options_column_are_rendered_into_the_question():
    q, answers, options, _ = normalise_mc("How many cubes are there?", ["7"], ["4", "7", "2"])
    assert q == "How many cubes are there?\nA. 4\nB. 7\nC. 2" and answers == ["B"]


def test_mc_options_column_matching_the_text_is_not_duplicated():
    q, _, _, _ = normalise_mc("Which?\nA. x\nB. y", ["A"], ["x", "y"])
    assert q == "Which?\nA. x\nB. y"
    assert normalise_mc("Which?\nA. x\nB. y", ["A"], ["x", "z"]).reason == "mc_options_mismatch"


def test_mc_suffix_after_the_block_is_kept():
    question = "Which?\nA. x\nB. y\nAnswer with the option's letter."
    q, answers, _, _ = normalise_mc(question, ["y"], [])
    assert q == question and answers == ["B"]


def test_mc_answer_forms():
    opts = ["red", "blue", "green"]
    assert normalise_mc("Q?", ["b"], opts)[1] == ["B"]
    assert normalise_mc("Q?", ["B. blue"], opts)[1] == ["B"]
    assert normalise_mc("Q?", ["Blue."], opts)[1] == ["B"]
    assert normalise_mc("Q?", ["C)"], opts)[1] == ["C"]


@pytest.mark.parametrize(
    "question,answers,options,reason",
    [
        ("Q?", ["purple"], ["red", "blue"], "mc_answer_not_in_options"),
        ("Q?", ["D"], ["red", "blue"], "mc_answer_not_in_options"),
        ("Q?", ["red"], ["red", "Red", "blue"], "mc_duplicate_options"),
        ("Q?", ["B. red"], ["red", "blue"], "mc_ambiguous_answer"),  # letter and text disagree
        ("Q?", ["B"], ["A", "B"], None),  # the letter and the option text agree
        ("Q?", ["A"], ["B", "A"], "mc_ambiguous_answer"),  # letter A, or the option whose text is "A"?
        ("Q?", ["red", "blue"], ["red", "blue"], "mc_ambiguous_answer"),  # acceptable answers name two options
        ("Total? Options: 1,000, 2,000", ["1,000"], [], "mc_unparseable_options"),
        ("Which? Options: red, , blue", ["red"], [], "mc_unparseable_options"),
        ("Which? Options: red", ["red"], [], "mc_unparseable_options"),
    ],
)
def test_mc_ambiguous_rows_are_dropped(question, answers, options, reason):
    out = normalise_mc(question, answers, options)
    if reason is None:
        assert out[1] == ["B"]
    else:
        assert isinstance(out, Rejected) and out.reason == reason


def test_non_mc_questions_are_left_alone():
    for q in ("How many objects are left?", "Is the value of A greater than B?", "What is 3. 5 rounded?",
              "Subtract all big blue things. Subtract all large rubber objects. How many objects are left?"):
        assert normalise_mc(q, ["3"], []) is None


def test_mc_through_check_qa_records_the_step():
    out = check_qa(rules(question_template="Question: {question}"), "Color? Options: red, blue", "blue", None, None)
    assert out.question == f"Question: Color?\nA. red\nB. blue\n{INSTRUCTION}"
    assert out.answers == ["B"] and out.options == ["red", "blue"] and "mc_normalise" in out.steps


# ---------------------------------------------------------------------------------------- provenance, merging, ids


def test_image_ref_resolution(tmp_path):
    raw, stored = "a" * 64, "b" * 64
    f = tmp_path / "other.png"
    f.write_bytes(b"different bytes")

    def resolve(ref):
        p = tmp_path / ref
        return str(p) if p.is_file() else None

    assert check_image_ref("img_1.png", "images/img_1.png", raw, stored, resolve) is None
    assert check_image_ref(stored, None, raw, stored, resolve) is None
    assert check_image_ref("img_2.png", "images/img_1.png", raw, stored, resolve) == "provenance_mismatch"
    assert check_image_ref("other.png", None, raw, stored, resolve) == "provenance_mismatch"
    assert check_image_ref("gone.png", None, raw, stored, resolve) == "provenance_unresolved"
    assert check_image_ref("", None, raw, stored, resolve) == "provenance_missing_ref"
    import hashlib

    same = tmp_path / "same.png"
    same.write_bytes(b"xyz")
    digest = hashlib.sha256(b"xyz").hexdigest()
    assert check_image_ref("same.png", None, digest, stored, resolve) is None


def qa(seq, question, answers, options=(), src=0):
    return SpilledQA(seq, src, f"r{seq}", question, list(answers), list(options), ["text_validate"])


def test_merge_same_question_same_answer():
    kept, dropped, merged = merge_duplicates([qa(2, "q", ["3"], src=1), qa(0, "q", ["3", "three"]), qa(1, "p", ["x"])])
    assert [k.seq for k in kept] == [0, 1]
    assert kept[0].answers == ["3", "three"] and "dedup_merge" in kept[0].steps
    assert [m.seq for m in merged] == [2] and dropped == []


def test_merge_is_case_and_space_insensitive_on_the_answer():
    kept, dropped, merged = merge_duplicates([qa(0, "q", ["Blue"]), qa(1, "q", [" blue "])])
    assert len(kept) == 1 and len(merged) == 1 and kept[0].answers == ["Blue", " blue "]


def test_conflicting_answers_drop_every_copy():
    kept, dropped, merged = merge_duplicates([qa(0, "q", ["3"]), qa(1, "q", ["4"]), qa(2, "q", ["3"]), qa(3, "p", ["1"])])
    assert [k.seq for k in kept] == [3]
    assert sorted(d.seq for d, _ in dropped) == [0, 1, 2]
    assert {r for _, r in dropped} == {"duplicate_conflicting_answers"} and merged == []


def test_ids_depend_on_content_only():
    a = qa_id("CLEVRMath", "ab" * 32, "Question: x?\nAnswer.")
    assert a == qa_id("CLEVRMath", "ab" * 32, "Question: x?\nAnswer.")
    assert len(a) == 16 and int(a, 16) >= 0
    assert a != qa_id("CLEVRMath", "ab" * 32, "Question: y?\nAnswer.")
    assert a != qa_id("Other", "ab" * 32, "Question: x?\nAnswer.")


def test_steps_are_versioned_and_ordered():
    assert ordered_steps({"dedup_merge", "text_validate", "mc_normalise"}) == [
        "text_validate@2",
        "mc_normalise@2",
        "dedup_merge@1",
    ]


# ------------------------------------------------------------------------------------------------ text and lists


@pytest.mark.parametrize(
    "raw,expected",
    [
        ("The answer is 3.", "3"),
        ("the answer is: 3", "3"),
        ("Answer - 3", "3"),
        ("Answer — 3", "3"),
        ("Answer: 3.5", "3.5"),
        ("Final answer: B", "B"),
        ("The correct answer is (B).", "(B)"),
        ("Answer -3", "Answer -3"),  # a minus sign, not a separator
        ("The answer is -3.", "-3"),
        ("Answering machine", "Answering machine"),
    ],
)
def test_strip_answer_prefix_reads_the_common_phrasings(raw, expected):
    out = check_qa(rules(answer_normalization=["strip_answer_prefix"]), "How many?", raw, None, None)
    assert isinstance(out, CleanQA) and out.answers == [expected]


def test_unicode_is_nfc_without_invisible_marks():
    out = check_qa(rules(), "Cafe\u0301 name?\u200b", "caf\u00e9\u200b", ["\u200bcafe\u0301", "tea"], None)
    assert isinstance(out, CleanQA)
    assert out.question.startswith("Caf\u00e9 name?\nA. caf\u00e9\nB. tea")
    assert out.answers == ["A"] and out.options == ["caf\u00e9", "tea"]
    assert "text_unicode_normalized" in out.converted


@pytest.mark.parametrize("value,expected", [(3.0, "3"), (-2.0, "-2"), (2.5, "2.5"), (7, "7"), (1e20, "1e+20")])
def test_numbers_from_typed_columns_have_no_spurious_decimal(value, expected):
    out = check_qa(rules(), "How many?", value, None, None)
    assert out.answers == [expected] and out.converted == ["answer_number_to_string"]


@pytest.mark.parametrize(
    "cell,answers",
    [
        ('["4", "four"]', ["4", "four"]),  # JSON
        ("['4', 'four']", ["4", "four"]),  # Python literal (pandas' str() of a list)
        ("[0, 1]", ["[0, 1]"]),  # not a list of quoted strings: an interval is an answer, not two
        ("[not a list", ["[not a list"]),
    ],
)
def test_list_valued_answer_cells_are_parsed(cell, answers):
    out = check_qa(rules(), "How many?", cell, None, None)
    assert out.answers == answers
    assert ("answer_list_parsed" in out.converted) is (len(answers) > 1)


def test_empty_list_cell_is_a_missing_answer():
    assert check_qa(rules(), "How many?", "[]", None, None) == Rejected("answer_missing")


@pytest.mark.parametrize("cell", ["['red', 'blue']", '["red", "blue"]'])
def test_list_valued_option_cells_are_parsed(cell):
    out = check_qa(rules(), "Which color?", "blue", cell, None)
    assert out.options == ["red", "blue"] and out.answers == ["B"]
    assert out.question.startswith("Which color?\nA. red\nB. blue\n")
    assert "options_list_parsed" in out.converted


@pytest.mark.parametrize("base,answer,letter", [(0, 0, "A"), (0, "2", "C"), (1, 1, "A"), (1, "3", "C")])
def test_integer_option_indices_become_letters(base, answer, letter):
    out = check_qa(rules(answer_index_base=base), "Which?", answer, ["x", "y", "z"], None)
    assert out.answers == [letter] and "mc_answer_index_to_letter" in out.converted


def test_integer_option_index_out_of_range_is_dropped():
    r = rules(answer_index_base=0)
    assert check_qa(r, "Which?", 3, ["x", "y", "z"], None) == Rejected("mc_answer_index_out_of_range")
    # Without the key a digit answer is an option text, as before: not among ["x", "y", "z"].
    assert check_qa(rules(), "Which?", 0, ["x", "y", "z"], None) == Rejected("mc_answer_not_in_options")


def test_answer_index_base_must_be_zero_or_one():
    with pytest.raises(RecipeError, match="answer_index_base 2"):
        rules(answer_index_base=2)


def test_pool_text_and_list_encodings_end_to_end(tmp_path, tools, pool_format):
    """The shapes of published pools, in every storage format: list cells, Python-literal option lists,
    0-based option indices, answer prefixes, NFD text and zero-width marks; bad rows under their reasons."""
    from rsgen.prepare import run_prepare
    from rsgen.schema import load_prepared

    same = tools.rgb_png(1)
    rows = [
        {"image": same, "question": "Cafe\u0301 name?", "answer": "The answer is 3.", "options": ""},
        {"image": same, "question": "Caf\u00e9 name?", "answer": "3\u200b", "options": ""},  # same question: merged
        {"image": tools.rgb_png(2), "question": "How many?", "answer": '["4", "four"]', "options": ""},
        {"image": tools.rgb_png(3), "question": "Which color?", "answer": "1", "options": "['red', 'blue']"},
        {"image": tools.rgb_png(4), "question": "Which size?", "answer": "Answer - 0", "options": '["big", "small"]'},
        {"image": tools.rgb_png(5), "question": "Empty list?", "answer": "[]", "options": ""},
        {"image": tools.rgb_png(6), "question": "Which shape?", "answer": "5", "options": "['cube', 'ball']"},
    ]
    source = tools.write_pool(tmp_path / "pool", pool_format, rows, options_column="options",
                              answer_index_base=0, answer_normalization=["strip_answer_prefix"])
    recipe = tools.make_recipe(tmp_path / "out", [source], instruction="")
    report = run_prepare(recipe)
    assert report["dropped"] == {"answer_missing": 1, "mc_answer_index_out_of_range": 1}
    assert report["merged"] == {"duplicate_question": 1}
    assert report["converted"] == {
        "answer_list_parsed": 1,
        "answer_normalized:strip_answer_prefix": 2,
        "mc_answer_index_to_letter": 2,
        "mc_options_rendered": 2,
        "options_list_parsed": 2,  # the third sits on a dropped row
        "text_unicode_normalized": 2,
    }
    qa = {q["question"]: q for row in load_prepared(recipe.output_dir) for q in row["qa"]}
    assert qa["Caf\u00e9 name?"]["answers"] == ["3"]
    assert qa["How many?"]["answers"] == ["4", "four"]
    assert qa["Which color?\nA. red\nB. blue"]["answers"] == ["B"]
    assert qa["Which size?\nA. big\nB. small"]["answers"] == ["A"]
    assert len(qa) == 4


def test_typed_number_columns_with_missing_cells_keep_their_digits(tmp_path, tools):
    """A CSV whose answer column has an empty cell is read by `datasets` (pandas) as float64: 3 arrives as 3.0.
    The same in a parquet float column. The answers stay "3"; the empty cells are answer_missing."""
    from rsgen.prepare import run_prepare
    from rsgen.schema import load_prepared

    repo = tmp_path / "csv_repo"
    repo.mkdir()
    for i in range(3):
        (repo / f"img{i}.png").write_bytes(tools.rgb_png(i))
    (repo / "train.csv").write_text("image,question,answer\nimg0.png,How many?,3\nimg1.png,How wide?,2.5\n"
                                    "img2.png,How tall?,\n")
    rows = [{"image": tools.rgb_png(10 + i), "question": q, "answer": a}
            for i, (q, a) in enumerate([("How many?", 3.0), ("How wide?", 2.5), ("How tall?", float("nan"))])]
    parquet = tools.write_pool(tmp_path / "pq", "parquet", rows)
    recipe = tools.make_recipe(tmp_path / "out", [
        {"dataset_name": str(repo), "data_dir": str(repo), "family": "F"}, parquet], instruction="")
    report = run_prepare(recipe)
    assert report["dropped"] == {"answer_missing": 2}
    assert report["converted"] == {"answer_number_to_string": 4}
    answers = sorted(a for row in load_prepared(recipe.output_dir) for q in row["qa"] for a in q["answers"])
    assert answers == ["2.5", "2.5", "3", "3"]
