"""Verifiers as TRL reward functions: the GRPOTrainer calling convention, and a real GRPO step on CPU."""

import pickle
import warnings

import pytest

from rsgen.verifiers import reward_function, verify_response
from rsgen.verifiers.rewards import VerifierReward, completion_text


def test_plain_text_completions():
    reward = reward_function("relaxed")
    completions = ["<think>about 41</think>The answer is 41.", "Answer: 7", "<think>cut off", "12 kg"]
    assert reward(completions=completions, answer=["42", "8", "1", "12"]) == [1.0, 0.0, 0.0, 1.0]


def test_called_the_way_grpo_trainer_calls_it():
    """prompts, completions, completion_ids, dataset columns and trainer extras, all as keywords."""
    reward = reward_function("exact")
    logged = {}
    rewards = reward(
        prompts=["Q1", "Q1", "Q2", "Q2"],
        completions=["3", "4", "yes", "No."],
        completion_ids=[[1], [2], [3], [4]],
        answer=["3", "3", "Yes", "yes"],
        image=[None] * 4,
        trainer_state=object(),
        log_extra=lambda column, values: logged.__setitem__(column, values),
        log_metric=lambda name, value: None,
    )
    assert rewards == [1.0, 0.0, 1.0, 0.0]
    assert all(isinstance(r, float) for r in rewards)
    assert logged["rsgen_exact_extracted"] == ["3", "4", "yes", "No."]
    assert logged["rsgen_exact_reason"] == [None, "wrong_answer", None, "wrong_answer"]


@pytest.mark.parametrize(
    "completion,text",
    [
        ("plain", "plain"),
        ([{"role": "assistant", "content": "B"}], "B"),
        ([{"role": "assistant", "content": [{"type": "text", "text": "B"}]}], "B"),
        ([{"role": "assistant", "content": [{"type": "image"}, {"type": "text", "text": "B"}]}], "B"),
        (
            [{"role": "assistant", "content": "<think>x"}, {"role": "assistant", "content": "</think>B"}],
            "<think>x\n</think>B",
        ),
        ({"role": "assistant", "content": "B"}, "B"),
        ([{"role": "assistant", "content": None}], None),
        ([], None),
        (None, None),
        (5, None),
    ],
)
def test_completion_text(completion, text):
    assert completion_text(completion) == text


def test_conversational_completions():
    reward = reward_function("mc")
    completions = [
        [{"role": "assistant", "content": "<think>hmm</think>(B)"}],
        [{"role": "assistant", "content": [{"type": "text", "text": "The answer is C"}]}],
        [{"role": "assistant", "content": "blue"}],
    ]
    options = [["red", "blue"], ["red", "blue", "green"], ["red", "blue"]]
    assert reward(completions=completions, answer=["B", "B", "B"], options=options) == [1.0, 0.0, 1.0]


def test_lists_of_acceptable_answers():
    reward = reward_function("relaxed")
    assert reward(completions=["12", "13", "20"], answer=[["12", "twelve"], ["10", "13"], ["1"]]) == [
        1.0,
        1.0,
        0.0,
    ]


def test_custom_column_and_verifier_keywords():
    reward = reward_function("numeric", answer_column="solution", numeric_tolerance=0.1)
    assert reward(completions=["3.25", "3.5"], solution=["3", "3"]) == [1.0, 0.0]  # 0.1 * 3


def test_math_reward_with_timeout():
    reward = reward_function("math", timeout_seconds=0.5)
    completions = ["\\boxed{\\frac{2}{4}}", "\\boxed{(10^{7})!}"]
    assert reward(completions=completions, answer=["0.5", "5"]) == [1.0, 0.0]


def test_missing_answer_column_is_a_clear_error():
    reward = reward_function("relaxed")
    with pytest.raises(ValueError, match="needs the dataset column 'answer'.*'solution'"):
        reward(completions=["1"], solution=["1"], trainer_state=None)


def test_length_mismatch_is_a_clear_error():
    with pytest.raises(ValueError, match="2 completions but 1"):
        reward_function("relaxed")(completions=["1", "2"], answer=["1"])


def test_unknown_verifier_fails_at_construction():
    with pytest.raises(ValueError, match="unknown verifier"):
        reward_function("fuzzy")


def test_bad_input_scores_zero_and_warns_once():
    reward = reward_function("relaxed")
    with pytest.warns(UserWarning, match="bad input"):
        assert reward(completions=["1", None, "3"], answer=["1", "2", 3]) == [1.0, 0.0, 0.0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert reward(completions=[None], answer=["1"]) == [0.0]  # no second warning
    assert reward.bad_input_count == 3


def test_picklable_and_named_for_trl():
    from trl.trainer.utils import get_callable_name

    reward = reward_function("relaxed")
    clone = pickle.loads(pickle.dumps(reward))
    assert isinstance(clone, VerifierReward)
    assert clone(completions=["41"], answer=["42"]) == reward(completions=["41"], answer=["42"]) == [1.0]
    assert get_callable_name(reward) == "rsgen_relaxed"


def test_rewards_agree_with_verify_response():
    responses = ["<think>a</think>41", "Answer: no", "\\boxed{1,000}", "<think>x", "(B)", "7 kg"]
    references = ["42", "yes", "1000", "1", "B", "7"]
    for name in ("relaxed", "exact", "numeric"):
        expected = [float(verify_response(name, r, a).match) for r, a in zip(responses, references)]
        assert reward_function(name)(completions=responses, answer=references) == expected


# ---------------------------------------------------------------- a real GRPO step on CPU


def _tiny_causal_lm():
    """A tiny Qwen2 causal LM and a word-level tokenizer trained here: GRPO on text needs no VLM."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    corpus = [
        "How many cubes are there ? What is 3 plus 4 ? The answer is 7 . 0 1 2 3 4 5 6 7 8 9 yes no"
    ] * 4
    backend = Tokenizer(models.WordLevel(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece()  # joins words with spaces
    backend.train_from_iterator(corpus, trainers.WordLevelTrainer(special_tokens=["<unk>", "<pad>", "<eos>"]))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>", eos_token="<eos>"
    )
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} <eos> {% endfor %}"
        "{% if add_generation_prompt %}assistant : {% endif %}"
    )
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)  # default init emits the same token forever; outputs must depend on the input
        model.lm_head.weight[tokenizer.eos_token_id] = 0.0  # no early stop: every completion has text
    return model, tokenizer


def _greedy_text(model, tokenizer, prompt_ids, max_new_tokens):
    import torch

    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt_ids]),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )
    return tokenizer.decode(out[0, len(prompt_ids) :], skip_special_tokens=True)


@pytest.mark.slow
@pytest.mark.parametrize("conversational", [False, True], ids=["plain", "conversational"])
@pytest.mark.floors  # .ci/run runs it on the declared floors too
def test_one_grpo_step_on_cpu_uses_the_reward(tmp_path, conversational):
    """GRPOTrainer samples at a near-zero temperature, so each prompt's completions equal its greedy output.
    One prompt's reference IS that output (reward 1.0), the other's is not (0.0): the logged reward mean
    must be 0.5, which only happens if TRL called our function with its completions and answer column."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model, tokenizer = _tiny_causal_lm()
    questions = ["What is 3 plus 4 ?", "How many cubes are there ?"]
    if conversational:
        prompts = [[{"role": "user", "content": q}] for q in questions]
        prompt_ids = [
            tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True) for p in prompts
        ]
        prompt_ids = [
            ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids for ids in prompt_ids
        ]
    else:
        prompts = questions
        prompt_ids = [tokenizer(q)["input_ids"] for q in questions]
    max_new_tokens = 4
    greedy = _greedy_text(model, tokenizer, prompt_ids[0], max_new_tokens)
    assert greedy.strip()
    dataset = Dataset.from_dict({"prompt": prompts, "answer": [greedy, "no such answer"]})

    reward = reward_function("exact")
    seen = []

    def watched_reward(completions, **kwargs):  # records what TRL passes, then defers to our reward
        rewards = reward(completions, **kwargs)
        seen.append((completions, kwargs["answer"], rewards))
        return rewards

    watched_reward.__name__ = reward.__name__
    args = GRPOConfig(
        output_dir=str(tmp_path),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=max_new_tokens,
        max_steps=1,
        temperature=1e-6,
        top_k=0,
        learning_rate=1e-3,
        report_to=[],
        logging_steps=1,
        save_strategy="no",
        seed=0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[watched_reward],
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    trainer.train()

    assert trainer.state.global_step == 1
    completions, answers, rewards = seen[0]
    if conversational:
        assert all(isinstance(c, list) and c[0]["role"] == "assistant" for c in completions)
    else:
        assert all(isinstance(c, str) for c in completions)
    assert sorted(rewards) == [0.0, 0.0, 1.0, 1.0]
    assert rewards == [float(a == greedy) for a in answers]
    logs = trainer.state.log_history[0]
    assert logs["rewards/rsgen_exact/mean"] == pytest.approx(0.5)
    assert logs["reward"] == pytest.approx(0.5)


# ---------------------------------------------------------------- rewards by dotted path


@pytest.mark.parametrize("name", ["relaxed", "exact", "numeric", "mc", "math"])
def test_rewards_by_dotted_path_as_trl_resolves_them(name):
    """TRL's `--reward_funcs a.b.c` imports the module and takes the attribute: a plain, named function."""
    import importlib

    module, _, attr = f"rsgen.verifiers.rewards.{name}".rpartition(".")
    reward = getattr(importlib.import_module(module), attr)
    assert callable(reward) and reward.__name__ == name
    assert pickle.loads(pickle.dumps(reward)) is reward


def test_dotted_path_rewards_read_solution_then_answer():
    from rsgen.verifiers import rewards

    completions = ["<think>x</think>41", "Answer: 7", "<think>cut off"]
    assert rewards.relaxed(completions=completions, solution=["42", "8", "1"]) == [1.0, 0.0, 0.0]
    assert rewards.exact(completions=completions, answer=["41", "7", "1"], trainer_state=None) == [1.0, 1.0, 0.0]
    # `solution` wins over `answer` when both are there (the _grpo view has solution).
    assert rewards.exact(completions=["7"], solution=["7"], answer=["8"]) == [1.0]
    assert rewards.mc(completions=[[{"role": "assistant", "content": "blue"}]], solution=["B"],
                      options=[["red", "blue"]]) == [1.0]
    assert rewards.math(completions=["\\boxed{\\frac{1}{2}}"], solution=["0.5"]) == [1.0]
    assert rewards.numeric(completions=["3.0000001", "3.1"], solution=["3", "3"]) == [1.0, 0.0]


def test_dotted_path_rewards_give_none_for_an_unusable_reference():
    from rsgen.verifiers import rewards

    got = rewards.relaxed(completions=["1", "2", "3", None], solution=["1", "", None, "4"])
    assert got == [1.0, None, None, 0.0]  # a completion without text is the model's fault: 0.0


def test_dotted_path_rewards_need_a_reference_column():
    from rsgen.verifiers import rewards

    with pytest.raises(ValueError, match="needs a dataset column 'solution'.*'label'"):
        rewards.relaxed(completions=["1"], label=["1"], trainer_state=None)
