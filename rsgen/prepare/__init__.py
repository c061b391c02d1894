"""The prepare stage: load a VQA pool, clean it, group it by image, write OUTPUT_DIR/prepared/.

Imports are deferred so that image workers (spawned processes importing `rsgen.prepare.images`) start without
loading `datasets`, and the command line reads STAGE without loading the stage.
"""

from __future__ import annotations

from rsgen.stage import Stage


def run_prepare(recipe, state=None, force: bool = False) -> dict:
    """Write OUTPUT_DIR/prepared/ (parquet shards + prepare_report.json); returns the report.

    A finished prepared/ made from the same recipe is reused (pass force=True to redo it)."""
    from rsgen.prepare.stage import run_prepare as _run

    return _run(recipe, force=force)


def check_prepare(recipe) -> None:
    """Raise the recipe errors prepare can find before reading a row, unless prepared/ is finished for this recipe
    (then prepare reuses it and reads nothing). Writes nothing: a bad recipe leaves the output_dir as it was."""
    from rsgen.prepare.stage import check_sources, prepare_finished

    if not prepare_finished(recipe):
        check_sources(recipe)


STAGE = Stage(
    name="prepare",
    help="load, group and clean the pool into OUTPUT_DIR/prepared/",
    work=lambda layout: layout.prepared,
    run=run_prepare,
    # Prepare is cheap next to generation and writes shared files: the main process does it.
    every_process=False,
    check=check_prepare,
)

__all__ = ["STAGE", "check_prepare", "run_prepare"]
