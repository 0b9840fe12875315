"""The pointer chase (`vcppo_trl.toy.pointer_chase*`): the table's no-way-back property, the cold start's error rate,
the formats, hop correctness, the oracle critic (values and module) and the cold start's cache."""

import dataclasses
import random

import pytest
import torch

from vcppo_trl.models import as_value_model
from vcppo_trl.toy import build_tiny_model, build_tokenizer
from vcppo_trl.toy.pointer_chase import (
    chain_cycle_length,
    format_completion,
    format_prompt,
    hop_error_rate,
    make_pointer_chase_dataset,
    make_pointer_chase_splits,
    make_problem,
    parse_prompt,
    pointer_chase_reward,
    sample_trace,
    start_letters,
    table_pool,
)
from vcppo_trl.toy.pointer_chase_cold_start import ColdStartRecipe, build_cold_start, weights_sha256
from vcppo_trl.toy.pointer_chase_credit import (
    PointerChaseOracleForTokenClassification,
    hop_correctness,
    oracle_values,
)

# "Ym Qi Ny Bn Mq Ib | M": the chain M Y N B (K = 3, answer B), the distractors I and Q (B → I → Q → M).
PROBLEM = make_problem(random.Random(0), num_hops=3, num_pairs=6, num_distractors=2)
EPS = hop_error_rate(3)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def _ids(tokenizer, text, eos=True):
    return tokenizer(text, add_special_tokens=False)["input_ids"] + ([tokenizer.eos_token_id] if eos else [])


def _value_before(k_left: int) -> float:
    return 2 * (1 - EPS) ** k_left - 1


# ----------------------------------------------------------------------------------------------------------------------
# The table
# ----------------------------------------------------------------------------------------------------------------------


def _traces(problem, value, hops_left, wrong):
    """(final value, wrong hops) of every trace from `value` whose hops are right or write a distractor."""
    if hops_left == 0:
        yield value, wrong
        return
    right = problem.lookup[value.lower()]  # KeyError: a reachable key missing from the table
    for choice in [right] + [d for d in problem.distractors if d != right]:
        yield from _traces(problem, choice, hops_left - 1, wrong + (choice != right))


SHAPES = [(1, 4, 2), (2, 6, 2), (3, 6, 2), (4, 8, 3), (5, 6, 2), (6, 6, 2), (7, 7, 3), (4, 5, 2)]


@pytest.mark.parametrize("num_hops, num_pairs, num_distractors", SHAPES)
def test_no_trace_with_a_wrong_hop_ends_on_the_answer(num_hops, num_pairs, num_distractors):
    """Every trace whose wrong hops write distractors (one or many, anywhere), going on consistently: only the
    all-right one ends on the answer, and every key it reaches is in the table."""
    rng = random.Random(num_hops * 100 + num_pairs)
    for _ in range(5):
        problem = make_problem(rng, num_hops=num_hops, num_pairs=num_pairs, num_distractors=num_distractors)
        lookup, distractors = problem.lookup, problem.distractors
        assert sorted(lookup) == sorted(v.lower() for v in lookup.values())  # a permutation
        assert len(distractors) >= num_distractors and problem.answer not in distractors

        outcomes = list(_traces(problem, problem.start, num_hops, 0))
        assert len(outcomes) > num_hops
        for final, wrong in outcomes:
            assert (final == problem.answer) == (wrong == 0), (problem, final, wrong)


@pytest.mark.parametrize("num_hops, num_pairs, num_distractors", SHAPES + [(8, 12, 3), (32, 12, 3)])
def test_every_start_of_a_pool_table_keeps_the_no_way_back_property(num_hops, num_pairs, num_distractors):
    shape = {"num_hops": num_hops, "num_pairs": num_pairs, "num_distractors": num_distractors}
    pool = table_pool(2, **shape)
    assert pool == table_pool(2, **shape)  # the task's, whatever the run
    for table in pool:
        starts = start_letters(table)
        assert starts[0] == table.start and len(set(starts)) == len(starts) >= num_hops % len(starts) + 1
        for start in starts:
            problem = dataclasses.replace(table, start=start)
            assert len(problem.distractors) >= num_distractors and problem.answer not in problem.distractors
            if num_hops <= 7:  # every trace
                for final, wrong in _traces(problem, problem.start, num_hops, 0):
                    assert (final == problem.answer) == (wrong == 0), (problem, final, wrong)
            else:  # too many to list: traces sampled with many wrong hops
                rng = random.Random(start)
                for _ in range(200):
                    values = sample_trace(problem, 0.3, rng)
                    keys = [problem.start, *values[:-1]]
                    wrong = sum(v != problem.lookup[k.lower()] for v, k in zip(values, keys))
                    assert (values[-1] == problem.answer) == (wrong == 0)


def test_a_pool_of_tables_gives_few_prompts_shared_by_the_splits():
    with pytest.raises(ValueError, match="at least 1"):
        table_pool(0)
    data = make_pointer_chase_dataset(300, seed=3, num_hops=8, num_tables=2)
    tables = {format_prompt(t).split(" | ")[0] for t in table_pool(2, num_hops=8)}
    assert {prompt.split(" | ")[0] for prompt in data["prompt"]} == tables
    assert len(set(data["prompt"])) <= 2 * 12
    assert all((row["wrong_hops"] == 0) == row["completion_correct"] for row in data)
    # One table: 12 prompts in all, so the test split's are trained on (no exclusion, and no endless draw).
    splits = make_pointer_chase_splits(50, 20, num_hops=8, num_tables=1)
    assert set(splits["test"]["prompt"]) <= set(splits["train"]["prompt"])
    fresh = make_pointer_chase_splits(50, 20, num_hops=8)
    assert not set(fresh["test"]["prompt"]) & set(fresh["train"]["prompt"])


def test_a_long_chase_reuses_letters_and_keeps_the_answer_off_the_start():
    assert chain_cycle_length(8, 12, 3) is None  # 9 chain letters + 3 distractors fit: one cycle
    assert chain_cycle_length(32, 12, 3) == 9  # 32 % 9 = 5: neither the start nor its predecessor
    assert chain_cycle_length(18, 12, 3) == 8  # 18 % 9 = 0 would answer with the start
    rng = random.Random(1)
    for num_hops in (9, 17, 32):
        problem = make_problem(rng, num_hops=num_hops)
        predecessor = {v: k.upper() for k, v in problem.entries}[problem.start]
        assert problem.answer not in (problem.start, predecessor)
        assert len(set(problem.walk())) < num_hops  # letters come round again
    with pytest.raises(ValueError, match="cannot walk"):
        make_problem(
            rng, num_hops=6, num_pairs=5, num_distractors=2
        )  # the one cycle left, 3 letters, answers with the start


@pytest.mark.parametrize("num_hops", [2, 8, 32])
def test_the_error_rate_gives_the_same_success_at_every_horizon(num_hops):
    success = 0.35
    eps = hop_error_rate(num_hops, success)
    assert (1 - eps) ** num_hops == pytest.approx(success)
    rng = random.Random(num_hops)
    right = 0
    for _ in range(3000):
        problem = make_problem(rng, num_hops=num_hops)
        right += sample_trace(problem, eps, rng)[-1] == problem.answer
    assert right / 3000 == pytest.approx(success, abs=0.03)


def test_the_formats_parse_back_and_the_reward_reads_the_box(tokenizer):
    prompt = format_prompt(PROBLEM)
    assert prompt == "Ym Qi Ny Bn Mq Ib | M\n" and parse_prompt(prompt, num_hops=3) == PROBLEM
    assert PROBLEM.walk() == ["Y", "N", "B"] and PROBLEM.distractors == ["I", "Q"]
    completion = format_completion(PROBLEM, PROBLEM.walk(), filler=2)
    assert completion == "<think>mY..\nyN..\nnB..\n</think> \\boxed{B}"
    assert tokenizer.decode(_ids(tokenizer, completion), skip_special_tokens=True) == completion
    wrong = format_completion(PROBLEM, ["Y", "I", "Q"])
    assert pointer_chase_reward([completion, wrong, completion[:-3]], ["\\boxed{B}"] * 3) == [1.0, -1.0, -1.0]
    dataset = make_pointer_chase_dataset(400, num_hops=4, filler=1, seed=2)
    assert set(dataset["difficulty"]) == {4}
    for row in dataset.select(range(50)):
        hops = hop_correctness([row["prompt"]], [_ids(tokenizer, row["completion"])], tokenizer)[0]
        assert len(hops) == 4 and sum(not h.right for h in hops) == row["wrong_hops"]
        assert (pointer_chase_reward([row["completion"]], [row["solution"]]) == [1.0]) == row["completion_correct"]
    splits = make_pointer_chase_splits(50, 20, num_hops=4)
    assert not set(splits["train"]["prompt"]) & set(splits["test"]["prompt"])
    assert all(splits["test"]["completion_correct"])


# ----------------------------------------------------------------------------------------------------------------------
# Hop correctness and the oracle's values
# ----------------------------------------------------------------------------------------------------------------------


def test_hop_correctness_finds_each_decision_and_judges_its_lookup(tokenizer):
    prompt = format_prompt(PROBLEM)
    texts = [
        format_completion(PROBLEM, ["Y", "N", "B"]),
        format_completion(PROBLEM, ["Y", "I", "Q"]),  # wrong at hop 2, then a right lookup from the wrong value
        "<think>mY.\nyQ.\nqN\n</think> \\boxed{N}",  # wrong, then a wrong lookup
        "<think>mY\nzz\nnB\nnB\n</think> \\boxed{B}",  # a malformed line, an extra hop
        "<think>mY\ny",  # truncated: only complete lines count
    ]
    decisions = hop_correctness([prompt] * len(texts), [_ids(tokenizer, t) for t in texts], tokenizer)
    assert [[h.right for h in hops] for hops in decisions] == [
        [True, True, True],
        [True, False, True],
        [True, False, False],
        [True, False, False, False],
        [True],
    ]
    assert [h.position for h in decisions[0]] == [2, 5, 8]  # "<think>" is one token, then "m", "Y", "\n", ...
    assert [(h.key, h.value) for h in decisions[1]] == [("m", "Y"), ("y", "I"), ("i", "Q")]
    assert [h.position for h in decisions[2]] == [2, 6, 10]  # a filler dot per line
    assert decisions[3][1].position == 4 and decisions[3][1].value == ""  # the malformed line's first token


def test_oracle_values_on_the_correct_trace_and_after_a_wrong_hop(tokenizer):
    prompt = format_prompt(PROBLEM)
    right = _ids(tokenizer, format_completion(PROBLEM, ["Y", "N", "B"], filler=1))
    wrong = _ids(tokenizer, format_completion(PROBLEM, ["Y", "I", "Q"], filler=1)) + [tokenizer.pad_token_id]
    values = oracle_values([prompt, prompt], [right, wrong], tokenizer, num_hops=3)
    assert values.shape == (2, len(wrong)) and values.dtype == torch.float32
    decisions = [2, 6, 10]  # "<think>", "m", "Y", ".", "\n", "y", "N", ...
    expected = []
    for t in range(len(right)):
        done = sum(d < t for d in decisions)
        expected.append(_value_before(3 - done))  # 2(1 - eps)^(hops left) - 1, +1 once all three are right
    assert values[0, : len(right)].tolist() == pytest.approx(expected)
    assert values[0, decisions[0]] == pytest.approx(_value_before(3))  # the value before a decision is chosen
    assert values[0, decisions[0] + 1] == pytest.approx(_value_before(2))
    assert values[0, len(right) - 1] == values[0, -1] == 1.0  # before the end-of-sequence token: the reward
    assert values[1, : decisions[1] + 1].tolist() == pytest.approx(expected[: decisions[1] + 1])
    assert (values[1, decisions[1] + 1 :] == -1).all()  # from the token after the wrong value to the end
    assert oracle_values([prompt], [right], tokenizer, num_hops=3, error_rate=0.0)[0].tolist() == [1.0] * len(right)


@pytest.mark.parametrize(
    "text, off_at, final",
    [
        ("<think>mY\nyN\n</think> \\boxed{N}", "</think>", -1.0),  # stops a hop early
        ("<think>mY\nyN\nnB\nbI\n</think> \\boxed{I}", "bI", -1.0),  # one hop too many
        ("<think>mY\nqN\nnB\n</think> \\boxed{B}", "qN", 1.0),  # a wrong key, then the right box
        ("<think>mY...\nyN\nnB.....\n</think> \\boxed{B}", None, 1.0),  # filler is free
        ("<think>mY\nyN\nnB\n</think> \\boxed{Q}", "Q", -1.0),  # a wrong answer
        ("<think>mY\nyN\nnB\n</think> \\boxed{BB}", "B}", -1.0),  # a box that does not close
    ],
)
def test_oracle_values_when_the_response_leaves_the_form(tokenizer, text, off_at, final):
    ids = _ids(tokenizer, text)
    values = oracle_values([format_prompt(PROBLEM)], [ids], tokenizer, num_hops=3)[0]
    assert values[-1] == final and values[0] == pytest.approx(_value_before(3))
    if off_at is not None:
        off = len(_ids(tokenizer, text[: text.rindex(off_at)], eos=False))
        assert values[off] > -1 and values[off + 1] == -1
    else:
        assert (values[:-1] > -1).all()


# ----------------------------------------------------------------------------------------------------------------------
# The oracle as a critic module
# ----------------------------------------------------------------------------------------------------------------------


def _batch(tokenizer):
    prompt = _ids(tokenizer, format_prompt(PROBLEM), eos=False)
    responses = [
        _ids(tokenizer, format_completion(PROBLEM, ["Y", "N", "B"], filler=1)),
        _ids(tokenizer, format_completion(PROBLEM, ["Y", "I", "Q"])),
    ]
    return prompt, responses


def test_the_oracle_module_reads_padded_and_packed_rows_like_oracle_values(tokenizer):
    oracle = PointerChaseOracleForTokenClassification.from_tokenizer(tokenizer, num_hops=3)
    prompt, responses = _batch(tokenizer)
    expected = oracle_values([format_prompt(PROBLEM)] * 2, responses, tokenizer, num_hops=3)
    width = max(map(len, responses))
    pad = tokenizer.pad_token_id
    rows = [[pad, pad] + prompt + r + [pad] * (width - len(r)) for r in responses]  # left and right padding
    mask = torch.tensor([[0, 0] + [1] * (len(prompt) + len(r)) + [0] * (width - len(r)) for r in responses])
    position_ids = (mask.cumsum(1) - 1).clamp(min=0)
    logits = oracle(input_ids=torch.tensor(rows), attention_mask=mask, position_ids=position_ids).logits
    assert logits.shape == (2, len(rows[0]), 1) and logits.dtype == torch.float32
    context = 2 + len(prompt)  # what the trainer's value_forward reads: logits[:, context - 1 : -1]
    for row, response in enumerate(responses):
        got = logits[row, context - 1 : context - 1 + len(response), 0]
        assert torch.equal(got, expected[row, : len(response)])
    packed = torch.tensor([prompt + responses[0] + prompt + responses[1]])
    positions = torch.tensor(
        [list(range(len(prompt) + len(responses[0]))) + list(range(len(prompt) + len(responses[1])))]
    )
    packed_logits = oracle(input_ids=packed, position_ids=positions).logits[0, :, 0]
    second = len(prompt) + len(responses[0]) + len(prompt) - 1
    assert torch.equal(
        packed_logits[len(prompt) - 1 : len(prompt) - 1 + len(responses[0])], expected[0, : len(responses[0])]
    )
    assert torch.equal(packed_logits[second : second + len(responses[1])], expected[1, : len(responses[1])])


def test_the_oracle_module_has_no_trainable_effect_and_passes_the_trainers_checks(tokenizer, tmp_path):
    from transformers import AutoModelForTokenClassification

    oracle = PointerChaseOracleForTokenClassification.from_tokenizer(tokenizer, num_hops=3)
    assert [name for name, _ in oracle.named_parameters()] == ["anchor.weight"]
    assert oracle.anchor.weight.abs().sum() == 0
    prompt, responses = _batch(tokenizer)
    ids = torch.tensor([prompt + responses[1]])
    before = oracle(input_ids=ids).logits.detach().clone()
    optimizer = torch.optim.AdamW(oracle.parameters(), lr=1.0, weight_decay=0.1)
    for _ in range(2):
        loss = ((oracle(input_ids=ids).logits - 0.5) ** 2).sum()
        loss.backward()
        assert oracle.anchor.weight.grad is not None and not oracle.anchor.weight.grad.any()
        optimizer.step()
        optimizer.zero_grad()
    assert not oracle.anchor.weight.any() and torch.equal(oracle(input_ids=ids).logits, before)
    # What the trainer checks of a critic given as a model: one label, a token-classification class, the vocabulary.
    policy = build_tiny_model(tokenizer, hidden_size=16, num_layers=1, num_heads=2)
    assert as_value_model(oracle) is oracle
    assert oracle.get_input_embeddings().num_embeddings == policy.get_input_embeddings().num_embeddings
    oracle.save_pretrained(tmp_path)
    reloaded = AutoModelForTokenClassification.from_pretrained(tmp_path)
    assert type(reloaded) is PointerChaseOracleForTokenClassification
    assert reloaded.config.error_rate == pytest.approx(EPS) and torch.equal(reloaded(input_ids=ids).logits, before)


# ----------------------------------------------------------------------------------------------------------------------
# The cold start's recipe and cache
# ----------------------------------------------------------------------------------------------------------------------


def test_the_cache_key_changes_with_every_knob():
    recipe = ColdStartRecipe()
    keys = {recipe.key()}
    for field in dataclasses.fields(ColdStartRecipe):
        value = getattr(recipe, field.name)
        changed = dataclasses.replace(recipe, **{field.name: value * 2 if value else 1})
        keys.add(changed.key())
    assert len(keys) == len(dataclasses.fields(ColdStartRecipe)) + 1
    assert ColdStartRecipe(seed=3).key() == ColdStartRecipe(seed=3).key()


def test_the_same_recipe_gives_the_same_weights_and_is_built_once(tmp_path):
    small = {"hidden_size": 16, "num_layers": 1, "num_heads": 2, "steps": 2, "lookup_steps": 2, "batch_size": 2}
    recipe = ColdStartRecipe(num_hops=2, seed=5, **small)
    # The first stage is the base of seed `lookup_seed` (0), whatever the recipe's own seed.
    base = ColdStartRecipe(num_hops=8, seed=0, **{**small, "lookup_steps": 0}, lookup_seed=None)
    assert recipe.lookup_stage() == base
    policy, _, built = build_cold_start(recipe, cache_dir=str(tmp_path))
    assert not built["loaded_from_cache"] and built["weights_sha256"] == weights_sha256(policy)
    assert built["lookup_stage"]["key"] == base.key()
    _, _, again = build_cold_start(recipe, cache_dir=str(tmp_path))
    assert again["loaded_from_cache"] and again["weights_sha256"] == built["weights_sha256"]
    rebuilt, _, _ = build_cold_start(recipe)  # no cache: both stages afresh, bit-identical on this machine
    assert weights_sha256(rebuilt) == built["weights_sha256"]
    # Another K and another seed share the first stage and have their own second.
    _, _, other_k = build_cold_start(dataclasses.replace(recipe, num_hops=3), cache_dir=str(tmp_path))
    assert other_k["lookup_stage"] == built["lookup_stage"] and other_k["weights_sha256"] != built["weights_sha256"]
    _, _, other_seed = build_cold_start(dataclasses.replace(recipe, seed=6), cache_dir=str(tmp_path))
    assert other_seed["lookup_stage"] == built["lookup_stage"]
    assert other_seed["weights_sha256"] != built["weights_sha256"]
    # A pool of tables: the same first stage (it learns the in-context lookup on fresh tables), its own second.
    pooled = dataclasses.replace(recipe, num_tables=3)
    assert pooled.lookup_stage() == base and pooled.task()["num_tables"] == 3
    # lookup_seed=None: the first stage from the recipe's own seed.
    _, _, own = build_cold_start(dataclasses.replace(recipe, lookup_seed=None), cache_dir=str(tmp_path))
    assert own["lookup_stage"]["key"] == dataclasses.replace(base, seed=5).key() != base.key()
    assert len([p for p in tmp_path.iterdir() if p.name.startswith("pointer_chase-")]) == 6
