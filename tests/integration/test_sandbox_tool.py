"""The code-interpreter tool (`python_tool`, issue 48) in the real tool loop of a trainer: the scripted policy calls
`python` twice, the first call's output and the second call's time out come back as tool messages, and the episode
goes on to its answer. The policy's turns are scripted (`tests/tool_fixtures.py`), the rest is the real trainer."""

from __future__ import annotations

import json

from datasets import Dataset

from tests import builders
from tests.tool_fixtures import ScriptedSampler, chat_tokenizer
from vcppo_trl import python_tool


def _call(code: str) -> str:
    call = json.dumps({"name": "python", "arguments": {"code": code}})
    return f"<tool_call>\n{call}\n</tool_call><|im_end|>"


SCRIPT = {0: _call("print(6*7)"), 1: _call("while True: pass"), 2: "42<|im_end|>"}


def test_the_python_tool_runs_in_the_tool_loop_and_a_time_out_is_an_answer_not_the_end(tiny_config):
    seen = []

    def reward(completions, **kwargs):
        seen.extend(completions)
        return [1.0 if c[-1]["content"] == "42" else -1.0 for c in completions]

    tokenizer = chat_tokenizer()
    prompts = [[{"role": "user", "content": f"What is 6 times 7? ({i})"}] for i in range(4)]
    trainer = builders.tiny_trainer(
        model=builders.tiny_policy(tokenizer),
        processing_class=tokenizer,
        reward_funcs=reward,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        tools=[python_tool(timeout=1.5, memory_mb=256)],
        args=tiny_config(
            response_length=400,
            max_steps=1,
            per_device_train_batch_size=2,
            gradient_accumulation_steps=1,
            num_mini_batches=1,
            local_rollout_forward_batch_size=2,
        ),
    )
    sampler = ScriptedSampler(tokenizer, SCRIPT)
    trainer.rollout_maker.sampler = sampler
    trainer.train()

    assert seen and '"name": "python"' in sampler.contexts[0]  # the tool's schema is in the prompt
    for episode in seen:
        assert [m["role"] for m in episode] == ["assistant", "tool", "assistant", "tool", "assistant"]
        assert episode[0]["tool_calls"][0]["function"] == {"name": "python", "arguments": {"code": "print(6*7)"}}
        assert episode[1] == {"role": "tool", "name": "python", "content": "42"}
        assert episode[3]["content"] == "Timed out after 1.5 s (the process was killed)."
        assert episode[4]["content"] == "42"  # the episode went on after the time out
    logged = next(e for e in trainer.state.log_history if "tools/call_frequency" in e)
    assert logged["tools/call_frequency"] == 2.0
    assert logged["tools/failure_frequency"] == 0.0  # the sandbox answered; the tool itself did not fail
    assert logged["objective/scores"] == 1.0
