"""The procedural demo pool: deterministic, every answer recomputable from its scene, loadable with `datasets`."""

import io
import json
from collections import Counter

import datasets
import pytest
from PIL import Image

from rsgen.demo import answer_from_scene, make_demo_rows, mc_option_texts, write_demo_pool
from rsgen.demo.pool import LETTERS, parse_descriptor, solve_from_scene
from rsgen.engine import demo_model_path

ROW_KEYS = {"image", "question", "answer", "options", "family", "source", "source_id", "scene"}


@pytest.fixture(scope="module")
def pool_rows():
    return list(make_demo_rows(120, seed=3))


def test_same_seed_same_pool_other_seed_other_pool(pool_rows):
    assert list(make_demo_rows(120, seed=3)) == pool_rows
    other = list(make_demo_rows(120, seed=4))
    assert [r["image"] for r in other] != [r["image"] for r in pool_rows]
    assert [r["question"] for r in other] != [r["question"] for r in pool_rows]


def test_smaller_pool_is_a_prefix(pool_rows):
    small = list(make_demo_rows(10, seed=3))
    assert small == pool_rows[: len(small)]


def test_every_answer_recomputed_from_the_scene_matches(pool_rows):
    for row in pool_rows:
        expected = answer_from_scene(row["scene"], row["question"], row["options"])
        if row["family"] == "DemoMC":
            _, options = mc_option_texts(row["question"], row["options"])
            assert len(options) >= 2, row
            assert options.count(expected) == 1, row
            letter = LETTERS[options.index(expected)]
            assert row["answer"] in (expected, letter), row
        else:
            assert row["answer"] == expected, row


def test_rows_have_the_contract_fields_and_families(pool_rows):
    families = Counter(r["family"] for r in pool_rows)
    assert set(families) == {"CLEVRMath", "DemoChart", "DemoMC"}
    per_image = Counter(r["image"] for r in pool_rows)
    assert min(per_image.values()) >= 2  # several QA pairs per image
    source_ids = [r["source_id"] for r in pool_rows]
    assert len(set(source_ids)) == len(source_ids)
    for row in pool_rows:
        assert set(row) == ROW_KEYS
        assert row["source"] == "rsgen-demo"
        assert isinstance(row["answer"], str) and row["answer"]
        scene = json.loads(row["scene"])
        if scene["kind"] == "clevr":
            assert 3 <= len(scene["objects"]) <= 10
        image = Image.open(io.BytesIO(row["image"]))
        assert image.format == "PNG" and image.size == (scene["width"], scene["height"])


def test_clevr_math_templates_are_present(pool_rows):
    questions = [r["question"] for r in pool_rows if r["family"] == "CLEVRMath"]
    assert any(q.startswith("Subtract all ") and q.count("Subtract all") == 2 for q in questions)
    assert any(q.startswith("Add ") and q.endswith("How many objects exist?") for q in questions)
    assert any(q == "How many objects are there?" for q in questions)


def test_mc_rows_come_in_prose_lettered_and_column_styles(pool_rows):
    mc = [r for r in pool_rows if r["family"] == "DemoMC"]
    assert any(" Options: " in r["question"] and not r["options"] for r in mc)
    assert any("\nA. " in r["question"] and not r["options"] for r in mc)
    assert any(r["options"] for r in mc)
    assert any(r["answer"] in LETTERS for r in mc)
    assert any(r["answer"] not in LETTERS for r in mc)


def test_chart_has_numeric_and_text_answers(pool_rows):
    chart = [r for r in pool_rows if r["family"] == "DemoChart"]
    assert any(r["answer"].isdigit() for r in chart)
    assert any(not r["answer"].isdigit() for r in chart)


def test_interpreter_on_hand_made_scenes():
    objects = [
        {"shape": "cube", "size": "large", "material": "rubber", "color": "blue"},
        {"shape": "sphere", "size": "large", "material": "metal", "color": "blue"},
        {"shape": "cylinder", "size": "small", "material": "rubber", "color": "gray"},
        {"shape": "cube", "size": "large", "material": "rubber", "color": "red"},
        {"shape": "sphere", "size": "small", "material": "metal", "color": "gray"},
    ]
    scene = {"kind": "clevr", "objects": objects}
    q = "Subtract all big blue things. Subtract all large rubber objects. How many objects are left?"
    assert answer_from_scene(scene, q) == "2"  # the big blue cube is counted once
    assert answer_from_scene(scene, "Add 1 matte objects. How many objects exist?") == "6"
    assert answer_from_scene(scene, "Add 2 matte objects. How many rubber things exist?") == "5"
    assert answer_from_scene(scene, "How many shiny balls are there?") == "2"
    assert answer_from_scene(scene, "Subtract 1 gray things. How many gray things are left?") == "1"
    assert (
        answer_from_scene(scene, "What color is the small rubber cylinder? Options: red, gray, blue.")
        == "gray"
    )
    assert answer_from_scene(scene, "What shape is the red thing?\nA. sphere\nB. cube") == "cube"
    with pytest.raises(ValueError, match="no single"):
        answer_from_scene(scene, "Which shape appears most often?")  # cubes and spheres tie
    with pytest.raises(ValueError, match="unknown"):
        answer_from_scene(scene, "Add 2 matte objects. How many red things exist?")
    with pytest.raises(ValueError, match="only 1 present"):
        answer_from_scene(scene, "Subtract 2 red things. How many objects are left?")
    with pytest.raises(ValueError, match="exactly one"):
        answer_from_scene(scene, "What color is the big cube?")
    with pytest.raises(ValueError):
        answer_from_scene(scene, "How many purple dragons are there?")

    chart = {"kind": "chart", "bars": [{"label": "apple", "value": 7}, {"label": "lime", "value": 9}]}
    assert answer_from_scene(chart, "What is the sum of apple and lime?") == "16"
    assert answer_from_scene(chart, "Which fruit has the highest value?") == "lime"
    assert answer_from_scene(chart, "What is the difference between apple and lime?") == "2"
    assert solve_from_scene(chart, "What is the value of apple?")[1] == ["The apple bar reaches 7."]


def test_parse_descriptor_synonyms():
    assert parse_descriptor("big blue things") == {"size": "large", "color": "blue"}
    assert parse_descriptor("tiny shiny balls") == {"size": "small", "material": "metal", "shape": "sphere"}
    assert parse_descriptor("matte blocks") == {"material": "rubber", "shape": "cube"}
    with pytest.raises(ValueError, match="two size"):
        parse_descriptor("big small cubes")


def test_write_demo_pool_loads_with_an_image_column(tmp_path):
    path = write_demo_pool(tmp_path / "pool" / "demo.parquet", num_images=8, seed=11)
    ds = datasets.load_dataset(
        "parquet", data_files=str(path), split="train", cache_dir=str(tmp_path / "cache")
    )
    assert isinstance(ds.features["image"], datasets.Image)
    rows = list(make_demo_rows(8, seed=11))
    assert len(ds) == len(rows)
    assert ds[0]["question"] == rows[0]["question"] and ds[0]["answer"] == rows[0]["answer"]
    assert ds[0]["image"].size == (168, 112)
    raw = ds.cast_column("image", datasets.Image(decode=False))
    assert raw[0]["image"]["bytes"] == rows[0]["image"]


def test_demo_model_path_points_inside_the_package():
    path = demo_model_path()
    assert path.name == "model" and path.parent.name == "demo"
