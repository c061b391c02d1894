"""`engine: openai` through the whole pipeline (prepare -> generate -> verify -> explore -> judge -> emit) in this
process, against the STUB chat server (rsgen.testing.stub_server): a test of the plumbing -- every model-calling
stage sends its requests to the server, records what came back and routes it -- not of answers (the stub
answers without a model). Some judge and explore requests are refused (HTTP 400): each is a recorded, counted
outcome (judge: UNSURE with the server's message; explore: a `request_refused` sample), never a crash or a
promotion. The real servers' end-to-end runs are in tests/engine/test_openai_server.py (slow tier)."""

from __future__ import annotations

import json

import yaml

from rsgen.cli import main
from rsgen.engine import REQUEST_REFUSED
from rsgen.layout import OutputLayout
from rsgen.records import REJECTED, UNSURE, ExploreRecord, GenerateRecord, JudgeRecord, read_records
from rsgen.store import CheckpointStore
from rsgen.testing.stub_server import STUB_MODEL, StubChatServer, stub_completion


def _text(body: dict) -> str:
    parts = []
    for message in body["messages"]:
        content = message["content"]
        parts += [content] if isinstance(content, str) else [p.get("text", "") for p in content]
    return "\n".join(parts)


class Replies:
    """Generate: "2" for every question. Judge: every other request refused, the rest CORRECT. Explore: every
    third request refused, the rest "3". Counts what it refused."""

    def __init__(self):
        self.sent = {"generate": 0, "judge": 0, "explore": 0}
        self.refused = {"judge": 0, "explore": 0}

    def __call__(self, body: dict, n: int):
        role = ("judge" if "<<<CANDIDATE>>>" in _text(body)
                else "explore" if body.get("temperature", 0) > 0 else "generate")
        self.sent[role] += 1
        if (role == "judge" and self.sent[role] % 2) or (role == "explore" and self.sent[role] % 3 == 0):
            self.refused[role] += 1
            return 400, {"error": {"message": f"stub refuses this {role} request"}}, {}
        return stub_completion({"generate": "2", "judge": "CORRECT", "explore": "3"}[role])


def test_a_run_with_engine_openai_against_the_stub(tmp_path, capsys):
    replies = Replies()
    with StubChatServer(reply=replies) as stub:
        recipe = {
            "output_dir": str(tmp_path / "out"),
            "model_name_or_path": STUB_MODEL,
            "engine": "openai",
            "engine_base_url": [stub.base_url],
            "sources": [{"dataset_name": "rsgen-demo", "demo_num_images": 4, "family_column": "family",
                         "options_column": "options", "source_id_column": "source_id"}],
            "explore_samples": 3,
            "judge_scope": "all",  # every rejection goes to the judge, decisive mismatches included
            "judge_calibration_size": 0,
            "judge_min_specificity": 0,  # no calibration: the gate is off, so each CORRECT promotes
            "checkpoint_every_items": 8,
        }
        path = tmp_path / "recipe.yaml"
        path.write_text(yaml.safe_dump(recipe))
        main(["run", "--config", str(path)])
    assert "accept rate" in capsys.readouterr().out
    layout = OutputLayout(tmp_path / "out")

    generated = list(read_records(CheckpointStore(layout.generate_work), GenerateRecord))
    assert len(generated) == replies.sent["generate"] > 0
    assert {r.model for r in generated} == {STUB_MODEL} and {r.response for r in generated} == {"2"}

    judged = [r for r in read_records(CheckpointStore(layout.judge_work), JudgeRecord) if r.kind == REJECTED]
    refused = [r for r in judged if r.refused]
    assert replies.refused["judge"] == len(refused) > 0 and len(judged) == replies.sent["judge"]
    assert all(r.verdict == UNSURE and "stub refuses this judge request" in r.refused for r in refused)

    explored = list(read_records(CheckpointStore(layout.explore_work), ExploreRecord))
    refused = [r for r in explored if r.refused]
    assert replies.refused["explore"] == len(refused) > 0 and len(explored) == replies.sent["explore"]
    assert all(r.reason == REQUEST_REFUSED and not r.match and r.response == "" for r in refused)

    stats = json.loads(layout.stats_json.read_text())
    totals = stats["totals"]
    assert totals["prepared_qa"] == totals["accepted_qa"] + totals["rejected_qa"] == len(generated)
    # The pairs route on their greedy response (explore's samples are judged for the pass rates): each greedy
    # rejection the judge answered CORRECT was promoted, and none whose request was refused.
    greedy = {r.key for r in generated}
    answered = [r for r in judged if r.key in greedy and not r.refused]
    assert any(r.key in greedy and r.refused for r in judged)
    promoted = sum(fam["judge"]["promoted"] for fam in stats["families"].values())
    assert promoted == len(answered) > 0
