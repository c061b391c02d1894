"""What each family's verifier can do with the prepared references, checked before any model work.

Verification is a pure function of the response, the references and the options, and `bad_input` depends on the
references and options alone (`rsgen.verifiers.unusable_reference`). So before a model is loaded:

- `verifier: mc` for a family with rows without options is refused: `mc` reads option letters, and a free-form
  row has none to read. Every other verifier checks a row with options as multiple choice and a row without as
  free form, so one setting (the default `relaxed`) serves a family that mixes both.
- A family where more than `BAD_INPUT_WARN_SHARE` of the QA pairs have references the verifier cannot use warns
  once, with the count, the reason and one example. Those pairs are rejected as `bad_input`: never judged, never
  promoted, never a DPO pair, and counted as `bad_input` in stats.json, the `_rejected` split and the final table.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from rsgen.config import RecipeConfig, RecipeError
from rsgen.schema import PreparedPool, PreparedQuestion, iter_questions
from rsgen.verifiers import unusable_reference

BAD_INPUT_WARN_SHARE = 0.05


@dataclass
class FamilyReferences:
    verifier: str
    qa_pairs: int = 0
    without_options: int = 0
    first_without_options: PreparedQuestion | None = None
    bad_input: Counter = field(default_factory=Counter)  # reason -> QA pairs
    bad_input_example: tuple[PreparedQuestion, str] | None = None  # (QA pair, reason)


def survey_references(recipe: RecipeConfig, prepared: PreparedPool) -> dict[str, FamilyReferences]:
    """Per family: its verifier, QA pairs, those without options, and those whose references the verifier cannot
    use, by reason. A verifier mapping without an entry for a family fails here (RecipeError)."""
    families: dict[str, FamilyReferences] = {}
    # unusable_reference is a function of (verifier, answers, options) alone, and pools repeat those a lot (yes/no,
    # small counts, the same option lists): decided once per distinct triple (~2x faster at every stage start).
    decided: dict[tuple, str | None] = {}
    for q in iter_questions(prepared):
        fam = families.get(q.family)
        if fam is None:
            fam = families[q.family] = FamilyReferences(recipe.verifier_for(q.family))
        fam.qa_pairs += 1
        if not q.options:
            fam.without_options += 1
            fam.first_without_options = fam.first_without_options or q
        case = (fam.verifier, q.answers, q.options)
        if case in decided:
            problem = decided[case]
        else:
            problem = decided[case] = unusable_reference(fam.verifier, list(q.answers), list(q.options) or None)
        if problem is not None:
            fam.bad_input[problem] += 1
            fam.bad_input_example = fam.bad_input_example or (q, problem)
    return families


def check_references(recipe: RecipeConfig, prepared: PreparedPool) -> list[str]:
    """Refuse `mc` for a family with rows without options (RecipeError naming the count and what to use instead);
    return one warning per family with more than BAD_INPUT_WARN_SHARE bad_input QA pairs."""
    families = survey_references(recipe, prepared)
    for name, fam in sorted(families.items()):
        if fam.verifier == "mc" and fam.without_options:
            example = fam.first_without_options
            raise RecipeError(
                f"verifier mc for family {name!r}: {fam.without_options} of its {fam.qa_pairs} QA pairs have no "
                f"options (e.g. {example.id!r}: {example.question.splitlines()[0][:80]!r}), and mc can only read "
                f"option letters. Use `verifier: relaxed` (or exact, numeric, math) for {name}: under every verifier a "
                "row with options is checked as multiple choice and a row without options as free form"
            )
    return [bad_input_warning(name, fam) for name, fam in sorted(families.items())
            if fam.qa_pairs and sum(fam.bad_input.values()) > BAD_INPUT_WARN_SHARE * fam.qa_pairs]


def bad_input_warning(name: str, fam: FamilyReferences) -> str:
    count = sum(fam.bad_input.values())
    q, reason = fam.bad_input_example
    reasons = ", ".join(f"{n} {why}" for why, n in fam.bad_input.most_common())
    return (f"family {name}: {count} of {fam.qa_pairs} QA pairs ({count / fam.qa_pairs:.1%}) are bad_input for verifier "
            f"{fam.verifier} ({reasons}); e.g. {q.id!r}: answers {list(q.answers)!r}, options {list(q.options)!r}. "
            "They are rejected as bad_input (never judged, never a DPO pair); fix the answer or options column")
