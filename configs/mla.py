"""A small DeepSeek-style model: multi-head latent attention with decoupled RoPE."""

from configs.common import base_config


def get_config():
    c = base_config(
        dict(
            vocab_size=256,
            max_seq_len=512,
            d_model=256,
            num_layers=4,
            num_heads=8,
            head_dim=32,  # the non-rotary query/key width per head
            v_head_dim=32,  # value width per head
            attention="mla",
            kv_latent_dim=64,  # the cache holds this latent per token and layer ...
            rope_head_dim=16,  # ... plus one shared rotary key of this width
            q_latent_dim=96,  # queries pass through their own (uncached) latent
            mlp_dim=688,
            activation="swiglu",
            position="rope",
            norm="rmsnorm",
            norm_bias=False,
            use_bias=False,
            tie_embeddings=False,
        )
    )
    return c
