"""OUTPUT_DIR/progress.json and `rsgen status` (rsgen/store/progress.py; a finished demo run:
tests/test_demo_command.py): a run stopped by SIGTERM mid-generate says "stopped N minutes ago" with
the records it had written; a progress.json nobody rewrites goes stale ("stopped"); the card's progress section goes
to the Hub at most every K minutes (the upload function replaced, as in tests/emit/test_emit_push.py)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
import yaml

from rsgen.cli import main
from rsgen.config import recipe_from_dict
from rsgen.demo_command import RECIPE
from rsgen.layout import OutputLayout
from rsgen.records import GenerateRecord, read_records
from rsgen.store import CheckpointStore, progress
from rsgen.store.progress import (
    CARD_SECTION_END,
    CARD_SECTION_START,
    ProgressBoard,
    card_with_progress,
    read_progress,
    status_table,
    sum_ranks,
)


def generate_records(out):
    return list(read_records(CheckpointStore(OutputLayout(out).generate_work), GenerateRecord))


def status(capsys, *args) -> str:
    main(["status", *args])
    return capsys.readouterr().out


def table_row(text: str, stage: str) -> list[str]:
    line = next(line for line in text.splitlines() if line.startswith(stage + " "))
    return line.split()


def demo_recipe(tmp_path, out):
    """The demo recipe on 2 images; the run is stopped in generate, so nothing after it matters."""
    raw = yaml.safe_load(RECIPE.read_text())
    raw["sources"][0]["demo_num_images"] = 2
    # Small batches (token_budget), so records land a few at a time and the stop comes mid-generate.
    raw.update(output_dir=str(out), prepare_num_proc=1, checkpoint_every_items=1, token_budget=512)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_status_of_a_run_stopped_mid_generate(tmp_path, capsys, monkeypatch):
    """SIGTERM once a few generate records are counted: progress.json says stopped, in generate, with exactly the
    records on disk (SIGTERM flushes them); later it reads "stopped N minutes ago"."""
    monkeypatch.setattr(progress, "WRITE_EVERY_SECONDS", 0.0)  # every record rewrites the rank file
    out = tmp_path / "demo"
    recipe = demo_recipe(tmp_path, out)
    rank0 = progress.rank_file(out, 0)

    def stop_mid_generate():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                data = json.loads(rank0.read_text())
            except (OSError, ValueError):
                data = {}
            if data.get("stage") == "generate" and data.get("done_now", 0) >= 2:
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.01)

    watcher = threading.Thread(target=stop_mid_generate, daemon=True)
    watcher.start()
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--config", str(recipe)])
    watcher.join()
    assert exit_info.value.code == 128 + signal.SIGTERM
    capsys.readouterr()
    data = read_progress(out)
    gen = data["stages"]["generate"]
    assert data["state"] == "stopped" and data["current_stage"] == "generate" and gen["state"] == "stopped"
    assert 2 <= gen["done"] == gen["on_disk"] == len(generate_records(out)) < gen["total"]
    text = status(capsys, "--output_dir", str(out))
    assert text.startswith("stopped 0 minutes ago, in generate")
    assert table_row(text, "generate")[:7] == ["generate", "stopped", str(gen["done"]), "/", str(gen["total"]),
                                               "samples", str(gen["done"])]
    later = status_table(data, now=data["written_unix"] + 7 * 60 + 5)
    assert later.startswith("stopped 7 minutes ago, in generate")


def test_a_file_nobody_rewrites_reads_as_stopped():
    data = {"state": "running", "current_stage": "judge", "written_unix": 1000.0, "written_at": "t", "stages": {}}
    assert status_table(data, now=1003.0).startswith("running: judge")
    data["stages"] = {"judge": {"state": "running", "unit": "pair", "total": 9, "done": 4, "on_disk": 4,
                                "items_per_second": 1.0, "eta_seconds": 5, "generated_tokens": 9, "retries": 0,
                                "accept_rate": None}}
    assert table_row(status_table(data, now=1003.0), "judge")[:2] == ["judge", "running"]
    stale = status_table(data, now=1000.0 + progress.STALE_AFTER_SECONDS + 125)
    assert stale.startswith("stopped 3 minutes ago") and table_row(stale, "judge")[:2] == ["judge", "stopped"]
    assert status_table({**data, "state": "finished"}, now=99999.0).startswith("finished")


def test_ranks_are_summed_into_rate_eta_and_accept_rate():
    ranks = [{"unit": "sample", "total": 100, "assigned": 50, "already_done": 10, "done_now": 20, "accepted": 5,
              "decided": 20, "prompt_tokens": 7, "generated_tokens": 300, "retries": 1, "started_unix": 0.0,
              "saved_now": 16},
             {"unit": "sample", "total": 100, "assigned": 50, "already_done": 10, "done_now": 20, "accepted": 15,
              "decided": 20, "prompt_tokens": 7, "generated_tokens": 100, "retries": 2, "started_unix": 10.0,
              "saved_now": 20}]
    out = sum_ranks(ranks, now=20.0)
    assert out["done"] == 60 and out["on_disk"] == 56 and out["total"] == 100 and out["ranks_reporting"] == 2
    assert out["items_per_second"] == 2.0 and out["eta_seconds"] == 20  # 40 left at 40 per 20 s
    assert out["accept_rate"] == 0.5 and out["generated_tokens"] == 400 and out["retries"] == 3


def test_status_without_a_run_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["status", "--output_dir", str(tmp_path / "nothing")])
    assert exit_info.value.code == 2
    assert "no progress.json in" in capsys.readouterr().err


def test_card_progress_section_pushed_at_most_every_k_minutes(tmp_path, monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    pushed = []
    board = ProgressBoard(tmp_path, 1, ["generate", "emit"], hub_push=pushed.append, hub_every_seconds=600.0)
    board.start("generate")  # the first write pushes
    for _ in range(5):  # heartbeats within the 10 minutes: no push
        clock[0] += 100
        board.write()
    assert len(pushed) == 1
    clock[0] += 101  # 601 s after the first push
    board.write()
    assert len(pushed) == 2 and CARD_SECTION_START in pushed[-1] and "| generate | running |" in pushed[-1]
    board.end("generate", "stopped", run_finished=False)  # how the run ended goes out at once
    assert len(pushed) == 3 and "stopped 0 minutes ago" in pushed[-1]


class RecordingHfApi:
    """Stands in for HfApi where the test is about which calls the progress push makes; records them."""

    def __init__(self):
        self.calls = []

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", repo_id))

    def upload_file(self, **kwargs):
        self.calls.append(("upload_file", kwargs))


def test_progress_section_upload_replaces_the_previous_section(tmp_path):
    from rsgen.emit.push import push_progress_section

    recipe = recipe_from_dict({"output_dir": str(tmp_path), "model_name_or_path": "m", "push_to_hub": True,
                               "hub_dataset_id": "someone/clevr-rs"})
    api = RecordingHfApi()
    section = f"{CARD_SECTION_START}\n## Progress\n\nfirst\n{CARD_SECTION_END}\n"
    push_progress_section(recipe, section, api=api)
    (name, upload), = [c for c in api.calls if c[0] == "upload_file"]
    assert upload["path_in_repo"] == "README.md" and upload["repo_id"] == "someone/clevr-rs"
    assert upload["repo_type"] == "dataset" and upload["path_or_fileobj"].decode().startswith("# someone/clevr-rs")
    card = "---\nlicense: other\n---\n# The card\n\ntext\n"
    once = card_with_progress(card, section, "t")
    again = card_with_progress(once, section.replace("first", "second"), "t")
    assert again.count(CARD_SECTION_START) == 1 and "second" in again and "first" not in again
    assert again.startswith(card.rstrip("\n"))


def test_pipeline_pushes_progress_only_with_push_to_hub(tmp_path, monkeypatch):
    import huggingface_hub

    from rsgen.pipeline import _hub_progress

    base = {"output_dir": str(tmp_path), "model_name_or_path": "m"}
    assert _hub_progress(recipe_from_dict(base)) == {}
    assert _hub_progress(recipe_from_dict({**base, "push_to_hub": True, "hub_dataset_id": "someone/x",
                                           "hub_progress_every_minutes": 0})) == {}
    api = RecordingHfApi()
    monkeypatch.setattr(huggingface_hub, "HfApi", lambda: api)
    wiring = _hub_progress(recipe_from_dict({**base, "push_to_hub": True, "hub_dataset_id": "someone/x",
                                             "hub_progress_every_minutes": 2.5}))
    assert wiring["hub_every_seconds"] == 150.0
    wiring["hub_push"]("SECTION")
    assert [c[0] for c in api.calls] == ["create_repo", "upload_file"]
    assert api.calls[1][1]["path_or_fileobj"].decode().endswith("SECTION")
    with pytest.raises(Exception, match="hub_progress_every_minutes must be >= 0"):
        recipe_from_dict({**base, "hub_progress_every_minutes": -1})


def test_docs_quote_status_on_the_progress_json_a_sigkill_left(capsys):
    """docs/scale.md's SIGKILL example: `rsgen status` on the progress.json a demo run left when it was killed
    mid-generate (kept in tests/data/killed_demo_run/, since where a kill lands is timing), read two minutes after
    its last write; the page's sentence states that file's counts (handed to the writer, on disk)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    killed = root / "tests" / "data" / "killed_demo_run"
    data = read_progress(killed)
    printed = status_table(data, now=data["written_unix"] + 2 * 60 + 5)
    docs = (root / "docs" / "scale.md").read_text()
    assert "`rsgen status --output_dir /tmp/house_killed` two minutes later" in docs
    assert f"```\n{printed}\n```" in docs, printed
    gen = data["stages"]["generate"]
    assert gen["done"] > gen["on_disk"]  # what a SIGKILL loses: the records a rank still buffered
    assert (f"{gen['done']} answers had been handed to the checkpoint writer, {gen['on_disk']} of them written; the "
            f"store held exactly {gen['on_disk']} records") in " ".join(docs.split())
    # The command prints the same table (its first line says how long ago, from the clock).
    table = status(capsys, "--output_dir", str(killed))
    assert table.startswith("stopped ") and table.splitlines()[1:] == printed.splitlines()[1:]
