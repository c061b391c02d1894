"""The prepare stage: load a VQA pool, clean it, group it by image, write OUTPUT_DIR/prepared/.

Imports are deferred so that image workers (spawned processes importing `rsgen.prepare.images`) start without
loading `datasets`.
"""

from __future__ import annotations

import os


def run_prepare(recipe, force: bool = False) -> dict:
    """Write OUTPUT_DIR/prepared/ (parquet shards + prepare_report.json); returns the report.

    A finished prepared/ made from the same recipe is reused (pass force=True to redo it)."""
    from rsgen.prepare.stage import run_prepare as _run

    return _run(recipe, force=force)


def load_prepared(output_dir: str | os.PathLike):
    """The prepared pool as a `datasets.Dataset` (one row per image), in a stable order."""
    from rsgen.prepare.stage import load_prepared as _load

    return _load(output_dir)


__all__ = ["load_prepared", "run_prepare"]
