"""A tiny Llama written as a GGUF file in-process (no download), laid out as llama.cpp's converter writes one: float32
tensors under GGUF's names (q and k rows permuted as llama.cpp permutes them), the llama metadata, and a byte-level
GPT-2 tokenizer with a chat template, as SmolLM2's file has."""

from __future__ import annotations

import numpy as np
import torch
from transformers import LlamaConfig, LlamaForCausalLM

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
ROPE_THETA = 10000.0
MERGES = ("Ġ t", "h e", "Ġt he")  # a real BPE, if a small one: "the" after a space is one token


def _byte_tokens() -> list[str]:
    """GPT-2's byte-level alphabet: each of the 256 bytes as the printable character that stands for it."""
    from tokenizers.pre_tokenizers import ByteLevel

    return sorted(ByteLevel.alphabet())


def _permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k row order (its converter's `permute`); transformers reverses it when loading."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def write_tiny_llama_gguf(path: str, *, seed: int = 0) -> LlamaForCausalLM:
    """Write a tiny random Llama (tied embeddings, 2 layers) with its tokenizer to the GGUF file `path`; returns the
    model whose weights it holds."""
    import gguf

    tokens = [*SPECIAL_TOKENS, *_byte_tokens(), *("".join(m.split()) for m in MERGES)]
    config = LlamaConfig(
        vocab_size=len(tokens),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": ROPE_THETA},
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=2,
        pad_token_id=2,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_rope_freq_base(ROPE_THETA)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_dimension_count(config.hidden_size // config.num_attention_heads)
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types(
        [gguf.TokenType.CONTROL] * len(SPECIAL_TOKENS) + [gguf.TokenType.NORMAL] * (len(tokens) - len(SPECIAL_TOKENS))
    )
    writer.add_token_merges(list(MERGES))
    writer.add_bos_token_id(config.bos_token_id)
    writer.add_eos_token_id(config.eos_token_id)
    writer.add_pad_token_id(config.pad_token_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    writer.add_tensor("token_embd.weight", state["model.embed_tokens.weight"])
    writer.add_tensor("output_norm.weight", state["model.norm.weight"])
    for i in range(config.num_hidden_layers):
        prefix = f"model.layers.{i}."
        layer = {
            "attn_norm": state[prefix + "input_layernorm.weight"],
            "attn_q": _permute(state[prefix + "self_attn.q_proj.weight"], heads),
            "attn_k": _permute(state[prefix + "self_attn.k_proj.weight"], kv_heads),
            "attn_v": state[prefix + "self_attn.v_proj.weight"],
            "attn_output": state[prefix + "self_attn.o_proj.weight"],
            "ffn_norm": state[prefix + "post_attention_layernorm.weight"],
            "ffn_gate": state[prefix + "mlp.gate_proj.weight"],
            "ffn_up": state[prefix + "mlp.up_proj.weight"],
            "ffn_down": state[prefix + "mlp.down_proj.weight"],
        }
        for name, tensor in layer.items():
            writer.add_tensor(f"blk.{i}.{name}.weight", np.ascontiguousarray(tensor))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return model
