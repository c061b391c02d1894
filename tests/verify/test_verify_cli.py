"""Issue #28.4 end to end, through the command line with the shipped demo model: generate once, change the verifier
settings, rerun. The generate model is not loaded again, the generate work stays byte-identical, the log says how
many decisions changed, the judge grades only items that changed, and the dataset equals a fresh run's with the
new settings."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import datasets
import pytest
import yaml

from rsgen.cli import main
from rsgen.generate import stage as generate_stage
from rsgen.judge import stage as judge_stage
from rsgen.layout import OutputLayout

SOURCE = {"dataset_name": "rsgen-demo", "demo_num_images": 6, "demo_seed": 11, "family_column": "family",
          "options_column": "options", "source_id_column": "source_id"}
FAMILIES = ("CLEVRMath", "DemoChart", "DemoMC")


def write_recipe(folder) -> str:
    path = folder / "recipe.yaml"
    path.write_text(yaml.safe_dump({"model_name_or_path": "rsgen-demo", "verifier": "numeric",
                                    "prepare_num_proc": 1, "max_new_tokens": 256, "judge_calibration_size": 6,
                                    "sources": [SOURCE]}))
    return str(path)


def masked_seconds(text: str) -> str:
    return re.sub(r" in [\d.]+ s,", " in # s,", " ".join(text.split()))


def work_bytes(out, stage: str) -> dict[str, bytes]:
    folder = OutputLayout(out).work / stage
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def split_rows(out, config: str) -> list:
    data = datasets.load_dataset(str(OutputLayout(out).dataset), config, split="train")
    return [(row["image_sha256"], row["qa"]) for row in data]


@pytest.fixture
def counted_engines(monkeypatch):
    """How many times each model stage built its engine, and what the judge was asked (the real engines)."""
    built = {"generate": 0, "judge": 0}
    judged: list[str] = []

    def counting(module, name):
        real = module.build_engine

        def build(recipe, role, *args, **kwargs):
            built[name] += 1
            engine = real(recipe, role, *args, **kwargs)
            generate = engine.generate

            def recording(requests):
                for request, result in generate(requests):
                    if name == "judge":
                        judged.append(request.key)
                    yield request, result

            engine.generate = recording
            return engine

        monkeypatch.setattr(module, "build_engine", build)

    counting(generate_stage, "generate")
    counting(judge_stage, "judge")
    return built, judged


@pytest.mark.slow
def test_a_tolerance_change_after_generate_redecides_without_the_model(tmp_path, counted_engines, caplog):
    built, judged = counted_engines
    recipe = write_recipe(tmp_path)
    out = tmp_path / "out"
    main(["run", "--config", recipe, "--output_dir", str(out)])
    assert built == {"generate": 1, "judge": 1}
    generate_before = work_bytes(out, "generate")
    judge_before = {json.loads(line)["key"]: line for part in work_bytes(out, "judge").values()
                    for line in part.decode().splitlines()}
    judged.clear()

    with caplog.at_level(logging.INFO, logger="rsgen"):
        main(["run", "--config", recipe, "--output_dir", str(out), "--numeric_tolerance", "1.0"])
    assert built["generate"] == 1  # the generating model was not loaded again
    assert work_bytes(out, "generate") == generate_before  # the responses stay as they were, byte for byte
    changed = re.search(r"verify: 28 stored responses decided with .* no model loaded; (\d+) decisions differ from "
                        r"the previous decisions \(numeric_tolerance 1e-06\); verifier-accepted (\d+) -> (\d+)",
                        caplog.text)
    assert changed, caplog.text
    assert int(changed[1]) > 0 and int(changed[3]) > int(changed[2])  # one too high is now within tolerance
    # docs/verifiers.md quotes this line, but for its seconds (a time on whatever machine ran it).
    logged = next(r.getMessage() for r in caplog.records if "differ from the previous decisions" in r.getMessage())
    docs = (Path(__file__).resolve().parents[2] / "docs" / "verifiers.md").read_text()
    quoted = next(b for b in re.findall(r"```[a-z]*\n(.*?)```", docs, flags=re.S) if "stored responses decided" in b)
    assert masked_seconds(quoted) == masked_seconds(logged), logged

    # The judge graded only items that changed: none it had already graded as they are now.
    judge_after = {json.loads(line)["key"]: line for part in work_bytes(out, "judge").values()
                   for line in part.decode().splitlines()}
    assert judged and len(judged) < len(judge_after)
    assert all(judge_after[key] == judge_before[key] for key in judge_after if key not in judged)
    assert all(key not in judge_before or judge_before[key] != judge_after[key] for key in judged)

    # A fresh run with the new setting makes the same dataset.
    fresh = tmp_path / "fresh"
    main(["run", "--config", recipe, "--output_dir", str(fresh), "--numeric_tolerance", "1.0"])
    for family in FAMILIES:
        for split in ("RS_think", "RS_nothink", "rejected"):
            config = f"{family}_{split}"
            has = [(OutputLayout(d).dataset / "data" / config).is_dir() for d in (out, fresh)]
            assert has[0] == has[1], config
            if has[0]:
                assert split_rows(out, config) == split_rows(fresh, config), config
    stats = [json.loads(OutputLayout(d).stats_json.read_text())["families"] for d in (out, fresh)]
    for family in FAMILIES:
        for key in ("accepted_qa", "rejected_qa", "rejected_reasons", "calibration", "judge"):
            assert stats[0][family][key] == stats[1][family][key], (family, key)
