"""Decontamination (issue #24): copies of evaluation images and evaluation questions leave the pool, counted.

Measured on both sides: every transformed copy is found (resized to half, JPEG at quality 60, cropped by 5% at
one edge, padded to another aspect ratio), and unrelated images of the same synthetic kind -- where global
hashes collide -- are not taken for copies, nor is an edited scene (one object moved).
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import yaml
from PIL import Image

from rsgen.cli import main
from rsgen.demo.pool import draw_clevr, make_demo_image
from rsgen.prepare.decontaminate import QuestionIndex, question_grams
from rsgen.prepare.perceptual import (
    GATE_MAX,
    PROPOSE_BITS,
    ImageIndex,
    gate,
    hash_distances,
    image_signature,
    is_copy,
)


def _demo_image(seed: int, index: int) -> Image.Image:
    return Image.open(io.BytesIO(make_demo_image(seed, index)[1])).convert("RGB")


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def half(image):
    return image.resize((image.width // 2, image.height // 2), Image.Resampling.BILINEAR)


def jpeg60(image):
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=60)
    return Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")


def crop5(image):
    return image.crop((0, 0, round(image.width * 0.95), image.height))


def letterbox(image):
    padded = Image.new("RGB", (image.width, round(image.height * 1.4)), (0, 0, 0))
    padded.paste(image, (0, round(image.height * 0.2)))
    return padded


TRANSFORMS = {"half": half, "jpeg60": jpeg60, "crop5": crop5, "letterbox": letterbox}


def _index(tmp_path, images) -> ImageIndex:
    ImageIndex.write(tmp_path / "index", [image_signature(im) for im in images])
    return ImageIndex.open(tmp_path / "index")


def measure(tmp_path, n_eval: int, n_unrelated: int) -> dict:
    evals = [_demo_image(7, i) for i in range(n_eval)]
    index = _index(tmp_path, evals)
    found = {name: sum(index.match(image_signature(f(im))) == i for i, im in enumerate(evals))
             for name, f in TRANSFORMS.items()}
    false = 0
    for i in range(n_unrelated):
        matched = index.match(image_signature(_demo_image(99, i)))
        # Small charts repeat by chance (same bars, same values: the same pixels); a match is false when the
        # scenes differ.
        false += matched is not None and make_demo_image(7, matched)[2] != make_demo_image(99, i)[2]
    return {"found": found, "false_matches": false}


def test_every_transformed_copy_is_found_and_no_unrelated_image_matches(tmp_path):
    measured = measure(tmp_path, 20, 60)
    print("decontamination (20 evaluation images, 60 unrelated):", measured)
    assert measured["found"] == {name: 20 for name in TRANSFORMS}
    assert measured["false_matches"] == 0


@pytest.mark.slow
def test_robustness_measured_on_1000_unrelated_demo_images(tmp_path):
    measured = measure(tmp_path, 100, 1000)
    print("decontamination (100 evaluation images, 1000 unrelated):", measured)
    assert measured["found"] == {name: 100 for name in TRANSFORMS}
    assert measured["false_matches"] == 0


def test_hashes_alone_cannot_decide_so_the_pixel_check_does():
    """An edited scene (one object moved) hashes near its original -- a candidate -- and the pixel check refuses
    it, while a letterboxed copy, whose whole-image hash is far off, is confirmed."""
    _, _, scene, _ = make_demo_image(7, 3)
    objects = [dict(o) for o in scene["objects"]]
    original = draw_clevr(objects)
    objects[0]["x"] = objects[0]["x"] + 40 if objects[0]["x"] < 200 else objects[0]["x"] - 40
    edited = draw_clevr(objects)
    a, b = image_signature(original), image_signature(edited)
    import numpy as np

    near = min(hash_distances(np.array([a.hash_whole], dtype=np.uint64), b.hash_whole)[0],
               hash_distances(np.array([a.hash_content], dtype=np.uint64), b.hash_content)[0])
    assert near <= PROPOSE_BITS, "the edited scene should be proposed: only the pixel check can tell"
    assert not is_copy(a, b)
    assert is_copy(image_signature(letterbox(original)), a)


def _tiny(sig) -> np.ndarray:
    return np.frombuffer(sig.tiny, dtype=np.uint8)[None]


def test_the_gate_passes_every_promised_copy_with_room_and_rejects_a_scene_the_pixel_check_once_took():
    """The gate (8 x 8 cell averages of the aligned content boxes) only rejects, so it must pass every promised copy
    -- with room: at most 3/4 of GATE_MAX here (63 at most measured on 150 demo images) -- and it rejects the pair of
    different scenes that signature version 1's pixel check confirmed (6 solid pixels) in bench_prepare's pool."""
    for i in range(20):
        original = image_signature(_demo_image(7, i))
        for name, transform in TRANSFORMS.items():
            copy = image_signature(transform(_demo_image(7, i)))
            value = gate(_tiny(copy), np.array([copy.aspect]), _tiny(original), np.array([original.aspect]))[0]
            assert value <= 0.75 * GATE_MAX, (i, name, value)
    pool, evaluation = (Image.open(io.BytesIO(make_demo_image(seed, i)[1])).convert("RGB")
                        for seed, i in ((20261202, 967), (20261203, 9944)))
    a, b = image_signature(pool), image_signature(evaluation)
    assert gate(_tiny(a), np.array([a.aspect]), _tiny(b), np.array([b.aspect]))[0] > GATE_MAX


def test_a_batch_of_images_is_matched_as_one_at_a_time(tmp_path, monkeypatch):
    """Workers match a batch at once (proposal and gate vectorised over every pair, in blocks); the decisions are
    those of one image at a time, whatever the block sizes."""
    from rsgen.prepare import perceptual

    index = _index(tmp_path, [_demo_image(7, i) for i in range(20)])
    sigs = [image_signature(f(_demo_image(7, i))) for i in range(0, 20, 3) for f in TRANSFORMS.values()]
    sigs += [image_signature(_demo_image(99, i)) for i in range(30)]
    one_by_one = [index.match(s) for s in sigs]
    assert sum(m is not None for m in one_by_one) == 4 * 7
    assert index.match_many(sigs) == one_by_one
    monkeypatch.setattr(perceptual, "PAIRS_AT_ONCE", 7 * len(index))  # 7 images a block
    monkeypatch.setattr(perceptual, "GATE_AT_ONCE", 3)
    assert index.match_many(sigs) == one_by_one


def test_a_batch_is_signed_as_one_image_at_a_time_and_the_thumbnail_made_late_is_the_same():
    """Workers sign a batch at once (its hashes in one product) and make a pool image's confirmation thumbnail
    only when a candidate reaches the pixel check; neither changes a signature."""
    from rsgen.prepare.perceptual import image_signatures

    images = [_demo_image(7, i) for i in range(6)] + [letterbox(_demo_image(7, 1)), half(_demo_image(7, 2))]
    images.append(Image.new("L", (40, 30), 128))  # uniform and grey: converted, full box
    batch = image_signatures(images)
    for image, signed in zip(images, batch):
        alone = image_signature(image).packed()  # packed: its thumbnail made now, as evaluation images are
        assert isinstance(signed._sharp, tuple)  # not made yet
        assert (signed.hash_whole, signed.hash_content, signed.aspect, signed.tiny) == \
            (alone.hash_whole, alone.hash_content, alone.aspect, alone.tiny)
        assert signed.thumb == alone.thumb and signed.sharp == alone.sharp


def test_a_batch_waiting_to_be_signed_holds_small_copies_that_sign_as_the_decoded_image():
    """A worker signs its batch after checking every image of it: what waits is each image's hashing copy (at most
    BASE_SIDE on its long side), not the decoded image (32 photos of 12 megapixels would be over 1 GB), and it
    signs exactly as the decoded image does."""
    from rsgen.prepare.images import ImageJob, _check_image
    from rsgen.prepare.perceptual import BASE_SIDE

    scene = _demo_image(7, 5)
    large = scene.resize((scene.width * 12, scene.height * 12), Image.Resampling.BICUBIC)  # 2016 x 1344
    job = ImageJob("bytes", _png(large), None, 1 << 30, 1000.0, "index-folder")
    result, waiting = _check_image(job)
    assert result.reason is None and (result.width, result.height) == large.size
    assert max(waiting.size) <= BASE_SIDE
    a, b = image_signature(waiting), image_signature(large)
    assert (a.hash_whole, a.hash_content, a.aspect, a.tiny, a.sharp) == \
        (b.hash_whole, b.hash_content, b.aspect, b.tiny, b.sharp)


def test_an_evaluation_image_that_cannot_be_read_or_signed_is_counted_not_fatal(monkeypatch):
    """Unreadable bytes, and an image Pillow decodes but signing fails on, give None (counted as unreadable by
    the index build); the rest of the batch is signed as it would be alone."""
    from rsgen.prepare import decontaminate, perceptual

    good = [("bytes", _png(_demo_image(7, i))) for i in range(3)]
    odd = ("bytes", _png(Image.new("RGB", (37, 23), (1, 2, 3))))
    real = perceptual.content_box

    def content_box_failing_on_the_odd_size(pixels):  # a fault injected where signing could fail, for one size
        if pixels.shape[:2] == (23, 37):
            raise ValueError("injected")
        return real(pixels)

    monkeypatch.setattr(perceptual, "content_box", content_box_failing_on_the_odd_size)
    out = decontaminate.eval_signatures([good[0], ("bytes", b"not an image"), odd, good[1], good[2]])
    assert [s is None for s in out] == [False, True, True, False, False]
    for (_, data), signed in zip(good, (out[0], out[3], out[4])):
        alone = image_signature(Image.open(io.BytesIO(data)).convert("RGB"))
        assert (signed.hash_whole, signed.hash_content, signed.tiny, signed.sharp) == \
            (alone.hash_whole, alone.hash_content, alone.tiny, alone.sharp)


def _jpeg(image, **kwargs) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=90, **kwargs)
    return buffer.getvalue()


def test_evaluation_images_are_decoded_only_as_large_as_hashing_needs_and_turned_upright(tmp_path):
    """A large evaluation JPEG is decoded at reduced size (Image.draft) and still matches its copies as prepare
    signs them (fully decoded); an evaluation image stored rotated with an EXIF orientation is turned upright, as
    prepare turns pool images, so the pool's upright copy matches it."""
    from rsgen.prepare.decontaminate import eval_signatures
    from rsgen.prepare.perceptual import BASE_SIDE, decode_for_hashing

    scene = _demo_image(7, 4)
    large = _jpeg(scene.resize((scene.width * 8, scene.height * 8), Image.Resampling.BICUBIC))
    assert BASE_SIDE <= max(decode_for_hashing(large).size) < 2 * BASE_SIDE  # 1/4 of 1344 x 896, in the decoder
    rotated = scene.transpose(Image.Transpose.ROTATE_90)
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 clockwise to show": what a camera writes for the pixels of `rotated`
    ImageIndex.write(tmp_path / "large", eval_signatures([("bytes", large)]))
    ImageIndex.write(tmp_path / "rotated", eval_signatures([("bytes", _jpeg(rotated, exif=exif))]))
    for name in ("large", "rotated"):
        index = ImageIndex.open(tmp_path / name)
        for copy in (scene, half(scene), jpeg60(scene)):
            assert index.match(image_signature(copy)) == 0, name
    with Image.open(io.BytesIO(large)) as full:  # the same file, decoded whole, as prepare decodes pool images
        assert ImageIndex.open(tmp_path / "large").match(image_signature(full.convert("RGB"))) == 0


def test_question_ngrams_find_a_copy_and_ignore_a_shared_phrase():
    index = QuestionIndex()
    chart_q = "What is the difference between the highest and the lowest value of the blue bars in 2019?"
    index.add(0, "eval.jsonl:1", chart_q)
    index.add(0, "eval.jsonl:2", "How many people voted for the green party in the northern district last year?")
    index.add(0, "eval.jsonl:3", "What shape is the large thing?")
    assert index.build(set()) == {0: 2}
    assert index.match("what is the DIFFERENCE between the highest, and the lowest value of the blue bars in "
                       "2019") is not None
    assert index.match("  What   is the difference between the highest and the lowest   value of the blue bars "
                       "in 2019 ?!") is not None
    # A common phrase (one 8-gram) inside an otherwise different question: under half of its grams.
    assert index.match("What is the difference between the highest and the lowest temperature recorded across "
                       "all the stations on the map shown here?") is None
    assert index.match("Which party won the southern district?") is None
    # Shorter than 8 words: no gram, never matched (short questions are asked of images in every VQA set).
    assert question_grams("What shape is the large thing?") == set()
    assert index.match("What shape is the large thing?") is None


def test_templated_evaluation_questions_are_not_indexed():
    """CLEVR-like sets ask the same text of many images: such a text identifies no evaluation item."""
    index = QuestionIndex()
    for i in range(10):
        index.add(0, f"e:{i}", "How many red cubes are there left of the small green sphere?")
    index.add(0, "e:10", "Are there more large metal cylinders than small rubber cubes behind the red sphere?")
    assert index.templated_sets({0: 11}) == {0}
    assert index.build({0}) == {}
    assert index.match("How many red cubes are there left of the small green sphere?") is None
    # The same texts in a set that is not templated: only the question asked once identifies an item.
    index = QuestionIndex()
    for i in range(10):
        index.add(0, f"e:{i}", "How many red cubes are there left of the small green sphere?")
    index.add(0, "e:10", "Are there more large metal cylinders than small rubber cubes behind the red sphere?")
    assert index.build(set()) == {0: 1}
    assert index.match("How many red cubes are there left of the small green sphere?") is None
    assert index.match("are there more large metal cylinders than small rubber cubes behind the red sphere") is not None


# ------------------------------------------------------------------------------ through the CLI, files on disk


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_prepare_through_the_cli_drops_copies_with_reasons_examples_and_card_lines(tmp_path, capsys):
    evals = tmp_path / "eval"
    evals.mkdir()
    eval_rows = []
    for i in range(6):
        (evals / f"e{i}.png").write_bytes(_png(_demo_image(7, i)))
        eval_rows.append({"image": f"e{i}.png", "question": f"In the chart of figure {i}, what is the total number "
                          f"of objects left of the yellow sphere number {i}?", "answer": "3"})
    _write_jsonl(evals / "test.jsonl", eval_rows)

    pool = tmp_path / "pool"
    pool.mkdir()
    pool_rows = []
    # Copies of evaluation images 0-3, transformed; images 10-17: unrelated.
    for i, (name, transform) in enumerate(TRANSFORMS.items()):
        (pool / f"copy_{name}.png").write_bytes(_png(transform(_demo_image(7, i))))
        pool_rows += [{"image": f"copy_{name}.png", "question": f"How many things in picture {name}?", "answer": "2"},
                      {"image": f"copy_{name}.png", "question": f"Is there a cube in picture {name}?", "answer": "yes"}]
    for i in range(10, 18):
        (pool / f"u{i}.png").write_bytes(_png(_demo_image(99, i)))
        pool_rows.append({"image": f"u{i}.png", "question": f"How many spheres are in scene {i}?", "answer": "1"})
    # An evaluation question with case, punctuation and spacing changed, on an unrelated image.
    pool_rows.append({"image": "u10.png", "question": "in the chart of figure 5 ,  WHAT is the total number of "
                      "objects left of the yellow sphere number 5", "answer": "3"})
    _write_jsonl(pool / "train.jsonl", pool_rows)

    out = tmp_path / "out"
    recipe = {"model_name_or_path": "rsgen-demo", "output_dir": str(out), "prepare_num_proc": 1,
              "sources": [{"data_files": [str(pool / "train.jsonl")], "family": "Mine"}],
              "decontaminate": [{"data_files": [str(evals / "test.jsonl")]}]}
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    assert main(["prepare", "--config", str(tmp_path / "r.yaml")]) in (0, None), capsys.readouterr().err

    report = json.loads((out / "prepared" / "prepare_report.json").read_text())
    assert report["dropped"] == {"contaminated_image": 8, "contaminated_question": 1}
    assert report["kept_qa_pairs"] == 8 and report["input_qa_pairs"] == 17
    image_examples = report["examples"]["contaminated_image"]
    assert len(image_examples) == 3
    assert {ex["eval_where"] for ex in image_examples} <= {f"test.jsonl:{i}" for i in range(1, 5)}
    assert all(ex["eval_set"] == "decontaminate[0]" and ex["source"] == "sources[0]" for ex in image_examples)
    (question_example,) = report["examples"]["contaminated_question"]
    assert question_example["eval_where"] == "test.jsonl:6" and question_example["source_row_id"] == "train.jsonl:17"
    (checked,) = report["decontamination"]["sets"]
    assert checked["images_indexed"] == 6 and checked["questions_indexed"] == 6
    assert checked["removed_qa_pairs"] == {"contaminated_image": 8, "contaminated_question": 1}
    assert checked["removed_pool_images"] == 4
    assert report["decontamination"]["questions"]["ngram"] == 8

    from rsgen.emit.card_tables import decontamination_text

    lines = decontamination_text(report["decontamination"])
    assert "removed 8 QA pairs on 4 copied images" in lines and "1 by question" in lines
    assert "test.jsonl" in lines


@pytest.mark.slow  # spawns image workers
def test_demo_evaluation_set_with_worker_processes(tmp_path):
    """Image workers check the pool (prepare_num_proc 2). Set 0: 300 demo images of another seed, whose questions
    come from templates (not indexed, the report says so) and whose images are all unrelated: nothing goes. Set 1:
    the pool's own first 12 images: exactly those go, by image or by question, and no other pool row."""
    from rsgen.config import RecipeConfig, source_from_dict
    from rsgen.prepare import run_prepare
    from rsgen.schema import load_prepared

    demo = {"dataset_name": "rsgen-demo", "demo_seed": 7, "family_column": "family", "options_column": "options"}
    recipe = RecipeConfig(output_dir=str(tmp_path / "out"), prepare_num_proc=2,
                          sources=[source_from_dict({**demo, "demo_num_images": 30})],
                          decontaminate=[source_from_dict({**demo, "demo_num_images": 300, "demo_seed": 8}, 0,
                                                          "decontaminate"),
                                         source_from_dict({**demo, "demo_num_images": 12}, 1, "decontaminate")])
    report = run_prepare(recipe)
    other, own = report["decontamination"]["sets"]
    assert other["images_indexed"] == 300 and other["questions_templated"] and other["questions_indexed"] == 0
    assert other["removed_qa_pairs"] == {} and other["removed_pool_images"] == 0
    assert own["images_indexed"] == 12 and not own["questions_templated"]
    assert set(report["dropped"]) == {"contaminated_image", "contaminated_question"}
    kept_ids = {qa["source_row_id"] for row in load_prepared(recipe.output_dir)["qa"] for qa in row}
    assert report["kept_qa_pairs"] + report["dropped_qa_pairs"] + report["merged_qa_pairs"] == report["input_qa_pairs"]
    assert len(load_prepared(recipe.output_dir)) == 18
    assert report["kept_qa_pairs"] == len(kept_ids) and kept_ids


@pytest.mark.slow  # a subprocess killed with SIGKILL
def test_prepare_with_decontamination_killed_midway_gives_the_same_pool(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    demo = {"dataset_name": "rsgen-demo", "demo_seed": 7, "family_column": "family", "options_column": "options"}

    def recipe_file(name):
        recipe = {"model_name_or_path": "rsgen-demo", "output_dir": str(tmp_path / name), "prepare_num_proc": 1,
                  "sources": [{**demo, "demo_num_images": 200}],
                  "decontaminate": [{**demo, "demo_num_images": 400, "demo_seed": 8}, {**demo, "demo_num_images": 20}]}
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump(recipe))
        return path

    killed = recipe_file("killed")
    proc = subprocess.Popen([sys.executable, "-m", "rsgen", "prepare", "--config", str(killed)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    index = tmp_path / "killed" / "prepared.partial" / "_work" / "eval_index" / "thumbs.u8"
    deadline = time.monotonic() + 120
    while not (index.exists() and index.stat().st_size) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    _, err = proc.communicate()
    assert proc.returncode == -signal.SIGKILL, err.decode()[-2000:]
    assert not (tmp_path / "killed" / "prepared").exists()  # killed while building the evaluation index

    assert main(["prepare", "--config", str(killed)]) in (0, None)
    assert main(["prepare", "--config", str(recipe_file("clean"))]) in (0, None)
    got, want = tmp_path / "killed" / "prepared", tmp_path / "clean" / "prepared"
    assert sorted(p.name for p in got.iterdir()) == sorted(p.name for p in want.iterdir())
    for path in want.iterdir():
        assert (got / path.name).read_bytes() == path.read_bytes(), path.name
    report = json.loads((got / "prepare_report.json").read_text())
    assert report["rows"] == 180  # the pool's own first 20 images went (by image, or by their questions first)
    assert report["decontamination"]["sets"][0]["removed_qa_pairs"] == {}


def _cached_scenario(tmp_path):
    """An evaluation set of 6 images named by path (jsonl) and a pool holding transformed copies of 4 of them."""
    evals, pool = tmp_path / "eval", tmp_path / "pool"
    evals.mkdir()
    pool.mkdir()
    for i in range(6):
        (evals / f"e{i}.png").write_bytes(_png(_demo_image(7, i)))
    _write_jsonl(evals / "test.jsonl", [{"image": f"e{i}.png", "question": f"In the chart of figure {i}, what is the "
                                         f"total number of objects left of the yellow sphere number {i}?", "answer": "3"}
                                        for i in range(6)])
    rows = []
    for i, (name, transform) in enumerate(TRANSFORMS.items()):
        (pool / f"copy_{name}.png").write_bytes(_png(transform(_demo_image(7, i))))
        rows.append({"image": f"copy_{name}.png", "question": f"How many things in picture {name}?", "answer": "2"})
    for i in range(10, 14):
        (pool / f"u{i}.png").write_bytes(_png(_demo_image(99, i)))
        rows.append({"image": f"u{i}.png", "question": f"How many spheres are in scene {i}?", "answer": "1"})
    _write_jsonl(pool / "train.jsonl", rows)
    return evals, pool


def test_cached_signatures_give_the_same_pool_byte_for_byte_and_a_changed_set_is_hashed_again(tmp_path, monkeypatch):
    """Issue #35: evaluation-set signatures are cached by the set's content fingerprint (and the signature version)
    under the HF assets cache. The second run hashes nothing and writes the identical prepared pool; a changed
    evaluation image is seen and its set hashed again."""
    from rsgen.config import RecipeConfig, source_from_dict
    from rsgen.prepare import decontaminate, run_prepare

    monkeypatch.setenv("HF_ASSETS_CACHE", str(tmp_path / "assets"))
    evals, pool = _cached_scenario(tmp_path)
    hashed = []
    real = decontaminate.eval_signatures
    monkeypatch.setattr(decontaminate, "eval_signatures", lambda jobs: hashed.extend(jobs) or real(jobs))

    def prepare(name):
        recipe = RecipeConfig(output_dir=str(tmp_path / name), prepare_num_proc=1,
                              sources=[source_from_dict({"data_files": [str(pool / "train.jsonl")], "family": "Mine"})],
                              decontaminate=[source_from_dict({"data_files": [str(evals / "test.jsonl")]}, 0,
                                                              "decontaminate")])
        hashed.clear()
        report = run_prepare(recipe)
        shards = sorted((tmp_path / name / "prepared").glob("*.parquet"))
        return report, [p.read_bytes() for p in shards], len(hashed)

    cold, cold_shards, cold_hashed = prepare("cold")
    assert cold_hashed == 6 and cold["dropped"] == {"contaminated_image": 4}
    (cached,) = (tmp_path / "assets" / "rsgen" / "decontamination").iterdir()
    assert cached.name.startswith(f"signatures-v{decontaminate.SIGNATURE_VERSION}-")
    warm, warm_shards, warm_hashed = prepare("warm")
    assert warm_hashed == 0, "the warm run hashed evaluation images again"
    assert warm_shards == cold_shards
    assert json.dumps(warm, sort_keys=True) == json.dumps(cold, sort_keys=True)

    (evals / "e1.png").write_bytes(_png(_demo_image(8, 1)))  # the copy of e1 in the pool is no longer one
    changed, _, changed_hashed = prepare("changed")
    assert changed_hashed == 6
    assert changed["dropped"] == {"contaminated_image": 3}
