"""The shipped demo model: loads through the product loader, answers demo questions in the expected format,
and judges with the judge stage's prompt."""

import re

import pytest

from rsgen.demo.pool import LETTERS, make_demo_image, mc_option_texts, solve_from_scene
from rsgen.engine import ChatRequest, demo_model_path
from rsgen.engine.models import load_model_and_processor
from rsgen.engine.transformers_engine import TransformersEngine
from rsgen.judge.prompt import render_judge_prompt
from rsgen.judge.verdict import parse_verdict
from rsgen.verify import verify_response
from rsgen.verify.extract import extract_answer

INSTRUCTION = "Answer in short without any other content."
EVAL_SEED = 4242  # not the training seed
THINK_RESPONSE = re.compile(r"^<think>\n[^<]+\n</think>\n\n\S[^\n]*$")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine():
    model, processor = load_model_and_processor(str(demo_model_path()))
    return TransformersEngine(
        model, processor, max_new_tokens=96, temperature=0.0, token_budget=16384, max_batch_size=64,
        chat_template_kwargs={"enable_thinking": True},
    )  # fmt: skip


def demo_questions(num_images: int):
    """(key, user text, reference, png) the way the pipeline asks them (lettered MC, answered by letter)."""
    out = []
    for index in range(num_images):
        _family, png, scene, qas = make_demo_image(EVAL_SEED, index)
        for q_index, (question, _answer, options) in enumerate(qas):
            stem, option_texts = mc_option_texts(question, options)
            answer = solve_from_scene(scene, question, options)[0]
            if option_texts:
                block = "\n".join(f"{LETTERS[i]}. {t}" for i, t in enumerate(option_texts))
                text, answer = f"{stem}\n{block}", LETTERS[option_texts.index(answer)]
            else:
                text = question
            out.append((f"{index}/{q_index}", f"{text}\n{INSTRUCTION}", answer, png))
    return out


def _request(key, text, png):
    return ChatRequest(
        key, [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": text}]}], [png]
    )


def test_shipped_model_is_small_and_documented():
    path = demo_model_path()
    weights = path / "model.safetensors"
    assert weights.is_file() and weights.stat().st_size < 10 * 1024 * 1024
    assert (path / "README.md").read_text().count("toy") >= 1
    assert not list(path.glob("*.bin"))


def test_answers_with_a_short_reasoning_trace_and_some_are_right(engine):
    questions = demo_questions(8)
    by_key = {
        request.key: result
        for request, result in engine.generate(_request(k, t, p) for k, t, _, p in questions)
    }
    right = 0
    for key, _text, reference, _png in questions:
        result = by_key[key]
        assert not result.hit_limit, result.text
        assert THINK_RESPONSE.match(result.text), result.text
        extracted = extract_answer(result.text).answer
        assert extracted is not None
        right += extracted == reference
    # Far from perfect by design, but not random either.
    assert 0.2 * len(questions) <= right < len(questions)


def test_thinking_off_answers_directly(engine):
    questions = demo_questions(2)
    off = TransformersEngine(
        engine.model, engine.processor, max_new_tokens=16, temperature=0.0, token_budget=8192,
        chat_template_kwargs={"enable_thinking": False},
    )  # fmt: skip
    for _, result in off.generate(_request(k, t, p) for k, t, _, p in questions):
        assert "<think>" not in result.text and "</think>" not in result.text
        assert re.fullmatch(r"\S[^\n]*", result.text), result.text


def _judge(engine, pairs):
    """{key: verdict} for (key, question text, reference, candidate) pairs, through the judge stage's prompt."""
    requests = [
        ChatRequest(
            key, [{"role": "user", "content": [{"type": "text", "text": render_judge_prompt(t, ref, cand)}]}]
        )
        for key, t, ref, cand in pairs
    ]
    return {r.key: parse_verdict(res.text, res.hit_limit) for r, res in engine.generate(requests)}


def test_judge_says_wrong_to_the_models_own_wrong_answers(engine):
    """What the demo's rejected split rests on: the judge compares, it does not wave candidates through. The
    candidates are the model's answers that the demo recipe's verifiers reject, as in `rsgen demo`."""
    questions = demo_questions(16)
    responses = {r.key: res.text for r, res in engine.generate(_request(k, t, p) for k, t, _, p in questions)}
    wrong = []
    for key, text, reference, _png in questions:
        verifier = "mc" if "\nA. " in text else "relaxed"
        decision = verify_response(verifier, responses[key], reference)
        if not decision.match and decision.extracted is not None:
            wrong.append((key, text, reference, decision.extracted))
    assert len(wrong) >= 20, len(wrong)
    verdicts = _judge(engine, wrong)
    said_wrong = sum(v == "WRONG" for v in verdicts.values())
    assert said_wrong >= 0.8 * len(wrong), (said_wrong, len(wrong), verdicts)


def test_judge_says_correct_when_the_candidate_is_the_reference(engine):
    """The calibration property the demo reports: on pairs the verifier accepted, the judge says CORRECT."""
    verdicts = _judge(engine, [(key, text, ref, ref) for key, text, ref, _png in demo_questions(8)])
    assert sum(v == "CORRECT" for v in verdicts.values()) >= 0.8 * len(verdicts), verdicts


def test_model_was_trained_on_the_shipped_judge_prompt():
    import hashlib
    import json

    from rsgen.judge.prompt import load_template

    record = json.loads((demo_model_path() / "rsgen_training.json").read_text())
    current = hashlib.sha256(load_template().encode()).hexdigest()
    assert record["judge_template_sha256"] == current, (
        "rsgen/judge/prompt.txt changed since the demo model was trained on it: "
        "retrain with `python scripts/train_demo_model.py` (see its docstring)"
    )
