"""The work records: what generate, verify, explore and judge write to their checkpoint parts (one JSON object per line,
`rsgen.store.CheckpointStore`) and what every later reader gets back, as typed records.

Writers build a record and store `record.to_json()`; readers get records from `read_records(store, Type)`, never
the raw dicts, so a field is named in one place and read as an attribute everywhere else. A part written by an
older rsgen is read as follows:

- a field this module gives a default (`GenerateRecord.model`, `.revision`; `JudgeRecord.family`, `.sample`,
  `.miss`) may be missing: the default stands for "not recorded" (older judge records carry no family: their
  generate record's family is used; no sample: the greedy answer);
- any other missing field, and any field this module does not know, is a `RecordError`: one line naming the
  part file, the record's key and the field, and what to do.

Keys: the work key of a response is `sample_key(qa_id, sample, responses)` (the bare QA id when a question has
one response in all, `{id}#{sample}` otherwise); judge keys prefix the judged response's key with its kind
(`calibration:`; `known_wrong:{id}` and `known_right:{id}` for the built calibration pairs); see `judge_key`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol, TypeVar

from rsgen.config import RecipeError


class Name(str, Enum):
    """A word rsgen writes to files (work records, stats.json) and reads back, typed in code: a member is its
    word (`==`, hash, `str`, JSON and f-strings give the word) and code compares members (`via is Via.JUDGE`)."""

    def __str__(self) -> str:
        return self.value

    __hash__ = str.__hash__  # Enum hashes the member's name: a dict keyed by members must find the word


def model_output(result) -> dict[str, Any]:
    """The fields of a record that come from the model's answer (an engine's GenerationResult), the same in every
    model stage's record: the text, its token counts, whether it hit the limit, a server's refusal or failure."""
    return {"response": result.text, "prompt_tokens": result.prompt_tokens, "generated_tokens": result.generated_tokens,
            "hit_limit": result.hit_limit, "refused": result.refused or None, "failed": result.failed or None}


def verifier_fields(decision, verifier: str) -> dict[str, Any]:
    """The fields of a generate or explore record that come from the verifier's decision on it."""
    return {"extracted": decision.extracted, "match": bool(decision.match),
            "reason": None if decision.match else decision.reason, "verifier": verifier}


# The judge's verdicts: only CORRECT promotes, UNSURE never counts (rsgen.routing).
CORRECT = "CORRECT"
WRONG = "WRONG"
UNSURE = "UNSURE"
VERDICTS = (CORRECT, WRONG, UNSURE)

# What a judge record grades (`JudgeRecord.kind`).
REJECTED = "rejected"  # a verifier rejection: its verdict routes the pair
CALIBRATION = "calibration"  # a verifier-accepted pair: the judge should say CORRECT
KNOWN_WRONG = "known_wrong"  # a pair built to be wrong: the judge should say WRONG
KNOWN_RIGHT = "known_right"  # a right answer rewritten so the verifier rejects it: the judge should say CORRECT
JUDGE_KINDS = (REJECTED, CALIBRATION, KNOWN_WRONG, KNOWN_RIGHT)
CALIBRATION_PREFIX = CALIBRATION + ":"
KNOWN_WRONG_PREFIX = KNOWN_WRONG + ":"
KNOWN_RIGHT_PREFIX = KNOWN_RIGHT + ":"

_SAMPLE_SEPARATOR = "#"

# Why a response was never verified: what the engine gave back cannot be an answer. Each is a counted drop of its
# own, never accepted, never judged, never in a training or DPO view (docs/reasons.md is made from this table).
REQUEST_REFUSED = "request_refused"
REQUEST_FAILED = "request_failed"
NO_CONTENT = "no_content"
HIT_TOKEN_LIMIT = "hit_token_limit"
RESPONSE_REASONS: dict[str, str] = {
    REQUEST_REFUSED: "the server refused the request (400/413: a prompt longer than its context, an image it cannot "
                     "read); the record keeps the server's message under `refused`",
    REQUEST_FAILED: "the request failed every retry (5xx, a malformed answer, a timeout) while the server answered "
                    "others; the record keeps the server's last message under `failed`, and a rerun asks it again",
    NO_CONTENT: "the server answered with `content: null` and no reasoning: no text at all (a filter, a server bug)",
    HIT_TOKEN_LIMIT: "the response ended at max_new_tokens (finish_reason `length`, or no EOS): cut off, never "
                     "accepted whatever it says so far; raise max_new_tokens if many are",
}


class RecordError(RecipeError):
    """A work record that cannot be read as its type (a RecipeError: the command line prints it as one line)."""


def sample_key(qa_id: str, sample: int, responses: int) -> str:
    """The work key of response `sample` of a question that has `responses` in all: the QA id itself when it has
    one (greedy generation, `num_samples: 1`), else `{id}#{sample}` (samples of `num_samples`; explore samples,
    where the greedy answer is sample 0 and `responses` counts it)."""
    return qa_id if responses == 1 else f"{qa_id}{_SAMPLE_SEPARATOR}{sample}"


def qa_id_of(key: str) -> str:
    """The QA id of a response's work key (inverse of `sample_key`)."""
    return key.partition(_SAMPLE_SEPARATOR)[0]


def sample_of(key: str) -> int:
    """The sample index of a response's work key: 0 for a bare QA id."""
    _, separator, sample = key.rpartition(_SAMPLE_SEPARATOR)
    return int(sample) if separator else 0


def judge_key(response_key: str, kind: str = REJECTED) -> str:
    """Key of the judge record grading a response: the response's key itself for a rejection, prefixed with
    `calibration:` for a calibration pair."""
    return CALIBRATION_PREFIX + response_key if kind == CALIBRATION else response_key


def known_wrong_key(qa_id: str) -> str:
    return KNOWN_WRONG_PREFIX + qa_id


def known_right_key(qa_id: str) -> str:
    return KNOWN_RIGHT_PREFIX + qa_id


class _Record:
    """to_json / from_json shared by the record types (dataclasses).

    Slotted: emit and the judge hold a record per response, and a million of them with a __dict__ each took twice
    the memory."""

    __slots__ = ()
    # Optional fields written only when set (a plain class attribute, not a field): files stay as older rsgens wrote
    # them unless the case arises.
    omit_when_none: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        # Field by field, not dataclasses.asdict: the fields are plain JSON values, and asdict's deep copy was a
        # fifth of the verify stage's time.
        out = {name: getattr(self, name) for name in _field_order(type(self))}
        for name in self.omit_when_none:
            if out[name] is None:
                del out[name]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any], where: str = "a work record"):
        """The record of one stored line; `where` names the part file in the error."""
        names, required = _field_names(cls)
        unknown = [name for name in data if name not in names]
        missing = [name for name in required if name not in data]
        if unknown or missing:
            problem = (f"has a field {unknown[0]!r} that this rsgen does not know (written by a newer rsgen?)"
                       if unknown else f"has no field {missing[0]!r} (written by an older rsgen?)")
            raise RecordError(f"{where}: {cls.__name__} {data.get('key')!r} {problem}; finish the run with the rsgen "
                              "that started it, or delete this stage's work folder to redo the stage")
        return cls(**data)


def _field_order(cls) -> tuple[str, ...]:
    cached = cls.__dict__.get("_order")
    if cached is None:
        cached = cls._order = tuple(f.name for f in dataclasses.fields(cls))
    return cached


def _field_names(cls) -> tuple[frozenset[str], tuple[str, ...]]:
    cached = cls.__dict__.get("_names")
    if cached is None:
        fields = dataclasses.fields(cls)
        cached = (frozenset(f.name for f in fields),
                  tuple(f.name for f in fields
                        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING))
        cls._names = cached
    return cached


@dataclass(frozen=True, slots=True)
class GenerateRecord(_Record):
    """One answer of the model to one QA pair (OUTPUT_DIR/work/generate/), verified as it landed."""

    omit_when_none = ("refused", "failed")

    key: str  # sample_key(id, sample, num_samples)
    id: str  # the prepared QA id
    sample: int
    family: str
    question: str  # the exact user text sent (checked against the emitted question)
    response: str  # the raw model output, reasoning included
    extracted: str | None  # the final answer after extraction; None when there was none
    match: bool  # the verifier's decision
    reason: str | None  # None when matched, else the verifier's reason (wrong_answer, no_answer, ...)
    verifier: str
    prompt_tokens: int
    generated_tokens: int
    hit_limit: bool  # generation stopped at max_new_tokens
    model: str | None = None  # the model as the recipe names it (None: not recorded)
    revision: str | None = None  # its commit (None: a local directory, or not recorded)
    # A server engine's refusal of the request (400/413: e.g. a prompt longer than its context): the server's message;
    # the reason is then request_refused. Written only when set.
    refused: str | None = None
    # A request that failed every retry (the server's last message); the reason is then request_failed, and the
    # next run asks it again (`rsgen.store.CheckpointStore.forget_failed`). Written only when set.
    failed: str | None = None



    @property
    def drop_reason(self) -> str | None:
        """Why this response is never verified (one of RESPONSE_REASONS), or None when the verifier decides it."""
        if self.refused:
            return REQUEST_REFUSED
        if self.failed:
            return REQUEST_FAILED
        if self.reason == NO_CONTENT:
            return NO_CONTENT
        if self.hit_limit:
            return HIT_TOKEN_LIMIT
        return None

    def decided(self, decision: VerifyRecord) -> GenerateRecord:
        """This response with the verify stage's decision in place of the one made as it was generated."""
        return dataclasses.replace(self, extracted=decision.extracted, match=decision.match, reason=decision.reason,
                                   verifier=decision.verifier)


@dataclass(frozen=True, slots=True)
class VerifyRecord(_Record):
    """The verifier's decision on one stored generate response (OUTPUT_DIR/work/verify/), made with the verifier
    settings in work/verify/settings.json. Readers take a response's decision from here, not from the generate
    record (whose decision is the one made as it landed, under the settings of that time)."""

    key: str  # the generate record's key
    id: str
    sample: int
    family: str
    extracted: str | None
    match: bool
    reason: str | None
    verifier: str


@dataclass(frozen=True, slots=True)
class ExploreRecord(GenerateRecord):
    """A sampled response of the explore pass (OUTPUT_DIR/work/explore/): a generate record of sample >= 1 (key
    `{id}#{sample}`; sample 0 is the greedy answer in work/generate/), plus the round that drew it."""

    round: int = field(kw_only=True)  # keyword-only: it follows the base class's defaulted fields


@dataclass(frozen=True, slots=True)
class JudgeRecord(_Record):
    """One verdict of the judge (OUTPUT_DIR/work/judge/): on a verifier rejection, a calibration pair or a
    known-wrong pair (`kind`)."""

    omit_when_none = ("miss", "refused", "failed")

    key: str  # judge_key(response key, kind), or known_wrong_key(id) / known_right_key(id)
    id: str  # the QA id
    kind: str  # one of JUDGE_KINDS
    reference: str  # the official answer(s) as the judge saw them
    candidate: str  # the answer it graded (never the reasoning)
    verdict: str  # one of VERDICTS
    response: str  # the judge's raw output
    prompt_tokens: int
    generated_tokens: int
    hit_limit: bool
    model: str
    family: str | None = None  # None: not recorded (older rsgen); readers take the graded response's family
    sample: int | None = None  # the graded response's sample (None: a known-wrong pair, or not recorded)
    # known_wrong / known_right: the form the candidate was built in (rsgen.judge.calibration: KNOWN_*_FORMS)
    miss: str | None = None
    refused: str | None = None  # a server engine refused the request: its message (the verdict is then UNSURE)
    failed: str | None = None  # the request failed every retry: the server's last message (asked again next run)


    @property
    def response_key(self) -> str:
        """The key of the response this record grades (rejected and calibration pairs)."""
        return self.key.removeprefix(CALIBRATION_PREFIX)


@dataclass(frozen=True, slots=True)
class BlindRecord(_Record):
    """An accepted QA pair asked again without its image (OUTPUT_DIR/work/blind/), checked by its verifier."""

    omit_when_none = ("failed",)

    key: str  # the QA id
    id: str
    family: str
    question: str  # the user text sent, without the image
    response: str
    extracted: str | None
    solvable: bool  # the blind answer passes the verifier: blind-solvable
    verifier: str
    options: int  # number of multiple-choice options (0: free form); chance rate 1 / options
    generated_tokens: int
    model: str
    settings: str  # digest of the verifier settings `solvable` was decided with (rsgen.decisions.verify_settings)
    failed: str | None = None  # the request failed every retry: the server's last message (asked again next run)



GENERATE_RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(GenerateRecord) if f.name not in ("refused", "failed"))
VERIFY_RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(VerifyRecord))
EXPLORE_RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(ExploreRecord) if f.name not in ("refused", "failed"))
JUDGE_RECORD_FIELDS = tuple(f.name for f in dataclasses.fields(JudgeRecord)
                            if f.name not in ("miss", "refused", "failed"))

R = TypeVar("R", bound=_Record)


class _Located(Protocol):
    def iter_located(self) -> Iterator[tuple[str, dict[str, Any]]]: ...


def read_records(store: _Located, record_type: type[R]) -> Iterator[R]:
    """Every record of a checkpoint store as `record_type`, once per key, in part order."""
    for where, data in store.iter_located():
        yield record_type.from_json(data, where)


def records_by_key(store: _Located, record_type: type[R]) -> dict[str, R]:
    return {rec.key: rec for rec in read_records(store, record_type)}  # type: ignore[attr-defined]
