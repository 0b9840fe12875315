"""Tests of the embedded toy task, tokenizer, model and cold-start SFT (CPU, no network)."""

import re

import pytest
import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForTokenClassification,
    AutoTokenizer,
    TrainerCallback,
)

from vcppo_trl.toy import (
    build_tiny_model,
    build_tokenizer,
    cold_start_sft,
    extract_boxed_answer,
    format_solution,
    greedy_accuracy,
    is_correct,
    make_arithmetic_dataset,
    make_splits,
    teacher_forced_exact_match,
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


@pytest.fixture(scope="module")
def splits():
    return make_splits(num_train=600, num_eval=120, seed=3)


def _numbers(prompt: str) -> tuple[int, int]:
    a, b = re.findall(r"\d+", prompt)
    return int(a), int(b)


class TestTask:
    def test_columns_and_types(self):
        dataset = make_arithmetic_dataset(50, seed=0)
        assert set(dataset.column_names) == {"prompt", "completion", "solution", "difficulty", "mode"}
        example = dataset[0]
        assert isinstance(example["prompt"], str) and re.fullmatch(r"Add \d+ and \d+\.\n", example["prompt"])
        assert isinstance(example["difficulty"], int)
        assert example["completion"].startswith("<think>")
        assert not example["completion"].endswith("<eos>")
        assert re.fullmatch(r"\\boxed\{\d+\}", example["solution"])

    def test_deterministic(self):
        assert make_arithmetic_dataset(20, seed=7)["prompt"] == make_arithmetic_dataset(20, seed=7)["prompt"]
        assert make_arithmetic_dataset(20, seed=7)["prompt"] != make_arithmetic_dataset(20, seed=8)["prompt"]

    def test_boxed_answer_is_the_sum(self):
        dataset = make_arithmetic_dataset(200, seed=1)
        for example in dataset:
            a, b = _numbers(example["prompt"])
            assert len(str(max(a, b))) == example["difficulty"]
            assert extract_boxed_answer(example["completion"]) == str(a + b)
            assert example["solution"] == f"\\boxed{{{a + b}}}"
            # The answer digits written on the last reasoning line are the answer too.
            assert example["completion"].split("</think>")[0].endswith(f", {a + b}\n")

    @pytest.mark.parametrize("a, b", [(0, 0), (9, 8), (999999, 1), (123456, 654321), (50, 50)])
    def test_format_solution_edge_cases(self, a, b):
        solution = format_solution(a, b)
        assert extract_boxed_answer(solution) == str(a + b)
        assert solution.count("\n") == len(str(max(a, b)))

    def test_difficulty_lengthens_completion(self):
        dataset = make_arithmetic_dataset(600, seed=2)
        mean_length = {}
        for d in range(1, 7):
            lengths = [len(c) for c, k in zip(dataset["completion"], dataset["difficulty"]) if k == d]
            assert lengths, f"no example of difficulty {d}"
            mean_length[d] = sum(lengths) / len(lengths)
        assert all(mean_length[d] < mean_length[d + 1] for d in range(1, 6))
        assert mean_length[6] > 3 * mean_length[1] and mean_length[6] > 140

    def test_digit_range(self):
        dataset = make_arithmetic_dataset(100, seed=0, min_digits=2, max_digits=3)
        assert set(dataset["difficulty"]) == {2, 3}

    def test_splits_do_not_overlap(self, splits):
        assert set(splits.keys()) == {"train", "test"}
        assert len(splits["train"]) == 600 and len(splits["test"]) == 120
        test_prompts = set(splits["test"]["prompt"])
        assert len(test_prompts) == 120  # the held-out prompts are distinct
        assert not test_prompts & set(splits["train"]["prompt"])
        assert set(splits["test"]["difficulty"]) == set(range(1, 7))

    def test_extract_boxed_answer(self):
        assert extract_boxed_answer("<think>1+1</think> \\boxed{2}") == "2"
        assert extract_boxed_answer("<think>\\boxed{3}</think> no answer") is None
        assert extract_boxed_answer("<think>never closed \\boxed{3}") is None
        assert extract_boxed_answer("</think> \\boxed{1} \\boxed{ 4 }") == "4"


class TestTokenizer:
    def test_round_trip(self, tokenizer, splits):
        for example in splits["test"].select(range(20)):
            text = example["prompt"] + example["completion"]
            ids = tokenizer(text)["input_ids"]
            assert tokenizer.decode(ids) == text
            assert tokenizer.decode(ids, skip_special_tokens=True) == text
        text = " a  b\n\t c {}\\"
        assert tokenizer.decode(tokenizer(text)["input_ids"]) == text.replace("\t", "<unk>")

    def test_character_level(self, tokenizer):
        assert tokenizer("Add 12")["input_ids"] == [tokenizer.convert_tokens_to_ids(c) for c in "Add 12"]
        assert (
            tokenizer.unk_token_id not in tokenizer(make_arithmetic_dataset(1, seed=0)[0]["completion"])["input_ids"]
        )

    def test_think_tags_are_single_non_special_tokens(self, tokenizer):
        for tag in ("<think>", "</think>"):
            ids = tokenizer(tag)["input_ids"]
            assert len(ids) == 1
            assert tag not in tokenizer.all_special_tokens
            assert tokenizer.decode(ids, skip_special_tokens=True) == tag
        ids = tokenizer("<think>1</think> \\boxed{1}<eos>")["input_ids"]
        assert ids[-1] == tokenizer.eos_token_id
        assert tokenizer.decode(ids, skip_special_tokens=True) == "<think>1</think> \\boxed{1}"

    def test_special_tokens(self, tokenizer):
        assert tokenizer.pad_token == "<pad>" and tokenizer.eos_token == "<eos>"
        assert tokenizer.pad_token_id != tokenizer.eos_token_id
        batch = tokenizer(["Add 1 and 2.\n", "Add 10 and 20.\n"], padding=True)
        assert batch["input_ids"][0][0] == tokenizer.pad_token_id  # left padding

    def test_save_and_reload(self, tokenizer, tmp_path):
        tokenizer.save_pretrained(tmp_path)
        reloaded = AutoTokenizer.from_pretrained(tmp_path)
        text = "Add 4738 and 2919.\n<think>8+9+0=17</think> \\boxed{7657}<eos>"
        assert reloaded(text)["input_ids"] == tokenizer(text)["input_ids"]
        assert reloaded.decode(reloaded(text)["input_ids"]) == text
        assert reloaded.pad_token_id == tokenizer.pad_token_id
        assert reloaded.eos_token_id == tokenizer.eos_token_id


class TestModel:
    def test_build(self, tokenizer):
        model = build_tiny_model(tokenizer)
        num_params = sum(p.numel() for p in model.parameters())
        assert 100_000 < num_params < 2_000_000
        assert model.config.vocab_size == len(tokenizer)
        assert model.config.pad_token_id == tokenizer.pad_token_id
        assert model.config.eos_token_id == tokenizer.eos_token_id
        assert model.generation_config.eos_token_id == tokenizer.eos_token_id
        assert model.generation_config.pad_token_id == tokenizer.pad_token_id

    def test_seed(self, tokenizer):
        a, b = build_tiny_model(tokenizer, seed=1), build_tiny_model(tokenizer, seed=1)
        c = build_tiny_model(tokenizer, seed=2)
        assert torch.equal(a.lm_head.weight, b.lm_head.weight)
        assert not torch.equal(a.lm_head.weight, c.lm_head.weight)

    def test_save_load_and_critic(self, tokenizer, tmp_path):
        model = build_tiny_model(tokenizer, seed=0)
        model.save_pretrained(tmp_path)
        tokenizer.save_pretrained(tmp_path)  # same directory as the model config: must still load the toy tokenizer
        reloaded = AutoModelForCausalLM.from_pretrained(tmp_path)
        input_ids = tokenizer(["Add 1 and 2.\n"], return_tensors="pt")["input_ids"]
        with torch.no_grad():
            torch.testing.assert_close(model(input_ids).logits, reloaded(input_ids).logits)
        reloaded_tokenizer = AutoTokenizer.from_pretrained(tmp_path)
        assert reloaded_tokenizer("Add 1 and 2.\n")["input_ids"] == input_ids[0].tolist()

        config = AutoConfig.from_pretrained(tmp_path, num_labels=1)
        critic = AutoModelForTokenClassification.from_config(config)
        with torch.no_grad():
            values = critic(input_ids).logits
        assert values.shape == (1, input_ids.shape[1], 1)

    def test_generate_stops_at_eos(self, tokenizer):
        model = build_tiny_model(tokenizer).eval()
        batch = tokenizer(["Add 1 and 2.\n", "Add 10 and 20.\n"], return_tensors="pt", padding=True)
        output = model.generate(**batch, max_new_tokens=5, do_sample=False)
        assert output.shape[0] == 2 and output.shape[1] <= batch["input_ids"].shape[1] + 5


class _LastStep(TrainerCallback):
    def __init__(self) -> None:
        self.global_step = -1

    def on_train_end(self, args, state, control, **kwargs):
        self.global_step = state.global_step


def test_cold_start_sft_short_run(tokenizer, splits, tmp_path, tiny_policy):
    model = tiny_policy
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    dataset = splits["train"].select(range(64))
    with torch.no_grad():
        batch = tokenizer(
            [p + c + tokenizer.eos_token for p, c in zip(dataset["prompt"][:16], dataset["completion"][:16])],
            return_tensors="pt",
            padding=True,
        )
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        loss_before = model(**batch, labels=labels).loss

    last_step = _LastStep()
    trained = cold_start_sft(
        model,
        tokenizer,
        dataset,
        output_dir=str(tmp_path / "sft"),
        max_steps=8,
        learning_rate=1e-2,
        per_device_train_batch_size=8,
        warmup_steps=0,
        target_accuracy=None,
        logging_steps=1,
        callbacks=[last_step],
    )
    assert last_step.global_step == 8
    assert trained is model and not trained.training
    changed = [name for name, p in trained.named_parameters() if not torch.equal(before[name], p.detach())]
    assert len(changed) == len(before)
    with torch.no_grad():
        loss_after = trained(**batch, labels=labels).loss
    assert loss_after < loss_before
    assert not list((tmp_path / "sft").glob("checkpoint*"))

    metrics = greedy_accuracy(trained, tokenizer, splits["test"].select(range(8)), max_new_tokens=16, batch_size=4)
    assert 0.0 <= metrics["accuracy"] <= 1.0
    assert 0 < metrics["response_length_mean"] <= 16
    assert set(metrics["accuracy_by_difficulty"]) <= set(range(1, 7))


def test_cold_start_sft_stops_at_target_accuracy(tokenizer, splits, tmp_path, tiny_policy):
    model = tiny_policy
    last_step = _LastStep()
    cold_start_sft(
        model,
        tokenizer,
        splits["train"].select(range(64)),
        output_dir=str(tmp_path / "sft"),
        max_steps=10,
        per_device_train_batch_size=4,
        target_accuracy=0.0,  # reached at the first check
        eval_dataset=splits["test"].select(range(8)),
        eval_steps=3,
        callbacks=[last_step],
    )
    assert last_step.global_step == 3


def test_cold_start_sft_tiny_dataset_with_default_target(tokenizer, tmp_path, tiny_policy):
    model = tiny_policy
    last_step = _LastStep()
    # Too few examples to hold some out: the target is ignored and training runs to the end.
    cold_start_sft(
        model,
        tokenizer,
        make_arithmetic_dataset(3, seed=0, max_digits=2),
        output_dir=str(tmp_path / "sft"),
        max_steps=4,
        per_device_train_batch_size=2,
        eval_steps=2,
        callbacks=[last_step],
    )
    assert last_step.global_step == 4


def test_exact_match_and_greedy_agree(tokenizer, splits, tiny_policy):
    model = tiny_policy
    dataset = splits["test"].select(range(6))
    assert teacher_forced_exact_match(model, tokenizer, dataset)["exact_match"] == 0.0
    # A response equal to the gold completion is correct; the exact-match check is a plain string comparison.
    assert is_correct(dataset[0]["completion"], dataset[0]["solution"])
    assert not is_correct(dataset[0]["completion"].replace("</think>", ""), dataset[0]["solution"])


def test_sampled_accuracy_counts_every_sample_and_leaves_the_random_state(tokenizer, splits, tiny_policy):
    """`sampled_accuracy` samples `num_samples` responses per prompt with its own seed: the same figures twice, the
    caller's random state untouched; a model that always writes the gold answer scores 1 (pass@k too)."""
    from vcppo_trl.toy import sampled_accuracy

    model = tiny_policy
    dataset = splits["test"].select(range(4))
    torch.manual_seed(5)
    state = torch.get_rng_state()
    first = sampled_accuracy(model, tokenizer, dataset, num_samples=3, max_new_tokens=8, seed=1)
    assert torch.equal(torch.get_rng_state(), state)
    assert first == sampled_accuracy(model, tokenizer, dataset, num_samples=3, max_new_tokens=8, seed=1)
    assert first["num_samples"] == 3 and first["num_examples"] == 4 and first["accuracy"] == 0.0
    assert 0 < first["response_length_mean"] <= 8

    gold = [
        tokenizer(c, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for c in dataset["completion"]
    ]

    def generate(input_ids, attention_mask=None, generation_config=None, **kwargs):
        # Prompts come 3 at a time per row of `dataset` (batched in order); answer each with its gold completion.
        rows = [gold[i // 3] for i in range(generate.offset, generate.offset + input_ids.shape[0])]
        generate.offset += input_ids.shape[0]
        width = max(len(r) for r in rows)
        tail = torch.tensor([r + [tokenizer.pad_token_id] * (width - len(r)) for r in rows])
        return torch.cat([input_ids, tail], dim=1)

    generate.offset = 0
    model.generate = generate
    perfect = sampled_accuracy(model, tokenizer, dataset, num_samples=3, max_new_tokens=64)
    assert perfect["accuracy"] == 1.0 and perfect["pass_at_k"] == 1.0 and perfect["eos_rate"] == 1.0
    with pytest.raises(ValueError, match="num_samples"):
        sampled_accuracy(model, tokenizer, dataset, num_samples=0)
