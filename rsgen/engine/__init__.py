"""Engines: a loaded model that answers chat requests, and the one place stages get one.

    engine = build_engine(recipe, role="generate", device=state.device)
    for request, result in engine.generate(requests): ...

`build_engine` reads the recipe keys of a role (`generate`: the model and its decoding; `judge`: the judge model —
a VLM or a text-only causal LM — greedy, `judge_max_new_tokens`, `judge_chat_template_kwargs`) into an `EngineSpec`
and hands it to the implementation the recipe's `engine` key names: `transformers` (the model loaded here,
`model.generate`) or `openai` (OpenAI-compatible servers: `openai_engine`, servers rsgen starts itself: `server`).
A new engine is one module here and one line in `ENGINES`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from rsgen.config import RecipeError
from rsgen.engine.base import (
    REQUEST_REFUSED,
    ChatRequest,
    Engine,
    EngineStats,
    EngineUnavailable,
    GenerationResult,
    Role,
)
from rsgen.engine.models import (
    DEMO_MODEL,
    ModelLoadError,
    check_model_config,
    demo_model_path,
    resolve_model_path,
)

# recipe `engine` value -> "module:factory"; the factory takes (EngineSpec, device) and returns an Engine.
ENGINES = {
    "transformers": "rsgen.engine.transformers_engine:TransformersEngine.from_spec",
    "openai": "rsgen.engine.openai_engine:OpenAIEngine.from_spec",
}
SERVER_ENGINES = ("openai",)  # engines that send requests to a server instead of loading the model
ROLES = tuple(role.value for role in Role)


@dataclass(frozen=True)
class EngineSpec:
    """Everything an engine needs to load its model and decode, for one role."""

    role: Role
    model_name_or_path: str  # as the recipe names it (recorded in work records and on the card)
    model_path: str  # where to load it from (the demo model's sentinel resolved to its directory)
    revision: str | None = None
    torch_dtype: str = "auto"
    attn_implementation: str = "auto"
    trust_remote_code: bool = False
    max_new_tokens: int = 2048
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    token_budget: int = 32768
    max_batch_size: int = 256
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    # Server engines (`engine: openai`): where the role's model is served and how to talk to it.
    base_urls: tuple[str, ...] = ()
    served_model: str = ""  # the name requests ask for (what the server's GET /v1/models lists)
    api_key_env: str | None = None  # the NAME of the environment variable holding the key
    max_concurrency: int | str = 64  # or "auto" (rsgen.engine.openai_engine.AdaptiveConcurrency)
    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    timeout_seconds: float = 600.0
    max_retries: int = 5


def engine_spec(recipe, role: Role | str) -> EngineSpec:
    """The `EngineSpec` of `role` from a recipe (`rsgen.config.RecipeConfig`)."""
    if role not in ROLES:
        raise ValueError(f"unknown engine role {str(role)!r}; expected one of {', '.join(ROLES)}")
    role = Role(role)
    common = dict(
        torch_dtype=recipe.torch_dtype,
        attn_implementation=recipe.attn_implementation,
        trust_remote_code=recipe.trust_remote_code,
        seed=recipe.seed,
        token_budget=recipe.token_budget,
        max_batch_size=recipe.max_batch_size,
        api_key_env=recipe.engine_api_key_env,
        max_concurrency=recipe.engine_max_concurrency,
        requests_per_minute=recipe.engine_requests_per_minute,
        tokens_per_minute=recipe.engine_tokens_per_minute,
        timeout_seconds=recipe.engine_timeout_seconds,
        max_retries=recipe.engine_max_retries,
    )
    if role is not Role.JUDGE:  # explore: the generating model, sampling at its own temperature
        explore = role is Role.EXPLORE
        return EngineSpec(
            role=role,
            model_name_or_path=recipe.model_name_or_path,
            model_path=resolve_model_path(recipe.model_name_or_path),
            revision=recipe.model_revision,
            max_new_tokens=recipe.max_new_tokens,
            temperature=recipe.explore_temperature if explore else recipe.temperature,
            top_p=recipe.explore_top_p if explore else recipe.top_p,
            chat_template_kwargs=recipe.generation_chat_template_kwargs(),
            base_urls=tuple(recipe.engine_base_url),
            served_model=served_model_name(recipe, recipe.model_name_or_path),
            **common,
        )
    name = judge_model_name(recipe)
    same_model = name == recipe.model_name_or_path
    return EngineSpec(
        role=role,
        model_name_or_path=name,
        model_path=resolve_model_path(name),
        revision=recipe.model_revision if same_model else None,
        max_new_tokens=recipe.judge_max_new_tokens,
        temperature=0.0,  # the judge always decodes greedily
        top_p=1.0,
        # Its own template arguments: the judge does not inherit the generator's `enable_thinking`.
        chat_template_kwargs=dict(recipe.judge_chat_template_kwargs),
        base_urls=tuple(judge_base_urls(recipe)),
        served_model=served_model_name(recipe, name),
        **common,
    )


def judge_base_urls(recipe) -> list[str]:
    """The judge's servers: `engine_judge_base_url`, else the generator's."""
    return list(recipe.engine_judge_base_url or recipe.engine_base_url)


def served_model_name(recipe, name: str) -> str:
    """The name a server knows model `name` by. `transformers serve MODEL` serves it under the path it was given
    (rsgen gives it the resolved path, the demo model's directory included); vLLM and SGLang started by rsgen get
    `--served-model-name` = the recipe's name (an `engine_server_command` without `{served_name}`: the path it was
    given); a server the user started serves what the recipe names."""
    from rsgen.engine.launcher import command_serves_under_its_path

    if recipe.engine_server == "transformers" or command_serves_under_its_path(recipe.engine_server_command):
        return resolve_model_path(name)
    return name


def judge_model_name(recipe) -> str:
    """The judge's model as the recipe names it: `judge_model_name_or_path`, else the generating model."""
    return recipe.judge_model_name_or_path or recipe.model_name_or_path


def check_engine(recipe, role: Role | str) -> None:
    """Before any work: the recipe's engine exists and the model of `role` is one it can load (config only).
    Raises a one-line RecipeError (ModelLoadError) naming the value and the fix."""
    name = getattr(recipe, "engine", "transformers")
    if name not in ENGINES:
        raise RecipeError(f"unknown engine {name!r}; choose one of {', '.join(sorted(ENGINES))}")
    spec = engine_spec(recipe, role)
    if name in SERVER_ENGINES:
        if recipe.engine_server:  # rsgen starts the server: it is checked once it answers (rsgen.engine.server)
            from rsgen.engine.launcher import check_launcher

            check_launcher(recipe.engine_server, recipe.engine_server_command)
            return
        from rsgen.engine.openai_engine import api_key_from_env, check_servers

        check_servers(spec.base_urls, spec.served_model, api_key_from_env(spec.api_key_env))
        return
    check_model_config(spec.model_name_or_path, spec.revision, spec.trust_remote_code,
                       allow_text_only=spec.role is Role.JUDGE)


def build_engine(recipe, role: Role | str, device=None) -> Engine:
    """Load the model of `role` and return the engine the recipe's `engine` key names."""
    name = getattr(recipe, "engine", "transformers")
    if name not in ENGINES:
        raise RecipeError(f"unknown engine {name!r}; choose one of {', '.join(sorted(ENGINES))}")
    module, _, attr = ENGINES[name].partition(":")
    factory: Any = importlib.import_module(module)
    for part in attr.split("."):
        factory = getattr(factory, part)
    return factory(engine_spec(recipe, role), device)


__all__ = [
    "DEMO_MODEL",
    "ENGINES",
    "REQUEST_REFUSED",
    "SERVER_ENGINES",
    "EngineUnavailable",
    "ChatRequest",
    "Engine",
    "EngineSpec",
    "EngineStats",
    "GenerationResult",
    "ModelLoadError",
    "Role",
    "build_engine",
    "check_engine",
    "demo_model_path",
    "engine_spec",
    "judge_model_name",
    "resolve_model_path",
]
