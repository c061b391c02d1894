"""The whole stage: a pool holding every class of bad input, grouping, provenance, determinism, reuse."""

import hashlib
import io
import json
import os

import datasets
import pyarrow.parquet as pq
import pytest
from PIL import Image

from rsgen.layout import OutputLayout
from rsgen.prepare import run_prepare
from rsgen.schema import POLICY_VERSION, PREPARED_FEATURES, load_prepared

INSTRUCTION = "Answer in short without any other content."
DEMO_SOURCE = {"dataset_name": "rsgen-demo", "demo_num_images": 30, "demo_seed": 7, "family_column": "family",
               "options_column": "options", "source_id_column": "source_id"}


def write_parquet(rows, path):
    features = datasets.Features({
        "image": datasets.Image(), "question": datasets.Value("string"), "answer": datasets.Value("string"),
        "sid": datasets.Value("string"),
    })
    datasets.Dataset.from_list(rows, features=features).to_parquet(str(path))
    return path


def bad_pool(tmp_path, tools):
    """Two sources of one family: parquet with image bytes (image classes, modes, duplicates) and JSON Lines with
    image paths (text classes, path classes). Returns (sources, expected drops, expected conversions)."""
    good = [tools.rgb_png(100 + i) for i in range(4)]
    rows = [
        {"image": good[0], "question": "How many objects?", "answer": "3", "sid": "p0"},
        {"image": good[0], "question": "How many objects?", "answer": "3 ", "sid": "p1"},  # merged
        {"image": good[0], "question": "What color?", "answer": "red", "sid": "p2"},  # conflict with p3
        {"image": good[0], "question": "What color?", "answer": "blue", "sid": "p3"},
        {"image": good[1], "question": "Which shape? Options: cube, sphere.", "answer": "sphere", "sid": "p4"},
        {"image": good[1], "question": "Which size? Options: big, small.", "answer": "huge", "sid": "p5"},
        {"image": good[1], "question": "Which one? Options: red, Red.", "answer": "red", "sid": "p6"},
    ]
    for i, (_reason, data) in enumerate(tools.bad_images().items()):
        rows.append({"image": data, "question": f"Bad image {i}?", "answer": "x", "sid": f"b{i}"})
    for i, (_conversion, data) in enumerate(tools.mode_images().items()):
        rows.append({"image": data, "question": f"Converted image {i}?", "answer": "y", "sid": f"m{i}"})
    parquet = write_parquet(rows, tmp_path / "bytes.parquet")

    images = tmp_path / "images"
    images.mkdir()
    (images / "good.png").write_bytes(good[0])  # same bytes as the parquet's first image: grouped with it
    (images / "other.png").write_bytes(good[2])
    (images / "empty.png").write_bytes(b"")
    lines = [
        {"image": "good.png", "question": "Is it shiny?", "answer": "no"},
        {"image": "other.png", "question": "How many?", "answer": 7},  # converted to "7"
        {"image": "other.png", "question": "How wide?", "answer": ["3 cm", "30 mm"]},
        {"image": "other.png", "question": None, "answer": "a"},
        {"image": "other.png", "question": "", "answer": "a"},
        {"image": "other.png", "question": 12, "answer": "a"},
        {"image": "other.png", "question": "No answer?"},
        {"image": "other.png", "question": "Empty answer?", "answer": "  "},
        {"image": "other.png", "question": "Object answer?", "answer": {"text": "a"}},
        {"image": "other.png", "question": "Bool answer?", "answer": False},
        {"image": "other.png", "question": "Done?<|im_end|>", "answer": "a"},
        {"image": "other.png", "question": "<image>\nWhat?", "answer": "a"},
        {"image": "other.png", "question": "What?", "answer": "<|image_pad|>"},
        {"image": "other.png", "question": "<|vision_start|>What?", "answer": "a"},
        {"image": "other.png", "question": "<fake_token_around_image>What?", "answer": "a"},
        {"image": "missing.png", "question": "Where is it?", "answer": "a"},
        {"image": "empty.png", "question": "Empty file?", "answer": "a"},
        {"image": None, "question": "No image?", "answer": "a"},
    ]
    jsonl = tmp_path / "paths.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in lines) + "{broken json\n")
    sources = [
        {"data_files": [str(parquet)], "family": "Pool", "source_id_column": "sid"},
        {"data_files": [str(jsonl)], "data_dir": str(images), "family": "Pool"},
    ]
    dropped = {
        "duplicate_conflicting_answers": 2,
        "mc_answer_not_in_options": 1,
        "mc_duplicate_options": 1,
        "image_undecodable": 1,
        "image_truncated": 1,
        "image_zero_size": 2,
        "image_aspect_ratio": 1,
        "image_too_many_pixels": 1,
        "question_missing": 1,
        "question_empty": 1,
        "question_not_string": 1,
        "answer_missing": 1,
        "answer_empty": 1,
        "answer_not_string": 2,
        "special_token": 5,
        "image_file_missing": 1,
        "image_missing": 1,
        "row_unparseable": 1,
    }
    converted = {
        **{c: 1 for c in tools.mode_images()},
        "answer_number_to_string": 1,
        "mc_answer_to_letter": 1,
        "mc_options_rendered": 1,
    }
    return sources, dropped, converted


def test_every_bad_input_class_is_counted_and_nothing_crashes(tmp_path, tools):
    sources, dropped, converted = bad_pool(tmp_path, tools)
    recipe = tools.make_recipe(tmp_path / "out", sources)
    report = run_prepare(recipe)
    assert report["dropped"] == dropped
    assert report["converted"] == converted
    assert report["merged"] == {"duplicate_question": 1}
    assert report["input_qa_pairs"] == 18 + 19  # parquet rows + JSON Lines lines
    assert report["kept_qa_pairs"] == 1 + 1 + 6 + 1 + 2  # p0(+p1), p4, six converted, good.png, two on other.png
    assert report["kept_qa_pairs"] + report["dropped_qa_pairs"] + report["merged_qa_pairs"] == report["input_qa_pairs"]
    assert report["images"]["dropped"]["image_too_many_pixels"] == 1
    fam = report["families"]["Pool"]
    assert fam["kept_qa_pairs"] + fam["dropped_qa_pairs"] + fam["merged_qa_pairs"] == fam["input_qa_pairs"] == 37
    for s in report["sources"]:
        assert s["kept_qa_pairs"] + s["dropped_qa_pairs"] + s["merged_qa_pairs"] == s["input_qa_pairs"]
    on_disk = json.loads(OutputLayout(recipe.output_dir).prepare_report.read_text())
    assert on_disk == report

    ds = load_prepared(recipe.output_dir)
    assert len(ds) == report["rows"] == 1 + 1 + 6 + 1  # good[0], good[1], six converted, other.png
    assert sum(len(r["qa"]) for r in ds) == report["kept_qa_pairs"]
    for row in ds:
        assert row["image"].mode == "RGB"
        assert row["clean_meta"]["policy_version"] == POLICY_VERSION
    # good[0] from parquet bytes and good.png from the JSON Lines source: one row, both sources named.
    shared = next(r for r in ds if r["image_sha256"] == hashlib.sha256(tools.rgb_png(100)).hexdigest())
    assert [q["question"] for q in shared["qa"]] == [f"How many objects?\n{INSTRUCTION}", f"Is it shiny?\n{INSTRUCTION}"]
    assert shared["qa"][0]["answers"] == ["3"]  # the merged copy's "3 " is the same answer
    assert shared["clean_meta"]["source_dataset"] == " + ".join(
        f"local:{s['data_files'][0]}" for s in sources
    )
    assert shared["clean_meta"]["source_row_ids"] == ["p0", "paths.jsonl:1"]  # line 1 of the JSON Lines file
    assert "dedup_merge@1" in shared["clean_meta"]["steps"]
    mc = next(q for r in ds for q in r["qa"] if q["question"].startswith("Which shape?"))
    assert mc["question"] == f"Which shape?\nA. cube\nB. sphere\n{INSTRUCTION}"
    assert mc["answers"] == ["B"] and mc["options"] == ["cube", "sphere"]


def test_rows_embed_image_bytes_and_match_the_schema(tmp_path, tools):
    sources, _, _ = bad_pool(tmp_path, tools)
    recipe = tools.make_recipe(tmp_path / "out", sources)
    report = run_prepare(recipe)
    prepared = OutputLayout(recipe.output_dir).prepared
    assert sorted(os.listdir(prepared)) == ["data-00000-of-00001.parquet", "prepare_report.json"]
    table = pq.read_table(prepared / report["shards"][0])
    assert datasets.Features.from_arrow_schema(table.schema) == PREPARED_FEATURES
    for image, sha in zip(table.column("image").to_pylist(), table.column("image_sha256").to_pylist()):
        assert image["path"] is None
        assert hashlib.sha256(image["bytes"]).hexdigest() == sha
        Image.open(io.BytesIO(image["bytes"])).load()
    shas = table.column("image_sha256").to_pylist()
    assert shas == sorted(shas)  # stable order: family, then image hash


def test_ids_are_unique_and_content_addressed(tmp_path, tools):
    sources, _, _ = bad_pool(tmp_path, tools)
    ds = load_prepared(run_prepare(tools.make_recipe(tmp_path / "out", sources)) and tmp_path / "out")
    ids = [q["id"] for r in ds for q in r["qa"]]
    assert len(ids) == len(set(ids))
    from rsgen.prepare.cleaning import qa_id

    for row in ds:
        for q in row["qa"]:
            assert q["id"] == qa_id(row["family"], row["image_sha256"], q["question"])


def prepared_bytes(output_dir) -> dict[str, bytes]:
    prepared = OutputLayout(output_dir).prepared
    return {name: (prepared / name).read_bytes() for name in sorted(os.listdir(prepared))}


def test_demo_pool_is_byte_identical_across_runs_and_process_counts(tmp_path, tools):
    one = tools.make_recipe(tmp_path / "a", [DEMO_SOURCE], prepare_num_proc=1)
    two = tools.make_recipe(tmp_path / "b", [DEMO_SOURCE], prepare_num_proc=2)
    report = run_prepare(one)
    run_prepare(two)
    first, second = prepared_bytes(one.output_dir), prepared_bytes(two.output_dir)
    assert list(first) == ["data-00000-of-00001.parquet", "prepare_report.json"]
    assert first == second
    assert report["rows"] == 30 and report["dropped_qa_pairs"] == 0
    assert set(report["families"]) == {"CLEVRMath", "DemoChart", "DemoMC"}
    ds_a, ds_b = load_prepared(one.output_dir), load_prepared(two.output_dir)
    assert [q["id"] for r in ds_a for q in r["qa"]] == [q["id"] for r in ds_b for q in r["qa"]]
    # Every demo MC question ends up as a lettered block with a letter answer.
    for row in ds_a:
        for q in row["qa"]:
            if row["family"] == "DemoMC":
                assert q["options"] and q["answers"][0] in "ABCDEFGH"[: len(q["options"])]
            assert q["question"].endswith("\n" + INSTRUCTION)


def test_bad_pool_gives_the_same_bytes_with_worker_processes(tmp_path, tools):
    """Image checks in spawned workers (bad images, paths read by the worker, conversions) change nothing."""
    sources, dropped, _ = bad_pool(tmp_path, tools)
    inline = tools.make_recipe(tmp_path / "a", sources, prepare_num_proc=1)
    workers = tools.make_recipe(tmp_path / "b", sources, prepare_num_proc=2)
    assert run_prepare(workers)["dropped"] == dropped
    run_prepare(inline)
    assert prepared_bytes(inline.output_dir) == prepared_bytes(workers.output_dir)


def test_finished_pool_is_reused_and_force_redoes_it(tmp_path, tools):
    recipe = tools.make_recipe(tmp_path / "out", [{**DEMO_SOURCE, "demo_num_images": 5}])
    first = run_prepare(recipe)
    shard = OutputLayout(recipe.output_dir).prepared / first["shards"][0]
    stamp = shard.stat().st_mtime_ns
    assert run_prepare(recipe) == first
    assert shard.stat().st_mtime_ns == stamp
    # A different recipe is not served the old pool.
    recipe.instruction = "Answer with a number."
    changed = run_prepare(recipe)
    assert changed["recipe_fingerprint"] != first["recipe_fingerprint"]
    assert all(q["question"].endswith("\nAnswer with a number.") for r in load_prepared(recipe.output_dir) for q in r["qa"])
    again = run_prepare(recipe, force=True)
    assert again == changed
    assert not (tmp_path / "out" / "prepared.partial").exists()


def test_source_id_naming_two_images_is_a_provenance_drop(tmp_path, tools):
    rows = [
        {"image": tools.rgb_png(1), "question": "q1", "answer": "a", "sid": "img-1"},
        {"image": tools.rgb_png(1), "question": "q2", "answer": "b", "sid": "img-1"},
        {"image": tools.rgb_png(2), "question": "q3", "answer": "c", "sid": "img-2"},
        {"image": tools.rgb_png(3), "question": "q4", "answer": "d", "sid": "img-2"},  # img-2 on another image
    ]
    path = write_parquet(rows, tmp_path / "p.parquet")
    recipe = tools.make_recipe(tmp_path / "out", [{"data_files": [str(path)], "family": "F", "source_id_column": "sid"}])
    report = run_prepare(recipe)
    assert report["dropped"] == {"provenance_source_id_conflict": 2}
    (row,) = load_prepared(recipe.output_dir)
    assert row["clean_meta"]["source_row_ids"] == ["img-1"]


def test_image_reference_that_does_not_resolve_is_dropped(tmp_path, tools):
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "cat.png").write_bytes(tools.rgb_png(1))
    (tmp_path / "imgs" / "dog.png").write_bytes(tools.rgb_png(2))
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [
        {"image": "imgs/cat.png", "ref": "cat.png", "question": "q1", "answer": "a"},
        {"image": "imgs/cat.png", "ref": "imgs/dog.png", "question": "q2", "answer": "a"},  # names another file
        {"image": "imgs/dog.png", "ref": "", "question": "q3", "answer": "a"},
        {"image": "imgs/dog.png", "ref": hashlib.sha256(tools.rgb_png(2)).hexdigest(), "question": "q4", "answer": "a"},
    ]))
    recipe = tools.make_recipe(tmp_path / "out", [{"data_files": [str(path)], "family": "F", "image_ref_column": "ref"}])
    report = run_prepare(recipe)
    assert report["dropped"] == {"provenance_mismatch": 1, "provenance_missing_ref": 1}
    assert report["kept_qa_pairs"] == 2


def test_task_purity_keeps_only_benchmark_questions(tmp_path, tools):
    rows = [
        {"image": tools.rgb_png(1), "question": "Subtract all red things. How many objects are left?", "answer": "2",
         "sid": "clevr_math/1"},
        {"image": tools.rgb_png(1), "question": "What is in the picture?", "answer": "cubes", "sid": "clevr_math/2"},
        {"image": tools.rgb_png(1), "question": "Subtract all cubes. How many objects are left?", "answer": "1",
         "sid": "general_vqa/3"},
    ]
    path = write_parquet(rows, tmp_path / "p.parquet")
    recipe = tools.make_recipe(tmp_path / "out", [{
        "data_files": [str(path)], "family": "CLEVRMath", "source_id_column": "sid",
        "keep_question_patterns": [r"How many objects are left\?$"], "source_allowlist": ["clevr_math"],
    }])
    report = run_prepare(recipe)
    assert report["dropped"] == {"purity_question_pattern": 1, "purity_source": 1}
    assert report["families"]["CLEVRMath"]["kept_qa_pairs"] == 1


def write_recipe(path, output_dir, sources) -> str:
    import yaml

    path.write_text(yaml.safe_dump({"output_dir": str(output_dir), "sources": sources, "prepare_num_proc": 1,
                                    "model_name_or_path": "rsgen-demo"}))
    return str(path)


def test_pool_whose_rows_are_all_dropped_exits_2_with_examples(tmp_path, tools, pool_format, capsys):
    from rsgen.cli import main

    rows = [{"image": tools.rgb_png(i), "question": f"q{i}?", "answer": ""} for i in range(4)]
    rows.append({"image": b"junk", "question": "bad image?", "answer": "a"})
    source = tools.write_pool(tmp_path / "pool", pool_format, rows)
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        main(["prepare", "--config", write_recipe(tmp_path / "r.yaml", out, [source])])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    wheres = tools.record_wheres(source)  # the line of each record (text files), the row index (parquet)
    assert "none of the 5 QA pairs survived cleaning" in err
    assert "answer_empty: 4" in err and "image_undecodable: 1" in err
    assert f"sources[0] row {wheres[0]} = \"\"" in err  # the row and the value that failed
    bad_image = "<4 bytes>" if pool_format == "parquet" else "img4.png"
    assert f"sources[0] row {wheres[4]} = \"{bad_image}\"" in err
    report = json.loads((out / "prepared.partial" / "prepare_report.json").read_text())
    assert str(out / "prepared.partial" / "prepare_report.json") in err
    assert [e["source_row_id"] for e in report["examples"]["answer_empty"]] == wheres[:3]
    assert not (out / "prepared").exists()  # never mistaken for a finished pool


def test_run_stops_at_prepare_when_every_row_is_dropped(tmp_path, tools, capsys):
    from rsgen.cli import main

    # Image paths resolve against data_dir, a folder without them.
    source = tools.write_pool(tmp_path / "pool", "csv", [{"image": tools.rgb_png(0), "question": "q?", "answer": "a"}],
                              data_dir=str(tmp_path / "elsewhere"))
    with pytest.raises(SystemExit) as exit_info:
        main(["run", "--config", write_recipe(tmp_path / "r.yaml", tmp_path / "out", [source])])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "image_file_missing: 1 (image paths resolve against the source's data_dir" in err
    assert "no generate work" not in err and "rsgen generate" not in err
    assert not (tmp_path / "out" / "work").exists()


def test_report_keeps_examples_per_reason(tmp_path, tools):
    sources, dropped, _ = bad_pool(tmp_path, tools)
    report = run_prepare(tools.make_recipe(tmp_path / "out", sources))
    examples = report["examples"]
    assert set(examples) == set(dropped) | {"duplicate_question"}  # merged copies are shown too
    # p1 repeats p0's question and answer on the same image: merged into it, and the report says which into which.
    assert examples["duplicate_question"] == [
        {"source": "sources[0]", "source_row_id": "p1", "where": "bytes.parquet:1",
         "value": {"question": f"How many objects?\n{INSTRUCTION}", "answers": ["3"], "merged_into": "bytes.parquet:0"}}]
    assert all(1 <= len(examples[r]) <= min(n, 3) for r, n in dropped.items())
    assert examples["image_file_missing"] == [
        {"source": "sources[1]", "source_row_id": "paths.jsonl:16", "value": "missing.png"}]
    assert examples["row_unparseable"] == [
        {"source": "sources[1]", "source_row_id": "paths.jsonl:19", "value": "{broken json\n"}]
    assert examples["answer_not_string"][0] == {"source": "sources[1]", "source_row_id": "paths.jsonl:9",
                                               "value": {"text": "a"}}
    assert examples["image_truncated"][0]["value"].endswith(" bytes>")
    assert [(e["source_row_id"], e["where"], e["value"]["answers"]) for e in examples["duplicate_conflicting_answers"]] \
        == [("p2", "bytes.parquet:2", ["red"]), ("p3", "bytes.parquet:3", ["blue"])]


def test_recipe_without_sources_is_an_error(tmp_path, tools):
    from rsgen.config import RecipeError

    with pytest.raises(RecipeError, match="no `sources`"):
        run_prepare(tools.make_recipe(tmp_path / "out", []))


def test_load_prepared_without_a_pool_says_what_to_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="rsgen prepare"):
        load_prepared(tmp_path)


@pytest.mark.slow  # spawns image workers
def test_image_workers_start_with_one_blas_thread_and_leave_the_parent_environment_as_it_was(monkeypatch):
    """Each image worker is one process per core: numpy's BLAS threads in it would only contend for the same
    cores (the gate's products), so the workers start with one; the main process's own settings stay."""
    from rsgen.prepare.stage import ImageWorkers

    monkeypatch.setenv("OMP_NUM_THREADS", "7")
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    with ImageWorkers(2) as workers:
        seen = [workers.pool.apply(os.getenv, (name,))
                for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")]
    assert seen == ["1", "1", "1"]
    assert os.environ["OMP_NUM_THREADS"] == "7" and "OPENBLAS_NUM_THREADS" not in os.environ
