"""Write recipes/local_files/: a small pool of a user's own files for `recipes/local_files.yaml`.

    python scripts/make_local_files.py            # rewrites recipes/local_files/ (same seeds, same bytes)

Three layouts a user's data comes in, drawn from the demo pool so that the shipped demo model answers them:

- pool.jsonl: image paths, one QA pair per line, a family that mixes multiple choice (options in the `options`
  column, or written into the question with `options: []`) and free-form counting, some answers lists;
- pool.csv: bar charts, lists written as JSON text in their cell;
- folder/: an image folder whose metadata.jsonl names each image by `file_name`.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from rsgen.testing.own_data import draw_rows, write_csv, write_image_folder, write_jsonl

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "recipes" / "local_files")
    out = parser.parse_args().out
    shutil.rmtree(out, ignore_errors=True)
    write_jsonl(out / "pool.jsonl", draw_rows(out, 8, seed=129, kinds=("CLEVRMath", "DemoMC"), image_dir="images"))
    write_csv(out / "pool.csv", draw_rows(out, 4, seed=102, kinds=("DemoChart",), image_dir="charts"),
              columns=("image", "question", "answer"))
    write_image_folder(out / "folder", draw_rows(out / "folder", 4, seed=103, kinds=("CLEVRMath",), image_dir="."))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
