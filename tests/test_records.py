"""The typed work records (rsgen.records): what a stage writes is what a reader gets back; a record written by an
older or newer rsgen is read with its stated defaults or stops emit with one line naming the part and the field."""

from __future__ import annotations

import pytest

from rsgen.records import (
    CALIBRATION,
    ExploreRecord,
    GenerateRecord,
    JudgeRecord,
    RecordError,
    judge_key,
    qa_id_of,
    read_records,
    sample_key,
    sample_of,
)
from rsgen.store import CheckpointStore


def generate_record(**fields) -> GenerateRecord:
    values = dict(key="q1", id="q1", sample=0, family="F", question="How many?\nAnswer.", response="<think>x</think>3",
                  extracted="3", match=True, reason=None, verifier="relaxed", prompt_tokens=5, generated_tokens=4,
                  hit_limit=False, model="m", revision=None)
    return GenerateRecord(**{**values, **fields})


def write_part(directory, records: list[dict]) -> None:
    with CheckpointStore(directory).writer(0) as writer:
        for record in records:
            writer.add(record)


def test_records_round_trip_through_a_checkpoint_part(tmp_path):
    gen = generate_record()
    explore = ExploreRecord(**{**generate_record(key="q1#1", sample=1).to_json(), "round": 2})
    judge = JudgeRecord(key=judge_key("q1", CALIBRATION), id="q1", kind=CALIBRATION, reference="3", candidate="3",
                        verdict="CORRECT", response="CORRECT", prompt_tokens=9, generated_tokens=1, hit_limit=False,
                        model="m", family="F", sample=0)
    for record in (gen, explore, judge):
        write_part(tmp_path / type(record).__name__, [record.to_json()])
        assert list(read_records(CheckpointStore(tmp_path / type(record).__name__), type(record))) == [record]
    assert "miss" not in judge.to_json() and judge.response_key == "q1"


def test_sample_keys():
    assert sample_key("q1", 0, 1) == "q1"  # one response in all: the QA id itself
    assert sample_key("q1", 2, 4) == "q1#2"
    assert (qa_id_of("q1#2"), sample_of("q1#2"), sample_of("q1")) == ("q1", 2, 0)


def test_a_field_with_a_stated_default_may_be_missing(tmp_path):
    """Records written before the model was recorded read as 'not recorded'."""
    old = generate_record().to_json()
    del old["model"], old["revision"]
    write_part(tmp_path, [old])
    (record,) = read_records(CheckpointStore(tmp_path), GenerateRecord)
    assert record.model is None and record.revision is None and record.match


@pytest.mark.parametrize("change, named", [
    (lambda rec: rec.pop("verifier"), "has no field 'verifier' (written by an older rsgen?)"),
    (lambda rec: rec.update(confidence=0.9), "has a field 'confidence' that this rsgen does not know"),
])
def test_a_missing_or_unknown_field_is_one_line_naming_the_part_and_the_field(tmp_path, change, named):
    record = generate_record().to_json()
    change(record)
    write_part(tmp_path, [record])
    with pytest.raises(RecordError) as err:
        list(read_records(CheckpointStore(tmp_path), GenerateRecord))
    (part,) = CheckpointStore(tmp_path).parts()
    assert str(err.value).startswith(f"{part} line 1: GenerateRecord 'q1' {named}")
    assert "\n" not in str(err.value)



def test_a_server_refusal_is_kept_in_the_record_and_stays_a_refusal_when_verified_again(tmp_path):
    """engine: openai records a 400 as `refused` (the server's message); re-verification must not turn the empty
    response into `no_answer`."""
    from rsgen.config import RecipeConfig
    from rsgen.engine import REQUEST_REFUSED
    from rsgen.schema import PreparedQuestion
    from rsgen.verify.stage import StoredResponses, VerifyRequest

    refused = generate_record(response="", extracted=None, match=False, reason=REQUEST_REFUSED,
                              refused="prompt longer than the context")
    assert "refused" not in generate_record().to_json()  # written only when set: older readers see no new field
    write_part(tmp_path / "gen", [refused.to_json()])
    assert list(read_records(CheckpointStore(tmp_path / "gen"), GenerateRecord)) == [refused]
    question = PreparedQuestion(id="q1", row=0, family="F", question=refused.question, answers=("3",), options=())
    engine = StoredResponses(RecipeConfig(), {"q1": question})
    [(_, (_, decision))] = list(engine.generate([VerifyRequest("q1", refused)]))
    assert (decision.match, decision.reason) == (False, REQUEST_REFUSED)
    [(_, (_, plain))] = list(engine.generate([VerifyRequest("q1", generate_record(response=""))]))
    assert plain.reason != REQUEST_REFUSED  # the same empty response without a refusal is the verifier's to decide
