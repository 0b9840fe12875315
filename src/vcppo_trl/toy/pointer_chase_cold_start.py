"""The pointer chase's cold start (`pointer_chase.py`): a recipe, built once per recipe and seed and cached under the
sha256 of the recipe, and the command line's toy (`train.py --toy_task pointer_chase`).

The cold start imitates traces whose hops are each wrong with probability ε_K = 1 − s^(1/K) (s = 0.35 by default), the
trace going on consistently from a wrong value: its success is about s at every K, and its errors are preferences
at a lookup the policy can do, not the limits of its capacity. It runs in two stages: a first one that learns the
lookup on 8-hop traces, shared by every K, then the task's own traces ([`ColdStartRecipe`]).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import platform
import shutil
import tempfile
import time
from dataclasses import dataclass

import torch
import transformers

from .pointer_chase import (
    BOX_OPEN,
    POINTER_CHASE_DISTRACTORS,
    POINTER_CHASE_FILLER,
    POINTER_CHASE_HOPS,
    POINTER_CHASE_NUM_EVAL,
    POINTER_CHASE_NUM_TRAIN,
    POINTER_CHASE_PAIRS,
    POINTER_CHASE_SUCCESS,
    POINTER_CHASE_TABLES,
    check_table_shape,
    make_pointer_chase_dataset,
    make_pointer_chase_splits,
)

logger = logging.getLogger(__name__)

COLD_START_RECIPE_VERSION = 2
"""Bumped whenever the code behind a recipe changes what it builds, so that older cached cold starts are not reused."""


LOOKUP_HOPS = 8
"""K of the shared first stage of every cold start (see [`ColdStartRecipe`])."""


@dataclass(frozen=True)
class ColdStartRecipe:
    """Everything that determines a pointer-chase cold start: the task's knobs, the tiny model's shape, the SFT runs
    and the seed (of the model's initialisation, the SFT data and the data order).

    A cold start has two stages. The first learns the lookup: `lookup_steps` steps on traces of `LOOKUP_HOPS` = 8
    hops without filler (the same table size, model and seed, whatever the task's K and filler), where with seed 0 the
    policy picked the lookup up between steps 1,000 and 1,500; with fewer hops a trace holds too few lookups to learn
    it in that time (2 hops stayed at chance after 3,000 steps). Not every initialisation picks it up: of seeds 0,
    900, 901 and 902, only seed 0 did within 3,000 steps (the others ended at 0.065–0.074 sampled success at K = 8,
    against 0.377), and seed 900 did not within 8,000 steps, at half the learning rate or with a fourth layer. So the
    first stage is a base shared by every seed, built from `lookup_seed` (0), as a pretrained model is: a recipe's
    `seed` sets its second stage (that stage's traces and their order) and what is trained from it.
    `lookup_seed=None` builds the first stage from `seed` instead. The first stage is itself the recipe
    `lookup_stage()`, built once and cached, and shared by every K, filler and seed. The second stage, `steps` steps
    on the task's own traces from there, sets the number of hops, the filler and the error rate ε_K. With
    `lookup_steps=0` the recipe is one stage from scratch (from `seed`).

    One SFT example per step and row: the traces are drawn fresh (`steps * batch_size` problems), so no trace's
    errors are seen twice and the policy learns the error rate, not the examples."""

    num_hops: int = POINTER_CHASE_HOPS
    num_pairs: int = POINTER_CHASE_PAIRS
    num_distractors: int = POINTER_CHASE_DISTRACTORS
    filler: int = POINTER_CHASE_FILLER
    success: float = POINTER_CHASE_SUCCESS
    num_tables: int | None = POINTER_CHASE_TABLES
    hidden_size: int = 128
    num_layers: int = 3
    num_heads: int = 4
    steps: int = 1000
    lookup_steps: int = 3000
    lookup_seed: int | None = 0
    learning_rate: float = 1e-3
    batch_size: int = 16
    warmup_steps: int = 10
    seed: int = 0
    version: int = COLD_START_RECIPE_VERSION

    def task(self) -> dict:
        """The task's knobs, as [`make_pointer_chase_dataset`] and [`make_pointer_chase_splits`] take them."""
        keys = ("num_hops", "num_pairs", "num_distractors", "filler", "success", "num_tables")
        return {key: getattr(self, key) for key in keys}

    def lookup_stage(self) -> ColdStartRecipe | None:
        """The first stage's recipe (one stage, 8 hops, no filler, a fresh table per problem, `lookup_steps` steps,
        seed `lookup_seed` unless `None`); `None` without one."""
        if self.lookup_steps == 0:
            return None
        seed = self.seed if self.lookup_seed is None else self.lookup_seed
        return dataclasses.replace(
            self,
            num_hops=LOOKUP_HOPS,
            filler=0,
            num_tables=None,
            steps=self.lookup_steps,
            lookup_steps=0,
            lookup_seed=None,
            seed=seed,
        )

    def data_seed(self) -> int:
        """Seed of the stage's SFT traces (a second stage's differ from the first's)."""
        return self.seed + (2_000_003 if self.lookup_steps == 0 else 3_000_017)

    def key(self) -> str:
        """sha256 of the recipe's fields (hex): the cold start's name in a cache."""
        return hashlib.sha256(json.dumps(dataclasses.asdict(self), sort_keys=True).encode()).hexdigest()

    def max_response_tokens(self) -> int:
        """Tokens of a complete response with the toy tokenizer (`<think>`, K lines, `</think> \\\\boxed{X}` and the
        end-of-sequence token: 37 at K = 8 without filler), plus 16 to spare."""
        return self.num_hops * (3 + self.filler) + 2 + len(BOX_OPEN) + 3 + 16


def weights_sha256(model: torch.nn.Module) -> str:
    """sha256 of a model's weights (every tensor of its state dict by name, raw bytes): equal iff bit-identical."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def _cpu_model() -> str:
    """The CPU's model name (Linux), else what `platform` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    except OSError:
        names = []
    return names[0] if names else platform.processor() or platform.machine()


def build_cold_start(recipe: ColdStartRecipe, cache_dir: str | None = None):
    """The cold-start policy of `recipe`: read from `cache_dir/pointer_chase-<key>` when that recipe was built there,
    else built and saved there with a manifest: its first stage ([`ColdStartRecipe.lookup_stage`], itself built or read
    from the cache), then `recipe.steps` steps of [`~toy.cold_start_sft`] (no early stop) on fresh traces of the task.

    The key is the sha256 of the recipe ([`ColdStartRecipe.key`]): the same recipe always names the same folder, so
    experiments build a seed's cold start once (and its first stage once for every K). The same recipe gives
    bit-identical weights on one machine with the same library versions and thread count (CPU training here is
    deterministic); on another CPU model the floating-point kernels differ and so may the weights. The manifest records
    their sha256 ([`weights_sha256`]), the libraries' versions, the CPU and the thread count, so that a rebuild
    elsewhere shows whether it matches: the key names the recipe, the sha256 the weights it gave.

    Args:
        recipe ([`ColdStartRecipe`]): What to build.
        cache_dir (`str` or `None`): Folder of the cache; `None` builds (both stages) without saving.

    Returns:
        `tuple`: `(policy, tokenizer, manifest)`, the policy in eval mode and the manifest a dict (`key`, `recipe`,
        `weights_sha256`, `seconds` of this stage's SFT, `lookup_stage` (the first stage's key and weights' sha256, or
        `None`), `torch`, `transformers`, `cpu`, `threads`, `loaded_from_cache`, `folder`: where it is cached, or
        `None` without a cache).
    """
    from transformers import AutoModelForCausalLM

    from .cold_start import cold_start_sft
    from .model import build_tiny_model
    from .tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    folder = None if cache_dir is None else os.path.join(cache_dir, f"pointer_chase-{recipe.key()[:16]}")
    manifest_path = None if folder is None else os.path.join(folder, "manifest.json")
    if manifest_path is not None and os.path.exists(manifest_path):
        with open(manifest_path) as f:
            manifest = json.load(f)
        if manifest.get("key") == recipe.key():
            policy = AutoModelForCausalLM.from_pretrained(folder).eval()
            return policy, tokenizer, {**manifest, "loaded_from_cache": True, "folder": folder}
    first = recipe.lookup_stage()
    if first is None:
        policy = build_tiny_model(
            tokenizer,
            hidden_size=recipe.hidden_size,
            num_layers=recipe.num_layers,
            num_heads=recipe.num_heads,
            seed=recipe.seed,
        )
        lookup_stage = None
    else:
        policy, _, built = build_cold_start(first, cache_dir=cache_dir)
        lookup_stage = {"key": built["key"], "weights_sha256": built["weights_sha256"]}
    started = time.time()
    examples = make_pointer_chase_dataset(recipe.steps * recipe.batch_size, seed=recipe.data_seed(), **recipe.task())
    with tempfile.TemporaryDirectory() as logs:
        policy = cold_start_sft(
            policy.train(),
            tokenizer,
            examples,
            output_dir=logs,
            max_steps=recipe.steps,
            learning_rate=recipe.learning_rate,
            per_device_train_batch_size=recipe.batch_size,
            warmup_steps=recipe.warmup_steps,
            target_accuracy=None,
            seed=recipe.seed,
        )
    manifest = {
        "key": recipe.key(),
        "recipe": dataclasses.asdict(recipe),
        "weights_sha256": weights_sha256(policy),
        "seconds": round(time.time() - started, 1),
        "lookup_stage": lookup_stage,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu": _cpu_model(),
        "threads": torch.get_num_threads(),
    }
    if folder is not None:
        # Written whole into a sibling folder, then renamed: a concurrent or interrupted build leaves no half folder.
        os.makedirs(cache_dir, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=".building-", dir=cache_dir)
        policy.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        with open(os.path.join(staging, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=1)
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(staging, folder)
    return policy, tokenizer, {**manifest, "loaded_from_cache": False, "folder": folder}


def build_pointer_chase_toy(
    *,
    output_dir: str,
    seed: int = 0,
    hops: int | None = None,
    filler: int | None = None,
    tables: int | None = None,
    num_train: int | None = None,
    num_eval: int | None = None,
    num_heads: int | None = None,
    cold_start_steps: int | None = None,
    cold_start_learning_rate: float | None = None,
):
    """The command line's pointer chase (`train.py --toy_task pointer_chase`, with the `--toy_*` options of these
    names): the toy tokenizer, the train and test splits (`prompt`, `solution`, `difficulty` = K) and the cold-start
    policy of the [`ColdStartRecipe`] these knobs give (`None`: the recipe's default; `cold_start_steps` is the steps
    of each of its two stages, 3,000 and 1,000 by default), cached in `<output_dir>/cold_start` ([`build_cold_start`])
    so that a rerun of the same command reuses it. Returns `(policy, tokenizer, train, test)`."""
    options = {
        "num_hops": hops,
        "filler": filler,
        "num_tables": tables,
        "num_heads": num_heads,
        "steps": cold_start_steps,
        "lookup_steps": cold_start_steps,
        "learning_rate": cold_start_learning_rate,
    }
    recipe = ColdStartRecipe(seed=seed, **{name: value for name, value in options.items() if value is not None})
    check_table_shape(recipe.num_hops, recipe.num_pairs, recipe.num_distractors)
    splits = make_pointer_chase_splits(
        POINTER_CHASE_NUM_TRAIN if num_train is None else num_train,
        POINTER_CHASE_NUM_EVAL if num_eval is None else num_eval,
        seed=seed,
        **recipe.task(),
    )
    cache_dir = os.path.join(output_dir, "cold_start")
    logger.warning(
        f"Embedded pointer-chase run: {recipe.num_hops} hops over {recipe.num_pairs} pairs "
        f"({'a fresh table per problem' if recipe.num_tables is None else f'a pool of {recipe.num_tables} tables'}), "
        f"{recipe.filler} filler dots a hop; cold-start SFT for {recipe.lookup_steps} steps on 8-hop traces then {recipe.steps} on the "
        f"task's, right {recipe.success:.0%} of the time (cached in {cache_dir})."
    )
    policy, tokenizer, manifest = build_cold_start(recipe, cache_dir=cache_dir)
    if manifest["loaded_from_cache"]:
        logger.warning(f"Cold start read from the cache (weights sha256 {manifest['weights_sha256']}).")
    columns = ["prompt", "solution", "difficulty"]
    return policy, tokenizer, splits["train"].select_columns(columns), splits["test"].select_columns(columns)
