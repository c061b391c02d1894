"""build_engine: one place that turns a recipe's keys of a role into a loaded engine."""

from __future__ import annotations

import pytest

from rsgen.config import RecipeConfig
from rsgen.engine import ENGINES, ChatRequest, build_engine, demo_model_path, engine_spec
from rsgen.engine.transformers_engine import TransformersEngine

# transformers' model, processor, generate and cache APIs: .ci/run runs the slow ones on the floors too
pytestmark = pytest.mark.floors


def test_generate_role_takes_the_model_and_its_decoding():
    recipe = RecipeConfig(model_name_or_path="some/model", model_revision="abc", max_new_tokens=77, temperature=0.7,
                          top_p=0.9, seed=3, enable_thinking=False, chat_template_kwargs={"x": 1})
    spec = engine_spec(recipe, "generate")
    assert (spec.model_name_or_path, spec.model_path, spec.revision) == ("some/model", "some/model", "abc")
    assert (spec.max_new_tokens, spec.temperature, spec.top_p, spec.seed) == (77, 0.7, 0.9, 3)
    assert spec.chat_template_kwargs == {"enable_thinking": False, "x": 1}


def test_judge_role_is_greedy_with_its_own_budget_and_model():
    recipe = RecipeConfig(model_name_or_path="gen/model", model_revision="abc", temperature=1.0, top_p=0.5,
                          judge_max_new_tokens=33)
    spec = engine_spec(recipe, "judge")
    assert (spec.model_name_or_path, spec.revision) == ("gen/model", "abc")  # the generating model by default
    assert (spec.temperature, spec.top_p, spec.max_new_tokens) == (0.0, 1.0, 33)
    other = engine_spec(RecipeConfig(model_name_or_path="gen/model", model_revision="abc",
                                     judge_model_name_or_path="judge/model"), "judge")
    assert (other.model_name_or_path, other.revision) == ("judge/model", None)  # the revision is the generator's


def test_demo_model_sentinel_resolves_to_the_shipped_directory():
    spec = engine_spec(RecipeConfig(model_name_or_path="rsgen-demo"), "generate")
    assert spec.model_name_or_path == "rsgen-demo" and spec.model_path == str(demo_model_path())
    assert (demo_model_path() / "config.json").is_file()


def test_unknown_role_and_engine_are_named():
    with pytest.raises(ValueError, match="unknown engine role 'critic'"):
        engine_spec(RecipeConfig(), "critic")
    with pytest.raises(ValueError, match="unknown engine 'vllm'.*transformers"):
        build_engine(RecipeConfig(engine="vllm"), "generate")
    assert set(ENGINES) == {"transformers", "openai"}


@pytest.mark.slow
def test_build_engine_loads_a_real_model_that_generates(tiny_vlm_path):
    recipe = RecipeConfig(model_name_or_path=tiny_vlm_path("qwen2_vl"), max_new_tokens=3)
    engine = build_engine(recipe, "judge", device="cpu")
    assert isinstance(engine, TransformersEngine) and engine.max_new_tokens == recipe.judge_max_new_tokens
    engine = build_engine(recipe, "generate", device="cpu")
    request = ChatRequest("k", [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], meta="mine")
    ((back, result),) = list(engine.generate([request]))
    assert back is request and back.meta == "mine"  # requests come back untouched
    assert 1 <= result.generated_tokens <= 3 and engine.stats.requests == 1


@pytest.mark.slow
def test_judge_may_be_a_text_only_causal_lm(tmp_path, tiny_vlm_path):
    from rsgen.testing.zoo import build_tiny_text_lm

    text_lm = build_tiny_text_lm(tmp_path / "text-lm")
    recipe = RecipeConfig(model_name_or_path=tiny_vlm_path("qwen2_vl"), judge_model_name_or_path=text_lm,
                          judge_max_new_tokens=4, judge_chat_template_kwargs={"enable_thinking": False})
    engine = build_engine(recipe, "judge", device="cpu")
    assert type(engine.model).__name__ == "Qwen2ForCausalLM" and engine.processor is engine.tokenizer
    # Its own template arguments: thinking off for the judge although generation has it on.
    assert engine.chat_template_kwargs == {"enable_thinking": False}
    request = ChatRequest("j", [{"role": "user", "content": [{"type": "text", "text": "Reference: 3. Candidate: 4."}]}])
    ((_, result),) = list(engine.generate([request]))
    assert 1 <= result.generated_tokens <= 4 and result.prompt_tokens > 5
    # A text LM is never the generating model: generation needs images.
    from rsgen.engine.models import ModelLoadError

    with pytest.raises(ModelLoadError, match="not an image-text-to-text model"):
        build_engine(RecipeConfig(model_name_or_path=text_lm), "generate", device="cpu")


def test_judge_does_not_inherit_enable_thinking():
    recipe = RecipeConfig(enable_thinking=True)
    assert engine_spec(recipe, "generate").chat_template_kwargs == {"enable_thinking": True}
    assert engine_spec(recipe, "judge").chat_template_kwargs == {}
    asked = RecipeConfig(enable_thinking=True, judge_chat_template_kwargs={"enable_thinking": True})
    assert engine_spec(asked, "judge").chat_template_kwargs == {"enable_thinking": True}
