"""The verifier's decisions of a run, as the stages after verify read them.

Generate stores each response with the decision made as it landed; the verify stage (`rsgen.verify`)
decides every stored response again under the recipe's verifier settings and writes the decisions to
work/verify/, with `settings.json` naming the settings they were made with. Explore, judge and emit read a
response's decision from there (`decided_records`): work/verify/ made with other settings, or not finished, is
a RecipeError that says to run `rsgen verify`, never a silent mix of two settings.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rsgen.config import RecipeConfig, RecipeError, recipe_fields
from rsgen.layout import OutputLayout
from rsgen.records import GenerateRecord, VerifyRecord, read_records, records_by_key
from rsgen.store import CheckpointStore
from rsgen.verifiers import Decision, verify_response
from rsgen.verifiers.decision import rejected

SETTINGS_FILE = "settings.json"


def decide_response(recipe: RecipeConfig, family: str, result, answers, options) -> tuple[str, Decision]:
    """(the verifier the recipe names for `family`, its decision on a model's answer) as generate and explore
    make it when the answer lands. A response with a drop reason (refused, failed every retry, no content, cut at
    the token limit: `GenerationResult.drop_reason`) is a rejection with that reason, never verified."""
    verifier = recipe.verifier_for(family)
    if result.drop_reason:
        return verifier, rejected(result.drop_reason, None)
    return verifier, verify_response(verifier, result.text, list(answers), options=list(options) or None,
                                     numeric_tolerance=recipe.numeric_tolerance,
                                     timeout_seconds=recipe.math_timeout_seconds)


def verify_keys() -> tuple[str, ...]:
    """The recipe keys the decisions depend on: the keys of the `verify` group in RecipeConfig's field metadata."""
    return tuple(f.name for f in recipe_fields() if f.metadata["stage"] == "verify")


def verify_settings(recipe: RecipeConfig) -> dict[str, Any]:
    values = recipe.to_dict()
    return {key: values[key] for key in verify_keys()}


def stored_settings(folder: Path) -> dict[str, Any] | None:
    """What `folder/settings.json` says: the settings its decisions were made with and whether they are
    `complete`; None when there is none (no decisions yet)."""
    try:
        return json.loads((folder / SETTINGS_FILE).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def same_settings(stored: dict[str, Any] | None, wanted: dict[str, Any]) -> bool:
    return stored is not None and all(
        json.dumps(stored.get(key), sort_keys=True) == json.dumps(value, sort_keys=True) for key, value in wanted.items())


def write_settings(folder: Path, settings: dict[str, Any], complete: bool) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (SETTINGS_FILE + ".tmp")
    tmp.write_text(json.dumps({**settings, "complete": complete}, sort_keys=True) + "\n")
    os.replace(tmp, folder / SETTINGS_FILE)


def describe(settings: dict[str, Any], keys: tuple[str, ...] | None = None) -> str:
    return ", ".join(f"{key} {settings.get(key)!r}" for key in (keys or verify_keys()))


def decisions_folder(recipe: RecipeConfig) -> Path:
    """work/verify/, checked to hold finished decisions made under the recipe's settings (else a RecipeError that
    says to run `rsgen verify`)."""
    folder = OutputLayout(recipe.output_dir).verify_work
    stored = stored_settings(folder)
    wanted = verify_settings(recipe)
    if not same_settings(stored, wanted) or not stored.get("complete"):
        held = ("no finished verifier decisions" if stored is None or not stored.get("complete") else
                f"verifier decisions made with {describe(stored)}")
        raise RecipeError(f"{str(folder)!r} holds {held}; this recipe has {describe(wanted)}: run `rsgen verify "
                          "--config RECIPE` (or `rsgen run`), which decides the stored responses again without the "
                          "model")
    return folder


def undecided_error(key: str, folder: Path) -> RecipeError:
    return RecipeError(f"generate response {key!r} has no decision in {str(folder)!r} (generate ran again after "
                       "verify?): run `rsgen verify --config RECIPE` (or `rsgen run`)")


def decided_records(recipe: RecipeConfig) -> dict[str, GenerateRecord]:
    """The generate records (key -> record), each with the decision verify made under the recipe's settings."""
    folder = decisions_folder(recipe)
    decisions = records_by_key(CheckpointStore(folder), VerifyRecord)
    out = {}
    # The generate records are read one by one, not as a dict first: the decided copy is all that is kept.
    for rec in read_records(CheckpointStore(OutputLayout(recipe.output_dir).generate_work), GenerateRecord):
        decision = decisions.get(rec.key)
        if decision is None:
            raise undecided_error(rec.key, folder)
        out[rec.key] = rec.decided(decision)
    return out
