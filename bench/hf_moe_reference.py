"""A Qwen3-MoE checkpoint and its reference logits from Hugging Face transformers, for
`fp4kv check-model` (the CPU runner's MoE block against transformers' own, on the device
machine where torch and transformers are installed).

Usage: python3 bench/hf_moe_reference.py OUT_DIR
Writes OUT_DIR/config.json + safetensors (a small random-weight Qwen3MoeForCausalLM in
float32: sparse layers, one dense layer through mlp_only_layers, renormalized top-k) and
OUT_DIR/reference_activations.safetensors (input_ids as I32, logits [tokens][vocab] F32).
"""
import sys

import torch
from safetensors.torch import save_file
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM


def main(out_dir: str) -> None:
    torch.manual_seed(0)
    config = Qwen3MoeConfig(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=4096,
        num_experts=16, num_experts_per_tok=4, moe_intermediate_size=32, norm_topk_prob=True,
        decoder_sparse_step=1, mlp_only_layers=[2], rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_theta=1e6, attention_bias=False, use_sliding_window=False)
    model = Qwen3MoeForCausalLM(config).to(torch.float32).eval()
    with torch.no_grad():  # spread the router so top-k choices are not near-ties
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.weight.mul_(20.0)
    model.save_pretrained(out_dir, safe_serialization=True)
    ids = torch.randint(0, config.vocab_size, (1, 57))
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].float().contiguous()
    save_file({"input_ids": ids[0].to(torch.int32).contiguous(), "logits": logits},
              f"{out_dir}/reference_activations.safetensors")
    print(f"wrote {out_dir}: {sum(p.numel() for p in model.parameters())} parameters, logits {tuple(logits.shape)}")


if __name__ == "__main__":
    main(sys.argv[1])
