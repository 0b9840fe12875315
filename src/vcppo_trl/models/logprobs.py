"""Log-probabilities (and entropy) of response tokens without materialising the `[B, T, V]` logits.

At 16k tokens and a 152k vocabulary one sequence's logits are ~5 GB in bf16 (~10 GB in float32). Instead, the causal
LM's backbone runs once, the hidden states of the response positions are kept (`[B, T, H]`), and TRL's
`ChunkedLogProbFunction` projects them through the LM head in `[tokens, VOCAB_CHUNK]` tiles, folding each tile into an
online log-sum-exp; its backward recomputes the tiles, so neither pass holds the full logits.

Models whose logits are not `lm_head(last_hidden_state)` up to TRL's supported transforms (logit scale, final
soft-capping) — or whose LM head is wrapped (e.g. LoRA on `lm_head`) — fall back to [`full_logits_logprobs`]. A model
sharded by FSDP2 takes the chunked path too: its backbone runs inside the model's own forward, asked for no logits.

With sampling knobs on (top-k, top-p, min-p, repetition penalty: [`~algo.logits_processing.SamplingKnobs`]) the
log-probabilities are those of the processed distribution the sampler drew from ([`processed_token_logprobs`]): its
truncation needs whole vocabulary rows, so the head is applied in tiles of tokens instead (`[PROCESSED_TILE // V, V]`),
the backward recomputing each tile; the entropy is the processed distribution's too.

A head cast by `cast_lm_head_to_fp32` ([`~models.fp32_head.cast_lm_head_to_fp32`]) is projected in float32 with
autocast off on both paths: the chunked one upcasts the hidden states here, the full-logits one calls the head.
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass

import torch
from accelerate.utils import is_peft_model
from torch import nn
from torch.distributed.fsdp import FSDPModule
from transformers import PreTrainedModel
from trl.kernels import ChunkedLogProbFunction
from trl.trainer.utils import entropy_from_logits, maybe_gather_lm_head_ctx, selective_log_softmax

from ..algo.logits_processing import NO_KNOBS, SamplingKnobs, first_seen_steps, processed_logprobs
from ..parallel.fsdp import unsharded_class
from .fp32_head import FP32LMHead, is_fp32_head
from .packing import PackedRow

# Vocabulary columns per projection tile: a [4096 tokens, 4096] float32 tile is 64 MiB, whatever the vocabulary size.
VOCAB_CHUNK = 4096
# Logits per tile of the processed path (top-k, top-p, min-p, repetition penalty), which needs whole vocabulary rows:
# [PROCESSED_TILE // V tokens, V], 32 MiB in float32 (its sort and softmaxes hold a few such tensors).
PROCESSED_TILE = 2**23
# Config fields of output-scaling schemes the chunked path does not reproduce: such models use the full logits.
UNSUPPORTED_LOGIT_SCALING = ("output_multiplier", "lm_head_multiplier", "logits_scaling")


@dataclass
class CausalLMParts:
    """A causal LM split into the pieces the chunked path needs: `logits = transform(lm_head(backbone(x)))`."""

    backbone: nn.Module
    lm_head: nn.Linear
    logit_scale: float = 1.0
    final_logit_softcapping: float | None = None
    fp32_head: bool = False  # `cast_lm_head_to_fp32`: project in float32, autocast off
    fsdp2_root: nn.Module | None = None  # the causal LM, when it is an FSDP2 root: the backbone runs through it

    def last_hidden_state(self, **inputs) -> torch.Tensor:
        """The backbone's last hidden state over `inputs`, the LM head not applied."""
        if self.fsdp2_root is None:
            return self.backbone(**inputs, use_cache=False).last_hidden_state
        # FSDP2: through the root's forward, whose hooks gather and free each unit in order (a direct backbone call
        # would skip the root's and make its first unit a root of its own). An empty `logits_to_keep` projects no
        # position; the head's unit (accelerate's tail of final norm and LM head) stays gathered after the forward,
        # and its gradient is reduced once the final norm's backward has run, after the tiles' backward.
        captured = {}
        hook = self.backbone.register_forward_hook(
            lambda module, args, output: captured.update(hidden=output.last_hidden_state)
        )
        try:
            nothing = torch.empty(0, dtype=torch.long, device=inputs["input_ids"].device)
            self.fsdp2_root(**inputs, use_cache=False, logits_to_keep=nothing)
        finally:
            hook.remove()
        return captured["hidden"]


def causal_lm_parts(model: nn.Module) -> CausalLMParts | None:
    """
    The backbone and plain linear LM head of a causal LM (PEFT-wrapped or not), or `None` when the logits are not
    simply the LM head applied to the backbone's last hidden state.
    """
    base = model.get_base_model() if is_peft_model(model) else model
    if not isinstance(base, PreTrainedModel):
        return None
    backbone = getattr(base, base.base_model_prefix, None)
    lm_head = base.get_output_embeddings()
    # An exact class on purpose: a LoRA or modules-to-save wrapper around the head is not a plain projection.
    if backbone is None or backbone is base or unsharded_class(lm_head) not in (nn.Linear, FP32LMHead):
        return None
    config = base.config.get_text_config()
    if any(getattr(config, name, None) is not None for name in UNSUPPORTED_LOGIT_SCALING):
        return None
    sharded = isinstance(base, FSDPModule)
    if sharded and "logits_to_keep" not in inspect.signature(base.forward).parameters:
        return None  # FSDP2 runs the backbone through the model's forward, which must be able to skip the logits
    logit_scale = getattr(config, "logit_scale", None)
    return CausalLMParts(
        backbone=backbone,
        lm_head=lm_head,
        logit_scale=1.0 if logit_scale is None else float(logit_scale),
        final_logit_softcapping=getattr(config, "final_logit_softcapping", None),
        fp32_head=is_fp32_head(lm_head),
        fsdp2_root=base if sharded else None,
    )


@dataclass(frozen=True)
class TokenHistory:
    """
    What the repetition penalty needs to know of the scored positions: the tokens each has seen.

    `history` holds each row's prompt (left-padded with -1) in its first `context` columns, then its response; `rows`
    and `steps` give the row and the response step of each scored position, in the order they are scored (`[N]`).
    """

    history: torch.Tensor  # [R, P + T]
    context: int  # P
    rows: torch.Tensor  # [N]
    steps: torch.Tensor  # [N]

    @classmethod
    def grid(cls, history: torch.Tensor, context: int, width: int) -> TokenHistory:
        """Every row's first `width` response steps, row after row (a `[R, width]` output flattened)."""
        device = history.device
        rows = torch.arange(history.shape[0], device=device).repeat_interleave(width)
        steps = torch.arange(width, device=device).repeat(history.shape[0])
        return cls(history, context, rows, steps)

    @classmethod
    def of_padded(cls, input_ids: torch.Tensor, attention_mask: torch.Tensor, context_length: int) -> TokenHistory:
        """The padded layout: `input_ids` is left-padded prompts (their mask 0 on the padding) then responses."""
        prompt = torch.where(attention_mask[:, :context_length].bool(), input_ids[:, :context_length], -1)
        history = torch.cat([prompt, input_ids[:, context_length:]], dim=1)
        return cls.grid(history, context_length, input_ids.shape[1] - context_length)

    def first_seen(self, vocab_size: int) -> torch.Tensor:
        """`[R, V]`: [`~algo.logits_processing.first_seen_steps`] of the rows."""
        return first_seen_steps(self.history, self.context, vocab_size)

    def seen(self, first_seen: torch.Tensor, start: int = 0, end: int | None = None) -> torch.Tensor:
        """`[n, V]` bool: the tokens scored positions `start:end` have seen."""
        return first_seen[self.rows[start:end]] < self.steps[start:end, None]


def _transform(logits: torch.Tensor, transform: tuple[float, float | None]) -> torch.Tensor:
    """The model's own output transform `(logit_scale, final_logit_softcapping)`, in float32 (as TRL's chunked
    kernel applies it)."""
    logit_scale, softcapping = transform
    logits = logits.float() * logit_scale
    return logits if softcapping is None else softcapping * torch.tanh(logits / softcapping)


class ProcessedLogProbFunction(torch.autograd.Function):
    """
    Per-token log-probabilities (and entropy) of the processed distribution of `hidden @ weight.T + bias`
    ([`~algo.logits_processing.processed_logprobs`]) in tiles of whole vocabulary rows, never holding the `[N, V]`
    logits; the backward recomputes each tile and takes its gradient through the same function.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, knobs, history, transform, compute_entropy):
        ctx.set_materialize_grads(False)
        device = hidden.device
        compute_dtype = (
            torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else hidden.dtype
        )
        vocab = weight.shape[0]
        first_seen = history.first_seen(vocab) if knobs.penalises else None
        tile = max(1, PROCESSED_TILE // vocab)
        logprobs = torch.empty(hidden.shape[0], device=device, dtype=torch.float32)
        entropy = torch.empty_like(logprobs) if compute_entropy else None
        with torch.no_grad():
            for start in range(0, hidden.shape[0], tile):
                end = min(start + tile, hidden.shape[0])
                logits = _tile_logits(hidden[start:end], weight, bias=bias, dtype=compute_dtype)
                seen = history.seen(first_seen, start, end) if first_seen is not None else None
                lp, ent = processed_logprobs(
                    _transform(logits, transform),
                    targets[start:end],
                    temperature=temperature,
                    knobs=knobs,
                    seen=seen,
                    compute_entropy=compute_entropy,
                )
                logprobs[start:end] = lp
                if entropy is not None:
                    entropy[start:end] = ent
        ctx.save_for_backward(hidden, weight, bias, targets)
        ctx.settings = (temperature, knobs, history, transform, compute_dtype, first_seen, tile)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):
        hidden, weight, bias, targets = ctx.saved_tensors
        temperature, knobs, history, transform, compute_dtype, first_seen, tile = ctx.settings
        needs_hidden, needs_weight, needs_bias = ctx.needs_input_grad[:3]
        with maybe_gather_lm_head_ctx(weight, bias), torch.autocast(hidden.device.type, enabled=False):
            grad_hidden = (
                torch.zeros(hidden.shape, device=hidden.device, dtype=torch.float32) if needs_hidden else None
            )
            grad_weight = (
                torch.zeros(weight.shape, device=weight.device, dtype=torch.float32) if needs_weight else None
            )
            grad_bias = torch.zeros(bias.shape, device=bias.device, dtype=torch.float32) if needs_bias else None
            w = weight.to(compute_dtype)
            for start in range(0, hidden.shape[0], tile):
                end = min(start + tile, hidden.shape[0])
                outputs, grads = [], []
                logits = (
                    _tile_logits(hidden[start:end], weight, bias=bias, dtype=compute_dtype).detach().requires_grad_()
                )
                with torch.enable_grad():
                    seen = history.seen(first_seen, start, end) if first_seen is not None else None
                    lp, ent = processed_logprobs(
                        _transform(logits, transform),
                        targets[start:end],
                        temperature=temperature,
                        knobs=knobs,
                        seen=seen,
                        compute_entropy=grad_entropy is not None,
                    )
                    if grad_logprobs is not None:
                        outputs.append(lp)
                        grads.append(grad_logprobs[start:end].float())
                    if grad_entropy is not None:
                        outputs.append(ent)
                        grads.append(grad_entropy[start:end].float())
                    if not outputs:
                        continue
                    (grad_logits,) = torch.autograd.grad(outputs, [logits], grads)
                grad_logits = grad_logits.to(compute_dtype)
                if grad_hidden is not None:
                    grad_hidden[start:end] = (grad_logits @ w).float()
                if grad_weight is not None:
                    grad_weight.addmm_(grad_logits.t().float(), hidden[start:end].float())
                if grad_bias is not None:
                    grad_bias += grad_logits.sum(dim=0, dtype=torch.float32)
        return (
            grad_hidden.to(hidden.dtype) if grad_hidden is not None else None,
            grad_weight.to(weight.dtype) if grad_weight is not None else None,
            grad_bias.to(bias.dtype) if grad_bias is not None else None,
            *([None] * 6),
        )


def _tile_logits(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype):
    """One tile of `hidden @ weight.T + bias`, `[n, V]` in `dtype` (the compute dtype, as TRL's kernel)."""
    logits = hidden.to(dtype) @ weight.to(dtype).t()
    return logits if bias is None else logits + bias.to(dtype)


def logits_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    compute_entropy: bool,
    knobs: SamplingKnobs = NO_KNOBS,
    history: TokenHistory | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """
    Log-probabilities of `targets` (and the entropy) from whole logits `[..., V]` (the full-logits paths): at the
    temperature alone, or under the processed distribution with `knobs` (`history`'s positions in the order of the
    flattened leading dimensions).
    """
    if not knobs.active:
        logits = logits.float() / temperature
        return selective_log_softmax(logits, targets), (entropy_from_logits(logits) if compute_entropy else None)
    seen = None
    if knobs.penalises:
        first_seen = history.first_seen(logits.shape[-1])
        seen = history.seen(first_seen).view(logits.shape)
    return processed_logprobs(
        logits, targets, temperature=temperature, knobs=knobs, seen=seen, compute_entropy=compute_entropy
    )


def chunked_token_logprobs(
    hidden: torch.Tensor,
    parts: CausalLMParts,
    targets: torch.Tensor,
    temperature: float,
    compute_entropy: bool,
    knobs: SamplingKnobs = NO_KNOBS,
    history: TokenHistory | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """
    `log softmax(transform(lm_head(hidden)) / temperature)[target]` (and the entropy) per position, in vocabulary
    tiles; with sampling `knobs` on, the log-probabilities of the processed distribution instead, in tiles of tokens
    ([`ProcessedLogProbFunction`]).

    Args:
        hidden (`torch.Tensor` of shape `[B, T, H]`): Hidden states of the positions that predict `targets`.
        parts ([`CausalLMParts`]): The LM head and its output transform.
        targets (`torch.Tensor` of shape `[B, T]`): Token ids whose log-probabilities are wanted.
        temperature (`float`): Sampling temperature the logits are divided by.
        compute_entropy (`bool`): Also return the entropy of each position's distribution.
        knobs ([`~algo.logits_processing.SamplingKnobs`]): The sampler's other knobs (none by default).
        history ([`TokenHistory`], *optional*): The tokens each position has seen, in the order of the flattened
            `targets` (needed for the repetition penalty).

    Returns:
        `(logprobs, entropy)`: float32 `[B, T]`; `entropy` is `None` unless `compute_entropy`.
    """
    outputs = ("log_probs", "entropy") if compute_entropy else ("log_probs",)
    weight, bias = parts.lm_head.weight, parts.lm_head.bias
    autocast = contextlib.nullcontext()
    if parts.fp32_head:
        # The kernel computes in the autocast dtype when autocast is on, else in the hidden states' dtype (as TRL's
        # fused LM head under `cast_lm_head_to_fp32`).
        hidden = hidden.float()
        autocast = torch.autocast(hidden.device.type, enabled=False)
    # The head is read directly, never called: under ZeRO-3 its weight must be gathered explicitly (and its shape is
    # only known once gathered: a partitioned parameter is empty).
    with autocast, maybe_gather_lm_head_ctx(weight, bias):
        if knobs.active:
            logprobs, entropy = ProcessedLogProbFunction.apply(
                hidden.reshape(-1, hidden.shape[-1]),
                weight,
                bias,
                targets.reshape(-1),
                temperature,
                knobs,
                history,
                (parts.logit_scale, parts.final_logit_softcapping),
                compute_entropy,
            )
        else:
            # The tile buffer is [tokens, chunk]: no wider than the vocabulary, so that small vocabularies get dense
            # tiles.
            vocab_chunk = min(VOCAB_CHUNK, weight.shape[0])
            logprobs, entropy, *_ = ChunkedLogProbFunction.apply(
                hidden.reshape(-1, hidden.shape[-1]),
                weight,
                bias,
                targets.reshape(-1),
                temperature,
                vocab_chunk,
                parts.final_logit_softcapping,
                parts.logit_scale,
                outputs,
            )
    shape = targets.shape
    return logprobs.view(shape), (entropy.view(shape) if entropy is not None else None)


def full_logits_logprobs(
    policy: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    context_length: int,
    temperature: float,
    compute_entropy: bool = False,
    knobs: SamplingKnobs = NO_KNOBS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """
    The same as [`response_logprobs`] through the model's own forward: materialises the `[B, T, V]` logits of the
    response positions (the fallback, and the reference the chunked path is tested and benchmarked against).
    """
    response_length = input_ids.shape[1] - context_length
    output = policy(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        logits_to_keep=response_length + 1,
        use_cache=False,
    )
    history = TokenHistory.of_padded(input_ids, attention_mask, context_length) if knobs.penalises else None
    return logits_logprobs(
        output.logits[:, :-1],
        input_ids[:, context_length:],
        temperature=temperature,
        compute_entropy=compute_entropy,
        knobs=knobs,
        history=history,
    )


def response_logprobs(
    policy: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    context_length: int,
    temperature: float,
    compute_entropy: bool = False,
    knobs: SamplingKnobs = NO_KNOBS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """
    Log-probabilities of the response tokens `input_ids[:, context_length:]`, each read from the logits at the position
    before it, at `temperature` (and under the sampler's other `knobs`: the processed distribution, the prompt without
    its left padding and the response before each token as the repetition penalty's history); one backbone pass and no
    `[B, T, V]` logits when the model allows it.

    Returns:
        `(logprobs, entropy)`: float32 `[B, T]`; `entropy` is `None` unless `compute_entropy`.
    """
    parts = causal_lm_parts(policy)
    if parts is None:
        return full_logits_logprobs(
            policy,
            input_ids,
            attention_mask,
            position_ids=position_ids,
            context_length=context_length,
            temperature=temperature,
            compute_entropy=compute_entropy,
            knobs=knobs,
        )
    hidden = parts.last_hidden_state(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids)
    hidden = hidden[:, context_length - 1 : -1]
    history = TokenHistory.of_padded(input_ids, attention_mask, context_length) if knobs.penalises else None
    return chunked_token_logprobs(
        hidden,
        parts,
        input_ids[:, context_length:],
        temperature=temperature,
        compute_entropy=compute_entropy,
        knobs=knobs,
        history=history,
    )


def packed_response_logprobs(
    policy: nn.Module,
    packed: PackedRow,
    temperature: float,
    compute_entropy: bool = False,
    knobs: SamplingKnobs = NO_KNOBS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """
    [`response_logprobs`] of a padding-free micro-batch: one pass over the packed row (no attention mask:
    transformers keeps the sequences apart from `position_ids`), each response token read at the position that
    predicts it ([`~models.packing.PackedRow`]).

    Returns:
        `(logprobs, entropy)`: float32 `[b, w]` (garbage past each response's end, which the losses mask).
    """
    parts = causal_lm_parts(policy)
    width = packed.targets.shape[1]
    history = None
    if knobs.penalises:
        history = TokenHistory.grid(packed.history, packed.history.shape[1] - width, width)
    if parts is None:
        output = policy(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False)
        return logits_logprobs(
            output.logits[0][packed.predicting],
            packed.targets,
            temperature=temperature,
            compute_entropy=compute_entropy,
            knobs=knobs,
            history=history,
        )
    hidden = parts.last_hidden_state(input_ids=packed.input_ids, position_ids=packed.position_ids)
    hidden = hidden[0][packed.predicting]
    return chunked_token_logprobs(
        hidden,
        parts,
        packed.targets,
        temperature=temperature,
        compute_entropy=compute_entropy,
        knobs=knobs,
        history=history,
    )
