"""Padding-free forwards: packing a micro-batch into one row, and the probe that refuses models that mix them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from vcppo_trl.algo.micro_batches import MicroBatch
from vcppo_trl.models.packing import PackingError, TokenBatch, check_packing, pack_micro_batch

from ..builders import tiny_policy


def test_pack_joins_real_tokens_restarts_positions_and_points_at_the_predicting_positions():
    query_ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]])  # left-padded: 2 and 4 prompt tokens
    response_ids = torch.tensor([[11, 12, 13, 0], [14, 0, 0, 0]])  # right-padded: 3 and 1 response tokens
    micro = MicroBatch(indices=torch.tensor([1, 0]), prompt_width=4, response_width=3)
    packed = pack_micro_batch(query_ids, response_ids, torch.tensor([2, 4]), torch.tensor([3, 1]), micro)
    assert packed.input_ids.tolist() == [[7, 8, 9, 10, 14, 5, 6, 11, 12, 13]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3, 4]]
    # Row 1's response token 0 is predicted at position 3 (its last prompt token); row 0's at 5 + 1 = 6, 7, 8.
    assert packed.predicting.tolist() == [[3, 0, 0], [6, 7, 8]]
    assert packed.targets.tolist() == [[14, 0, 0], [11, 12, 13]]
    assert packed.tokens == 10


def test_pack_refuses_an_empty_prompt():
    micro = MicroBatch(indices=torch.tensor([0]), prompt_width=1, response_width=2)
    with pytest.raises(ValueError, match="empty prompt"):
        pack_micro_batch(
            torch.zeros(1, 2, dtype=torch.long),
            torch.ones(1, 2, dtype=torch.long),
            torch.tensor([0]),
            torch.tensor([2]),
            micro,
        )


def test_token_batch_gives_padded_or_packed_inputs():
    query_mask = torch.tensor([[0, 1], [1, 1]])
    response_mask = torch.tensor([[True, False, False], [True, True, True]])
    tokens = TokenBatch(
        torch.tensor([[0, 3], [4, 5]]), query_mask, torch.tensor([[6, 0, 0], [7, 8, 9]]), response_mask
    )
    micro = MicroBatch(indices=torch.tensor([0]), prompt_width=1, response_width=1)
    padded = tokens.model_inputs(micro, padding_free=False)
    assert padded["input_ids"].tolist() == [[3, 6]] and padded["context_length"] == 1
    packed = tokens.model_inputs(micro, padding_free=True)
    assert packed["input_ids"] is None and packed["packed"].input_ids.tolist() == [[3, 6]]
    assert tokens.real_tokens(MicroBatch(torch.tensor([0, 1]), 2, 3)) == 2 + 5


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_transformers_keeps_packed_sequences_apart_and_the_probe_accepts_it(tokenizer, implementation):
    model = tiny_policy(tokenizer, num_layers=2)
    model.config._attn_implementation = implementation
    model.eval()
    check_packing(model, model.config.vocab_size, "policy")
    row = torch.tensor([[5, 6, 7, 8, 9, 10, 11]])
    positions = torch.tensor([[0, 1, 2, 0, 1, 2, 3]])
    with torch.no_grad():
        # No cache (transformers looks for packed rows only without one) and no 2-D mask.
        packed = model(input_ids=row, position_ids=positions, use_cache=False).logits[0, 3:]
        alone = model(input_ids=row[:, 3:], position_ids=positions[:, 3:], use_cache=False).logits[0]
        # What the padded path's mask, or a cache, would do here: the row becomes one sequence again.
        ones = torch.ones_like(row)
        masked = model(input_ids=row, attention_mask=ones, position_ids=positions, use_cache=False).logits[0, 3:]
        cached = model(input_ids=row, position_ids=positions, use_cache=True).logits[0, 3:]
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(masked, alone, atol=1e-3) and not torch.allclose(cached, alone, atol=1e-3)


class LeakyModel(nn.Module):
    """Each position sees the running mean of every earlier token of the row, whichever sequence it belongs to."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(32, 4)
        self.config = type("Config", (), {"_attn_implementation": "custom"})()

    def forward(self, input_ids, position_ids=None, use_cache=False, attention_mask=None):
        hidden = self.embed(input_ids).cumsum(1) / torch.arange(1, input_ids.shape[1] + 1)[None, :, None]
        return type("Output", (), {"logits": hidden})()


def test_the_probe_refuses_a_model_whose_packed_sequences_attend_to_each_other():
    with pytest.raises(PackingError, match="would attend to each other.*padding_free=False"):
        check_packing(LeakyModel(), 32, "critic")


def test_the_probe_accepts_bf16_rounding(tokenizer):
    model = tiny_policy(tokenizer, num_layers=2).to(torch.bfloat16)
    check_packing(model, model.config.vocab_size, "policy")
