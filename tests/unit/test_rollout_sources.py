"""The rollout-source protocol: every source meets it, the composition routes by update kind, the factory picks the
source from its settings, and the trainer and checkpoint code read no rollout-mode flag."""

from __future__ import annotations

import ast
import os

import pytest

from vcppo_trl.rollout import (
    CriticFirst,
    OverlappedRollouts,
    ResponsePool,
    RolloutSource,
    SourceSettings,
    StoredRolloutSource,
    WholeResponses,
    WindowedRollouts,
    build_rollout_source,
)

from ..paths import REPO

PACKAGE = os.path.join(REPO, "src", "vcppo_trl")

# Config fields that choose where rollouts come from or how sequences are split, and the only modules that may read
# them (as `<config or settings>.<field>`): where their source or engine is built, and the config that defines them.
ROLLOUT_MODE_FIELDS = {
    "generation_window": {"config/ppo.py", "config/vcppo.py", "rollout/sources.py"},
    "max_staleness": {"config/ppo.py", "config/vcppo.py", "rollout/sources.py", "rollout/overlap.py"},
    "value_pretrain_dataset": {"config/vcppo.py", "rollout/sources.py"},
    "sequence_parallel_size": {"config/ppo.py", "trainer/model_setup.py"},
}
# The trainer's loop and the checkpoint code never ask which source or split a run has.
NEVER_READ_THERE = ("trainer/ppo.py", "trainer/vcppo.py", "trainer/saving.py", "trainer/resuming.py")


def attribute_reads(source: str, names: set[str]) -> list[str]:
    """`x.<name>` attribute reads of any of `names` in Python source (strings and comments do not count)."""
    return [
        f"line {node.lineno}: .{node.attr}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute) and node.attr in names
    ]


def test_rollout_mode_fields_are_read_only_where_their_source_or_engine_is_built():
    found = []
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            relative = os.path.relpath(path, PACKAGE).replace(os.sep, "/")
            text = open(path).read()
            for field, readers in ROLLOUT_MODE_FIELDS.items():
                if relative not in readers:
                    found += [f"{relative} {hit}" for hit in attribute_reads(text, {field})]
    assert not found, "\n".join(found)
    assert not any(set(NEVER_READ_THERE) & readers for readers in ROLLOUT_MODE_FIELDS.values())


def test_the_field_check_sees_reads_and_ignores_text():
    text = 'args.generation_window\nx = "generation_window"\n# args.max_staleness\nself.args.max_staleness > 0\n'
    assert attribute_reads(text, {"generation_window", "max_staleness"}) == [
        "line 1: .generation_window",
        "line 4: .max_staleness",
    ]


@pytest.mark.parametrize(
    "cls", [WholeResponses, WindowedRollouts, OverlappedRollouts, StoredRolloutSource, CriticFirst]
)
def test_every_source_meets_the_protocol(cls):
    for method in ("next", "after_policy_step", "state_dict", "load_state_dict", "close"):
        assert callable(getattr(cls, method, None)), f"{cls.__name__}.{method}"
    assert hasattr(cls, "holds_rollouts_in_flight")


class Recording:
    """A source that records what it was asked."""

    def __init__(self, name: str, holds: bool = False):
        self.name, self.holds_rollouts_in_flight, self.calls = name, holds, []

    def next(self, train_policy, trainer_state=None):
        self.calls.append(("next", train_policy))
        return self.name, None

    def after_policy_step(self):
        self.calls.append(("after_policy_step",))

    def state_dict(self):
        return {"from": self.name}

    def load_state_dict(self, state):
        self.calls.append(("load", state))

    def close(self):
        self.calls.append(("close",))


def test_critic_first_asks_one_source_for_critic_only_updates_and_the_other_for_the_rest():
    stored, online = Recording("stored"), Recording("online", holds=True)
    source = CriticFirst(stored, then=online)
    assert isinstance(source, RolloutSource) and source.holds_rollouts_in_flight
    assert source.next(False)[0] == "stored" and source.next(True)[0] == "online"
    source.after_policy_step()
    assert source.state_dict() == {"from": "online"}
    source.load_state_dict({"x": 1})
    source.close()
    assert stored.calls == [("next", False), ("close",)]
    assert online.calls == [("next", True), ("after_policy_step",), ("load", {"x": 1}), ("close",)]
    with pytest.raises(ValueError, match="keep nothing in flight"):
        CriticFirst(Recording("stateful", holds=True), then=online)


class Maker:
    """What the factory reads of a rollout maker when no worker is started."""

    class settings:
        response_length = 8


def test_the_factory_builds_whole_responses_or_a_pool_from_the_settings():
    def settings(**overrides):
        return SourceSettings(
            **(
                dict(generation_window=None, rollout_pool_size=None, max_staleness=0, seed=0, rollout_worker_threads=1)
                | overrides
            )
        )

    whole = build_rollout_source(settings(), Maker(), draw=list, policy=lambda: None, local_batch_size=4)
    assert type(whole) is WholeResponses and not whole.holds_rollouts_in_flight and whole.state_dict() == {}
    windowed = build_rollout_source(
        settings(generation_window=2), Maker(), draw=list, policy=lambda: None, local_batch_size=4
    )
    assert type(windowed) is WindowedRollouts and windowed.ahead is None and windowed.holds_rollouts_in_flight
    assert (windowed.pool.size, windowed.pool.window, windowed.pool.response_length) == (4, 2, 8)
    larger = build_rollout_source(
        settings(generation_window=2, rollout_pool_size=12),
        Maker(),
        draw=list,
        policy=lambda: None,
        local_batch_size=4,
    )
    assert larger.pool.size == 12


def test_a_windowed_source_saves_and_restores_its_pool():
    from vcppo_trl.rollout import InFlight

    pool = ResponsePool(2, window=4, response_length=8)
    pool.slots = [
        InFlight({"prompt": "a"}, [1, 2], response_ids=[3], sampler_logprobs=[-0.5], windows=1, token_staleness=[2])
    ]
    pool.pending = [{"prompt": "b"}]
    state = WindowedRollouts(None, pool, draw=list).state_dict()
    restored = WindowedRollouts(None, ResponsePool(2, window=4, response_length=8), draw=list)
    restored.load_state_dict(state)
    assert restored.pool.slots == pool.slots and restored.pool.pending == pool.pending
    with pytest.raises(ValueError, match="rollout worker's"):
        restored.load_state_dict({"batches": []})  # an overlap's queue is not a pool


def test_a_pool_saves_tool_episodes_only_with_tools_and_loads_what_was_saved_before_them():
    import threading

    from vcppo_trl.episodes.tool_episode import ToolEpisode
    from vcppo_trl.rollout import InFlight

    saved_before = {
        "row": {"prompt": "a"},
        "prompt_ids": [1],
        "response_ids": [3],
        "sampler_logprobs": [],
        "windows": 1,
    }
    pool = ResponsePool(2, window=4, response_length=8)
    pool.load_state_dict({"window": 4, "slots": [saved_before], "pending": []})  # a pool saved before tools
    # Saved the same without tools, with the ages its tokens were given (one update before the resume).
    assert pool.state_dict()["slots"] == [{**saved_before, "token_staleness": [1]}]
    episode = ToolEpisode([1], prompt_text="p", completion_ids=[3, 4], env_mask=[1, 0], turn_start=2, iterations=1)
    episode.messages = [{"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "add"}}]}]
    pool.slots = [InFlight({"prompt": "a"}, [1], response_ids=[3, 4], episode=episode, environment={"total": 7})]
    pool.slots[0].token_staleness = [1, 0]
    restored = ResponsePool(2, window=4, response_length=8)
    restored.load_state_dict(pool.state_dict())
    assert restored.slots == pool.slots  # the episode's state and its environment (pickled), as they were
    pool.slots[0].environment = threading.Lock()
    with pytest.raises(ValueError, match=r"The environment lock of an episode in flight cannot be pickled"):
        pool.state_dict()


def test_a_prompt_stream_moved_to_a_count_draws_what_a_stream_started_there_draws(toy_splits):
    from vcppo_trl.trainer.prompts import PromptStream

    plan = type("Plan", (), {"prompts_per_update": 4, "local_prompts_per_update": 2})()  # 2 processes' share
    moved = PromptStream(toy_splits["train"], plan, 1, seed=3, num_generations=2)
    moved.draw()
    moved.seek(5)
    started = PromptStream(toy_splits["train"], plan, 1, seed=3, num_generations=2, consumed=5)
    assert moved.consumed == started.consumed == 5
    for _ in range(3):
        assert moved.draw() == started.draw()
    assert moved.consumed == started.consumed == 8
