"""A protein's fold, made up: a compact self-avoiding walk on the cubic lattice, and its contact map.

    coords = fold(rng, length)          # int [L, 3]: residue i sits at lattice point coords[i]
    contacts = contact_map(coords)      # bool [L, L]: closer than CUTOFF and |i - j| >= MIN_SEPARATION

The walk grows one step at a time, each free neighbour weighted exp(COMPACTNESS x its occupied
neighbours), so the chain folds into a globule (as a protein's hydrophobic core does) rather than a
random coil with almost no long-range contacts; a walk that traps itself starts again."""

from __future__ import annotations

import numpy as np

CUTOFF = 1.5  # lattice units: face neighbours (1) and face diagonals (sqrt 2) are in contact
MIN_SEPARATION = 6  # |i - j| >= 6: the long-range contacts that contact prediction is scored on
COMPACTNESS = 2.0  # the growth's preference for lattice points next to the chain already laid
STEPS = np.array([[1, 0, 0], [-1, 0, 0], [0, 1, 0], [0, -1, 0], [0, 0, 1], [0, 0, -1]])


def fold(rng: np.random.Generator, length: int) -> np.ndarray:
    """A compact self-avoiding walk of `length` residues: int coordinates [length, 3]."""
    while True:
        coords, occupied = [np.zeros(3, int)], {(0, 0, 0)}
        for _ in range(length - 1):
            free = [c for c in coords[-1] + STEPS if tuple(c) not in occupied]
            if not free:
                break
            packed = np.array([sum(tuple(c + s) in occupied for s in STEPS) for c in free])
            weights = np.exp(COMPACTNESS * packed)
            coords.append(free[rng.choice(len(free), p=weights / weights.sum())])
            occupied.add(tuple(coords[-1]))
        if len(coords) == length:
            return np.stack(coords)


def separation_mask(length: int, min_separation: int = MIN_SEPARATION) -> np.ndarray:
    """bool [L, L]: the pairs |i - j| >= min_separation, the only ones contacts are scored on."""
    i = np.arange(length)
    return np.abs(i[:, None] - i[None, :]) >= min_separation


def contact_map(coords: np.ndarray, cutoff: float = CUTOFF, min_separation: int = MIN_SEPARATION) -> np.ndarray:
    """coords [L, 3] -> bool [L, L], symmetric: residues closer than `cutoff` and |i - j| >= min_separation."""
    distance = np.linalg.norm(coords[:, None] - coords[None, :], axis=-1)
    return (distance < cutoff) & separation_mask(len(coords), min_separation)
