"""The prepare stage: load a VQA pool, clean it, group it by image, write OUTPUT_DIR/prepared/.

Imports are deferred so that image workers (spawned processes importing `rsgen.prepare.images`) start without
loading `datasets`, and the command line reads STAGE without loading the stage (the stage's code is named by
string, so `rsgen.prepare.stage` can read STAGE's pins without the two modules importing each other).
"""

from __future__ import annotations

from rsgen.stage import Stage, lazy_exports

# Prepare is cheap next to generation and writes shared files: the main process does it (every_process=False).
STAGE = Stage.in_package(__name__, "prepare", work=lambda layout: layout.prepared, every_process=False,
                         help="load, group and clean the pool into OUTPUT_DIR/prepared/")

__getattr__ = lazy_exports(__name__, {"run_prepare": "rsgen.prepare.stage", "check_prepare": "rsgen.prepare.stage"})
__all__ = ["STAGE", "check_prepare", "run_prepare"]  # noqa: F822 (loaded on first use)
