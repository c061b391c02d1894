"""Each supported source shape, as a local copy: flat pools (list answers like ChartQA's `label`), the_cauldron,
LLaVA conversations, JSON Lines / CSV with image paths, an image folder, and the Hub loader on a local dataset."""

import io
import json

import datasets
import pytest
from PIL import Image

from rsgen.config import RecipeError, source_from_dict
from rsgen.prepare import run_prepare
from rsgen.prepare.sources import iter_raw_rows
from rsgen.schema import load_prepared

INSTRUCTION = "Answer in short without any other content."


def write_dataset(rows, features, path):
    ds = datasets.Dataset.from_list(rows, features=features)
    ds.to_parquet(str(path))
    return path


def chartqa_like(tools, n=4):
    features = datasets.Features(
        {
            "image": datasets.Image(),
            "query": datasets.Value("string"),
            "label": datasets.List(datasets.Value("string")),
            "human_or_machine": datasets.Value("int64"),
        }
    )
    rows = [
        {"image": tools.rgb_png(i), "query": f"What is the value of bar {i}?", "label": [str(i * 10)],
         "human_or_machine": i % 2}
        for i in range(n)
    ]
    rows.append({"image": tools.rgb_png(0), "query": "Which bar is highest?", "label": ["B", "b"],
                 "human_or_machine": 0})
    return rows, features


def cauldron_like(tools):
    features = datasets.Features(
        {
            "images": datasets.List(datasets.Image()),
            "texts": datasets.List(
                {"user": datasets.Value("string"), "assistant": datasets.Value("string"),
                 "source": datasets.Value("string")}
            ),
        }
    )
    rows = [
        {"images": [tools.rgb_png(10)], "texts": [
            {"user": "Subtract all red cubes. How many objects are left?", "assistant": "Answer: 3.", "source": "clevr_math"},
            {"user": "Add 1 matte objects. How many objects exist?", "assistant": "Answer: 6.", "source": "clevr_math"},
        ]},
        {"images": [tools.rgb_png(11), tools.rgb_png(12)], "texts": [
            {"user": "Compare the two images.", "assistant": "Answer: same.", "source": "clevr_math"},
        ]},
        {"images": [tools.rgb_png(13)], "texts": [
            {"user": "What is the man holding?", "assistant": "Answer: kite.", "source": "infinitymm_general"},
        ]},
    ]
    return rows, features


def prepared(recipe):
    report = run_prepare(recipe)
    return report, load_prepared(recipe.output_dir)


def all_qa(ds):
    return [qa for row in ds for qa in row["qa"]]


def test_flat_parquet_with_list_answers(tmp_path, tools):
    rows, features = chartqa_like(tools)
    path = write_dataset(rows, features, tmp_path / "chartqa.parquet")
    recipe = tools.make_recipe(tmp_path / "out", [
        {"data_files": [str(path)], "question_column": "query", "answer_column": "label", "family": "ChartQA"}
    ])
    report, ds = prepared(recipe)
    assert report["input_qa_pairs"] == 5 and report["kept_qa_pairs"] == 5
    assert len(ds) == 4  # image 0 carries two questions
    by_q = {qa["question"]: qa for qa in all_qa(ds)}
    assert by_q[f"Which bar is highest?\n{INSTRUCTION}"]["answers"] == ["B", "b"]
    assert by_q[f"What is the value of bar 3?\n{INSTRUCTION}"]["answers"] == ["30"]
    assert {row["family"] for row in ds} == {"ChartQA"}
    assert all(row["clean_meta"]["source_dataset"] == f"local:{path}" for row in ds)


@pytest.mark.parametrize("streaming", [False, True])
def test_hub_loader_on_a_local_dataset_repo(tmp_path, tools, streaming):
    """`dataset_name` goes through datasets.load_dataset; a local folder laid out like a Hub repo stands in for it."""
    rows, features = chartqa_like(tools)
    repo = tmp_path / "ChartQA"
    (repo / "data").mkdir(parents=True)
    write_dataset(rows, features, repo / "data" / "train-00000-of-00001.parquet")
    recipe = tools.make_recipe(tmp_path / "out", [
        {"dataset_name": str(repo), "split": "train", "streaming": streaming, "question_column": "query",
         "answer_column": "label", "family": "ChartQA", "max_rows": 3}
    ])
    report, ds = prepared(recipe)
    assert report["sources"][0]["source_rows"] == 3 and report["kept_qa_pairs"] == 3
    assert report["sources"][0]["source_dataset"] == str(repo)
    # Images come through as the stored bytes, not re-encoded.
    original = {tools.rgb_png(i) for i in range(3)}
    assert {row["image"]["bytes"] for row in ds.cast_column("image", datasets.Image(decode=False))} == original


def test_hub_loader_missing_column_names_what_exists(tmp_path, tools):
    rows, features = chartqa_like(tools)
    repo = tmp_path / "repo"
    (repo / "data").mkdir(parents=True)
    write_dataset(rows, features, repo / "data" / "train.parquet")
    recipe = tools.make_recipe(tmp_path / "out", [{"dataset_name": str(repo), "question_column": "question",
                                                    "answer_column": "label", "family": "ChartQA"}])
    with pytest.raises(RecipeError, match=r"no column 'question' \(question_column\).*human_or_machine, image, label, query"):
        run_prepare(recipe)


def test_hub_loader_unloadable_dataset_is_a_clear_error(tmp_path, tools):
    recipe = tools.make_recipe(tmp_path / "out", [{"dataset_name": str(tmp_path / "nothing-here"), "family": "F"}])
    with pytest.raises(RecipeError, match="cannot load"):
        run_prepare(recipe)


@pytest.mark.parametrize("via_hub_loader", [False, True])
def test_cauldron_format(tmp_path, tools, via_hub_loader):
    rows, features = cauldron_like(tools)
    if via_hub_loader:
        repo = tmp_path / "the_cauldron"
        (repo / "clevr_math").mkdir(parents=True)
        write_dataset(rows, features, repo / "clevr_math" / "train-00000-of-00001.parquet")
        where = {"dataset_name": str(repo), "data_files": ["clevr_math/*.parquet"]}
    else:
        where = {"data_files": [str(write_dataset(rows, features, tmp_path / "cauldron.parquet"))]}
    recipe = tools.make_recipe(tmp_path / "out", [{
        **where, "format": "cauldron", "family": "CLEVRMath", "question_template": "Question: {question}",
        "answer_normalization": ["strip_answer_prefix", "strip_trailing_period"],
        "source_allowlist": ["clevr_math"],
    }])
    report, ds = prepared(recipe)
    assert report["input_qa_pairs"] == 4
    assert report["kept_qa_pairs"] == 2
    assert report["dropped"] == {"multi_image": 1, "purity_source": 1}
    assert report["converted"]["answer_normalized:strip_answer_prefix"] == 2
    (row,) = ds
    assert [qa["question"] for qa in row["qa"]] == [
        f"Question: Subtract all red cubes. How many objects are left?\n{INSTRUCTION}",
        f"Question: Add 1 matte objects. How many objects exist?\n{INSTRUCTION}",
    ]
    assert [qa["answers"] for qa in row["qa"]] == [["3"], ["6"]]
    # A local row names its file; a Hub row its split.
    first = "train:0" if via_hub_loader else "cauldron.parquet:0"
    assert [qa["source_row_id"] for qa in row["qa"]] == [f"{first}#0", f"{first}#1"]
    assert "task_purity@1" in row["clean_meta"]["steps"] and "answer_normalize@2" in row["clean_meta"]["steps"]


def llava_rows(tools, folder):
    (folder / "coco").mkdir(parents=True)
    for i in range(3):
        image = Image.open(io.BytesIO(tools.rgb_png(20 + i)))
        (folder / "coco" / f"{i:012d}.jpg").write_bytes(tools.encode(image, "JPEG"))
    return [
        {"id": "000000000000", "image": "coco/000000000000.jpg", "conversations": [
            {"from": "human", "value": "<image>\nWhat color is the bus?"},
            {"from": "gpt", "value": "Red"},
            {"from": "human", "value": "How many wheels are visible?"},
            {"from": "gpt", "value": "4"},
        ]},
        {"id": "000000000001", "image": "coco/000000000001.jpg", "conversations": [
            {"from": "human", "value": "What is on the table?\n<image>"},
            {"from": "gpt", "value": "A cake"},
            {"from": "human", "value": "Is it a birthday?"},
        ]},
        {"id": "000000000002", "image": "coco/000000000002.jpg", "conversations": [
            {"from": "human", "value": "<image>\nCompare with <image>"},
            {"from": "gpt", "value": "Same"},
        ]},
        {"id": "text-only", "conversations": [
            {"from": "human", "value": "Tell me a joke."},
            {"from": "gpt", "value": "No."},
        ]},
    ]


@pytest.mark.parametrize("layout", ["json_array", "jsonl"])
def test_llava_format(tmp_path, tools, layout):
    images = tmp_path / "images"
    rows = llava_rows(tools, images)
    path = tmp_path / ("llava.json" if layout == "json_array" else "llava.jsonl")
    if layout == "json_array":
        path.write_text(json.dumps(rows, indent=1))
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    recipe = tools.make_recipe(tmp_path / "out", [{
        "data_files": [str(path)], "data_dir": str(images), "format": "llava", "family": "LLaVA",
        "source_id_column": "id",
    }])
    report, ds = prepared(recipe)
    assert report["input_qa_pairs"] == 6
    assert report["dropped"] == {"answer_missing": 1, "image_missing": 1, "multi_image": 1}
    assert report["kept_qa_pairs"] == 3
    by_q = {qa["question"].split("\n")[0]: qa for qa in all_qa(ds)}
    assert set(by_q) == {"What color is the bus?", "How many wheels are visible?", "What is on the table?"}
    assert "<image>" not in "".join(by_q)
    assert by_q["What is on the table?"]["answers"] == ["A cake"]
    assert by_q["How many wheels are visible?"]["source_row_id"] == "000000000000#1"


def test_json_array_streams_large_files_in_chunks(tmp_path):
    from rsgen.prepare.sources import _iter_json_array

    rows = [{"i": i, "text": "x" * (i % 50), "nested": {"a": [1, 2, {"b": "]"}]}} for i in range(500)]
    path = tmp_path / "big.json"
    path.write_text(json.dumps(rows))
    assert [record for _line, record in _iter_json_array(str(path), chunk_chars=256)] == rows
    # Each record comes with the line where it starts, across chunk boundaries.
    path.write_text(json.dumps(rows, indent=1))
    starts = [n for n, line in enumerate(path.read_text().splitlines(), 1) if line == " {"]
    assert list(_iter_json_array(str(path), chunk_chars=256)) == list(zip(starts, rows))


def test_jsonl_and_csv_with_image_paths(tmp_path, tools):
    (tmp_path / "imgs").mkdir()
    for i in range(3):
        (tmp_path / "imgs" / f"{i}.png").write_bytes(tools.rgb_png(30 + i))
    jsonl = tmp_path / "pool.jsonl"
    jsonl.write_text(
        json.dumps({"img": "imgs/0.png", "q": "How many?", "a": 3}) + "\n"
        + json.dumps({"img": str(tmp_path / "imgs" / "1.png"), "q": "Which?", "a": "left"}) + "\n"
        + "{not json\n"
        + json.dumps({"img": "imgs/missing.png", "q": "Where?", "a": "here"}) + "\n"
    )
    csv_file = tmp_path / "pool.csv"
    csv_file.write_text('img,q,a\nimgs/2.png,"What number, exactly?",007\nimgs/0.png,How many?,3\n')
    recipe = tools.make_recipe(tmp_path / "out", [
        {"data_files": [str(jsonl)], "image_column": "img", "question_column": "q", "answer_column": "a",
         "family": "Local"},
        {"data_files": [str(csv_file)], "image_column": "img", "question_column": "q", "answer_column": "a",
         "family": "Local"},
    ])
    report, ds = prepared(recipe)
    assert report["input_qa_pairs"] == 6
    assert report["dropped"] == {"image_file_missing": 1, "row_unparseable": 1}
    assert report["merged"] == {"duplicate_question": 1}  # "How many?" on imgs/0.png in both files
    assert report["converted"]["answer_number_to_string"] == 1
    assert report["kept_qa_pairs"] == 3 and len(ds) == 3
    by_q = {qa["question"].split("\n")[0]: qa for qa in all_qa(ds)}
    assert by_q["What number, exactly?"]["answers"] == ["007"]  # CSV text kept as written
    assert by_q["How many?"]["answers"] == ["3"]
    merged_row = next(r for r in ds if any(q["question"].startswith("How many?") for q in r["qa"]))
    assert merged_row["clean_meta"]["source_dataset"] == f"local:{jsonl}"
    assert "dedup_merge@1" in merged_row["clean_meta"]["steps"]


def test_image_folder(tmp_path, tools):
    train = tmp_path / "folder" / "train"
    train.mkdir(parents=True)
    for i in range(2):
        (train / f"{i}.png").write_bytes(tools.rgb_png(40 + i))
    (train / "metadata.jsonl").write_text(
        json.dumps({"file_name": "0.png", "question": "What is it?", "answer": "a dot"}) + "\n"
        + json.dumps({"file_name": "0.png", "question": "How many dots?", "answer": "1"}) + "\n"
        + json.dumps({"file_name": "1.png", "question": "What is it?", "answer": "a line"}) + "\n"
    )
    recipe = tools.make_recipe(tmp_path / "out", [{"data_dir": str(tmp_path / "folder"), "family": "Folder",
                                                    "image_ref_column": "file_name"}])
    report, ds = prepared(recipe)
    assert report["kept_qa_pairs"] == 3 and len(ds) == 2
    assert sorted(len(r["qa"]) for r in ds) == [1, 2]
    assert all("provenance@1" in r["clean_meta"]["steps"] for r in ds)


def test_image_folder_without_metadata_is_an_error(tmp_path, tools):
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "0.png").write_bytes(tools.rgb_png(1))
    with pytest.raises(RecipeError, match="no metadata file"):
        run_prepare(tools.make_recipe(tmp_path / "out", [{"data_dir": str(tmp_path / "f"), "family": "F"}]))


def test_local_file_missing_column_names_what_exists(tmp_path, tools):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"image": "x.png", "query": "q", "label": "a"}) + "\n")
    recipe = tools.make_recipe(tmp_path / "out", [{"data_files": [str(path)], "family": "F"}])
    with pytest.raises(RecipeError) as err:
        run_prepare(recipe)
    message = str(err.value)
    assert "'question' (question_column)" in message and "'answer' (answer_column)" in message
    assert "image, label, query" in message
    assert not (tmp_path / "out" / "prepared").exists()


def test_bad_data_files_are_clear_errors(tmp_path, tools):
    with pytest.raises(RecipeError, match="does not exist"):
        run_prepare(tools.make_recipe(tmp_path / "o", [{"data_files": [str(tmp_path / "no.parquet")], "family": "F"}]))
    (tmp_path / "x.txt").write_text("hi")
    with pytest.raises(RecipeError, match="use .parquet, .jsonl"):
        run_prepare(tools.make_recipe(tmp_path / "o", [{"data_files": [str(tmp_path / "x.txt")], "family": "F"}]))


def test_misspelled_source_key_names_the_right_one():
    with pytest.raises(RecipeError, match="unknown key 'question_colum'.*Did you mean 'question_column'"):
        source_from_dict({"dataset_name": "x", "family": "F", "question_colum": "q"})


def test_family_from_a_column(tmp_path, tools):
    path = tmp_path / "p.jsonl"
    (tmp_path / "a.png").write_bytes(tools.rgb_png(1))
    path.write_text("".join(json.dumps(r) + "\n" for r in [
        {"image": "a.png", "question": "q1", "answer": "1", "fam": "Alpha"},
        {"image": "a.png", "question": "q1", "answer": "1", "fam": "Beta"},
        {"image": "a.png", "question": "q2", "answer": "2", "fam": None},
        {"image": "a.png", "question": "q3", "answer": "3", "fam": "bad name/x"},
    ]))
    report, ds = prepared(tools.make_recipe(tmp_path / "out", [{"data_files": [str(path)], "family_column": "fam"}]))
    # One image, two families: one row per family.
    assert [r["family"] for r in ds] == ["Alpha", "Beta"]
    assert len({r["image_sha256"] for r in ds}) == 1
    assert report["dropped"] == {"family_invalid": 1, "family_missing": 1}
    assert report["families"]["(unknown)"]["dropped_qa_pairs"] == 2
    assert report["families"]["Alpha"]["kept_qa_pairs"] == 1


def test_raw_rows_of_the_demo_pool():
    source = source_from_dict({"dataset_name": "rsgen-demo", "demo_num_images": 2, "demo_seed": 5,
                               "family_column": "family", "options_column": "options", "source_id_column": "source_id"})
    rows = list(iter_raw_rows(source, 0))
    assert rows and all(len(r.qas) == 1 for r in rows)
    assert rows[0].source_row_id == "5/0/0" and isinstance(rows[0].image, bytes)


# ------------------------------------------------------------------------------------------------ row ids, columns


def test_source_row_id_names_the_file(tmp_path, tools, pool_format):
    rows = [{"image": tools.rgb_png(i), "question": f"q{i}?", "answer": "a"} for i in range(2)]
    rows.append({"image": b"not an image", "question": "q2?", "answer": "a"})
    source = tools.write_pool(tmp_path / "pool", pool_format, rows)
    report, ds = prepared(tools.make_recipe(tmp_path / "out", [source]))
    assert report["dropped"] == {"image_undecodable": 1}
    assert sorted(q["source_row_id"] for q in all_qa(ds)) == sorted(tools.record_wheres(source)[:2])


def test_source_row_id_of_files_in_several_folders_is_relative_to_their_common_folder(tmp_path, tools):
    sources = [tools.write_pool(tmp_path / "data" / split, "jsonl",
                                [{"image": tools.rgb_png(i), "question": f"{split}?", "answer": "a"}])
               for i, split in enumerate(["a", "b"])]
    files = sources[0]["data_files"] + sources[1]["data_files"]
    report, ds = prepared(tools.make_recipe(tmp_path / "out", [{"data_files": files, "family": "F"}]))
    assert sorted(q["source_row_id"] for q in all_qa(ds)) == ["a/pool.jsonl:1", "b/pool.jsonl:1"]


@pytest.mark.parametrize("pool_format", ["jsonl", "json", "imagefolder"])
def test_a_column_first_used_late_in_a_json_file_is_found(tmp_path, tools, pool_format):
    rows = [{"image": tools.rgb_png(0), "question": f"q{i}?", "answer": "a"} for i in range(120)]
    rows[110] = {**rows[110], "sid": "late-id"}
    source = tools.write_pool(tmp_path / "pool", pool_format, rows, source_id_column="sid")
    report, ds = prepared(tools.make_recipe(tmp_path / "out", [source]))
    assert report["kept_qa_pairs"] == 120
    ids = {q["question"]: q["source_row_id"] for q in all_qa(ds)}
    assert ids[f"q110?\n{INSTRUCTION}"] == "late-id"


def test_a_column_declared_by_the_schema_is_found_even_when_empty_at_first(tmp_path, tools):
    rows = [{"image": tools.rgb_png(i), "question": f"q{i}?", "answer": "a", "sid": None} for i in range(120)]
    rows[110]["sid"] = "late-id"
    source = tools.write_pool(tmp_path / "pool", "parquet", rows, source_id_column="sid")
    report, _ = prepared(tools.make_recipe(tmp_path / "out", [source]))
    assert report["kept_qa_pairs"] == 120


@pytest.mark.parametrize("pool_format", ["csv", "tsv", "jsonl", "json", "parquet", "imagefolder"])
def test_a_column_absent_from_the_whole_file_is_an_error(tmp_path, tools, pool_format):
    rows = [{"image": tools.rgb_png(0), "question": f"q{i}?", "answer": "a"} for i in range(120)]
    source = tools.write_pool(tmp_path / "pool", pool_format, rows, answer_column="label")
    with pytest.raises(RecipeError, match=r"no column 'label' \(answer_column\).*answer"):
        run_prepare(tools.make_recipe(tmp_path / "out", [source]))


# ------------------------------------------------------------------------------------------------ image lists


def test_flat_list_of_images_with_one_image_is_the_row_image(tmp_path, tools):
    """TRL-style copies of ChartQA store `images: list<Image>`; one image is the row's image."""
    features = datasets.Features({"images": datasets.List(datasets.Image()), "question": datasets.Value("string"),
                                  "answer": datasets.Value("string")})
    rows = [
        {"images": [tools.rgb_png(1)], "question": "one?", "answer": "a"},
        {"images": [tools.rgb_png(2), tools.rgb_png(3)], "question": "two?", "answer": "a"},
        {"images": [], "question": "none?", "answer": "a"},
    ]
    path = write_dataset(rows, features, tmp_path / "trl.parquet")
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "x.png").write_bytes(tools.rgb_png(4))
    jsonl = tmp_path / "paths.jsonl"
    jsonl.write_text(json.dumps({"images": ["imgs/x.png"], "question": "path?", "answer": "b"}) + "\n")
    report, ds = prepared(tools.make_recipe(tmp_path / "out", [
        {"data_files": [str(path)], "family": "F", "image_column": "images"},
        {"data_files": [str(jsonl)], "family": "F", "image_column": "images"},
    ]))
    assert report["dropped"] == {"multi_image": 1, "image_missing": 1}
    assert sorted(q["question"].split("\n")[0] for q in all_qa(ds)) == ["one?", "path?"]


@pytest.mark.parametrize("pool_format", ["csv", "tsv", "jsonl", "json"])
def test_a_byte_order_mark_at_the_start_of_a_text_file_is_not_data(tmp_path, tools, pool_format):
    """Spreadsheet programs save CSV with a UTF-8 byte order mark; it must not become part of `image`."""
    rows = [{"image": tools.rgb_png(i), "question": f"q{i}?", "answer": "a"} for i in range(2)]
    source = tools.write_pool(tmp_path / "pool", pool_format, rows)
    path = tmp_path / "pool" / f"pool.{pool_format}"
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    report, _ = prepared(tools.make_recipe(tmp_path / "out", [source]))
    assert report["kept_qa_pairs"] == 2 and report["dropped"] == {}
