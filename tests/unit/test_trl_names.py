"""TRL GRPOConfig's field names (issue 47): every field of the installed TRL's GRPOConfig has an answer here, TRL's
names set ours, the fields with no meaning are refused by name with the reason, and `max_steps` is the number of
updates."""

from __future__ import annotations

import dataclasses

import pytest
from transformers import TrainingArguments
from trl import GRPOConfig

from vcppo_trl import PPOConfig, VAPOConfig, VCPPOConfig
from vcppo_trl.config import trl_names
from vcppo_trl.config.batch_plan import plan_batches

from ..builders import tiny_config, tiny_config_kwargs

GRPO_FIELDS = sorted(
    {f.name for f in dataclasses.fields(GRPOConfig)} - {f.name for f in dataclasses.fields(TrainingArguments)}
)
GRPO_DEFAULTS = {f.name: f.default for f in dataclasses.fields(GRPOConfig) if f.default is not dataclasses.MISSING}
TABLES = (trl_names.ALIASES, trl_names.SAME_NAME, trl_names.REFUSED, trl_names.ONLY_VALUE)


def test_every_field_grpo_config_adds_has_an_answer():
    """A new TRL release with a new field fails here until the field is classified in config/trl_names.py."""
    unanswered = [name for name in GRPO_FIELDS if not any(name in table for table in TABLES)]
    assert not unanswered, f"classify these GRPOConfig fields in config/trl_names.py: {unanswered}"
    for name in GRPO_FIELDS:
        assert trl_names.answer(name)
    twice = [name for name in GRPO_FIELDS if sum(name in table for table in TABLES) > 1]
    assert not twice


def test_the_tables_name_only_grpo_fields():
    """No stale entry: what the tables answer is a field of the installed GRPOConfig."""
    for table in TABLES:
        assert set(table) <= set(GRPO_FIELDS), set(table) - set(GRPO_FIELDS)


@pytest.mark.parametrize("cls", [PPOConfig, VCPPOConfig, VAPOConfig])
def test_same_names_and_aliases_are_fields(cls):
    fields = {f.name for f in dataclasses.fields(cls)}
    assert trl_names.SAME_NAME <= fields
    assert set(trl_names.ALIASES) <= fields
    assert set(trl_names.ALIASES.values()) <= fields
    assert not (set(trl_names.REFUSED) | set(trl_names.ONLY_VALUE)) & fields


ALIAS_VALUES = {
    "max_completion_length": 24,
    "beta": 0.0,
    "epsilon": 0.25,
    "epsilon_high": 0.3,
    "delta": 4.0,
    "num_iterations": 2,
    "num_generations_eval": 4,
    "vllm_importance_sampling_cap": 5.0,
}


@pytest.mark.parametrize("trl_name", sorted(trl_names.ALIASES))
def test_a_trl_name_sets_ours_and_then_reads_and_writes_it(trl_name, tmp_path):
    ours = trl_names.ALIASES[trl_name]
    kwargs = tiny_config_kwargs(tmp_path, **{trl_name: ALIAS_VALUES[trl_name]})
    kwargs.pop(ours, None)  # the tiny config sets some of ours
    config = VCPPOConfig(**kwargs)
    assert getattr(config, ours) == ALIAS_VALUES[trl_name]
    assert getattr(config, trl_name) == ALIAS_VALUES[trl_name]  # user code written for GRPOConfig reads it
    rebuilt = dataclasses.replace(config, seed=1)  # a config rebuilt from its fields is the same
    assert getattr(rebuilt, ours) == getattr(rebuilt, trl_name) == ALIAS_VALUES[trl_name]
    changed = ALIAS_VALUES[trl_name] * 2 + 1
    assert getattr(dataclasses.replace(config, **{ours: changed}), ours) == changed  # a rebuild changes ours
    assert VCPPOConfig(**{k: v for k, v in config.to_dict().items() if k in kwargs}).to_dict() == config.to_dict()
    other = ALIAS_VALUES[trl_name] + 1
    setattr(config, trl_name, other)  # a live view: setting TRL's name sets ours
    assert getattr(config, ours) == other
    plain = VCPPOConfig(**tiny_config_kwargs(tmp_path))  # not given: reads ours all the same
    assert getattr(plain, trl_name) == getattr(plain, ours)


@pytest.mark.parametrize("trl_name", sorted(trl_names.ALIASES))
def test_both_names_with_different_values_is_an_error_naming_both(trl_name, tmp_path):
    ours = trl_names.ALIASES[trl_name]
    other = {
        "cliprange_high": 0.35,
        "dual_clip_c": 3.0,
        "kl_coef": 0.1,
        "num_ppo_epochs": 3,
        "eval_num_generations": 2,
    }
    ours_value = other.get(ours, {"response_length": 12, "cliprange": 0.1}.get(ours, 7.0))
    kwargs = tiny_config_kwargs(tmp_path, **{trl_name: ALIAS_VALUES[trl_name], ours: ours_value})
    with pytest.raises(ValueError, match=f"`{trl_name}=.*`{ours}=.*set only one"):
        VCPPOConfig(**kwargs)
    same = tiny_config_kwargs(tmp_path, **{trl_name: ALIAS_VALUES[trl_name], ours: ALIAS_VALUES[trl_name]})
    assert getattr(VCPPOConfig(**same), ours) == ALIAS_VALUES[trl_name]


@pytest.mark.parametrize("name", sorted(trl_names.REFUSED))
def test_a_refused_field_is_refused_by_name_with_its_reason(name, tmp_path):
    kwargs = tiny_config_kwargs(tmp_path, **{name: GRPO_DEFAULTS.get(name)})
    with pytest.raises(ValueError, match=f"`{name}` \\(a TRL GRPOConfig field\\) has no meaning in VCPPOConfig: .+"):
        VCPPOConfig(**kwargs)


def _another_value(value):
    if isinstance(value, bool):
        return not value
    if value is None:
        return 1
    if isinstance(value, str):
        return value + "-other"
    return value + 1


@pytest.mark.parametrize("name", sorted(trl_names.ONLY_VALUE))
def test_an_only_value_field_takes_its_no_op_value_and_refuses_others(name, tmp_path):
    accepted, _ = trl_names.ONLY_VALUE[name]
    config = VCPPOConfig(**tiny_config_kwargs(tmp_path, **{name: accepted}))
    assert getattr(config, name) == accepted  # read as in GRPOConfig
    assert not hasattr(config, name + "_misspelt")
    other = _another_value(accepted)
    with pytest.raises(ValueError, match=f"`{name}={other!r}` \\(a TRL GRPOConfig field\\) is refused by VCPPOConfig"):
        VCPPOConfig(**tiny_config_kwargs(tmp_path, **{name: other}))


@pytest.mark.parametrize(("trl_value", "ours"), sorted(trl_names.LOSS_TYPE_ALIASES.items()))
def test_trl_loss_types_map_to_the_aggregation_they_denote(trl_value, ours, tmp_path):
    config = tiny_config(tmp_path, loss_type=trl_value)
    assert (config.loss_type, config.value_loss_type) == (ours, ours)


@pytest.mark.parametrize("trl_value", sorted(trl_names.REFUSED_LOSS_TYPES))
def test_trl_losses_not_built_here_are_refused_by_name(trl_value, tmp_path):
    with pytest.raises(ValueError, match=f"loss_type='{trl_value}' is TRL GRPO's .* does not implement"):
        tiny_config(tmp_path, loss_type=trl_value)


def test_a_misspelt_field_is_answered_with_the_closest_names(tmp_path):
    with pytest.raises(TypeError, match="no field `max_complettion_length`. Did you mean `max_completion_length`"):
        tiny_config(tmp_path, max_complettion_length=12)
    with pytest.raises(TypeError, match="no field `responce_length`. Did you mean `response_length`"):
        tiny_config(tmp_path, responce_length=12)
    with pytest.raises(TypeError, match="no field `zzz_qqq`.$|no field `zzz_qqq`. \\("):
        tiny_config(tmp_path, zzz_qqq=1)


def test_steps_per_generation_and_generation_batch_size_set_the_mini_batches(tmp_path):
    base = dict(per_device_train_batch_size=4, gradient_accumulation_steps=2, num_mini_batches=1)
    assert tiny_config(tmp_path, **base, steps_per_generation=6).num_mini_batches == 3
    assert tiny_config(tmp_path, **base, generation_batch_size=16).num_mini_batches == 2  # 16 / (4 x 1 process) / 2
    with pytest.raises(ValueError, match="multiple of gradient_accumulation_steps=2"):
        tiny_config(tmp_path, **base, steps_per_generation=3)
    with pytest.raises(ValueError, match="multiple of per_device_train_batch_size"):
        tiny_config(tmp_path, **base, generation_batch_size=6)
    with pytest.raises(ValueError, match="both set the mini-batches"):
        tiny_config(tmp_path, **base, steps_per_generation=2, generation_batch_size=8)
    with pytest.raises(ValueError, match="num_mini_batches=2 is set too"):
        tiny_config(tmp_path, **{**base, "num_mini_batches": 2}, steps_per_generation=6)


def test_a_grpo_script_config_builds_under_trl_names(tmp_path):
    """The GRPOConfig of a small GRPO script (TRL's names only) builds a VCPPOConfig unchanged."""
    kwargs = dict(
        output_dir=str(tmp_path),
        use_cpu=True,
        report_to="none",
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_generations=4,
        max_completion_length=32,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        num_iterations=1,
        loss_type="dapo",
        steps_per_generation=2,
        max_steps=3,
        top_p=1.0,
        top_k=0,
        shuffle_dataset=True,
    )
    config = VCPPOConfig(**kwargs)
    assert (config.response_length, config.kl_coef, config.cliprange, config.cliprange_high) == (32, 0.0, 0.2, 0.28)
    assert (config.num_ppo_epochs, config.loss_type, config.num_mini_batches, config.max_steps) == (
        1,
        "token_mean",
        1,
        3,
    )
    grpo = GRPOConfig(**kwargs)  # the same keywords build TRL's own config
    assert grpo.max_completion_length == 32


def test_max_steps_is_the_number_of_updates_over_epochs_and_total_episodes(tmp_path, caplog):
    config = tiny_config(tmp_path, max_steps=3, total_episodes=32)  # 16 sequences per update
    plan = plan_batches(config, world_size=1, train_rows=64)
    assert (plan.num_ppo_updates, plan.total_episodes) == (3, 48)
    unset = plan_batches(tiny_config(tmp_path, total_episodes=32), world_size=1, train_rows=64)
    assert unset.num_ppo_updates == 2


def test_every_default_that_differs_from_grpo_config_is_named_with_its_reason(tmp_path):
    trl = GRPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    ours = VCPPOConfig(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    differ = []
    for f in dataclasses.fields(GRPOConfig):
        name = trl_names.ALIASES.get(f.name, f.name)
        if not f.init or not hasattr(ours, name) or f.name in ("output_dir", "logging_dir"):
            continue
        theirs, mine = getattr(trl, f.name), getattr(ours, name)
        if theirs != mine and not (isinstance(theirs, float) and theirs == pytest.approx(mine)):
            differ.append(f.name)
    assert sorted(differ) == sorted(trl_names.DIFFERENT_DEFAULTS), "classify in trl_names.DIFFERENT_DEFAULTS"


def test_the_migration_page_answers_every_grpo_field():
    import pathlib

    page = (pathlib.Path(__file__).parents[2] / "docs" / "migrating_from_grpo.md").read_text()
    missing = [name for name in GRPO_FIELDS if f"`{name}`" not in page]
    assert not missing, f"docs/migrating_from_grpo.md does not name: {missing}"
    for name, (value, reason) in trl_names.ONLY_VALUE.items():
        assert f"| `{name}` | `{value!r}` | {reason} |" in page
    for name, reason in trl_names.REFUSED.items():
        assert f"| `{name}` | {reason} |" in page
    for name, reason in trl_names.DIFFERENT_DEFAULTS.items():
        assert f"| `{name}` | {reason} |" in page


def test_train_py_refuses_abbreviated_flags_and_takes_trl_names(tmp_path):
    from vcppo_trl.cli import build_parser

    common = ["--output_dir", str(tmp_path), "--use_cpu", "--report_to", "none"]
    with pytest.raises((SystemExit, ValueError), match="value_pretrain_step"):
        build_parser().parse_args_and_config(["--value_pretrain_step", "3", *common])
    _, config, _ = build_parser().parse_args_and_config(["--max_completion_length", "12", "--beta", "0.01", *common])
    assert (config.response_length, config.kl_coef) == (12, 0.01)


def test_the_sampling_knobs_are_fields_with_trls_defaults(tmp_path):
    config = tiny_config(tmp_path)
    for name in ("top_p", "top_k", "min_p", "repetition_penalty", "generation_kwargs"):
        assert name in trl_names.SAME_NAME and getattr(config, name) == GRPO_DEFAULTS[name], name
    config = tiny_config(tmp_path, top_p=0.9, top_k=20, min_p=0.05, repetition_penalty=1.1)
    assert (config.top_p, config.top_k, config.min_p, config.repetition_penalty) == (0.9, 20, 0.05, 1.1)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(top_p=0.0), "`top_p` must be in \\(0, 1\\]"),
        (dict(top_p=1.5), "`top_p` must be in \\(0, 1\\]"),
        (dict(top_k=-1), "`top_k` must be an integer >= 0"),
        (dict(top_k=2.5), "`top_k` must be an integer >= 0"),
        (dict(min_p=1.5), "`min_p` must be in \\[0, 1\\]"),
        (dict(repetition_penalty=0.0), "`repetition_penalty` must be > 0"),
    ],
)
def test_knobs_out_of_trls_ranges_are_refused(fields, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        tiny_config(tmp_path, **fields)


def test_generation_kwargs_set_the_knobs_and_refuse_everything_else(tmp_path):
    config = tiny_config(tmp_path, generation_kwargs={"top_p": 0.9, "min_p": 0.1, "temperature": 1.0})
    assert (config.top_p, config.min_p, config.temperature) == (0.9, 0.1, 1.0)
    assert config.generation_kwargs == {"top_p": 0.9, "min_p": 0.1, "temperature": 1.0}  # kept, as TRL code reads it
    assert tiny_config(tmp_path, generation_kwargs='{"top_k": 5}').top_k == 5  # its JSON, from the command line
    assert dataclasses.replace(config, seed=1).top_p == 0.9  # a config rebuilt from its fields is the same
    same = tiny_config(tmp_path, top_k=5, generation_kwargs={"top_k": 5})
    assert same.top_k == 5
    with pytest.raises(ValueError, match="`generation_kwargs=\\{'top_k': 7\\}` and `top_k=5` .*set only one"):
        tiny_config(tmp_path, top_k=5, generation_kwargs={"top_k": 7})
    with pytest.raises(
        ValueError, match="refused: `max_new_tokens`: the trainer's log-probabilities .* response_length"
    ):
        tiny_config(tmp_path, generation_kwargs={"top_k": 5, "max_new_tokens": 12})
    with pytest.raises(ValueError, match="refused: `num_beams`: .*ratio would no longer be that of the sampled"):
        tiny_config(tmp_path, generation_kwargs={"num_beams": 4, "suppress_tokens": [3]})
    with pytest.raises(ValueError, match="must be a dict"):
        tiny_config(tmp_path, generation_kwargs="[1, 2]")
