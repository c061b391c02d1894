"""A user's own files, drawn from the demo pool so that the shipped demo model can answer them: PNG files in a
folder, and a JSON Lines file, a CSV file or an image folder's `metadata.jsonl` naming them, written the way a
user writes them (relative image paths, list-valued answers, options on some rows and `[]` on others).

Tests make their pools with these functions, and `scripts/make_local_files.py` wrote `recipes/local_files/` with
them.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

from rsgen.demo.pool import make_demo_image

NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")


def draw_rows(folder: str | Path, num_images: int, seed: int, kinds: tuple[str, ...] = ("CLEVRMath", "DemoMC"),
              image_dir: str = "images") -> list[dict]:
    """Draw demo images of the `kinds` (CLEVRMath: counting, free form; DemoMC: multiple choice; DemoChart: bar
    charts) until `num_images` are found, save each as `folder/image_dir/NNNN.png`, and return one row per QA
    pair: `image` (path relative to `folder`), `question`, `answer`, `options`, `kind`.

    Multiple-choice rows keep their options where the pool puts them: in `options`, or written into the question
    with `options: []` (prepare reads them from there). Every third counting answer is a list, the digits and the
    word ("3" and "three"), as pools with several acceptable answers store them."""
    folder = Path(folder)
    (folder / image_dir).mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    index = found = 0
    while found < num_images:
        kind, png, _scene, qas = make_demo_image(seed, index)
        index += 1
        if kind not in kinds:
            continue
        name = f"{found:04d}.png" if image_dir in ("", ".") else f"{image_dir}/{found:04d}.png"
        (folder / name).write_bytes(png)
        found += 1
        for question, answer, options in qas:
            if kind == "CLEVRMath" and answer.isdigit() and int(answer) < len(NUMBER_WORDS) and len(rows) % 3 == 0:
                answer = [answer, NUMBER_WORDS[int(answer)]]
            rows.append({"image": name, "question": question, "answer": answer, "options": list(options),
                         "kind": kind})
    return rows


def write_jsonl(path: str | Path, rows: list[dict], columns=("image", "question", "answer", "options")) -> Path:
    path = Path(path)
    with path.open("w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps({c: row[c] for c in columns if c in row}, ensure_ascii=False) + "\n")
    return path


def write_csv(path: str | Path, rows: list[dict], columns=("image", "question", "answer", "options")) -> Path:
    """Lists (answers, options) as JSON text in their cell, as spreadsheets and pandas exports store them."""
    path = Path(path)
    with path.open("w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([json.dumps(row[c]) if isinstance(row[c], list) else row[c] for c in columns])
    return path


def write_image_folder(folder: str | Path, rows: list[dict]) -> Path:
    """An `imagefolder`: the rows' images are already under `folder`; `metadata.jsonl` names them in `file_name`."""
    folder = Path(folder)
    return write_jsonl(folder / "metadata.jsonl",
                       [{"file_name": r["image"], **{k: r[k] for k in ("question", "answer", "options")}} for r in rows],
                       columns=("file_name", "question", "answer", "options"))
