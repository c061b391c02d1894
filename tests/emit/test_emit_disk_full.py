"""Disk full while emit writes its shards (ENOSPC injected into pyarrow's parquet writer): `rsgen emit` ends with
one line and exit code 1, leaves nothing a rerun would trust, and the rerun writes what a clean emit writes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from emit_helpers import scripted_recipe, write_scripted_run

ROOT = Path(__file__).resolve().parents[2]

# `rsgen` with a disk that is full from the first parquet row group on.
FULL_DISK_RSGEN = """
import errno, sys
import pyarrow.parquet as pq

def write_table(self, *args, **kwargs):
    raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")

pq.ParquetWriter.write_table = write_table
from rsgen.cli import main
main(sys.argv[1:])
"""


def rsgen(args: list[str], cwd: Path, full_disk: bool = False) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-c", FULL_DISK_RSGEN] if full_disk else [sys.executable, "-m", "rsgen"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(cmd + args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def dataset_rows(output_dir: Path) -> dict[str, list[str]]:
    return {config.name: sorted(json.dumps(r, sort_keys=True, default=lambda b: b.hex())
                                for shard in sorted(config.glob("*.parquet")) for r in pq.read_table(shard).to_pylist())
            for config in sorted((output_dir / "dataset" / "data").iterdir())}


@pytest.mark.slow
def test_disk_full_during_emit_is_one_line_and_the_rerun_is_clean(tmp_path):
    clean, full = tmp_path / "clean", tmp_path / "full"
    for root in (clean, full):
        write_scripted_run(root)
        (root.parent / f"{root.name}.yaml").write_text(yaml.safe_dump(scripted_recipe(root).to_dict()))
    assert rsgen(["emit", "--config", "clean.yaml"], tmp_path).returncode == 0

    failed = rsgen(["emit", "--config", "full.yaml"], tmp_path, full_disk=True)
    assert failed.returncode == 1, failed.stderr[-3000:]
    errors = [line for line in failed.stderr.splitlines() if line.startswith("rsgen:")]
    assert len(errors) == 1 and errors[0].startswith("rsgen: error: no space left on device"), failed.stderr
    assert "Traceback" not in failed.stderr and "rerun the same command" in errors[0]
    assert not (full / "dataset").exists()
    # Only hidden, unfinished files in dataset.partial/, which a rerun deletes first: no shard got its final name.
    assert [p.name for p in (full / "dataset.partial").rglob("*.parquet") if not p.name.startswith(".part-")] == []
    assert not (full / "rsgen.lock").exists()

    rerun = rsgen(["emit", "--config", "full.yaml"], tmp_path)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert dataset_rows(full) == dataset_rows(clean)
