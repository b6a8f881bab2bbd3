"""Known kissing configurations built by our own code: the D_n root system and a constant-weight-code construction.

- `root_system_dn(n)`: all vectors with two entries +-1 and the rest 0, `2 n (n - 1)` points of squared norm 2 at
  squared distance >= 2 (220 in dimension 11; the kissing configuration of the D_n lattice).
- `constant_weight_configuration(blocks, n)`: the `2n` vectors `+-2 e_i` and, for each 4-subset in `blocks`, its 16
  sign vectors `+-1` on the subset. All have squared norm 4. When any two blocks share at most 2 coordinates (a
  binary constant-weight code of weight 4 and distance 4), two such vectors on blocks S, T differ by
  `|S ^ T| + 4 * (sign disagreements on S & T) >= 4`, and `+-2 e_i` against a block vector by >= 4, so the set is
  valid with `2n + 16 |blocks|` points.
- `quadruple_packing(n, size)`: such a family of 4-subsets, found by a seeded local search. With n = 11 and
  size = 35 (the largest possible, A(11, 4, 4) = 35) the construction has 22 + 560 = 582 points.
"""

from __future__ import annotations

import itertools
import random

__all__ = ["configuration_program", "constant_weight_configuration", "quadruple_packing", "root_system_dn"]


def root_system_dn(n: int = 11) -> list[list[int]]:
    """The D_n roots: every vector with entries +-1 in two coordinates and 0 elsewhere (`2 n (n - 1)` vectors)."""
    points = []
    for i, j in itertools.combinations(range(n), 2):
        for a, b in itertools.product((1, -1), repeat=2):
            vector = [0] * n
            vector[i], vector[j] = a, b
            points.append(vector)
    return points


def quadruple_packing(n: int = 11, size: int = 35, seed: int = 0, max_steps: int = 200_000) -> list[tuple[int, ...]]:
    """4-subsets of range(n), any two sharing at most 2 elements (no 3-subset covered twice), `size` of them.

    Local search: add a random 4-subset if at most one chosen block shares a 3-subset with it, evicting that block
    half of the time; restart with the next seed after `max_steps`.

    Raises:
        RuntimeError: no family of `size` found within 50 restarts.
    """
    quads = list(itertools.combinations(range(n), 4))
    for attempt in range(50):
        rng = random.Random(seed + attempt)
        owner: dict[tuple[int, ...], tuple[int, ...]] = {}  # 3-subset -> the block covering it
        blocks: set[tuple[int, ...]] = set()
        for _ in range(max_steps):
            quad = rng.choice(quads)
            if quad in blocks:
                continue
            triples = list(itertools.combinations(quad, 3))
            clashes = {owner[t] for t in triples if t in owner}
            if len(clashes) > 1 or (clashes and rng.random() < 0.5):
                continue
            for block in clashes:
                blocks.discard(block)
                for t in itertools.combinations(block, 3):
                    del owner[t]
            blocks.add(quad)
            owner.update(dict.fromkeys(triples, quad))
            if len(blocks) >= size:
                return sorted(blocks)
    raise RuntimeError(f"no family of {size} 4-subsets of {n} points sharing at most 2 elements was found")


def constant_weight_configuration(blocks: list[tuple[int, ...]], n: int = 11) -> list[list[int]]:
    """`+-2 e_i` for each coordinate, then the 16 sign vectors on each 4-subset of `blocks` (see the module doc)."""
    points = []
    for i in range(n):
        for sign in (2, -2):
            vector = [0] * n
            vector[i] = sign
            points.append(vector)
    for block in blocks:
        for signs in itertools.product((1, -1), repeat=len(block)):
            vector = [0] * n
            for i, s in zip(block, signs, strict=True):
                vector[i] = s
            points.append(vector)
    return points


def configuration_program(points: list[list[int]]) -> str:
    """A Python program that defines `points` literally (for tests, examples and seeding a discovery loop)."""
    rows = ",\n    ".join(repr(list(p)) for p in points)
    return f"points = [\n    {rows},\n]\n"
