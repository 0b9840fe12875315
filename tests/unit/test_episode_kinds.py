"""The kinds of episode ([`vcppo_trl.episodes.EpisodeKind`]): which one a maker gets, and that each gives a
`SampledBatch` a rollout source scores without knowing the kind."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from vcppo_trl.episodes import (
    EpisodeKind,
    RolloutFunctionEpisodes,
    SampledBatch,
    SingleTurn,
    ToolLoopEpisodes,
    episode_kind,
)
from vcppo_trl.sampling import Samples


def fake_maker(**overrides):
    def generate(query_ids, query_mask, greedy, temperature):
        ids = torch.tensor([[5, 2], [6, 2]])
        return Samples(ids, torch.ones_like(ids, dtype=torch.bool), torch.tensor([True, True]))

    maker = SimpleNamespace(
        tool_loop=None,
        rollout_function=None,
        prompt_texts=lambda rows: [row["prompt"] for row in rows],
        tokenize_prompts=lambda texts: (torch.ones(len(texts), 3, dtype=torch.long), torch.ones(len(texts), 3)),
        generate=generate,
        settings=SimpleNamespace(response_length=4, num_generations=2, temperature=1.0),
        stop_token_ids=[2],
        tokenizer=SimpleNamespace(pad_token_id=0),
        accelerator=SimpleNamespace(device=torch.device("cpu")),
    )
    for key, value in overrides.items():
        setattr(maker, key, value)
    return maker


def test_the_maker_gets_the_kind_its_settings_name():
    assert isinstance(episode_kind(fake_maker()), SingleTurn)
    assert isinstance(episode_kind(fake_maker(rollout_function=lambda prompts: {})), RolloutFunctionEpisodes)
    tools = episode_kind(fake_maker(tool_loop=SimpleNamespace(environments=None)))
    assert isinstance(tools, ToolLoopEpisodes) and tools.name == "tools"
    assert episode_kind(fake_maker(tool_loop=SimpleNamespace(environments=object()))).name == "environment"
    assert all(isinstance(k, EpisodeKind) for k in (SingleTurn(None), RolloutFunctionEpisodes(None), tools))


def test_one_turn_and_a_rollout_func_give_the_same_batch_shape():
    rows = [{"prompt": "a"}, {"prompt": "b"}]
    one = SingleTurn(fake_maker()).sample(rows, greedy=False, temperature=None, num_generations=None)
    assert isinstance(one, SampledBatch) and one.rows == rows and one.prompt_texts == ["a", "b"]
    assert one.samples.response_ids.tolist() == [[5, 2], [6, 2]] and one.messages is None

    def rollout_func(prompts):  # TRL's, bound to the trainer: token lists per completion, extra keys kept
        return {
            "prompt_ids": [[7, 8]] * len(prompts),
            "completion_ids": [[5, 2], [6, 6, 2]],
            "logprobs": [[-0.1, -0.2], [-0.3, -0.4, -0.5]],
            "tag": ["x", "y"],
        }

    made = RolloutFunctionEpisodes(fake_maker(rollout_function=rollout_func)).sample(
        rows, greedy=False, temperature=None, num_generations=1
    )
    assert made.prompt_texts == ["a", "b"] and [row["tag"] for row in made.rows] == ["x", "y"]
    assert made.samples.response_mask.sum(1).tolist() == [2, 3] and made.messages is None
