"""An SAE spliced in at its point, as an edit: the model runs on the reconstruction instead of the activation.

    logits, _ = edits.run(params, cfg, tokens, [Splice(sae)])               # x -> decode(encode(x)) + error
    logits, _ = edits.run(params, cfg, tokens, [Splice(sae, error=False)])  # x -> decode(encode(x))
    _, _, got = capture(params, cfg, tokens, [sae.point + ".features"], edits=[Splice(sae)])  # [B, T, N]
    steer(cfg, sae.point + ".features", alpha * onehot(feature))            # any edit of the features

With the error term (x - decode(encode(x)), from the unedited features) the model computes what it did
without the SAE, to float rounding, while its features can be read, patched, ablated or steered as
the point P.features [B, T, N] (model/points.py): an edit of f gives x + decode(f') - decode(f).
Splices go in the same list as edits (model/edits.py), through `edits.run`, `capture` and the sampler.
"""

from __future__ import annotations

from collections.abc import Callable

import flax.struct
import jax

from transformer.analysis.sae.autoencoder import SAE

Array = jax.Array


@flax.struct.dataclass
class Splice:
    """`sae` in place of the activation at `sae.point`; `error`: add back what the SAE misses."""

    sae: SAE
    error: bool = flax.struct.field(pytree_node=False, default=True)

    @property
    def name(self) -> str:
        """The point it replaces, as an Edit's name."""
        return self.sae.point

    def spliced(self, x: Array, mark: Callable[[Array], Array]) -> Array:
        """The value that goes on for activations x [B, T, D]: decode of the features as `mark` (the
        point P.features: captured, edited) leaves them, plus the error term. Called by points.point."""
        features = self.sae.encode(x)
        out = self.sae.decode(mark(features))
        if self.error:
            out = out + (x - self.sae.decode(features))
        return out.astype(x.dtype)
