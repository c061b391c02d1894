"""The generate stage's closing table: a fresh single-process run prints it from the counts it kept while writing
(no second pass over the records); the table must be the one a pass over the store prints (the path of a rerun, or
of several ranks), including a family with hit-limit and no-answer rows."""

from __future__ import annotations

import dataclasses

from rsgen.config import recipe_from_dict
from rsgen.generate.stage import print_summary_table, run_generate
from rsgen.layout import OutputLayout
from rsgen.prepare import run_prepare
from rsgen.store import CheckpointStore
from rsgen.testing.stub_server import STUB_MODEL, StubChatServer, stub_completion


def _reply(body: dict, n: int):
    # Every third answer cut at the token limit, every fifth with no answer in it: the table's other columns.
    if n % 3 == 0:
        return {**stub_completion("The answer is"), "choices": [{"index": 0, "finish_reason": "length",
                                                                  "message": {"role": "assistant",
                                                                              "content": "The answer is"}}]}
    return stub_completion("The answer is" if n % 5 == 0 else "2")


def test_the_table_from_kept_counts_equals_the_table_from_the_store(tmp_path, capsys):
    with StubChatServer(reply=_reply) as stub:
        recipe = recipe_from_dict({
            "output_dir": str(tmp_path / "out"), "model_name_or_path": STUB_MODEL, "engine": "openai",
            "engine_base_url": [stub.base_url], "judge": False, "prepare_num_proc": 1,
            "sources": [{"dataset_name": "rsgen-demo", "demo_num_images": 16, "family_column": "family",
                         "options_column": "options", "source_id_column": "source_id"}]})
        run_prepare(recipe)
        capsys.readouterr()
        summary = run_generate(dataclasses.replace(recipe))
    kept = capsys.readouterr().out
    assert summary.found == 0 and summary.done_now > 10
    print_summary_table(CheckpointStore(OutputLayout(recipe.output_dir).generate_work), summary)
    reread = capsys.readouterr().out
    assert kept == reread
    total = next(line for line in kept.splitlines() if line.startswith("total"))
    items, accepted, _, no_answer, hit_limit, _ = total.split()[1:7]
    assert int(items) == summary.done_now and int(hit_limit) > 0 and int(no_answer) > 0 and 0 < int(accepted)
