"""Emit over work written by an older rsgen: a generate record without a field that has no stated default stops
emit with one line naming the part file, the record and the field (rsgen.records), never a KeyError deep in emit."""

from __future__ import annotations

import json

import pytest
from emit_helpers import scripted_recipe, write_scripted_run

from rsgen.emit.stage import run_emit
from rsgen.layout import OutputLayout
from rsgen.records import RecordError
from rsgen.store import CheckpointStore


def test_emit_over_an_older_work_file_stops_with_the_part_and_the_field(tmp_path):
    """Not a KeyError deep in emit: the generate record without `match` is named, with its part file."""
    write_scripted_run(tmp_path, judge=False)
    store = CheckpointStore(OutputLayout(tmp_path).generate_work)
    part = store.parts()[0]
    lines = [json.loads(line) for line in part.read_text().splitlines()]
    del lines[2]["match"]
    part.unlink()
    with store.writer(0) as writer:  # the same records again, as an rsgen that wrote no `match` would
        for record in lines:
            writer.add(record)
    with pytest.raises(RecordError, match=r"generate/.*line 3: GenerateRecord '[^']+' has no field 'match'"):
        run_emit(scripted_recipe(tmp_path, judge=False))
