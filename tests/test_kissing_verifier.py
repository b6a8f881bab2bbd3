"""The kissing verifier: exact integer checks against a plain-loop reference, every failure message, and the
reference constructions (D11 roots: 220 points; weight-4 constant-weight code: 582 points) with perturbations."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from trl_ext.rewards.kissing import kissing_score, verify_kissing_configuration
from trl_ext.rewards.kissing_constructions import (
    constant_weight_configuration,
    quadruple_packing,
    root_system_dn,
)


def reference_check(points: list[list[int]]) -> tuple[bool, int, int]:
    """Plain Python loops over all pairs: (valid, min squared distance, max squared norm)."""
    norms = [sum(c * c for c in p) for p in points]
    dists = [sum((a - b) ** 2 for a, b in zip(p, q, strict=True)) for p, q in itertools.combinations(points, 2)]
    return min(dists) >= max(norms) and min(norms) > 0, min(dists), max(norms)


@pytest.fixture(scope="module")
def d11():
    return root_system_dn(11)


@pytest.fixture(scope="module")
def code582():
    return constant_weight_configuration(quadruple_packing(11, 35), 11)


def test_d11_root_system_is_valid_with_220_points(d11):
    # 55 coordinate pairs x 4 sign choices, all distinct, squared norm 2
    assert len(d11) == 220 == 4 * 11 * 10 // 2
    assert len({tuple(p) for p in d11}) == 220
    result = verify_kissing_configuration(d11)
    assert result["validity"] == 1.0 and result["num_points"] == 220 and result["dimension"] == 11
    assert (result["min_squared_distance"], result["max_squared_norm"]) == (2, 2)
    assert reference_check(d11) == (True, 2, 2)
    assert kissing_score(result) == 220


def test_quadruple_packing_is_a_weight_4_distance_4_code_of_size_35():
    blocks = quadruple_packing(11, 35)
    assert len(blocks) == 35 and len(set(blocks)) == 35
    assert all(len(set(b)) == 4 and set(b) <= set(range(11)) for b in blocks)
    # any two blocks share at most 2 coordinates (Hamming distance >= 4 between the supports)
    assert max(len(set(a) & set(b)) for a, b in itertools.combinations(blocks, 2)) <= 2


def test_constant_weight_construction_is_valid_with_582_points(code582):
    assert len(code582) == 2 * 11 + 16 * 35 == 582
    result = verify_kissing_configuration(code582)
    assert result["validity"] == 1.0 and result["num_points"] == 582, result["message"]
    assert reference_check(code582) == (True, 4, 4)
    assert result["message"] == (
        "Valid: 582 points in dimension 11, minimum squared distance 4 >= maximum squared norm 4"
    )


def test_a_block_sharing_three_coordinates_breaks_the_construction(code582):
    """Catches a verifier that only compares norms: a block meeting another in 3 coordinates gives two vectors at
    squared distance 2 < 4."""
    blocks = quadruple_packing(11, 35)
    a = blocks[0]
    extra = (a[0], a[1], a[2], next(i for i in range(11) if i not in a))
    points = constant_weight_configuration([*blocks, extra], 11)
    result = verify_kissing_configuration(points)
    assert result["validity"] == 0.0
    assert result["message"].startswith("Minimum squared distance 2 < maximum squared norm 4: points ")
    assert reference_check(points)[:2] == (False, 2)


@pytest.mark.parametrize("which", ["d11", "code582"])
def test_perturbations_fail_with_the_right_message(which, request):
    points = [list(p) for p in request.getfixturevalue(which)]
    norm = sum(c * c for c in points[0])
    # lengthen one vector: its squared norm becomes the maximum and exceeds the minimum distance
    longer = [list(p) for p in points]
    longer[7] = [2 * c for c in longer[7]]
    msg = verify_kissing_configuration(longer)["message"]
    assert msg.startswith(f"Minimum squared distance {norm} < maximum squared norm {4 * norm}: points ")
    assert msg.endswith(f"point 7 has squared norm {4 * norm}")
    # duplicate a point
    dup = [*points, list(points[3])]
    assert verify_kissing_configuration(dup)["message"] == (
        f"points 3 and {len(points)} are the same vector {tuple(points[3])}"
    )
    # zero vector
    zero = [*points[:5], [0] * 11, *points[5:]]
    assert verify_kissing_configuration(zero)["message"] == "point 5 is the zero vector"
    # wrong dimension
    short = [*points[:9], points[9][:10], *points[10:]]
    assert verify_kissing_configuration(short)["message"] == "point 9 has 10 coordinates; expected 11 (dimension 11)"
    # a non-integer coordinate
    frac = [list(p) for p in points]
    frac[2][4] = 0.5
    assert verify_kissing_configuration(frac)["message"] == "point 2, coordinate 4 is 0.5 (float), not an integer"
    for bad in (longer, dup, zero, short, frac):
        result = verify_kissing_configuration(bad)
        assert result["validity"] == 0.0 and kissing_score(result) == 0


def test_nlpdl_hw3_message_format_on_a_hand_computed_case():
    # norms 40 and 36, distance^2 between them (6-0)^2 + (2-6)^2 ... computed by hand below
    points = [[6, 2] + [0] * 9, [6, -2] + [0] * 9, [0, 6] + [0] * 9]
    # |p0|^2 = 40, |p1|^2 = 40, |p2|^2 = 36; d(p0,p1)^2 = 16, d(p0,p2)^2 = 36 + 16 = 52, d(p1,p2)^2 = 36 + 64 = 100
    result = verify_kissing_configuration(points)
    assert result["message"] == (
        "Minimum squared distance 16 < maximum squared norm 40: points 0 and 1 are at squared distance 16, "
        "point 0 has squared norm 40"
    )
    ok = verify_kissing_configuration([[6, 0] + [0] * 9, [0, 6] + [0] * 9, [-6, 0] + [0] * 9])
    # d^2 = 72 or 144 against norm 36: valid
    assert ok["validity"] == 1.0 and (ok["min_squared_distance"], ok["max_squared_norm"]) == (72, 36)


@pytest.mark.parametrize(
    ("points", "message"),
    [
        ("abc", "points must be a list of vectors, got 'abc' (str)"),  # not a list
        ({"a": 1}, "points must be a list of vectors, got {'a': 1} (dict)"),
        (None, "points must be a list of vectors, got None (NoneType)"),
        ([], "points is empty: no vectors"),
        ([[1] * 11, "x"], "point 1 is 'x' (str), not a vector (a list of 11 integers)"),
        ([[True] + [0] * 10], "point 0, coordinate 0 is True (bool), not an integer"),  # bool is not an int here
        ([[1.0] + [0] * 10], "point 0, coordinate 0 is 1.0 (float), not an integer"),  # no silent float -> int
        ([["1"] + [0] * 10], "point 0, coordinate 0 is '1' (str), not an integer"),
        ([[None] + [0] * 10], "point 0, coordinate 0 is None (NoneType), not an integer"),
        ([[1] * 12], "point 0 has 12 coordinates; expected 11 (dimension 11)"),
    ],
)
def test_malformed_input_messages(points, message):
    result = verify_kissing_configuration(points)
    assert result["validity"] == 0.0 and result["message"] == message


def test_single_point_and_other_dimensions():
    assert verify_kissing_configuration([[0] * 10 + [3]])["validity"] == 1.0
    # the 6 vectors +-e_i of Z^3 kiss (tau_3 >= 6); adding (1,1,0) breaks it (distance^2 1 < norm^2 2)
    cube = [[1, 0, 0], [-1, 0, 0], [0, 1, 0], [0, -1, 0], [0, 0, 1], [0, 0, -1]]
    assert verify_kissing_configuration(cube, dimension=3)["validity"] == 1.0
    bad = verify_kissing_configuration([*cube, [1, 1, 0]], dimension=3)
    assert bad["message"].startswith("Minimum squared distance 1 < maximum squared norm 2")
    with pytest.raises(ValueError, match="dimension must be a positive int"):
        verify_kissing_configuration(cube, dimension=0)


def test_numpy_inputs_are_accepted_and_float_arrays_refused(d11):
    array = np.array(d11, dtype=np.int32)
    assert verify_kissing_configuration(array)["validity"] == 1.0
    assert verify_kissing_configuration([np.array(p) for p in d11])["validity"] == 1.0
    assert verify_kissing_configuration([[np.int64(c) for c in p] for p in d11])["validity"] == 1.0
    refused = verify_kissing_configuration(array.astype(np.float64))
    assert refused["message"] == "points has dtype float64; coordinates must be integers"
    assert verify_kissing_configuration(array[:, :10])["message"] == "points has shape (220, 10); expected (n, 11)"


def test_huge_coordinates_stay_exact(d11):
    """Catches int64 overflow: coordinates near 2^62 square far beyond int64; Python ints must be used."""
    scale = 2**62
    big = [[c * scale for c in p] for p in d11]
    result = verify_kissing_configuration(big)
    assert result["validity"] == 1.0 and result["max_squared_norm"] == 2 * scale**2
    # one unit longer breaks it; float64 arithmetic could not see a difference of 1 at this size
    big[0][big[0].index(scale)] += 1
    broken = verify_kissing_configuration(big)
    assert broken["validity"] == 0.0
    assert broken["max_squared_norm"] == (scale + 1) ** 2 + scale**2 > broken["min_squared_distance"]


def test_random_configurations_agree_with_the_plain_loop():
    rng = random.Random(0)
    for trial in range(60):
        n, d = rng.randint(2, 40), rng.randint(1, 6)
        spread = rng.choice([1, 2, 5, 10**12])  # 10^12: the int64 path right below its bound
        points = [[rng.randint(-spread, spread) for _ in range(d)] for _ in range(n)]
        if any(not any(p) for p in points) or len({tuple(p) for p in points}) < n:
            continue
        valid, min_d, max_n = reference_check(points)
        result = verify_kissing_configuration(points, dimension=d)
        assert (result["validity"] == 1.0, result["min_squared_distance"], result["max_squared_norm"]) == (
            valid,
            min_d,
            max_n,
        ), (trial, points)


def test_chunked_pairwise_search_finds_the_pair_in_a_later_chunk(monkeypatch):
    """Catches a chunking bug (pairs across chunk boundaries skipped): 1-row chunks, closest pair at the end."""
    import trl_ext.rewards.kissing as kissing

    points = [[10 * i, 0, 0] for i in range(1, 30)] + [[0, 0, 7], [0, 1, 7]]
    monkeypatch.setattr(kissing, "_BLOCK_ENTRIES", 1)
    result = verify_kissing_configuration(points, dimension=3)
    assert result["min_squared_distance"] == 1 and result["message"].startswith(
        "Minimum squared distance 1 < maximum squared norm 84100: points 29 and 30"
    )


def test_too_many_points_are_refused_before_the_quadratic_check():
    result = verify_kissing_configuration([[1] * 11] * 20, max_points=10)
    assert result["validity"] == 0.0 and result["message"] == "20 points: more than the 10 this verifier checks"
