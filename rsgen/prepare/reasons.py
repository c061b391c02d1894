"""Every reason prepare drops or merges a QA pair for, what it means and what to do about it.

The prepare report counts pairs by these names (`dropped`, `merged`) and shows examples of each; docs/reasons.md
is generated from this table (`python scripts/update_reasons_table.py`), and `Report` refuses a reason that is
not here, so a new reason cannot go undocumented.
"""

from __future__ import annotations

from typing import NamedTuple


class Reason(NamedTuple):
    means: str
    fix: str = ""  # what to look at first (shown when every row of a pool is dropped for it)


DROP_REASONS: dict[str, Reason] = {
    # The row as read
    "row_unparseable": Reason("the record does not parse (broken JSON line, more CSV cells than header names)",
                              "the file does not parse as its extension says"),
    "multi_image": Reason("the row holds several images (a QA pair needs exactly one)"),
    "conversation_malformed": Reason("cauldron / llava: the turns are not a list of user/assistant turns",
                                     "check conversation_column and format"),
    "family_missing": Reason("family_column is empty for the row", "check family_column, or set `family: NAME`"),
    "family_invalid": Reason("the family name has characters other than letters, digits, '_', '-', '.'"),
    # Text
    "question_missing": Reason("no question (the column is null or absent in this row)",
                               "check question_column (or format: cauldron / llava for conversation pools)"),
    "question_not_string": Reason("the question is not text (a number, a list, a mapping)"),
    "question_empty": Reason("the question is blank"),
    "answer_missing": Reason("no answer (null, NaN or an empty list)", "check answer_column"),
    "answer_not_string": Reason("the answer is not text or a number (a mapping, a list of lists)"),
    "answer_empty": Reason("the answer is blank (after answer_normalization)"),
    "special_token": Reason("question, answer or an option contains a chat-template special token (`<|im_end|>`...)"),
    "purity_question_pattern": Reason("the question matches none of keep_question_patterns",
                                      "keep_question_patterns matches no question"),
    "purity_no_source": Reason("source_allowlist is set but the row names no source"),
    "purity_source": Reason("the row's source is not in source_allowlist",
                            "source_allowlist matches no row's source id"),
    # Multiple choice
    "mc_unparseable_options": Reason("options that cannot be read: not a list of texts, a blank option, fewer than "
                                     "two or more than 26, or options in the question that cannot be split"),
    "mc_ambiguous_answer": Reason("the answer names two different options (a letter that is also another option's "
                                  "text, or acceptable answers that disagree)"),
    "mc_options_mismatch": Reason("the options written in the question differ from the options column"),
    "mc_duplicate_options": Reason("two options have the same text"),
    "mc_answer_index_out_of_range": Reason("the answer is an option index beyond the options (answer_index_base)"),
    "mc_answer_not_in_options": Reason("the answer is neither an option's letter nor its text",
                                       "answers written as option indices need answer_index_base: 0 or 1"),
    # Images
    "image_missing": Reason("no image in the row", "check image_column (the column that holds each row's image)"),
    "image_file_missing": Reason("the image path names no file",
                                 "image paths resolve against the source's data_dir, else the data file's folder"),
    "image_zero_size": Reason("the image has no bytes, or a width or height of 0"),
    "image_undecodable": Reason("the bytes are not an image PIL can open"),
    "image_truncated": Reason("the image file is cut short"),
    "image_too_many_pixels": Reason("more pixels than max_image_pixels (a decompression bomb, or a huge scan)"),
    "image_aspect_ratio": Reason("more elongated than max_aspect_ratio"),
    "image_unsupported_mode": Reason("a pixel format that cannot be turned into RGB"),
    # Provenance (image_ref_column, source_id_column)
    "provenance_missing_ref": Reason("image_ref_column is empty for the row"),
    "provenance_unresolved": Reason("the recorded image reference names no file to compare with"),
    "provenance_mismatch": Reason("the recorded image reference names another image than the one attached"),
    "provenance_source_id_conflict": Reason("one source id is recorded on two different images"),
    # Decontamination (decontaminate: evaluation sets)
    "contaminated_image": Reason("the image is a copy of an evaluation image (resized, re-encoded, cropped or padded "
                                 "ones included): every QA pair of the image goes"),
    "contaminated_question": Reason("the question shares at least half of its word 8-grams with one evaluation "
                                    "question (case, punctuation and spacing ignored)"),
    # Duplicates
    "duplicate_conflicting_answers": Reason("the same question twice on one image with different answers "
                                            "(every copy is dropped)"),
}

MERGE_REASONS: dict[str, Reason] = {
    "duplicate_question": Reason("the same question twice on one image with the same answer: the copy is merged "
                                 "into the first (acceptable answers united)"),
}
