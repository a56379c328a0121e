"""GPT-2 small (124M): the architecture of Radford et al. 2019 / Hugging Face `gpt2`."""

from configs.common import base_config


def get_config():
    c = base_config(
        dict(
            vocab_size=50257,
            max_seq_len=1024,
            d_model=768,
            num_layers=12,
            num_heads=12,
            position="learned",
            activation="gelu_tanh",
            norm="layernorm",
            norm_eps=1e-5,
            use_bias=True,
            tie_embeddings=True,
        )
    )
    c.data.tokenizer = "bpe"
    c.train.batch_size = 8
    c.train.seq_len = 1024
    c.optim.learning_rate = 6e-4
    return c
