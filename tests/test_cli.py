"""Every documented way to reach the command line prints the same help."""

import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rsgen.cli import _build_parser, _recipe_overrides, main
from rsgen.config import SourceConfig, recipe_keys_by_stage
from rsgen.pipeline import STAGES

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def run(cmd, cwd):
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(
    "cmd, where",
    [
        (["rsgen", "--help"], "tmp"),
        ([sys.executable, "-m", "rsgen", "--help"], "tmp"),
        pytest.param(["accelerate", "launch", "rsgen", "--help"], "root",  # runs rsgen/__main__.py as a script
                     marks=pytest.mark.slow),
        pytest.param(["accelerate", "launch", "-m", "rsgen", "--help"], "tmp", marks=pytest.mark.slow),
    ],
)
def test_help_everywhere(cmd, where, tmp_path):
    out = run(cmd, ROOT if where == "root" else tmp_path)
    assert out.returncode == 0, out.stderr
    for command in ("run", "prepare", "generate", "judge", "emit", "demo", "card"):
        assert command in out.stdout


def test_bad_recipe_key_exits_with_a_named_error(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("output_dirr: x\n")
    out = run([sys.executable, "-m", "rsgen", "prepare", "--config", str(recipe)], tmp_path)
    assert out.returncode == 2
    assert "unknown key 'output_dirr'" in out.stderr and "output_dir" in out.stderr


def _help_text(command, capsys) -> str:
    with pytest.raises(SystemExit) as exit_:
        main([command, "--help"])
    assert exit_.value.code == 0
    return capsys.readouterr().out


def test_run_help_lists_every_key_by_stage(capsys):
    text = _help_text("run", capsys)
    for stage, fields in recipe_keys_by_stage().items():
        block = text.split(f"\n{stage} keys:\n", 1)[1].split(" keys:\n", 1)[0]  # this stage's group
        for f in fields:
            assert f"--{f.name} VALUE" in block and f.metadata["help"].split()[0] in block, f.name
    for f in dataclasses.fields(SourceConfig):
        assert f"  {f.name} " in text


@pytest.mark.parametrize("stage", STAGES, ids=lambda stage: stage.name)
def test_a_stage_help_lists_the_keys_that_stage_reads(stage, capsys):
    """`rsgen prepare --help` lists prepare's keys (and --config, --output_dir), not the judge's."""
    text = _help_text(stage.name, capsys)
    listed = set(re.findall(r"^  --(\w+) VALUE", text, re.MULTILINE))
    assert listed == set(stage.keys) and "output_dir" in listed and "--config CONFIG" in text
    for group, fields in recipe_keys_by_stage().items():
        read = [f for f in fields if f.name in stage.keys]
        assert (f"\n{group} keys:\n" in text) == bool(read), group
    assert ("  dataset_name " in text) == ("sources" in stage.keys)  # the source keys, with the pools they describe


def test_a_stage_accepts_keys_its_help_does_not_list():
    """A rerun of one stage passes the whole recipe: keys of other stages are overrides all the same."""
    parser = _build_parser()
    args, rest = parser.parse_known_args(["prepare", "--config", "r.yaml", "--judge_max_new_tokens", "4"])
    assert _recipe_overrides(args, rest) == {"judge_max_new_tokens": 4} and not rest


def test_recipe_keys_on_the_command_line_are_yaml_values():
    parser = _build_parser()
    args, rest = parser.parse_known_args(
        ["run", "--config", "r.yaml", "--judge", "false", "--max-new-tokens", "5", "--verifier={A: exact}",
         "--sources", "[{dataset_name: x, family: X}]"]
    )
    overrides = _recipe_overrides(args, rest)
    assert overrides == {"judge": False, "max_new_tokens": 5, "verifier": {"A": "exact"},
                         "sources": [{"dataset_name": "x", "family": "X"}]}


def test_abbreviated_key_is_not_guessed(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("output_dir: x\n")
    with pytest.raises(SystemExit) as exit_:
        main(["prepare", "--config", str(recipe), "--max_new", "5"])
    assert exit_.value.code == 2


# ------------------------------------------------------------------ one-line errors before any work


def _recipe(tmp_path, text="", **keys):
    path = tmp_path / "r.yaml"
    lines = [f"output_dir: {tmp_path / 'out'}", "sources:", "  - dataset_name: rsgen-demo", "    family_column: family",
             "    demo_num_images: 2"] + [f"{k}: {v}" for k, v in keys.items()]
    path.write_text("\n".join(lines) + "\n" + text)
    return path


def _one_line_error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rsgen: error: ") and "Traceback" not in err, err
    return err


@pytest.fixture(scope="module")
def text_lm(tmp_path_factory):
    from rsgen.testing.zoo import build_tiny_text_lm

    return build_tiny_text_lm(tmp_path_factory.mktemp("text_lm"))


def test_a_model_that_is_not_a_vlm_fails_before_prepare(tmp_path, capsys, text_lm):
    err = _one_line_error(capsys, ["run", "--config", str(_recipe(tmp_path, model_name_or_path=text_lm))])
    assert repr(text_lm) in err and "is not an image-text-to-text model" in err and "set model_name_or_path" in err
    assert not (tmp_path / "out").exists()  # nothing created, prepare never started


def test_a_missing_model_or_judge_model_path(tmp_path, capsys):
    missing = str(tmp_path / "no-such-model")
    err = _one_line_error(capsys, ["generate", "--config", str(_recipe(tmp_path)), "--model_name_or_path", missing])
    assert repr(missing) in err and "no such local directory" in err
    err = _one_line_error(capsys, ["run", "--config", str(_recipe(tmp_path)), "--judge_model_name_or_path", missing])
    assert repr(missing) in err
    assert not (tmp_path / "out").exists()


def test_a_yaml_syntax_error_names_file_and_line(tmp_path, capsys):
    path = _recipe(tmp_path, text="judge: true\n  seed: 1\nmax_new_tokens: 5\n")  # line 7 is indented by mistake
    err = _one_line_error(capsys, ["run", "--config", str(path)])
    assert f"{path}:7: YAML syntax error (mapping values are not allowed here)" in err


def test_an_unwritable_output_dir(tmp_path, capsys):
    (tmp_path / "a-file").write_text("x")
    out = tmp_path / "a-file" / "out"
    err = _one_line_error(capsys, ["prepare", "--config", str(_recipe(tmp_path)), "--output_dir", str(out)])
    assert repr(str(out)) in err and "cannot be written" in err


def test_a_missing_prepared_pool(tmp_path, capsys):
    for stage in ("judge", "emit"):
        err = _one_line_error(capsys, [stage, "--config", str(_recipe(tmp_path))])
        assert "no prepared pool" in err and "rsgen prepare" in err
    assert not (tmp_path / "out").exists()


def test_debug_shows_the_traceback(tmp_path, text_lm):
    from rsgen.engine import ModelLoadError

    with pytest.raises(ModelLoadError):
        main(["run", "--config", str(_recipe(tmp_path, model_name_or_path=text_lm)), "--debug"])


@pytest.mark.slow
@pytest.mark.floors  # .ci/run runs it on the declared floors too
def test_under_accelerate_the_error_is_printed_once(tmp_path):
    missing = str(tmp_path / "no-such-model")
    cmd = ["accelerate", "launch", "--config_file", str(ROOT / "accelerate_configs" / "cpu_2proc.yaml"),
           "--main_process_port", "29677", "-m", "rsgen", "run", "--config", str(_recipe(tmp_path)),
           "--model_name_or_path", missing]
    out = run(cmd, tmp_path)
    assert out.returncode != 0
    assert out.stderr.count("rsgen: error: ") == 1, out.stderr
    assert "Traceback" not in out.stderr.split("rsgen: error: ")[0] + out.stderr.split("\n", 1)[0]
    assert not (tmp_path / "out").exists()


def test_log_level_and_quiet_other_ranks():
    import logging

    import datasets
    import transformers

    from rsgen.cli import setup_logging

    logger = logging.getLogger("rsgen")
    try:
        setup_logging("debug", is_main=True)
        assert logger.level == logging.DEBUG and transformers.utils.logging.get_verbosity() == logging.WARNING
        assert transformers.utils.logging.is_progress_bar_enabled()
        setup_logging("error", is_main=True)
        assert logger.level == logging.ERROR and datasets.utils.logging.get_verbosity() == logging.ERROR
        setup_logging("debug", is_main=False)  # another rank: warnings only, no progress bars
        assert logger.level == logging.WARNING
        assert not transformers.utils.logging.is_progress_bar_enabled()
        assert not datasets.utils.logging.is_progress_bar_enabled()
    finally:
        setup_logging("info", is_main=True)
        transformers.utils.logging.enable_progress_bar()
        datasets.enable_progress_bars()
        import huggingface_hub

        huggingface_hub.utils.enable_progress_bars()
