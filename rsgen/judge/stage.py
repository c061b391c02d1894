"""The judge stage: a text-only second pass over verifier rejections, plus a calibration sample of acceptances.

Same machinery as generation: the generation engine (batching by token budget), per-rank checkpoint parts,
data parallelism by striping the full ordered key list, and resume by skipping keys already on disk. The judge
sees the prepared question, the official reference and the candidate (the model's extracted final answer) —
never the image, never the model's reasoning — and only grades text already produced.
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rsgen.config import RecipeConfig, RecipeError
from rsgen.judge.prompt import format_reference, load_template, render_judge_prompt
from rsgen.judge.routing import CALIBRATION, REJECTED, judge_key, needs_judging
from rsgen.judge.verdict import CORRECT, UNSURE, WRONG, parse_verdict
from rsgen.layout import OutputLayout
from rsgen.store import CheckpointStore, shard_for_rank


@dataclass(frozen=True)
class JudgeItem:
    key: str  # judge record key
    id: str  # QA id
    sample: int | None
    kind: str  # rejected | calibration
    family: str
    question: str
    reference: str
    candidate: str


def _log(state, message: str) -> None:
    if state is None or state.is_main_process:
        print(f"[rsgen judge] {message}", flush=True)


def calibration_sample(keys: Iterable[str], size: int, seed: int) -> list[str]:
    """A fixed-seed sample of `size` keys: the keys with the smallest sha256(seed:key). It depends only on the
    set of keys and the seed (not on their order, the process count or Python's random module)."""
    ranked = sorted(keys, key=lambda k: hashlib.sha256(f"{seed}:{k}".encode()).hexdigest())
    return sorted(ranked[: max(0, size)])


def prepared_index(output_dir: str | Path) -> dict[str, dict[str, Any]]:
    """QA id -> {question, answers, family} from the prepared pool (images are not read)."""
    from rsgen.prepare import load_prepared

    dataset = load_prepared(output_dir).select_columns(["family", "qa"])
    index: dict[str, dict[str, Any]] = {}
    for batch in dataset.iter(batch_size=1000):
        for family, qas in zip(batch["family"], batch["qa"]):
            for qa in qas:
                index[qa["id"]] = {"question": qa["question"], "answers": list(qa["answers"]), "family": family}
    return index


def select_items(
    generate_records: dict[str, dict[str, Any]], prepared: dict[str, dict[str, Any]], recipe: RecipeConfig
) -> list[JudgeItem]:
    """Every item of the stage in one global order: rejected pairs (sorted by key), then the calibration sample
    (sorted by key). Every rank computes the same list."""
    rejected = sorted(k for k, rec in generate_records.items() if needs_judging(rec))
    accepted = [k for k, rec in generate_records.items() if rec["match"]]
    calibration = calibration_sample(accepted, recipe.judge_calibration_size, recipe.judge_calibration_seed)
    items = []
    for kind, keys in ((REJECTED, rejected), (CALIBRATION, calibration)):
        for gen_key in keys:
            rec = generate_records[gen_key]
            qa = prepared.get(rec["id"])
            if qa is None:
                raise RecipeError(
                    f"generate record {gen_key!r} names QA id {rec['id']!r}, which is not in the prepared pool of "
                    f"{recipe.output_dir!r}: the work files do not belong to this prepared pool"
                )
            if not qa["answers"]:
                raise RecipeError(f"prepared QA {rec['id']!r} has no official answer")
            items.append(
                JudgeItem(
                    key=judge_key(gen_key, kind),
                    id=rec["id"],
                    sample=rec.get("sample"),
                    kind=kind,
                    family=rec.get("family") or qa["family"],
                    question=qa["question"],
                    reference=format_reference(qa["answers"]),
                    # A calibration pair's candidate is what the verifier accepted; a rejected pair's is the
                    # answer it refused. Either way only the final answer, never the reasoning.
                    candidate=rec["extracted"] if rec["extracted"] is not None else "",
                )
            )
    return items


def _check_generate_finished(
    generate_records: dict[str, dict[str, Any]], prepared: dict[str, dict[str, Any]], recipe: RecipeConfig
) -> None:
    """The calibration sample and the rejected set are defined over the finished generate stage; judging a
    partial one would later mix two samples. Refuse instead."""
    done_ids = Counter(rec["id"] for rec in generate_records.values())
    missing = [qid for qid in prepared if done_ids.get(qid, 0) < recipe.num_samples]
    if missing:
        raise RecipeError(
            f"generate is not finished in {recipe.output_dir!r}: {len(missing)} of {len(prepared)} QA pairs lack "
            f"a generate record (e.g. {', '.join(missing[:3])}); run `rsgen generate` (or `rsgen run`) first"
        )


def build_judge_engine(recipe: RecipeConfig, device=None):
    """The judge model loaded with the generation loader, wrapped in the generation engine, greedy."""
    from rsgen.generate.engine import GenerationEngine
    from rsgen.generate.models import load_model_and_processor

    same_model = recipe.judge_model_name_or_path in (None, recipe.model_name_or_path)
    model, processor = load_model_and_processor(
        recipe.resolved_judge_model,
        revision=recipe.model_revision if same_model else None,
        torch_dtype=recipe.torch_dtype,
        attn_implementation=recipe.attn_implementation,
        trust_remote_code=recipe.trust_remote_code,
        device=device,
    )
    return GenerationEngine(
        model,
        processor,
        max_new_tokens=recipe.judge_max_new_tokens,
        temperature=0.0,
        top_p=1.0,
        token_budget=recipe.token_budget,
        max_batch_size=recipe.max_batch_size,
        chat_template_kwargs=recipe.generation_chat_template_kwargs(),
        seed=recipe.seed,
    )


def judge_model_name(recipe: RecipeConfig) -> str:
    return recipe.judge_model_name_or_path or recipe.model_name_or_path


def _requests(items: list[JudgeItem], template: str) -> Iterator:
    from rsgen.generate.engine import ChatRequest

    for item in items:
        prompt = render_judge_prompt(item.question, item.reference, item.candidate, template=template)
        # Text only: no image part, no images.
        yield ChatRequest(item.key, messages=[{"role": "user", "content": [{"type": "text", "text": prompt}]}], images=[])


def run_judge(recipe: RecipeConfig, state=None, engine=None) -> dict[str, Any] | None:
    """Judge this rank's share of the items not yet on disk; every rank of an `accelerate launch` calls this.
    `engine` replaces the model-backed engine (tests). Returns `judge_summary` on the main process, else None."""
    if state is None:
        from rsgen.pipeline import distributed_state

        state = distributed_state()
    layout = OutputLayout(recipe.output_dir)
    if not recipe.judge:
        _log(state, "judge: false in the recipe — skipping the judge stage (no model loaded); "
                    "verifier rejections keep the verifier's reason")
        return None
    template = load_template(recipe.judge_prompt_file)  # fail on a bad template before any model work
    if not layout.generate_work.is_dir():
        raise RecipeError(f"no generate work in {str(layout.generate_work)!r}: run `rsgen generate` first")
    generate_records = CheckpointStore(layout.generate_work).records()
    prepared = prepared_index(recipe.output_dir)
    _check_generate_finished(generate_records, prepared, recipe)
    items = select_items(generate_records, prepared, recipe)

    store = CheckpointStore(layout.judge_work)
    done = store.done_keys()
    by_key = {item.key: item for item in items}
    mine = [by_key[k] for k in shard_for_rank([item.key for item in items], state.process_index, state.num_processes)]
    pending = [item for item in mine if item.key not in done]
    n_rejected = sum(item.kind == REJECTED for item in items)
    _log(state, f"{n_rejected} rejected pairs to judge + {len(items) - n_rejected} calibration pairs; "
                f"{len(done & by_key.keys())} already done; {state.num_processes} process(es)")

    start = time.perf_counter()
    if pending:
        _judge_pending(recipe, state, pending, template, store, engine)
    seconds = time.perf_counter() - start

    state.wait_for_everyone()
    if not state.is_main_process:
        return None
    missing = [k for k in by_key if k not in store.done_keys()]
    if missing:
        raise RuntimeError(f"judge stage ended with {len(missing)} items unjudged (e.g. {missing[:3]})")
    summary = judge_summary(recipe.output_dir)
    _log(state, format_summary(summary))
    if pending:
        _log(state, f"this run (rank {state.process_index}): {len(pending)} pairs in {seconds:.1f} s "
                    f"({len(pending) / max(seconds, 1e-9):.2f} pairs/s)")
    return summary


def _judge_pending(recipe, state, pending: list[JudgeItem], template: str, store, engine) -> None:
    from tqdm.auto import tqdm

    if engine is None:
        engine = build_judge_engine(recipe, device=state.device)
    model = judge_model_name(recipe)
    by_key = {item.key: item for item in pending}
    verdicts: Counter = Counter()
    bar = tqdm(
        total=len(pending),
        desc=f"judge (rank {state.process_index} of {state.num_processes})" if state.num_processes > 1 else "judge",
        unit="pair",
        disable=not state.is_main_process,
        dynamic_ncols=True,
        mininterval=1.0,
    )
    writer = store.writer(state.process_index, recipe.checkpoint_every_items, recipe.checkpoint_every_seconds)
    with writer, bar:
        for request, result in engine.generate(_requests(pending, template)):
            item = by_key[request.key]
            verdict = parse_verdict(result.text, result.hit_limit)
            writer.add(
                {
                    "key": item.key,
                    "id": item.id,
                    "sample": item.sample,
                    "kind": item.kind,
                    "family": item.family,
                    "reference": item.reference,
                    "candidate": item.candidate,
                    "verdict": verdict,
                    "response": result.text,
                    "prompt_tokens": result.prompt_tokens,
                    "generated_tokens": result.generated_tokens,
                    "hit_limit": result.hit_limit,
                    "model": model,
                }
            )
            verdicts[verdict] += 1
            bar.update(1)
            bar.set_postfix({v: verdicts[v] for v in (CORRECT, WRONG, UNSURE)}, refresh=False)


# ------------------------------------------------------------------ summary


def _empty_counts() -> dict[str, int]:
    return {"judged": 0, "promotions": 0, "wrong": 0, "unsure": 0,
            "calibration_agreed": 0, "calibration_wrong": 0, "calibration_unsure": 0, "calibration_total": 0}


def _count(counts: dict[str, int], rec: dict[str, Any]) -> None:
    verdict = rec["verdict"]
    if rec["kind"] == CALIBRATION:
        counts["calibration_total"] += 1
        counts["calibration_agreed"] += verdict == CORRECT
        counts["calibration_wrong"] += verdict == WRONG
        counts["calibration_unsure"] += verdict == UNSURE
    else:
        counts["judged"] += 1
        counts["promotions"] += verdict == CORRECT
        counts["wrong"] += verdict == WRONG
        counts["unsure"] += verdict == UNSURE


def judge_summary(output_dir: str | Path) -> dict[str, Any]:
    """Counts from the judge work records, overall and per family:
    judged (rejected pairs judged), promotions (CORRECT), wrong, unsure, calibration_agreed (calibration pairs
    called CORRECT), calibration_wrong, calibration_unsure, calibration_total; plus "families": {family: same}.
    All zero when the judge never ran (e.g. `judge: false`)."""
    summary: dict[str, Any] = _empty_counts()
    families: dict[str, dict[str, int]] = {}
    for rec in CheckpointStore(OutputLayout(output_dir).judge_work).iter_records():
        _count(summary, rec)
        _count(families.setdefault(rec.get("family") or "unknown", _empty_counts()), rec)
    summary["families"] = dict(sorted(families.items()))
    return summary


def format_summary(summary: dict[str, Any]) -> str:
    return (
        f"judged {summary['judged']} rejected pairs: CORRECT {summary['promotions']} (promoted), "
        f"WRONG {summary['wrong']}, UNSURE {summary['unsure']}; calibration on verifier-accepted pairs: "
        f"agreed on {summary['calibration_agreed']}/{summary['calibration_total']}"
    )
