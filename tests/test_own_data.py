"""A user's own files through the command line (issue #28): JSON Lines and CSV with image paths, list-valued answers,
a family that mixes multiple choice and free form, planted mistakes, a rerun.

The fast tests stop before any model is loaded (the refusals, the messages, prepare); the slow ones run the shipped
demo model through `rsgen run` in a subprocess, as a user would.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import datasets
import pytest
import yaml

from rsgen.cli import main
from rsgen.layout import OutputLayout
from rsgen.records import CALIBRATION_PREFIX, KNOWN_WRONG_PREFIX
from rsgen.schema import iter_questions, open_prepared
from rsgen.store import CheckpointStore
from rsgen.testing.own_data import draw_rows, write_csv, write_jsonl
from rsgen.verifiers.mc import reference_letter

ROOT = Path(__file__).resolve().parents[1]


def write_recipe(folder: Path, sources: list[dict], name: str = "my.yaml", **keys) -> Path:
    recipe = {"model_name_or_path": "rsgen-demo", "output_dir": str(folder / "out"), "sources": sources,
              "max_new_tokens": 96, "judge_max_new_tokens": 32, "judge_calibration_size": 8, "prepare_num_proc": 1,
              **keys}
    path = folder / name
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


@pytest.fixture
def mixed_pool(tmp_path) -> tuple[Path, list[dict]]:
    """12 images, one family mixing multiple choice (options in the column, or in the question with `[]`) and
    free-form counting (some answers lists), as pool.jsonl with image paths."""
    rows = draw_rows(tmp_path, 12, seed=5)
    write_jsonl(tmp_path / "pool.jsonl", rows)
    return tmp_path, rows


def mixed_source(folder: Path) -> dict:
    return {"data_files": [str(folder / "pool.jsonl")], "options_column": "options", "family": "Mixed"}


def cli(capsys, *args) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(list(args))
    return exit_info.value.code, capsys.readouterr().err


# ------------------------------------------------------------------------------ before any model: fast


def test_mc_on_a_family_with_free_form_rows_is_refused_before_the_model_loads(mixed_pool, capsys):
    folder, rows = mixed_pool
    recipe = write_recipe(folder, [mixed_source(folder)])
    code, err = cli(capsys, "run", "--config", str(recipe), "--verifier", "mc")
    assert code == 2
    # Prepare reads the options written into questions too: the rows left without options are the counting ones.
    free_form = sum(r["kind"] == "CLEVRMath" for r in rows)
    assert f"verifier mc for family 'Mixed': {free_form} of its {len(rows)} QA pairs have no options" in err
    assert "Use `verifier: relaxed`" in err
    layout = OutputLayout(folder / "out")
    assert layout.prepared.is_dir() and not layout.generate_work.exists()  # refused before generate, no model


def test_a_flag_that_is_no_key_is_blamed_on_the_command_line_with_the_closest_keys(mixed_pool, capsys):
    folder, _ = mixed_pool
    recipe = write_recipe(folder, [mixed_source(folder)])
    code, err = cli(capsys, "run", "--config", str(recipe), "--max_new_token", "5")
    assert code == 2
    assert "unknown key --max_new_token on the command line" in err and str(recipe) not in err
    assert "Did you mean --max_new_tokens, --judge_max_new_tokens?" in err
    assert "--shard_size_mb" not in err and "Known keys" not in err  # not all 52 keys
    code, err = cli(capsys, "run", "--config", str(recipe), "--not_a_key", "1")
    assert "unknown key --not_a_key on the command line" in err
    # A mistake inside the file is still the file's.
    (folder / "typo.yaml").write_text(recipe.read_text() + "output_dirr: x\n")
    code, err = cli(capsys, "run", "--config", str(folder / "typo.yaml"))
    assert f"unknown key 'output_dirr' in {folder / 'typo.yaml'}. Did you mean 'output_dir'?" in err


@pytest.mark.parametrize("flag, value, entry", [
    ("--demo_num_images", "5", "{dataset_name: rsgen-demo, family_column: family, demo_num_images: 5}"),
    ("--data_files", "x.jsonl", "{data_files: x.jsonl, family: MyFamily}"),
])
def test_a_source_key_given_as_a_flag_says_it_belongs_inside_sources(mixed_pool, capsys, flag, value, entry):
    folder, _ = mixed_pool
    code, err = cli(capsys, "run", "--config", str(write_recipe(folder, [mixed_source(folder)])), flag, value)
    assert code == 2
    assert "is a source key: it belongs inside an entry of `sources:`" in err
    assert f"--sources '[{entry}]'" in err


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_a_missing_column_leaves_the_output_dir_as_it_was_and_the_fix_runs_there(tmp_path, capsys, fmt):
    rows = draw_rows(tmp_path, 2, seed=3, kinds=("CLEVRMath",))
    (write_csv if fmt == "csv" else write_jsonl)(tmp_path / f"pool.{fmt}", rows)
    source = {"data_files": [str(tmp_path / f"pool.{fmt}")], "family": "Counting"}
    out = tmp_path / "out"
    code, err = cli(capsys, "run", "--config", str(write_recipe(tmp_path, [{**source, "answer_column": "label"}])))
    assert code == 2 and "has no column 'label' (answer_column)" in err
    assert not out.exists()  # no run.json, no prepared.partial/, not even the folder
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    code, err = cli(capsys, "prepare", "--config", str(write_recipe(tmp_path, [{**source, "answer_column": "label"}])))
    assert code == 2 and sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    main(["prepare", "--config", str(write_recipe(tmp_path, [source]))])  # corrected: runs there, no cleanup
    assert OutputLayout(out).prepared.is_dir()


def test_the_report_names_each_rows_own_line_in_the_file(tmp_path):
    """Lines as an editor shows them, counted from 1: JSON Lines with a blank line, CSV with its header and a
    quoted cell over two lines; merged duplicates have examples too."""
    rows = draw_rows(tmp_path, 2, seed=3, kinds=("CLEVRMath",))
    good, again = rows[0], dict(rows[0])
    lines = [json.dumps(good), "", json.dumps({**rows[1], "answer": ""}), json.dumps(again),
             json.dumps({**rows[1], "image": "images/missing.png", "question": "Is it there?"})]
    (tmp_path / "pool.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "pool.csv").write_text(
        "image,question,answer\n"
        f'{rows[1]["image"]},"How many\nobjects?",3\n'
        f'{rows[1]["image"]},How many cubes?,\n')
    sources = [{"data_files": [str(tmp_path / "pool.jsonl")], "family": "A"},
               {"data_files": [str(tmp_path / "pool.csv")], "family": "B"}]
    main(["prepare", "--config", str(write_recipe(tmp_path, sources))])
    report = json.loads(OutputLayout(tmp_path / "out").prepare_report.read_text())
    examples = report["examples"]
    assert [e["source_row_id"] for e in examples["answer_empty"]] == ["pool.jsonl:3", "pool.csv:4"]
    assert [e["source_row_id"] for e in examples["image_file_missing"]] == ["pool.jsonl:5"]
    assert [(e["source_row_id"], e["value"]["merged_into"]) for e in examples["duplicate_question"]] == \
        [("pool.jsonl:4", "pool.jsonl:1")]


def test_references_that_read_like_missing_values_are_answers(tmp_path):
    """"None", "null", "nan" written as answers reach the verifier as the text they are."""
    rows = draw_rows(tmp_path, 2, seed=3, kinds=("CLEVRMath",))[:4]
    for row, text in zip(rows, ["None", "null", "nan", "NaN"]):
        row["answer"] = text
    write_csv(tmp_path / "pool.csv", rows, columns=("image", "question", "answer"))
    main(["prepare", "--config", str(write_recipe(tmp_path, [{"data_files": [str(tmp_path / "pool.csv")],
                                                                "family": "F"}]))])
    from rsgen.config import load_recipe
    from rsgen.references import check_references

    prepared = open_prepared(tmp_path / "out")
    assert sorted(a for q in iter_questions(prepared) for a in q.answers) == ["NaN", "None", "nan", "null"]
    assert check_references(load_recipe(tmp_path / "my.yaml"), prepared) == []  # no bad_input


# ------------------------------------------------------------------------------ through the model: slow


def rsgen(*args, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "rsgen", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


@pytest.mark.slow
def test_a_mixed_family_is_served_by_the_default_verifier(mixed_pool):
    """Issue #28.2: under `relaxed`, two different option letters went to the judge (a lenient one could promote a
    wrong letter). A row with options is multiple choice under every verifier: another option is decisive."""
    folder, _ = mixed_pool
    done = rsgen("run", "--config", str(write_recipe(folder, [mixed_source(folder)])), cwd=folder)
    out = folder / "out"
    options = {q.id: list(q.options) for q in iter_questions(open_prepared(out))}
    generate = CheckpointStore(OutputLayout(out).generate_work).records()
    judged = [k for k in CheckpointStore(OutputLayout(out).judge_work).records()
              if not k.startswith((CALIBRATION_PREFIX, KNOWN_WRONG_PREFIX))]
    option_rejections = [r for r in generate.values() if options[r["id"]] and not r["match"]]
    assert len(option_rejections) >= 3  # the model misses some multiple-choice rows: the test measures something
    for rec in option_rejections:
        names_an_option = reference_letter(rec["extracted"], options[rec["id"]]) is not None
        assert names_an_option != (rec["key"] in judged), rec  # another option: decided; anything else: judged
    free_form_rejections = [r for r in generate.values() if not options[r["id"]] and not r["match"]]
    assert {r["verifier"] for r in generate.values()} == {"relaxed"} and free_form_rejections
    stats = json.loads((out / "stats.json").read_text())["families"]["Mixed"]
    assert stats["judge"]["decisive"] >= sum(reference_letter(r["extracted"], options[r["id"]]) is not None
                                             for r in option_rejections)
    assert "bad_input" not in stats["rejected_reasons"]
    assert "accept rate" in done.stdout  # the final table


@pytest.mark.slow
def test_nothing_accepted_means_no_default_config(tmp_path):
    """Issue #28.3: with 0 accepted, `load_dataset(dir, split="train")` returned the rejected rows."""
    rows = draw_rows(tmp_path, 3, seed=8, kinds=("CLEVRMath",))
    write_jsonl(tmp_path / "pool.jsonl", [{**r, "answer": "a purple elephant"} for r in rows])
    recipe = write_recipe(tmp_path, [{"data_files": [str(tmp_path / "pool.jsonl")], "family": "Zoo"}], judge=False)
    done = rsgen("run", "--config", str(recipe), cwd=tmp_path)
    dataset = str(tmp_path / "out" / "dataset")
    with pytest.raises(ValueError, match="Config name is missing"):  # `datasets`' own list of the configs
        datasets.load_dataset(dataset, split="train")
    assert len(datasets.load_dataset(dataset, "Zoo_rejected", split="train")) == 3
    assert "WARNING: no default config" in done.stderr


@pytest.mark.slow
def test_a_rerun_of_generate_says_what_it_found(mixed_pool):
    """Issue #28.8: a rerun said nothing about the work it found on disk."""
    folder, rows = mixed_pool
    recipe = str(write_recipe(folder, [mixed_source(folder)], checkpoint_every_items=8))
    rsgen("prepare", "--config", recipe, cwd=folder)
    first = rsgen("generate", "--config", recipe, cwd=folder)
    assert f"generate: 0 of {len(rows)} samples already done, {len(rows)} to go" in first.stderr
    parts = sorted(OutputLayout(folder / "out").generate_work.glob("*.jsonl"))
    assert len(parts) > 1
    lost = len(parts[-1].read_text().splitlines())
    parts[-1].unlink()  # as if the run had been killed before its last checkpoint
    again = rsgen("generate", "--config", recipe, cwd=folder)
    assert f"generate: {len(rows) - lost} of {len(rows)} samples already done, {lost} to go" in again.stderr


@pytest.mark.slow
def test_the_local_files_recipe_runs_as_shipped(tmp_path):
    """recipes/local_files.yaml (docs/own-data.md): a JSON Lines file mixing multiple choice and free form with
    list-valued answers, a CSV file and an image folder, all naming images on disk."""
    out = tmp_path / "local_files"
    done = rsgen("run", "--config", "recipes/local_files.yaml", "--output_dir", str(out), cwd=ROOT)
    stats = json.loads((out / "stats.json").read_text())
    report = json.loads(OutputLayout(out).prepare_report.read_text())
    assert set(stats["families"]) == {"Shapes", "Charts", "Counting"}
    assert report["dropped_qa_pairs"] == 0 and report["kept_qa_pairs"] == stats["totals"]["prepared_qa"]
    for name, fam in stats["families"].items():
        assert fam["accepted_qa"] > 0 and fam["rejected_qa"] > 0, name
        assert "bad_input" not in fam["rejected_reasons"], name
    shapes = [q for q in iter_questions(open_prepared(out)) if q.family == "Shapes"]
    assert any(q.options for q in shapes) and any(not q.options for q in shapes)
    assert any(len(q.answers) == 2 for q in shapes)  # ["8", "eight"]
    assert datasets.load_dataset(str(out / "dataset"), split="train").config_name == "Charts_sft"  # the default
    assert "accept rate" in done.stdout
