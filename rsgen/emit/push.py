"""Pushing `OUTPUT_DIR/dataset/` to the Hub, and the early check that a push will be possible.

`check_hub_access` runs before any model work (rsgen.pipeline calls it first when `push_to_hub: true`), so a
missing token or an offline machine is reported in seconds, not after a week of generation. The upload uses
`HfApi.upload_folder`, which in huggingface_hub >= 2.4 with hf_xet is the large-folder path (streamed, committed
in batches, resumable: re-running the same call skips what is already on the Hub); with an older
huggingface_hub that still has `upload_large_folder`, that is used instead.
"""

from __future__ import annotations

from rsgen.config import RecipeConfig, RecipeError
from rsgen.layout import OutputLayout


class HubAccessError(RecipeError):
    """A push that cannot happen (no token, no network, read-only token); the message says how to fix it."""


def _offline() -> bool:
    from huggingface_hub import constants

    return bool(constants.HF_HUB_OFFLINE)


def check_hub_access(recipe: RecipeConfig, api=None) -> str | None:
    """Fail early when `push_to_hub` is on but the Hub is unreachable or no write token is available.

    Returns the user name the token belongs to (None when nothing will be pushed)."""
    if not recipe.push_to_hub:
        return None
    if not recipe.hub_dataset_id:
        raise HubAccessError("push_to_hub: true needs hub_dataset_id: USER/NAME")
    if _offline():
        raise HubAccessError(
            f"push_to_hub is on (hub_dataset_id {recipe.hub_dataset_id!r}) but the Hugging Face Hub is switched "
            "off on this machine (HF_HUB_OFFLINE=1 or TRANSFORMERS_OFFLINE=1). Unset it, or run with "
            "--push_to_hub false and push OUTPUT_DIR/dataset later"
        )
    from huggingface_hub import HfApi, get_token

    token = get_token()
    if not token:
        raise HubAccessError(
            f"push_to_hub is on (hub_dataset_id {recipe.hub_dataset_id!r}) but no Hugging Face token was found. "
            "Log in with `hf auth login` or set HF_TOKEN to a token with write access, or run with "
            "--push_to_hub false"
        )
    api = api or HfApi()
    try:
        info = api.whoami(token=token)
    except Exception as err:  # network errors, invalid token: both mean no push
        raise HubAccessError(
            f"push_to_hub is on but the Hub could not confirm the token ({type(err).__name__}: {err}). Check the "
            "network connection and the token (`hf auth whoami`), or run with --push_to_hub false"
        ) from err
    role = ((info.get("auth") or {}).get("accessToken") or {}).get("role")
    if role == "read":
        raise HubAccessError(
            f"push_to_hub is on but the token of {info.get('name')!r} is read-only; create a token with write "
            "access (https://huggingface.co/settings/tokens) and log in with it"
        )
    return info.get("name")


def push_dataset(recipe: RecipeConfig, api=None, validate_card: bool = True) -> str:
    """Create the dataset repository if needed and upload `OUTPUT_DIR/dataset/`; returns the repository URL.

    `validate_card` asks the Hub to check the card's YAML header first (a network call)."""
    from huggingface_hub import DatasetCard, HfApi

    dataset_dir = OutputLayout(recipe.output_dir).dataset
    if not (dataset_dir / "README.md").is_file():
        raise HubAccessError(f"{str(dataset_dir)!r} holds no emitted dataset; run `rsgen emit` first")
    card = DatasetCard.load(dataset_dir / "README.md")  # parses the YAML header: a broken card fails here
    if validate_card:
        card.validate(repo_type="dataset")  # the Hub's own check, before any upload
    api = api or HfApi()
    repo = api.create_repo(recipe.hub_dataset_id, repo_type="dataset", private=recipe.hub_private, exist_ok=True)
    upload_large_folder = getattr(api, "upload_large_folder", None)
    if upload_large_folder is not None:
        upload_large_folder(repo_id=recipe.hub_dataset_id, folder_path=str(dataset_dir), repo_type="dataset",
                            private=recipe.hub_private)
    else:
        api.upload_folder(
            repo_id=recipe.hub_dataset_id,
            folder_path=str(dataset_dir),
            repo_type="dataset",
            commit_message="rsgen: upload dataset",
            # Shards of an earlier push whose count changed would otherwise stay and match `train-*`.
            delete_patterns=["data/**", "assets/**"],
        )
    return str(getattr(repo, "url", repo))



def push_progress_section(recipe: RecipeConfig, section: str, api=None) -> None:
    """While the run lasts: the repository's README.md becomes the last emitted card (or a placeholder title) with
    `section`, the progress table of progress.json, in place of the previous one. One small commit."""
    from huggingface_hub import HfApi

    from rsgen.store.progress import card_with_progress

    card_path = OutputLayout(recipe.output_dir).dataset / "README.md"
    card = card_path.read_text() if card_path.is_file() else None
    text = card_with_progress(card, section, title=recipe.hub_dataset_id)
    api = api or HfApi()
    api.create_repo(recipe.hub_dataset_id, repo_type="dataset", private=recipe.hub_private, exist_ok=True)
    api.upload_file(path_or_fileobj=text.encode(), path_in_repo="README.md", repo_id=recipe.hub_dataset_id,
                    repo_type="dataset", commit_message="rsgen: progress")
