"""Sampling from a decoder: logit filters, prefill and the `lax.scan` decode loop over a functional
KV cache (sampler.py); its public names are re-exported here."""

from transformer.sampling.sampler import (  # noqa: F401
    SMALLEST_BUCKET, DecodeState, GenerateOutput, SamplingOptions, apply_temperature, bucket, check_seed, decode,
    decode_step, encode_prompt, generate, generate_stream, prefill, row_keys, sample_token, seed_key, top_k_filter,
    top_p_filter,
)
