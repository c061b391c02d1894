"""Emit's on-disk index of the work (rsgen.emit.work_index, issue #35 point 6) gives routing what the in-memory
`WorkRecords.load` gives it: the same records per QA id (generate with verify's decisions, judge verdicts, explore
samples, blind records), the first record of a key written twice, the same errors; and it leaves no file behind."""

from __future__ import annotations

import json

import pytest
from emit_helpers import scripted_recipe, write_scripted_run

from rsgen.config import RecipeError
from rsgen.emit.splits import with_blind, with_explore
from rsgen.emit.stage import load_work, run_emit
from rsgen.emit.work_index import IndexedWork
from rsgen.layout import OutputLayout
from rsgen.records import RecordError
from rsgen.schema import iter_questions, open_prepared
from rsgen.store import CheckpointStore


def _with_blind_and_explore(root) -> None:
    """Blind records for every pair (half of them solvable), two explore samples for every
    pair (the second right), and a generate record of a key written twice (the second copy must be ignored)."""
    layout = OutputLayout(root)
    generate = [json.loads(line) for part in CheckpointStore(layout.generate_work).parts()
                for line in part.read_text().splitlines()]
    with CheckpointStore(layout.blind_work).writer(0, 3, 1e9) as blind:
        for n, rec in enumerate(generate):
            blind.add({"key": rec["id"], "id": rec["id"], "family": rec["family"], "question": rec["question"],
                       "response": "blind", "extracted": rec["extracted"], "solvable": n % 2 == 0,
                       "verifier": rec["verifier"], "options": 0, "generated_tokens": 4, "model": "test-model",
                       "settings": "s"})
    with CheckpointStore(layout.explore_work).writer(0, 5, 1e9) as explore:
        for rec in generate:
            for sample in (1, 2):
                right = sample == 2  # the first unanswered (never judged), the second right
                explore.add({**rec, "key": f"{rec['id']}#{sample}", "sample": sample, "match": right,
                             "extracted": rec["extracted"] if right else None,
                             "reason": None if right else "no_answer", "round": 0})
    with CheckpointStore(layout.generate_work).writer(0, 1, 1e9) as again:
        again.add({**generate[0], "response": "a later copy of the same key: never read"})


@pytest.mark.parametrize("batch", [1, 4, 1000])
def test_the_index_routes_every_pair_as_the_records_in_memory_do(tmp_path, batch):
    write_scripted_run(tmp_path)
    _with_blind_and_explore(tmp_path)
    recipe = scripted_recipe(tmp_path, blind_check="flag", explore_samples=2)
    held = load_work(recipe)
    ids = [q.id for q in iter_questions(open_prepared(tmp_path))]
    qas = {q.id: {"id": q.id, "question": q.question, "answers": list(q.answers), "options": list(q.options)}
           for q in iter_questions(open_prepared(tmp_path))}
    with IndexedWork.build(recipe) as indexed:
        assert OutputLayout(tmp_path).emit_index.is_file()
        for start in range(0, len(ids), batch):
            chunk = ids[start:start + batch]
            view = indexed.batch(chunk)
            assert set(view.samples) == set(chunk)
            for qa_id in chunk:
                assert view.samples[qa_id] == held.samples[qa_id]
                assert view.explore[qa_id] == held.explore[qa_id]
                assert view.blind.get(qa_id) == held.blind.get(qa_id)
                qa = qas[qa_id]
                routed = with_blind(with_explore(view.outcome(qa), qa, view), view)
                assert routed == with_blind(with_explore(held.outcome(qa), qa, held), held)
            assert view.judge == {key: rec for key, rec in held.judge.items() if rec.id in chunk}
        assert held.samples[ids[0]][0].response != "a later copy of the same key: never read"
        assert (indexed.calibration, indexed.known_wrong, indexed.known_right) == (
            held.calibration, held.known_wrong, held.known_right)
        assert indexed.judge_needed() == held.judge_needed()
        assert indexed.has_judge_records() and held.has_judge_records()
        indexed.note_prepared(ids[:-2])
        held.note_prepared(ids[:-2])
        assert indexed.outside_pool() == held.outside_pool() == 2
    assert not OutputLayout(tmp_path).emit_index.exists()


def test_emit_leaves_no_index_behind_and_replaces_a_killed_emits(tmp_path):
    write_scripted_run(tmp_path)
    OutputLayout(tmp_path).emit_index.write_text("what a killed emit left")
    run_emit(scripted_recipe(tmp_path))
    assert not OutputLayout(tmp_path).emit_index.exists()
    assert (tmp_path / "dataset" / "README.md").is_file()


def test_a_later_copy_of_a_key_is_not_checked_and_a_first_one_is(tmp_path):
    """As CheckpointStore.iter_records: a key's later copy is never read (here it could not be), its first is."""
    write_scripted_run(tmp_path, judge=False)
    store = CheckpointStore(OutputLayout(tmp_path).generate_work)
    first = json.loads(store.parts()[0].read_text().splitlines()[0])
    with store.writer(0, 1, 1e9) as writer:
        writer.add({**first, "field_from_the_future": 1})
    recipe = scripted_recipe(tmp_path, judge=False)
    with IndexedWork.build(recipe) as indexed:
        assert indexed.batch([first["id"]]).samples[first["id"]][0].response == first["response"]
    new = {**first, "key": "new-0", "id": "new-0", "field_from_the_future": 1}
    with store.writer(0, 1, 1e9) as writer:
        writer.add(new)
    with pytest.raises(RecordError, match=r"generate/.*line 1: GenerateRecord 'new-0' has a field "
                                          r"'field_from_the_future'"):
        IndexedWork.build(recipe)
    assert not OutputLayout(tmp_path).emit_index.exists()


def test_a_response_without_a_decision_is_refused_by_name(tmp_path):
    write_scripted_run(tmp_path, judge=False)
    recipe = scripted_recipe(tmp_path, judge=False)  # decisions written for the responses there now
    store = CheckpointStore(OutputLayout(tmp_path).generate_work)
    first = json.loads(store.parts()[0].read_text().splitlines()[0])
    with store.writer(0, 1, 1e9) as writer:
        writer.add({**first, "key": "late-0", "id": "late-0"})
    with pytest.raises(RecipeError, match=r"generate response 'late-0' has no decision in .*rsgen verify"):
        run_emit(recipe)
