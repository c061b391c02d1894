"""The verify stage over stored responses (issue #28.4): real demo pool, real verifiers, generate responses written
as a model would have left them (this module is about verification, not generation; the end-to-end run through
the command line with the shipped demo model is `test_verify_cli.py`)."""

from __future__ import annotations

import logging
import shutil
from dataclasses import dataclass

import pytest

from rsgen.config import RecipeError, recipe_from_dict
from rsgen.decisions import decided_records
from rsgen.layout import OutputLayout
from rsgen.prepare import run_prepare
from rsgen.records import GenerateRecord, VerifyRecord, records_by_key, sample_key
from rsgen.schema import iter_questions, open_prepared
from rsgen.store import CheckpointStore
from rsgen.verifiers.mc import reference_letter
from rsgen.verify import stage as verify_stage
from rsgen.verify.stage import run_verify


@dataclass
class OneProcess:
    """accelerate's PartialState for one process (what the stage reads of it)."""

    process_index: int = 0
    num_processes: int = 1
    is_main_process: bool = True

    def wait_for_everyone(self) -> None:
        pass


def recipe(out, **keys):
    return recipe_from_dict({
        "output_dir": str(out), "prepare_num_proc": 1, "verifier": "numeric",
        "sources": [{"dataset_name": "rsgen-demo", "demo_num_images": 6, "demo_seed": 3, "family_column": "family",
                     "options_column": "options", "source_id_column": "source_id"}],
        **keys})


def off_by_one(answer: str) -> str | None:
    return str(int(answer) + 1) if answer.isdigit() else None


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    """A prepared demo pool and its generate work: every other numeric question answered one too high."""
    out = tmp_path_factory.mktemp("verify")
    run_prepare(recipe(out))
    with CheckpointStore(OutputLayout(out).generate_work).writer(0, 7, 1e9) as writer:
        for n, q in enumerate(iter_questions(open_prepared(out))):
            answer = q.answers[0]
            if q.options:
                said = reference_letter(answer, list(q.options)) or answer
            else:
                said = off_by_one(answer) if n % 2 and off_by_one(answer) else answer
            writer.add(GenerateRecord(
                key=sample_key(q.id, 0, 1), id=q.id, sample=0, family=q.family, question=q.question,
                response=f"<think>counting</think>{said}", extracted=said, match=said == answer,
                reason=None if said == answer else "wrong_answer", verifier="numeric", prompt_tokens=9,
                generated_tokens=4, hit_limit=False, model="scripted").to_json())
    return out


def generate_bytes(out) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in OutputLayout(out).generate_work.iterdir()}


def test_a_tolerance_change_decides_again_without_touching_generate(generated, tmp_path, caplog):
    out = tmp_path / "run"

    shutil.copytree(generated, out)
    before = generate_bytes(out)
    run_verify(recipe(out), OneProcess())
    strict = decided_records(recipe(out))
    off = [k for k, rec in strict.items() if not rec.match]
    assert off and all(rec.reason == "wrong_answer" for k, rec in strict.items() if k in off)

    with caplog.at_level(logging.INFO, logger="rsgen"):
        run_verify(recipe(out, numeric_tolerance=1.0), OneProcess())
    loose = decided_records(recipe(out, numeric_tolerance=1.0))
    assert all(loose[k].match for k in off)  # one too high is within |ref| for every reference >= 1
    assert f"{len(off):,} decisions differ from the previous decisions (numeric_tolerance 1e-06)" in caplog.text
    assert "no model loaded" in caplog.text
    assert generate_bytes(out) == before  # the responses are as generate wrote them, byte for byte
    assert not OutputLayout(out).verify_previous.exists()

    # The decisions of the old settings are no longer served.
    with pytest.raises(RecipeError, match=r"verifier decisions made with verifier 'numeric', numeric_tolerance 1\.0"):
        decided_records(recipe(out))


def test_a_rerun_with_the_same_settings_does_nothing(generated, monkeypatch, tmp_path):

    out = tmp_path / "run"
    shutil.copytree(generated, out)
    run_verify(recipe(out), OneProcess())
    parts = sorted(p.name for p in CheckpointStore(OutputLayout(out).verify_work).parts())
    monkeypatch.setattr(verify_stage, "verify_response", lambda *a, **k: pytest.fail("decided again"))
    run_verify(recipe(out), OneProcess())
    assert sorted(p.name for p in CheckpointStore(OutputLayout(out).verify_work).parts()) == parts


def test_an_interrupted_verify_resumes_where_it_stopped(generated, monkeypatch, tmp_path):

    out = tmp_path / "run"
    shutil.copytree(generated, out)
    total = len(records_by_key(CheckpointStore(OutputLayout(out).generate_work), GenerateRecord))
    real = verify_stage.verify_response
    calls = []

    def stops_after_five(*args, **kwargs):
        if len(calls) == 5:
            raise KeyboardInterrupt
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(verify_stage, "verify_response", stops_after_five)
    with pytest.raises(KeyboardInterrupt):
        run_verify(recipe(out), OneProcess())
    assert len(CheckpointStore(OutputLayout(out).verify_work).done_keys()) == 5  # finished decisions were kept
    with pytest.raises(RecipeError, match="no finished verifier decisions"):
        decided_records(recipe(out))

    monkeypatch.setattr(verify_stage, "verify_response", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    run_verify(recipe(out), OneProcess())
    assert len(calls) == total  # 5 before the stop, the rest after: none twice
    assert len(records_by_key(CheckpointStore(OutputLayout(out).verify_work), VerifyRecord)) == total


def test_unfinished_generate_is_refused(generated, tmp_path):

    out = tmp_path / "run"
    shutil.copytree(generated, out)
    store = CheckpointStore(OutputLayout(out).generate_work)
    store.parts()[0].unlink()
    with pytest.raises(RecipeError, match="generate is not finished"):
        run_verify(recipe(out), OneProcess())


def test_mc_on_free_form_rows_is_refused_before_deciding(generated, tmp_path):

    out = tmp_path / "run"
    shutil.copytree(generated, out)
    with pytest.raises(RecipeError, match="mc"):
        run_verify(recipe(out, verifier="mc"), OneProcess())
    assert not OutputLayout(out).verify_work.exists()
