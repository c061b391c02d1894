"""Normalisation and number reading shared by relaxed, exact, numeric and mc."""

import pytest

from rsgen.verifiers.normalize import MAX_NUMBER_CHARS, Number, normalize_text, parse_number, text_info

NORMALIZE = [
    ("Yes", "yes"),
    ("  Yes.  ", "yes"),
    ("Yes..", "yes."),  # one trailing period only
    ("N.Y.", "n.y"),
    ("**Blue**", "blue"),
    ("`42`", "42"),
    ("$5$", "5"),
    ("$5", "$5"),  # a currency sign, not math delimiters
    ("$5$.", "5"),  # math ending a sentence
    ("$10,455$.", "10,455"),
    ("$5.", "$5"),
    ("\\(x\\)", "x"),
    ("\\[x\\]", "x"),
    ("\\text{Blue}", "blue"),
    ("\\textbf{Blue}", "blue"),
    ("\\mathrm{kg}", "kg"),
    ("$\\boxed{\\text{B}}$", "b"),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\text{a}} {\\text{b}", "\\text{a}} {\\text{b}"),  # not one wrapper: left alone
    ("50\\%", "50%"),
    ("\\$5", "$5"),
    ("1\\,000", "1000"),
    ("New   York", "new york"),
    ("New\nYork", "new york"),
    ("a\tb", "a b"),
    ("", ""),
    ("   ", ""),
    (".", ""),
    ("Ünïcödé", "ünïcödé"),
]


@pytest.mark.parametrize("text,expected", NORMALIZE)
def test_normalize_text(text, expected):
    assert normalize_text(text) == expected


NUMBERS = [
    ("12", Number(12.0, False, "", "")),
    ("12.5", Number(12.5, False, "", "")),
    (".5", Number(0.5, False, "", "")),
    ("5.", Number(5.0, False, "", "")),
    ("-3", Number(-3.0, False, "", "")),
    ("−3", Number(-3.0, False, "", "")),  # Unicode minus
    ("+5", Number(5.0, False, "", "")),
    ("1,000", Number(1000.0, False, "", "")),
    ("1,234,567.5", Number(1234567.5, False, "", "")),
    ("45%", Number(45.0, True, "", "")),
    ("45 %", Number(45.0, True, "", "")),
    ("45 percent", Number(45.0, True, "", "")),
    ("-12.5%", Number(-12.5, True, "", "")),
    ("$5", Number(5.0, False, "$", "")),
    ("-$5", Number(-5.0, False, "$", "")),
    ("€5", Number(5.0, False, "€", "")),
    ("$5 million", Number(5.0, False, "$", "million")),
    ("5 kg", Number(5.0, False, "", "kg")),
    ("5kg", Number(5.0, False, "", "kg")),
    ("5 km/h", Number(5.0, False, "", "km/h")),
    ("5 m²", Number(5.0, False, "", "m²")),
    ("20°c", Number(20.0, False, "", "°c")),
    ("3 years old", Number(3.0, False, "", "years old")),
    ("1.5e6", Number(1.5e6, False, "", "")),
    ("2e-3", Number(2e-3, False, "", "")),
    ("0", Number(0.0, False, "", "")),
    ("٣", Number(3.0, False, "", "")),  # a decimal digit in another script
    ("1" * 18, Number(float("1" * 18), False, "", "")),
    # a space as thousands separator (issue #18 class 5): SI style and many locales
    ("100 000", Number(100000.0, False, "", "")),
    ("1 000", Number(1000.0, False, "", "")),
    ("12 345.6", Number(12345.6, False, "", "")),
    ("-1 234 567", Number(-1234567.0, False, "", "")),
    ("$1 000", Number(1000.0, False, "$", "")),
    ("5 000 kg", Number(5000.0, False, "", "kg")),
    ("2 500%", Number(2500.0, True, "", "")),
]
NOT_NUMBERS = [
    "1,00",  # not groups of three: neither 1.00 nor 100
    "1,5",
    "12,34,567",
    "1 00",  # a space separates groups of exactly three digits only (issue #18 class 5)
    "10 0000",
    "1,000 000",
    "1 000,000",
    "1_000",
    "12.5.3",
    "1/2",
    "5 or 6",
    "5 apples, not 6",
    "12 (approx)",
    "five",
    "nan",
    "inf",
    "infinity",
    "-inf",
    "1e400",  # overflows a float
    "²",
    "$€5",
    "%",
    "$",
    "-",
    "+",
    ".",
    "",
    "yes",
    "5 a b c d",  # a unit is at most three words
    "1" * (MAX_NUMBER_CHARS + 1),
]


@pytest.mark.parametrize("text,expected", NUMBERS)
def test_parse_number(text, expected):
    assert parse_number(text) == expected


@pytest.mark.parametrize("text", NOT_NUMBERS)
def test_not_a_number(text):
    assert parse_number(text) is None


def test_text_info_memo_returns_the_same_as_the_functions():
    for text, plain in [
        ("  Yes. ", None),
        ("1,000", 1000.0),
        ("45 %", None),
        ("$5", None),
        ("5 kg", None),
        ("x" * 500, None),
    ]:
        normalized = normalize_text(text)
        assert text_info(text) == (normalized, parse_number(normalized), plain)
        assert text_info(text) == (normalized, parse_number(normalized), plain)  # from the memo


CAFE_NFC, CAFE_NFD = "caf\u00e9", "cafe\u0301"


@pytest.mark.parametrize(
    "text,expected",
    [
        (CAFE_NFD, CAFE_NFC),  # letter + combining accent -> one code point
        ("3\u200b", "3"),  # zero-width space
        ("\u200e42\u200f", "42"),  # left-to-right / right-to-left marks
        ("\ufeffYes", "Yes"),  # byte order mark at the start of a pasted cell
        ("a\u2066b\u2069", "ab"),  # bidi isolates
        ("plain ascii", "plain ascii"),
    ],
)
def test_canonical_text(text, expected):
    from rsgen.verifiers.normalize import canonical_text

    assert canonical_text(text) == expected


@pytest.mark.parametrize("name", ["relaxed", "exact", "numeric", "mc"])
def test_every_string_verifier_compares_canonical_text(name):
    from rsgen.verifiers import compare

    if name == "mc":
        options = [CAFE_NFC, "tea"]
        assert compare(name, CAFE_NFD, ["A"], options=options).match
        assert compare(name, "A\u200b", ["A"], options=options).match
        return
    reference = "3" if name == "numeric" else CAFE_NFC
    prediction = "3\u200b" if name == "numeric" else CAFE_NFD
    assert compare(name, prediction, [reference]).match
    assert compare(name, reference + "\u200b", [reference]).match
    assert not compare(name, "4" if name == "numeric" else "tea", [reference]).match
