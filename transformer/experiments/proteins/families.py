"""The protein task (`data.task='proteins'`): sequences of synthetic families (fold.py, potts.py), one a row.

    spec = FamilySpec.from_config(config.data.proteins)
    f = family(spec, i)              # Family i: its fold, contacts, Potts model and sequences [N, L]

A row is a causal language model's example, one sequence of length L <= T = train.seq_len:

    inputs  [B, T] int32: START, x_0 .. x_{L-2}, then START as padding
    targets [B, T] int32: x_0 .. x_{L-1}, then IGNORED

Training rows draw a family and one of its first N - held_out sequences from (seed, step); the last
held_out sequences of every family are the validation rows and the ones contacts are read from. The
first train_families families' contacts may be used to fit (a head, a regression); the others are
held out for scoring them. The language model reads every family's sequences: no contacts."""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

import jax
import numpy as np

from transformer.data.batches import IGNORED, host_rows
from transformer.data.tasks import DataTask
from transformer.experiments.proteins.fold import contact_map, fold
from transformer.experiments.proteins.potts import COUPLING, FIELD, Q, Potts, draw_potts, gibbs

START = Q  # the token before every sequence (the amino acids are 0..Q-1): a vocabulary of Q + 1


@dataclass(frozen=True)
class FamilySpec:
    """The families a run trains on (`config.data.proteins`)."""

    families: int = 8  # families drawn; the first train_families may be used to fit contact read-outs
    train_families: int = 4
    min_length: int = 48  # family i's length is drawn uniformly in [min_length, max_length]
    max_length: int = 64
    sequences: int = 20_000  # per family
    held_out: int = 500  # the last this many sequences of each family: validation, and contacts are read from them
    sweeps: int = 50  # Gibbs sweeps of every chain from a uniformly random start
    coupling: float = COUPLING  # std of the contacts' couplings
    field: float = FIELD  # std of the fields
    seed: int = 0  # family i draws from (seed, i), whatever the training seed

    def __post_init__(self) -> None:
        if not 0 < self.train_families < self.families:
            raise ValueError(f"data.proteins needs 0 < train_families < families (got {self.train_families}, "
                             f"{self.families}): some families fit the read-out, the others score it")
        if not 8 <= self.min_length <= self.max_length:
            raise ValueError(f"data.proteins needs 8 <= min_length <= max_length (got {self.min_length}, "
                             f"{self.max_length})")
        if not 0 < self.held_out < self.sequences:
            raise ValueError(f"data.proteins.held_out={self.held_out} must be in (0, sequences={self.sequences})")

    @classmethod
    def from_config(cls, section: Any) -> FamilySpec:
        """From a config's data.proteins section (a ConfigDict or a dict)."""
        return cls(**{f.name: section[f.name] for f in fields(cls) if f.name in section})


class Family(NamedTuple):
    coords: np.ndarray  # int [L, 3]: the fold
    contacts: np.ndarray  # bool [L, L]
    potts: Potts
    sequences: np.ndarray  # int8 [N, L]


@functools.lru_cache(maxsize=64)
def family(spec: FamilySpec, index: int) -> Family:
    """Family `index`, drawn from (spec.seed, index): the same family in every run and process."""
    rng = np.random.default_rng([spec.seed, index])
    coords = fold(rng, int(rng.integers(spec.min_length, spec.max_length, endpoint=True)))
    contacts = contact_map(coords)
    potts = draw_potts(rng, contacts, spec.coupling, spec.field)
    key = jax.random.key(int(rng.integers(2**31)))
    return Family(coords, contacts, potts, gibbs(potts, key, spec.sequences, spec.sweeps).astype(np.int8))


def rows(sequences: list[np.ndarray], seq_len: int) -> tuple[np.ndarray, np.ndarray]:
    """Sequences (int [L_b] each, L_b <= seq_len) -> (inputs, targets) int32 [B, seq_len] (module docstring)."""
    inputs = np.full((len(sequences), seq_len), START, np.int32)
    targets = np.full((len(sequences), seq_len), IGNORED, np.int32)
    for b, x in enumerate(sequences):
        inputs[b, 1: len(x)] = x[:-1]
        targets[b, : len(x)] = x
    return inputs, targets


def batch_at(tokens: Any, *, seed: int, step: int, batch_size: int, seq_len: int, spec: FamilySpec,
             host_index: int = 0, host_count: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Training batch `step` from (seed, step) alone (`tokens` is unused): inputs, targets [B / hosts, T]."""
    rng = np.random.default_rng([seed, step])
    which = rng.integers(spec.families, size=batch_size)
    index = rng.integers(spec.sequences - spec.held_out, size=batch_size)
    chosen = [family(spec, int(f)).sequences[i] for f, i in zip(which, index)]
    return rows(chosen[host_rows(batch_size, host_index, host_count)], seq_len)


def eval_batches(tokens: Any, *, num_batches: int, batch_size: int, seq_len: int, spec: FamilySpec,
                 host_index: int = 0, host_count: int = 1) -> list[tuple[np.ndarray, np.ndarray]]:
    """Validation: the held-out sequences, families in turn (row r: family r mod F), batch_size rows a batch."""
    batches = []
    for start in range(0, num_batches * batch_size, batch_size):
        r = np.arange(start, start + batch_size)[host_rows(batch_size, host_index, host_count)]
        chosen = [family(spec, int(k % spec.families)).sequences[spec.sequences - spec.held_out + k // spec.families
                                                                  % spec.held_out] for k in r]
        batches.append(rows(chosen, seq_len))
    return batches


def proteins_task(config: Any) -> DataTask:
    """data.task='proteins': the families of config.data.proteins, checked against the model and seq_len."""
    spec, model = FamilySpec.from_config(config.data.proteins), config.model
    if model.get("inputs", "tokens") != "tokens" or model.vocab_size < Q + 1:
        raise ValueError(f"data.task='proteins' needs a token model with model.vocab_size >= {Q + 1} "
                         f"({Q} amino acids and the start token; configs/proteins.py)")
    if config.train.seq_len < spec.max_length:
        raise ValueError(f"train.seq_len={config.train.seq_len} is below data.proteins.max_length={spec.max_length}; "
                         "raise it (a sequence is one row)")
    return DataTask(functools.partial(batch_at, spec=spec), functools.partial(eval_batches, spec=spec), text=False)
