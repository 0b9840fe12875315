"""An `async def` reward function trains as TRL's GRPOTrainer accepts it (issue 48), from a trainer built and run
inside a running event loop, as in a notebook."""

from __future__ import annotations

import asyncio

from tests import builders


async def async_length_reward(completions, **kwargs):
    await asyncio.sleep(0)
    return builders.length_reward(completions)


def test_an_async_reward_function_trains_as_its_sync_twin(tiny_config, tokenizer):
    def run(reward, name):
        trainer = builders.tiny_trainer(
            processing_class=tokenizer,
            model=builders.tiny_policy(tokenizer),
            reward_funcs=reward,
            args=tiny_config(max_steps=1, output_dir=f"{tiny_config().output_dir}-{name}"),
        )
        trainer.train()
        return trainer

    async def notebook_cell():  # the whole run inside a running event loop
        return run(async_length_reward, "async")

    plain = run(builders.length_reward, "sync")
    awaited = asyncio.run(notebook_cell())
    assert [e.get("objective/scores") for e in plain.state.log_history] == [
        e.get("objective/scores") for e in awaited.state.log_history
    ]
    for (name, a), (_, b) in zip(plain.model.named_parameters(), awaited.model.named_parameters()):
        assert (a == b).all(), name
