"""Accept rates of one round, by slice (held out / trained on) and family, routed exactly as the round's emit
routed them: `verifier` counts the pairs the verifier accepted, `accepted` adds the judge's trusted promotions."""

from __future__ import annotations

from collections import Counter
from typing import Any

from rsgen.config import RecipeConfig
from rsgen.emit.splits import Via
from rsgen.emit.stage import load_work
from rsgen.schema import open_prepared

SLICES = ("held_out", "train")


def _rates(counts: Counter) -> dict[str, Any]:
    qa = counts["qa"]
    return {"qa": qa, "verifier_accepted": counts["verifier"], "accepted": counts["accepted"],
            "verifier_rate": counts["verifier"] / qa if qa else None,
            "accept_rate": counts["accepted"] / qa if qa else None}


def measure_round(round_recipe: RecipeConfig, held_out: set[str]) -> dict[str, Any]:
    """{slice: {qa, verifier_accepted, accepted, verifier_rate, accept_rate, families: {family: the same}}}."""
    work = load_work(round_recipe)
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
    out = {}
    for name, families in counts.items():
        total = sum(families.values(), Counter())
        out[name] = {**_rates(total), "families": {f: _rates(c) for f, c in sorted(families.items())}}
    return out
