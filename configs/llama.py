"""A small Llama-style model: RoPE, RMSNorm, SwiGLU, grouped-query attention, no biases, untied head."""

from configs.common import base_config


def get_config():
    c = base_config(
        dict(
            vocab_size=256,
            max_seq_len=512,
            d_model=256,
            num_layers=4,
            num_heads=8,
            num_kv_heads=2,  # 4 query heads share each key/value head
            mlp_dim=688,  # ~ 8/3 * d_model, as Llama sizes its gated MLP
            activation="swiglu",
            position="rope",
            rope_theta=10000.0,
            norm="rmsnorm",
            norm_bias=False,
            use_bias=False,
            tie_embeddings=False,
        )
    )
    return c
