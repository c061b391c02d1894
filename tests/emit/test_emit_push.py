"""Pushing the dataset: the early access check (before any model work) and the upload calls."""

from __future__ import annotations

import huggingface_hub
import pytest
from emit_helpers import scripted_recipe, write_scripted_run
from huggingface_hub import constants

from rsgen.cli import main
from rsgen.emit import run_emit
from rsgen.emit.push import HubAccessError, check_hub_access, push_dataset
from rsgen.layout import OutputLayout


class RecordingHfApi:
    """Stands in for HfApi where the test is about which calls the push makes; records them."""

    def __init__(self, whoami=None):
        self.calls = []
        self._whoami = whoami or {"name": "someone", "auth": {"accessToken": {"role": "write"}}}

    def whoami(self, token=None):
        if isinstance(self._whoami, Exception):
            raise self._whoami
        return self._whoami

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", repo_id, kwargs))
        return f"https://huggingface.co/datasets/{repo_id}"

    def upload_folder(self, **kwargs):
        self.calls.append(("upload_folder", kwargs))


def _recipe(tmp_path, **kw):
    return scripted_recipe(tmp_path, push_to_hub=True, hub_dataset_id="someone/clevr-rs", **kw)


def test_offline_machine_fails_early_with_a_clear_message(tmp_path):
    assert constants.HF_HUB_OFFLINE  # tests/conftest.py sets HF_HUB_OFFLINE=1
    with pytest.raises(HubAccessError, match="HF_HUB_OFFLINE=1"):
        check_hub_access(_recipe(tmp_path))
    assert check_hub_access(scripted_recipe(tmp_path)) is None  # nothing to push, nothing to check


def test_missing_token_unreachable_hub_and_read_only_token(tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)
    with pytest.raises(HubAccessError, match="no Hugging Face token was found.*hf auth login"):
        check_hub_access(_recipe(tmp_path))
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_xxx")
    with pytest.raises(HubAccessError, match="could not confirm the token.*ConnectionError"):
        check_hub_access(_recipe(tmp_path), api=RecordingHfApi(whoami=ConnectionError("no route to host")))
    read_only = {"name": "someone", "auth": {"accessToken": {"role": "read"}}}
    with pytest.raises(HubAccessError, match="read-only"):
        check_hub_access(_recipe(tmp_path), api=RecordingHfApi(whoami=read_only))
    assert check_hub_access(_recipe(tmp_path), api=RecordingHfApi()) == "someone"


def test_run_with_push_fails_before_any_model_work(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    out_dir = tmp_path / "out"
    recipe.write_text(f"output_dir: {out_dir}\npush_to_hub: true\nhub_dataset_id: someone/clevr-rs\n"
                      "sources:\n  - dataset_name: rsgen-demo\n    family_column: family\n")
    # The command line in this process (the tests run offline: HF_HUB_OFFLINE=1, see tests/conftest.py).
    with pytest.raises(SystemExit) as exit_:
        main(["run", "--config", str(recipe)])
    err = capsys.readouterr().err
    assert exit_.value.code == 2, err
    assert "rsgen: error: push_to_hub is on" in err and "HF_HUB_OFFLINE=1" in err
    assert not out_dir.exists()  # nothing prepared, no model loaded


def test_push_uploads_the_dataset_folder(tmp_path):
    write_scripted_run(tmp_path)
    recipe = _recipe(tmp_path, hub_private=True)
    run_emit(scripted_recipe(tmp_path))  # emit without pushing, then push what is on disk
    api = RecordingHfApi()
    url = push_dataset(recipe, api=api, validate_card=False)
    assert url == "https://huggingface.co/datasets/someone/clevr-rs"
    (create, repo_id, create_kw), (upload, upload_kw) = api.calls
    assert (create, repo_id) == ("create_repo", "someone/clevr-rs")
    assert create_kw == {"repo_type": "dataset", "private": True, "exist_ok": True}
    assert upload == "upload_folder"
    assert upload_kw["repo_id"] == "someone/clevr-rs" and upload_kw["repo_type"] == "dataset"
    assert upload_kw["folder_path"] == str(OutputLayout(tmp_path).dataset)
    assert upload_kw["delete_patterns"] == ["data/**", "assets/**"]


def test_emit_with_push_checks_access_before_writing(tmp_path):
    write_scripted_run(tmp_path)
    with pytest.raises(HubAccessError, match="HF_HUB_OFFLINE=1"):
        run_emit(_recipe(tmp_path))
    assert not OutputLayout(tmp_path).dataset.exists()
