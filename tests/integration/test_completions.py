"""`log_completions` (TRL GRPO's name): the update's completions as parquet files, on the console and in the trackers
(tensorboard for real, offline; Weights & Biases and trackio through stand-ins)."""

from __future__ import annotations

import math
import pathlib
import sys
import types

import pandas as pd
import pytest

COLUMNS = ["step", "prompt", "completion", "score", "length_reward", "advantage", "value", "length"]


def test_every_logging_step_writes_the_updates_completions(fresh_trainer, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "tb"))
    trainer = fresh_trainer(
        log_completions=True,
        num_completions_to_print=2,
        logging_steps=2,
        total_episodes=64,  # 4 updates of 16: logged at 2 and 4
        report_to=["tensorboard"],
    )
    trainer.train()
    folder = tmp_path / "out" / "completions"
    assert sorted(p.name for p in folder.iterdir()) == ["completions_00002.parquet", "completions_00004.parquet"]
    frame = pd.read_parquet(folder / "completions_00004.parquet")
    assert list(frame.columns) == COLUMNS
    assert len(frame) == trainer.batches.local_batch_size and set(frame["step"]) == {4}
    last = trainer.last_update.rollout
    assert frame["completion"].tolist() == [str(c) for c in last.completions]
    assert frame["length"].tolist() == last.response_mask.sum(1).tolist()
    assert frame["score"].tolist() == pytest.approx(last.scores.tolist())
    assert frame["value"].tolist() == pytest.approx(last.values[:, 0].tolist())
    printed = capsys.readouterr().out
    assert "Step 2" in printed and "Step 4" in printed  # TRL's printout, at each logging step
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0})
    events.Reload()
    assert "completions/text_summary" in events.Tags()["tensors"]
    steps = [e.step for e in events.Tensors("completions/text_summary")]
    assert steps == [2, 4]
    text = events.Tensors("completions/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert text.startswith("| step | prompt | completion |") and text.count("\n") == 1 + len(frame)


def test_windows_mark_the_unfinished_responses_which_have_no_score_yet(fresh_trainer):
    trainer = fresh_trainer(log_completions=True, generation_window=4, total_episodes=32)
    trainer.train()
    folder = pathlib.Path(trainer.args.output_dir) / "completions"
    frame = pd.concat([pd.read_parquet(p) for p in sorted(folder.glob("*.parquet"))])
    assert list(frame.columns) == [*COLUMNS, "finished"]
    unfinished = ~frame["finished"]
    assert unfinished.any() and frame["finished"].any()
    assert frame.loc[unfinished, "score"].isna().all() and frame.loc[~unfinished, "score"].notna().all()


class _Recorder(types.ModuleType):
    """A stand-in for `wandb` or `trackio`: a `Table` that keeps its frame and a `log` that records."""

    def __init__(self, name):
        super().__init__(name)
        self.logged = []
        self.run = object()  # wandb: a run is active

        class Table:
            def __init__(self, dataframe):
                self.dataframe = dataframe

        self.Table = Table

    def log(self, data):
        self.logged.append(data)


def test_weights_and_biases_and_trackio_get_a_table(monkeypatch, tmp_path):
    import torch

    from vcppo_trl.rollout.types import Rollout
    from vcppo_trl.trainer.completions import CompletionLog, CompletionLogSettings, completion_table
    from vcppo_trl.trainer.metrics import UpdateRecord

    trackers = {name: _Recorder(name) for name in ("wandb", "trackio")}
    for name, module in trackers.items():
        monkeypatch.setitem(sys.modules, name, module)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    rollout = Rollout(
        prompts=["1+1=", "2+2="],
        completions=["2", "4|x\ny"],
        extra_columns={},
        query_ids=torch.zeros(2, 2, dtype=torch.long),
        query_mask=torch.ones(2, 2, dtype=torch.long),
        response_ids=torch.zeros(2, 3, dtype=torch.long),
        response_mask=mask,
        has_stop=torch.tensor([True, False]),
        scores=torch.tensor([1.0, -1.0]),
        raw_scores=torch.tensor([1.0, -1.0]),
        rewards_per_func=torch.tensor([[1.0], [math.nan]]),
        reward_failed=torch.tensor([False, False]),
        values=torch.tensor([[0.5, 0.2, 0.0], [-0.1, 0.0, 0.3]]),
    )
    advantages = torch.tensor([[1.0, 3.0, 9.0], [0.0, 1.5, 3.0]])
    update = UpdateRecord(rollout, advantages, returns=advantages, result=None)
    table = completion_table(update, ["correct"], step=7)
    assert table["advantage"] == pytest.approx([2.0, 1.5])  # masked mean over the response
    assert table["value"] == pytest.approx([0.5, -0.1]) and table["length"] == [2, 3]
    assert math.isnan(table["correct"][1]) and "finished" not in table
    settings = CompletionLogSettings(
        log_completions=True,
        num_completions_to_print=None,
        num_sample_generations=0,
        report_to=("wandb", "trackio"),
        output_dir=str(tmp_path),
    )
    CompletionLog(settings, accelerator=None, reward_func_names=["correct"], max_steps=10, callbacks=[]).write(
        table, step=7
    )
    for module in trackers.values():
        (logged,) = module.logged
        assert logged["completions"].dataframe["completion"].tolist() == ["2", "4|x\ny"]
    assert (tmp_path / "completions" / "completions_00007.parquet").is_file()


def test_markdown_cells_stay_on_one_line():
    from vcppo_trl.trainer.completions import markdown_table

    text = markdown_table({"completion": ["a|b\nc"], "score": [0.123456]})
    assert text.splitlines() == ["| completion | score |", "| --- | --- |", "| a\\|b<br>c | 0.1235 |"]


def test_reward_functions_log_columns_and_metrics_as_in_trl(tmp_path):
    """TRL's `log_extra(column, values)` adds a column to the logged completions and `log_metric(name, value)` a
    metric under its own name, averaged over the values logged in the update; under generation windows a column is
    logged for the responses that finished in that update only (None for the others)."""
    from tests.builders import tiny_config, tiny_trainer

    seen = []

    def checked_length(completions, log_extra, log_metric, **kwargs):
        lengths = [len(str(c)) for c in completions]
        log_extra("chars", lengths)
        log_metric("custom/chars_mean", sum(lengths) / len(lengths))
        log_metric("custom/batches", 1.0)
        seen.append(lengths)
        return [min(n, 20) / 20 for n in lengths]

    trainer = tiny_trainer(
        args=tiny_config(str(tmp_path / "out"), log_completions=True, logging_steps=1, total_episodes=32),
        reward_funcs=checked_length,
    )
    trainer.train()
    logged = [e for e in trainer.state.log_history if "custom/chars_mean" in e]
    assert len(logged) == 2 and all(e["custom/batches"] == 1.0 for e in logged)
    assert logged[-1]["custom/chars_mean"] == pytest.approx(sum(seen[-1]) / len(seen[-1]))
    frame = pd.read_parquet(pathlib.Path(trainer.args.output_dir) / "completions" / "completions_00002.parquet")
    assert frame["chars"].tolist() == seen[-1]

    windowed = tiny_trainer(
        args=tiny_config(str(tmp_path / "windowed"), log_completions=True, generation_window=4, total_episodes=32),
        reward_funcs=checked_length,
    )
    windowed.train()
    folder = pathlib.Path(windowed.args.output_dir) / "completions"
    frame = pd.concat([pd.read_parquet(p) for p in sorted(folder.glob("*.parquet"))])
    finished = frame["finished"]
    assert frame.loc[finished, "chars"].notna().all() and frame.loc[~finished, "chars"].isna().all()
    assert frame.loc[finished, "chars"].tolist() == [n for lengths in seen[2:] for n in lengths]


def test_log_extra_and_log_metric_refuse_bad_input():
    from vcppo_trl.rewards import RewardLogs

    logs = RewardLogs()
    with pytest.raises(TypeError, match="one value per completion"):
        logs.log_extra("col", 3)
    with pytest.raises(TypeError, match="must be a number"):
        logs.log_metric("m", "high")
    logs.log_extra("col", [1, 2])
    assert logs.columns_for(3) == {"col": [1, 2, None]} and logs.columns_for(1) == {"col": [2]}
