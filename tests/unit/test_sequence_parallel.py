"""Sequence parallelism on one process: the split layout, its forwards against the padded ones (a group of one), and
the refusals. The split across 2 processes (Ulysses' all-to-all, the gradient) is tested in
tests/integration/distributed/test_distributed.py."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForTokenClassification, LlamaConfig, LlamaForCausalLM

from vcppo_trl import PPOConfig
from vcppo_trl.algo.micro_batches import MicroBatch
from vcppo_trl.models.forward_engine import ForwardEngine, ForwardSettings
from vcppo_trl.models.packing import TokenBatch, split_micro_batch
from vcppo_trl.models.policy_and_value import PolicyAndValueModel
from vcppo_trl.parallel.sequence import SequenceGroup, SequenceParallelError, check_attention, sequence_group

QUERY = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10], [0, 0, 0, 3]])  # left-padded: 2, 4 and 1 prompt tokens
RESPONSE = torch.tensor([[11, 12, 13, 0], [14, 0, 0, 0], [15, 16, 17, 18]])  # 3, 1 and 4 response tokens
PROMPTS, RESPONSES = torch.tensor([2, 4, 1]), torch.tensor([3, 1, 4])


def group(size: int, rank: int = 0) -> SequenceGroup:
    return SequenceGroup(size=size, rank=rank, first_process=0)


def test_split_rows_start_at_column_zero_and_cover_every_response_token_once():
    micro = MicroBatch(indices=torch.tensor([1, 0, 2]), prompt_width=4, response_width=4)
    whole = split_micro_batch(QUERY, RESPONSE, PROMPTS, RESPONSES, micro, group(1))
    # Longest row: 4 + 1 = 5 tokens; right-padded with zeros; positions 0, 1, ...
    assert whole.input_ids.tolist() == [[7, 8, 9, 10, 14], [5, 6, 11, 12, 13], [3, 15, 16, 17, 18]]
    assert whole.position_ids.tolist() == [list(range(5))] * 3
    halves = [split_micro_batch(QUERY, RESPONSE, PROMPTS, RESPONSES, micro, group(2, rank)) for rank in (0, 1)]
    # 5 columns rounded up to 6, 3 per process; the halves rebuild the rows.
    assert [h.input_ids.shape[1] for h in halves] == [3, 3]
    assert torch.equal(torch.cat([h.input_ids for h in halves], dim=1)[:, :5], whole.input_ids)
    assert halves[1].position_ids.tolist() == [[3, 4, 5]] * 3
    seen = {}
    for rank, half in enumerate(halves):
        for row, step, column, target in zip(half.rows, half.steps, half.columns, half.targets):
            seen[(int(row), int(step))] = (rank * 3 + int(column), int(target))
    # Each response token once, predicted at prompt − 1 + t, its target the token itself.
    expected = {}
    for row, (prompt, response, source) in enumerate(zip([4, 2, 1], [1, 3, 4], [1, 0, 2])):
        for step in range(response):
            expected[(row, step)] = (prompt - 1 + step, int(RESPONSE[source, step]))
    assert seen == expected


def test_split_refuses_an_empty_prompt():
    micro = MicroBatch(indices=torch.tensor([0]), prompt_width=1, response_width=2)
    with pytest.raises(ValueError, match="empty prompt"):
        split_micro_batch(
            torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.long), torch.tensor([0]),
            torch.tensor([2]), micro, group(1),
        )  # fmt: skip


def tiny_models(seed=0):
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation="sdpa",
    )
    policy = LlamaForCausalLM(config).eval()
    critic_config = LlamaConfig(**config.to_dict())
    critic_config.num_labels = 1
    critic = AutoModelForTokenClassification.from_config(critic_config).eval()
    return PolicyAndValueModel(policy, critic)


@pytest.mark.parametrize("head", ["chunked", "full logits"])
def test_a_group_of_one_gives_the_padded_forwards_outputs(head, monkeypatch):
    """The split layout (no mask, rows unpadded on the left) gives the padded forward's log-probs, entropy and values
    at every response token, and the same gradients."""
    if head == "full logits":
        monkeypatch.setattr("vcppo_trl.models.split_forwards.causal_lm_parts", lambda model: None)
    model = tiny_models()
    tokens = TokenBatch(QUERY, (QUERY != 0).long(), RESPONSE, torch.arange(4)[None, :] < RESPONSES[:, None])
    micro = MicroBatch(indices=torch.tensor([0, 1, 2]), prompt_width=4, response_width=4)
    mask = tokens.attention_mask[:, 4:].bool()

    def run(inputs):
        model.zero_grad()
        logprobs, entropy, values = model(temperature=0.7, **inputs)
        (logprobs * mask).sum().add((entropy * mask).sum()).add((values * mask).sum()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return logprobs.detach(), entropy.detach(), values.detach(), grads

    padded = run(tokens.model_inputs(micro, padding_free=False))
    split = run(tokens.model_inputs(micro, padding_free=False, group=group(1)))
    for name, a, b in zip(("logprobs", "entropy", "values"), padded[:3], split[:3]):
        assert torch.allclose(a[mask], b[mask], atol=1e-5), name
        assert not b[~mask].any(), name  # zero past each response's end
    assert padded[3].keys() == split[3].keys()
    for name, grad in padded[3].items():
        assert torch.allclose(grad, split[3][name], atol=1e-5), name


def test_the_token_budget_is_per_process():
    settings = ForwardSettings(
        max_tokens=100, budget_field="max_tokens_per_micro_batch", sequences=1, padding_free=False
    )
    assert ForwardEngine(settings, accelerator=None).max_tokens == 100
    assert ForwardEngine(settings, accelerator=None, sequence_group=group(4)).max_tokens == 400


def test_check_attention_refuses_eager_and_heads_the_size_does_not_divide():
    model = tiny_models().policy
    assert check_attention(model, "policy", 2) == "sdpa"
    assert check_attention(model, "policy", 4) == "sdpa"  # 2 key/value heads, each shared by 2 processes
    with pytest.raises(SequenceParallelError, match="attention heads"):
        check_attention(model, "policy", 3)
    model.config._attn_implementation = "eager"
    with pytest.raises(SequenceParallelError, match="attn_implementation='sdpa'"):
        check_attention(model, "policy", 2)


def test_one_process_has_no_group_to_split_over():
    with pytest.raises(SequenceParallelError, match="needs 2 or more processes"):
        sequence_group(2)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"sequence_parallel_size": 0}, "at least 1"),
        ({"sequence_parallel_size": 2, "padding_free": True}, "padding_free"),
        ({"sequence_parallel_size": 2, "balance_ranks": True, "max_tokens_per_micro_batch": 64}, "balance_ranks"),
    ],
)
def test_config_refuses_what_sequence_parallelism_cannot_run_with(tmp_path, fields, message):
    with pytest.raises(ValueError, match=message):
        PPOConfig(output_dir=str(tmp_path), report_to="none", **fields)


def test_config_refuses_accelerates_sequence_split_and_names_its_own():
    from accelerate import ParallelismConfig

    with pytest.raises(ValueError, match="Set sequence_parallel_size instead"):
        PPOConfig(output_dir="unused", report_to="none", parallelism_config=ParallelismConfig(sp_size=2))


@pytest.fixture
def one_process_world(gloo_world_of_one):
    """A group of one over a process group of one: its rows go through the all-to-all like any group's."""
    return SequenceGroup(size=1, rank=0, first_process=0, process_group=gloo_world_of_one)


@pytest.mark.parametrize("reference_kind", ["model", "peft"])
def test_the_rollout_forwards_of_a_group_of_one_equal_the_padded_ones(one_process_world, tmp_path, reference_kind):
    """The maker's forwards over the group's shared rows, each micro-batch in the split layout, this process's own rows
    kept: old log-probs, values, the reference's log-probs and a window's bootstrap values equal the padded ones.
    "peft": no reference model, the LoRA policy with its adapters off is the reference."""
    from types import SimpleNamespace

    from vcppo_trl.rollout.maker import RolloutMaker
    from vcppo_trl.rollout.settings import RolloutSettings
    from vcppo_trl.rollout.types import Rollout

    model, reference = tiny_models(), tiny_models(seed=1).policy
    if reference_kind == "peft":
        from peft import LoraConfig, get_peft_model

        model.policy = get_peft_model(model.policy, LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
        with torch.no_grad():  # adapters that move the outputs, so that the reference differs from the policy
            for name, parameter in model.policy.named_parameters():
                if "lora_B" in name:
                    parameter.normal_(std=0.5)
        reference = None
    accelerator = SimpleNamespace(num_processes=1, device=torch.device("cpu"), gather=lambda t: t)
    accelerator.unwrap_model = lambda m: m
    args = PPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True, kl_coef=0.1, max_tokens_per_forward=12)
    makers = [
        RolloutMaker(
            RolloutSettings.from_args(args),
            accelerator,
            tokenizer=SimpleNamespace(pad_token_id=0),
            sampler=None,
            current_model=lambda: model,
            ref_model=reference,
            reward_funcs=[],
            reward_processing_classes=[],
            reward_weights=torch.ones(0),
            stop_token_ids=[0],
            reference_is_initial_policy=False,
        )
        for _ in range(2)
    ]
    makers[1].forwarder.forwards = ForwardEngine(
        makers[1].settings.forwards, accelerator, sequence_group=one_process_world
    )
    mask = torch.arange(4)[None, :] < RESPONSES[:, None]
    rollout = Rollout(
        prompts=["p"] * 3, completions=["c"] * 3, extra_columns={}, query_ids=QUERY, query_mask=(QUERY != 0).long(),
        response_ids=RESPONSE, response_mask=mask, has_stop=torch.ones(3, dtype=torch.bool), scores=torch.zeros(3),
        raw_scores=torch.zeros(3), rewards_per_func=torch.zeros(3, 1), reward_failed=torch.zeros(3, dtype=torch.bool),
    )  # fmt: skip
    outputs = []
    for maker in makers:
        forwards = maker.forwarder
        plan = forwards.forward_plan(rollout)
        assert (plan.own is not None) == (maker is makers[1])  # the group's rows, shared through the all-to-all
        logprobs, values = forwards.forward(rollout, compute_policy=True, plan=plan)
        window = Rollout(**{**rollout.__dict__, "finished": torch.tensor([True, False, False])})
        bootstrap = forwards.forward_with_bootstrap(window, compute_policy=True)
        outputs.append((logprobs, values, forwards.reference_logprobs(rollout, plan), *bootstrap, len(plan)))
    padded, split = outputs
    assert split[-1] == padded[-1] > 1  # the same micro-batches (a group of one: the same budget)
    for name, a, b in zip(("logprobs", "values", "reference", "window logprobs", "window values"), padded, split):
        torch.testing.assert_close(b[mask], a[mask], rtol=1e-5, atol=1e-6, msg=name)
    torch.testing.assert_close(split[5], padded[5], rtol=1e-5, atol=1e-6)  # bootstrap values
    assert padded[5][0] == 0 and padded[5][1:].abs().min() > 0
    assert (padded[2] - padded[0])[mask].abs().max() > 1e-3  # the reference is not the policy


def test_group_loads_sum_each_groups_mini_batches():
    """4 processes in groups of 2, 4 rows each, mini-batches of 2: group g's k-th load sums its two processes' k-th
    mini-batch rows (picked through each process's own order)."""
    from vcppo_trl.learner.sequence_group_rows import group_loads

    counts = torch.tensor([[1, 2, 3, 4], [10, 20, 30, 40], [100, 200, 300, 400], [5, 6, 7, 8]])
    orders = torch.tensor([[3, 2, 1, 0], [0, 1, 2, 3], [1, 3, 0, 2], [2, 0, 3, 1]])
    loads = group_loads(orders, counts, mini_batch_size=2, group_size=2)
    assert loads.tolist() == [[4 + 3 + 10 + 20, 200 + 400 + 7 + 5], [2 + 1 + 30 + 40, 100 + 300 + 8 + 6]]


def test_the_group_shares_its_rows_once_per_update_and_indexes_each_epochs_order(one_process_world, monkeypatch):
    """Over two epochs of different orders: one exchange; each mini-batch's shared rows are the rows its order names;
    what an epoch computes goes back to this process's rows; the imbalance of one group is 1."""
    from types import SimpleNamespace

    from vcppo_trl.algo.objective import PPOBatch
    from vcppo_trl.learner import sequence_group_rows

    exchanges = []
    exchange = sequence_group_rows.exchange_epoch_rows
    monkeypatch.setattr(
        sequence_group_rows, "exchange_epoch_rows", lambda *a, **k: exchanges.append(1) or exchange(*a, **k)
    )
    mask = torch.arange(4)[None, :] < RESPONSES[:, None]
    tokens = TokenBatch(query_ids=QUERY, query_mask=(QUERY != 0).long(), response_ids=RESPONSE, response_mask=mask)
    values = torch.arange(12, dtype=torch.float32).view(3, 4)
    batch = PPOBatch(mask=mask, old_values=values, returns=values + 1, advantages=values + 2)
    accelerator = SimpleNamespace(num_processes=1, device=torch.device("cpu"), gather=lambda t: t)
    rows = sequence_group_rows.SequenceGroupRows(accelerator, mini_batch_size=1, group=one_process_world)
    for order in (torch.tensor([2, 0, 1]), torch.tensor([1, 2, 0])):
        epoch = rows.epoch(order, batch=batch, tokens=tokens)
        for k, mini_batch in enumerate(epoch.mini_batches):
            assert torch.equal(epoch.batch.old_values[mini_batch], values[order[k : k + 1]])
            assert torch.equal(epoch.tokens.response_ids[mini_batch], RESPONSE[order[k : k + 1]])
        into = torch.zeros(3, 4)
        rows.restore(epoch, epoch.batch.returns * 2, into)
        assert torch.equal(into, (values + 1) * 2)
    assert len(exchanges) == 1
    assert rows.metrics() == {"perf/rank_token_imbalance": 1.0}
