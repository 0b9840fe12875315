"""The sampled distribution: what a sampler does to the logits before it draws a token (repetition penalty,
temperature, top-k, top-p, min-p), as pure functions, so that every log-probability the trainer takes (the old and the
learner's, the reference's for the KL) is of the distribution the tokens were drawn from, truncation renormalised.

Two orders, one per sampler (both apply the repetition penalty to the raw logits, then the temperature):

- transformers' `generate` (`_get_logits_processor`): top-k, top-p, then min-p;
- vLLM's sampler (`vllm/v1/sample/sampler.py`): min-p (an argmax-invariant logits processor), then top-k and top-p.

Top-k and min-p each keep the highest-probability tokens down to a threshold, so they commute; top-p after min-p
renormalises over fewer tokens and can keep fewer than top-p before it, so with both `top_p` and `min_p` the order
decides the distribution, and the trainer follows the sampler in use ([`SamplingKnobs.order`]).

Each step computes its kept set as the sampler does (the same operations, so the same set on the same logits); the
sets are chosen without gradient and the log-softmax over the kept tokens carries it.
"""

from __future__ import annotations

import dataclasses
import math

import torch

TRANSFORMERS_ORDER = "transformers"  # repetition penalty, temperature, top-k, top-p, min-p
VLLM_ORDER = "vllm"  # repetition penalty, temperature, min-p, top-k, top-p
ORDERS = (TRANSFORMERS_ORDER, VLLM_ORDER)
# The log-probability given to a token outside the kept set (a pad after a response's end, or a token the reference's
# truncation drops): the log of float32's smallest normal number, finite so that masked sums and ratios stay finite.
UNREACHABLE_LOGPROB = math.log(torch.finfo(torch.float32).tiny)  # about -87.3
# A first-seen step past any response: the token was not seen.
_NEVER = torch.iinfo(torch.int64).max


@dataclasses.dataclass(frozen=True)
class SamplingKnobs:
    """
    What shapes the sampled distribution besides the temperature: TRL GRPO's `top_k` (0: off), `top_p` (1.0: off),
    `min_p` (None: off), `repetition_penalty` (1.0: off), and the order the sampler in use applies them in (`order`,
    one of [`ORDERS`]). The default changes nothing: sampling at the temperature alone.
    """

    top_k: int = 0
    top_p: float = 1.0
    min_p: float | None = None
    repetition_penalty: float = 1.0
    order: str = TRANSFORMERS_ORDER

    def __post_init__(self):
        if self.order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS}, got {self.order!r}.")

    @classmethod
    def from_args(cls, args) -> SamplingKnobs:
        """The knobs of a config (`top_k`, `top_p`, `min_p`, `repetition_penalty`), in the order of its sampler:
        vLLM's under `use_vllm`, else transformers'."""
        return cls(
            top_k=args.top_k,
            top_p=args.top_p,
            min_p=args.min_p,
            repetition_penalty=args.repetition_penalty,
            order=VLLM_ORDER if args.use_vllm else TRANSFORMERS_ORDER,
        )

    def describe(self) -> dict | None:
        """What defines the distribution, for a record (stored rollouts): `None` when nothing but the temperature
        does; the order only where it matters (top_p with min_p)."""
        if not self.active:
            return None
        described = {
            "top_k": self.top_k,
            "top_p": self.top_p,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
        }
        if self.top_p < 1.0 and self.min_p:
            described["order"] = self.order
        return described

    @property
    def truncates(self) -> bool:
        """Whether some tokens are dropped (top-k, top-p or min-p on)."""
        return self.top_k > 0 or self.top_p < 1.0 or bool(self.min_p)

    @property
    def penalises(self) -> bool:
        """Whether the repetition penalty is on (it needs the tokens each position has seen)."""
        return self.repetition_penalty != 1.0

    @property
    def active(self) -> bool:
        """Whether the distribution is other than the temperature's alone."""
        return self.truncates or self.penalises


NO_KNOBS = SamplingKnobs()


def require_order(knobs: SamplingKnobs, order: str, sampler: str) -> None:
    """Refuse knobs whose order is not `sampler`'s when the order decides the distribution (top_p with min_p): the
    trainer would score another distribution than the one sampled."""
    if knobs.order != order and knobs.top_p < 1.0 and knobs.min_p:
        raise ValueError(
            f"{sampler} applies min_p {'before' if order == VLLM_ORDER else 'after'} top_p, but these knobs are scored "
            f"in {knobs.order}'s order: with both top_p={knobs.top_p} and min_p={knobs.min_p} the trainer would score "
            f"another distribution than the one {sampler} samples. Build the knobs with order={order!r}."
        )


def first_seen_steps(history: torch.Tensor, context: int, vocab_size: int) -> torch.Tensor:
    """
    For each row and token id, the first response step whose prediction sees it, for the repetition penalty.

    Args:
        history (`torch.Tensor` of shape `[R, P + T]`): Each row's prompt in its first `P = context` columns
            (left-padded; a negative id is no token), then its response.
        context (`int`): `P`, the width of the prompt columns.
        vocab_size (`int`): `V`, the width of the logits (ids at or past it are never penalised, as transformers').

    Returns:
        `torch.Tensor` of shape `[R, V]`, int64: a negative number for a prompt token, `t` for a token first sampled at
        response step `t`, a huge number for one never seen. The prediction of response step `t` penalises exactly the
        tokens whose entry is below `t` (the prompt and the response before it, as `generate` and vLLM see them).
    """
    rows = history.shape[0]
    ids = history.long()
    ids = torch.where((ids < 0) | (ids >= vocab_size), vocab_size, ids)  # no token: one spare column, dropped
    steps = (torch.arange(ids.shape[1], device=ids.device) - context).expand(rows, -1)
    table = torch.full((rows, vocab_size + 1), _NEVER, dtype=torch.int64, device=ids.device)
    table.scatter_reduce_(1, ids, steps, reduce="amin")
    return table[:, :vocab_size]


def seen_before(first_seen: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """`[..., V]` bool: the tokens the prediction of response step `steps[...]` has seen, from a row's
    [`first_seen_steps`] broadcast against `steps[..., None]`."""
    return first_seen < steps.unsqueeze(-1)


def _top_k(scores: torch.Tensor, top_k: int) -> torch.Tensor:
    # transformers' TopKLogitsWarper (vLLM's top-k keeps the same tokens: all those at or above the k-th logit)
    top_k = min(top_k, scores.shape[-1])
    return scores.masked_fill(scores < torch.topk(scores, top_k)[0][..., -1, None], -math.inf)


def _top_p(scores: torch.Tensor, top_p: float, order: str) -> torch.Tensor:
    # transformers' TopPLogitsWarper and vLLM's apply_top_k_top_p: drop the ascending-sorted tokens whose cumulative
    # probability stays at or under 1 - top_p, always keeping the most probable
    sorted_scores, sorted_indices = torch.sort(scores, descending=False)
    cumulative = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
    if order == VLLM_ORDER:  # vLLM's threshold is a float32 tensor, transformers' a Python float
        limit = 1 - torch.tensor(top_p, dtype=torch.float32, device=scores.device)
    else:
        limit = 1 - top_p
    sorted_removed = cumulative <= limit
    sorted_removed[..., -1:] = False
    removed = sorted_removed.scatter(-1, sorted_indices, sorted_removed)
    return scores.masked_fill(removed, -math.inf)


def _min_p(scores: torch.Tensor, min_p: float) -> torch.Tensor:
    # transformers' MinPLogitsWarper and vLLM's MinPLogitsProcessor: drop tokens under min_p × the top probability,
    # keeping the most probable
    probs = torch.softmax(scores, dim=-1)
    removed = probs < min_p * probs.amax(dim=-1, keepdim=True)
    removed.scatter_(-1, torch.topk(probs, 1, dim=-1).indices, False)
    return scores.masked_fill(removed, -math.inf)


def _penalised(logits: torch.Tensor, penalty: float, seen: torch.Tensor, order: str) -> torch.Tensor:
    if order == VLLM_ORDER:  # vLLM: logits × (1 / penalty) when positive, × penalty otherwise, in float32
        factor = torch.tensor(penalty, dtype=torch.float32, device=logits.device)
        penalised = logits * torch.where(logits > 0, 1.0 / factor, factor)
    else:  # transformers' RepetitionPenaltyLogitsProcessor
        penalised = torch.where(logits < 0, logits * penalty, logits / penalty)
    return torch.where(seen, penalised, logits)


def processed_logits(
    logits: torch.Tensor,
    temperature: float,
    knobs: SamplingKnobs = NO_KNOBS,
    seen: torch.Tensor | None = None,
) -> torch.Tensor:
    """
    The logits a sampler draws from: `logits` (`[..., V]`, taken in float32) with the repetition penalty on the tokens
    in `seen`, divided by `temperature`, then truncated by top-k, top-p and min-p in `knobs.order` (dropped tokens at
    `-inf`).

    Args:
        logits (`torch.Tensor` of shape `[..., V]`): The model's logits (after its own scale or soft-capping).
        temperature (`float`): The sampling temperature.
        knobs ([`SamplingKnobs`]): The other knobs and their order.
        seen (`torch.Tensor` of shape `[..., V]`, bool, *optional*): The tokens each position has seen (prompt and
            response before it, [`seen_before`]); needed when `knobs.repetition_penalty != 1`.
    """
    logits = logits.float()
    if knobs.penalises:
        if seen is None:
            raise ValueError("repetition_penalty needs the tokens each position has seen (`seen`).")
        logits = _penalised(logits, knobs.repetition_penalty, seen=seen, order=knobs.order)
    logits = logits / temperature
    if not knobs.truncates:
        return logits
    with torch.no_grad():  # the kept set, chosen as the sampler chooses it; no gradient through the choice
        scores = logits.detach()
        steps = {
            "top_k": (knobs.top_k > 0, lambda s: _top_k(s, knobs.top_k)),
            "top_p": (knobs.top_p < 1.0, lambda s: _top_p(s, knobs.top_p, knobs.order)),
            "min_p": (bool(knobs.min_p), lambda s: _min_p(s, knobs.min_p)),
        }
        names = ("min_p", "top_k", "top_p") if knobs.order == VLLM_ORDER else ("top_k", "top_p", "min_p")
        for name in names:
            on, step = steps[name]
            if on:
                scores = step(scores)
        dropped = torch.isneginf(scores)
    return logits.masked_fill(dropped, -math.inf)


def processed_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    knobs: SamplingKnobs = NO_KNOBS,
    seen: torch.Tensor | None = None,
    compute_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """
    Log-probabilities of `targets` (and the entropy) under the sampled distribution of `logits`
    ([`processed_logits`]): the kept tokens renormalised, a token outside them at [`UNREACHABLE_LOGPROB`].

    Args:
        logits (`torch.Tensor` of shape `[..., V]`): The model's logits.
        targets (`torch.Tensor` of shape `[...]`): The token ids whose log-probabilities are wanted.
        temperature, knobs, seen: As [`processed_logits`].
        compute_entropy (`bool`): Also return the entropy of each position's processed distribution.

    Returns:
        `(logprobs, entropy)`: float32 `[...]`; `entropy` is `None` unless `compute_entropy`.
    """
    scores = processed_logits(logits, temperature, knobs, seen=seen)
    logprobs_all = torch.log_softmax(scores, dim=-1)
    logprobs = logprobs_all.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)
    logprobs = logprobs.clamp(min=UNREACHABLE_LOGPROB)
    entropy = None
    if compute_entropy:
        kept_logprobs = logprobs_all.masked_fill(torch.isneginf(scores), 0.0)  # 0 × -inf would be NaN
        entropy = -(logprobs_all.exp() * kept_logprobs).sum(-1)
    return logprobs, entropy
