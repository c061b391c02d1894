"""Work directories scripted by tests: the verify stage's work for scripted generate records.

Tests of the judge and of emit script the verifier's decisions in the generate records they write (which pair is
accepted, which rejected and why). The stages after verify read decisions from work/verify/ (`rsgen.decisions`),
so `verified_as_scripted` writes that work as the verify stage would had it reached the scripted decisions under
the recipe's settings. Tests of the verify stage itself run the real stage."""

from __future__ import annotations

from rsgen.config import RecipeConfig
from rsgen.decisions import same_settings, stored_settings, verify_settings, write_settings
from rsgen.layout import OutputLayout
from rsgen.records import GenerateRecord, VerifyRecord, read_records
from rsgen.store import CheckpointStore


def verified_as_scripted(recipe: RecipeConfig) -> RecipeConfig:
    """Write work/verify/ holding the scripted generate decisions under `recipe`'s verifier settings (unless it
    holds decisions of these settings already); returns `recipe`."""
    layout = OutputLayout(recipe.output_dir)
    settings = verify_settings(recipe)
    if not layout.generate_work.is_dir() or same_settings(stored_settings(layout.verify_work), settings):
        return recipe
    generate = CheckpointStore(layout.generate_work)
    with CheckpointStore(layout.verify_work).writer(0, every_items=1 << 20, every_seconds=float("inf")) as writer:
        for rec in read_records(generate, GenerateRecord):
            writer.add(VerifyRecord(key=rec.key, id=rec.id, sample=rec.sample, family=rec.family,
                                    extracted=rec.extracted, match=rec.match, reason=rec.reason,
                                    verifier=rec.verifier).to_json())
    write_settings(layout.verify_work, settings, complete=True)
    return recipe
