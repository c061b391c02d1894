"""The shipped demo model: loads through the product loader, answers demo questions in the expected format,
and judges with the judge stage's prompt."""

import re

import pytest

from rsgen.demo.pool import LETTERS, make_demo_image, mc_option_texts, solve_from_scene
from rsgen.demo.truth import final_answer, states_truth
from rsgen.engine import ChatRequest, demo_model_path
from rsgen.engine.models import load_model_and_processor
from rsgen.engine.transformers_engine import TransformersEngine
from rsgen.judge.prompt import render_judge_prompt
from rsgen.judge.verdict import parse_verdict
from rsgen.verifiers import verify_response
from rsgen.verifiers.extract import extract_answer

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


def demo_questions(num_images: int, with_truth: bool = False):
    """(key, user text, reference, png) the way the pipeline asks them (lettered MC, answered by letter); with
    `with_truth`, also the scene's answer and the option texts (what `states_truth` grades against)."""
    out = []
    for index in range(num_images):
        _family, png, scene, qas = make_demo_image(EVAL_SEED, index)
        for q_index, (question, _answer, options) in enumerate(qas):
            stem, option_texts = mc_option_texts(question, options)
            truth = answer = solve_from_scene(scene, question, options)[0]
            if option_texts:
                block = "\n".join(f"{LETTERS[i]}. {t}" for i, t in enumerate(option_texts))
                text, answer = f"{stem}\n{block}", LETTERS[option_texts.index(answer)]
            else:
                text = question
            row = (f"{index}/{q_index}", f"{text}\n{INSTRUCTION}", answer, png)
            out.append(row + (truth, option_texts) if with_truth else row)
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
    questions = demo_questions(8, with_truth=True)
    by_key = {
        request.key: result
        for request, result in engine.generate(_request(k, t, p) for k, t, _, p, *_ in questions)
    }
    right = 0
    for key, _text, _reference, _png, truth, options in questions:
        result = by_key[key]
        assert not result.hit_limit, result.text
        assert THINK_RESPONSE.match(result.text), result.text
        assert extract_answer(result.text).answer is not None
        right += states_truth(final_answer(result.text), truth, options)
    # Far from perfect by design, but not random either.
    assert 0.2 * len(questions) <= right < len(questions)


def test_words_some_right_answers_as_the_verifier_does_not_accept(engine):
    """What the demo's judge exists for: right answers (by the scene) in words the demo's verifier rejects
    (`two`, `five bars`, `the lime`), which the judge then recovers."""
    questions = demo_questions(40, with_truth=True)
    responses = {r.key: res.text for r, res in engine.generate(_request(k, t, p) for k, t, _, p, *_ in questions)}
    right, right_rejected = 0, []
    for key, _text, reference, _png, truth, options in questions:
        if states_truth(final_answer(responses[key]), truth, options):
            right += 1
            if not verify_response("relaxed", responses[key], reference, options=options or None).match:
                right_rejected.append(final_answer(responses[key]))
    assert 0.1 * right <= len(right_rejected) <= 0.6 * right, (right, right_rejected)


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


def test_judge_says_wrong_to_the_models_wrong_answers_and_correct_to_its_right_ones(engine):
    """Both sides of the judge on the model's own answers that the demo's verifier rejects, graded by the scene:
    the wrong ones (the rejected split rests on them: the judge compares, it does not wave candidates through) and
    the right ones in other words (what it recovers)."""
    questions = demo_questions(24, with_truth=True)
    responses = {r.key: res.text for r, res in engine.generate(_request(k, t, p) for k, t, _, p, *_ in questions)}
    wrong, right = [], []
    for key, text, reference, _png, truth, options in questions:
        decision = verify_response("relaxed", responses[key], reference, options=options or None)
        if not decision.match and decision.extracted is not None:
            is_right = states_truth(final_answer(responses[key]), truth, options)
            (right if is_right else wrong).append((key, text, reference, decision.extracted))
    assert len(wrong) >= 20 and len(right) >= 5, (len(wrong), len(right))
    verdicts = _judge(engine, wrong + right)
    said_wrong = sum(verdicts[key] == "WRONG" for key, *_ in wrong)
    said_correct = sum(verdicts[key] == "CORRECT" for key, *_ in right)
    assert said_wrong >= 0.8 * len(wrong), (said_wrong, len(wrong), verdicts)
    assert said_correct >= 0.8 * len(right), (said_correct, right, verdicts)


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
