"""Sampling from a decoder: logit filters, prefill and the `lax.scan` decode loop
over a functional KV cache (sampler.py); its public names are re-exported here."""

from transformer.sampling.sampler import (
    SMALLEST_BUCKET,
    apply_temperature,
    top_k_filter,
    top_p_filter,
    SamplingOptions,
    sample_token,
    encode_prompt,
    check_seed,
    seed_key,
    row_keys,
    DecodeState,
    prefill,
    decode_step,
    decode,
    GenerateOutput,
    bucket,
    generate,
    generate_stream,
)

__all__ = [
    "SMALLEST_BUCKET",
    "apply_temperature",
    "top_k_filter",
    "top_p_filter",
    "SamplingOptions",
    "sample_token",
    "encode_prompt",
    "check_seed",
    "seed_key",
    "row_keys",
    "DecodeState",
    "prefill",
    "decode_step",
    "decode",
    "GenerateOutput",
    "bucket",
    "generate",
    "generate_stream",
]
