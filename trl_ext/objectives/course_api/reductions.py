"""The courses' reductions where their calling convention differs from `trl_ext.objectives.reductions`.

`masked_normalize` takes the divisor under both names the courses use: section 4.2 of NYU Assignment 3 (a modified
CS336 A5) declares
`normalize_constant`; the length-normalisation example of NYU Assignment 3, NLPDL HW3 and CS336 A5 calls
`masked_normalize(ratio * advs, masks, dim=1, constant_normalizer=max_gen_len)`. The arithmetic is
`trl_ext.objectives.reductions.masked_normalize`'s.
"""

from __future__ import annotations

import torch

from trl_ext.objectives.reductions import masked_normalize as _masked_normalize


def masked_normalize(
    tensor: torch.Tensor,
    mask: torch.Tensor,
    normalize_constant: float | None = None,
    dim: int | None = None,
    *,
    constant_normalizer: float | None = None,
) -> torch.Tensor:
    """Masked sum divided by a constant: `sum(m * x) / C` over `dim` (all elements when None).

    Args:
        tensor: any shape, e.g. `(B, T)`.
        mask: same shape, 0/1 (bool or numeric).
        normalize_constant: `C` (NYU Assignment 3 section 4.2's name).
        dim: the dimension to sum over; `None` sums all elements (a scalar).
        constant_normalizer: `C` under the name the courses' length-normalisation example uses; give one of the two.

    Returns:
        The normalised sum, with `dim` reduced.

    Raises:
        TypeError: both names given, or neither.
    """
    if (normalize_constant is None) == (constant_normalizer is None):
        raise TypeError(
            "masked_normalize takes the constant as normalize_constant or as constant_normalizer (the courses' "
            f"example's name), exactly one; got normalize_constant={normalize_constant!r}, "
            f"constant_normalizer={constant_normalizer!r}"
        )
    constant = normalize_constant if constant_normalizer is None else constant_normalizer
    return _masked_normalize(tensor, mask, constant, dim=dim)
