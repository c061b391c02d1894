"""Accept rates of one round, by slice (held out / trained on) and family, routed exactly as the round's emit
routed them: `verifier` counts the pairs the verifier accepted, `accepted` adds the judge's trusted promotions.

On the demo pool (one `dataset_name: rsgen-demo` source) the pool knows every answer, so each round is also graded
against the scene (rsgen.demo.truth): `truth_right` counts the greedy answers that state the scene's answer, whatever
the verifier and the judge said, and `truth` holds the round's truth check of its accepted pairs."""

from __future__ import annotations

from collections import Counter
from typing import Any

from rsgen.config import DEMO_DATASET, RecipeConfig
from rsgen.emit.splits import Via
from rsgen.emit.stage import load_work
from rsgen.schema import open_prepared

SLICES = ("held_out", "train")


def _rates(counts: Counter, graded: bool) -> dict[str, Any]:
    qa = counts["qa"]
    out = {"qa": qa, "verifier_accepted": counts["verifier"], "accepted": counts["accepted"],
           "verifier_rate": counts["verifier"] / qa if qa else None,
           "accept_rate": counts["accepted"] / qa if qa else None}
    if graded:
        out.update({"truth_right": counts["truth"], "truth_rate": counts["truth"] / qa if qa else None})
    return out


def demo_source(recipe: RecipeConfig):
    """The recipe's demo-pool source when the demo pool is its only source (the truth is known), else None."""
    if len(recipe.sources) == 1 and recipe.sources[0].dataset_name == DEMO_DATASET:
        return recipe.sources[0]
    return None


def measure_round(round_recipe: RecipeConfig, held_out: set[str]) -> dict[str, Any]:
    """{slice: {qa, verifier_accepted, accepted, verifier_rate, accept_rate, [truth_right, truth_rate,]
    families: {family: the same}}, [truth: {accepted, accepted_wrong, verifier_missed, recovered}]}."""
    work = load_work(round_recipe)
    source = demo_source(round_recipe)
    right: dict[str, bool] = {}
    truth = None
    if source is not None:
        from rsgen.demo.truth import grade_demo_run

        truth = Counter()
        for pair in grade_demo_run(round_recipe.output_dir, source.demo_num_images, source.demo_seed):
            right[pair.qa_id] = pair.right
            truth["accepted"] += pair.accepted
            truth["accepted_wrong"] += pair.accepted and not pair.right
            truth["verifier_missed"] += pair.right and not pair.verifier_match
            truth["recovered"] += pair.right and not pair.verifier_match and pair.accepted
    counts: dict[str, dict[str, Counter]] = {s: {} for s in SLICES}
    pool = open_prepared(round_recipe.output_dir)
    for table in pool.batches(["family", "image_sha256", "qa"], batch_size=1024):
        for family, sha, qas in zip(*(table.column(c).to_pylist() for c in ("family", "image_sha256", "qa"))):
            tally = counts["held_out" if sha in held_out else "train"].setdefault(family, Counter())
            for qa in qas:
                outcome = work.outcome(qa)
                tally["qa"] += 1
                tally["verifier"] += outcome.accepted and outcome.via is Via.VERIFIER
                tally["accepted"] += outcome.accepted
                tally["truth"] += right.get(qa["id"], False)
    graded = truth is not None
    out: dict[str, Any] = {}
    for name, families in counts.items():
        total = sum(families.values(), Counter())
        out[name] = {**_rates(total, graded), "families": {f: _rates(c, graded) for f, c in sorted(families.items())}}
    if graded:
        out["truth"] = {key: truth[key] for key in ("accepted", "accepted_wrong", "verifier_missed", "recovered")}
    return out
