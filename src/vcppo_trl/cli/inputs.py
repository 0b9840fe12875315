"""What `train.py` builds the trainer from besides its config, its reward functions and its datasets
([`~cli.datasets`]): the policy and tokenizer of `--model_name_or_path`, and the tools (`--tools`, `--python_tool`)."""

from __future__ import annotations

from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import ModelConfig
from trl.trainer.utils import get_quantization_config

from .arguments import VCPPOScriptArguments


def resolve_tools(script_args: VCPPOScriptArguments, toy: bool) -> list:
    """`--tools` as functions, then `python_tool()` with `--python_tool`; on the toy, its tools ([`~toy.toy_tools`]).
    Stops here if wrong."""
    from ..episodes import python_tool
    from ..rewards import import_dotted
    from ..toy import toy_tools

    tools = []
    for spec in script_args.tools:
        try:
            tool = import_dotted(spec)
        except (ImportError, AttributeError) as error:
            raise ValueError(f"--tools {spec!r} does not import ({error}): give `package.module:name`.") from error
        if isinstance(tool, type) or not callable(tool):
            kind = "a class" if isinstance(tool, type) else f"an object of type {type(tool).__name__}"
            raise ValueError(f"--tools {spec!r} is {kind}, not a function (sync or async).")
        tools.append(tool)
    if script_args.python_tool:
        memory_mb = script_args.python_tool_memory_mb or None
        tools.append(python_tool(timeout=script_args.python_tool_timeout, memory_mb=memory_mb))
    return toy_tools(tools, script_args.toy_task) if toy else tools


def load_model_and_tokenizer(model_args: ModelConfig, trust_remote_code: bool = False):
    # `trust_remote_code` is the trainer config's (TRL 1.16's ModelConfig no longer has it).
    kwargs = {
        "revision": model_args.model_revision,
        "trust_remote_code": trust_remote_code,
        "attn_implementation": model_args.attn_implementation,
        "dtype": model_args.dtype,
    }
    quantization_config = get_quantization_config(model_args)
    if quantization_config is not None:
        kwargs["quantization_config"] = quantization_config
    model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path, **kwargs)
    tokenizer = AutoTokenizer.from_pretrained(
        model_args.model_name_or_path,
        revision=model_args.model_revision,
        trust_remote_code=trust_remote_code,
    )
    return model, tokenizer
