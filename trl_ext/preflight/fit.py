"""The picker: a run's estimate against its memory limit, and the alternatives that fit (the one loop over the
estimate).

`fit_memory` takes the model's shape and the run's `TrainingSetup` (each read once, by the plan) and the limit, and
calls the pure `trl_ext.preflight.memory.estimate_memory` for the run itself, then, only where the plan needs them:
for a padding-free run the largest micro-batch the batch arithmetic allows that fits (and the padded layout's), and
for a run over the limit the knobs of `trl_ext.preflight.knobs` that bring it under. It returns them in a `MemoryFit`
that the plan prints; nothing here reads a recipe or prints.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from trl_ext.preflight.knobs import Knob, knob_candidates, merge_knob
from trl_ext.preflight.memory import MemoryEstimate, estimate_memory
from trl_ext.preflight.models import ModelShape
from trl_ext.preflight.setup import TrainingSetup


def largest_fitting_micro_batch(
    shape: ModelShape, setup: TrainingSetup, budget_gib: float, candidates: list[int]
) -> tuple[int, MemoryEstimate] | None:
    """The largest micro-batch of `candidates` (the ones the batch arithmetic allows) whose estimate fits
    `budget_gib`, with that estimate; None when none fits."""
    for micro_batch in sorted(set(candidates), reverse=True):
        estimate = estimate_memory(shape, replace(setup, micro_batch=micro_batch))
        if estimate.peak_gib <= budget_gib:
            return micro_batch, estimate
    return None


def knobs_to_fit(shape: ModelShape, setup: TrainingSetup, budget_gib: float) -> list[Knob]:
    """Single changes (`knob_candidates`, mildest first) that bring the estimate under `budget_gib`, one micro-batch
    and one validation-batch size each (the largest that fits); when none does alone, the greedy combination that
    does (each candidate kept if it lowers the peak), else nothing."""
    fits = []
    for flags, candidate, caveat in knob_candidates(setup):
        estimate = estimate_memory(shape, candidate)
        if estimate.peak_gib <= budget_gib:
            fits.append(Knob(flags, estimate, caveat))
    if fits:
        seen: set[str] = set()
        unique = []
        for knob in fits:
            key = knob.flags.split()[0]
            if key not in seen:
                seen.add(key)
                unique.append(knob)
        return unique
    combined, flags = setup, []
    current = estimate_memory(shape, combined)
    for flag, candidate, _caveat in knob_candidates(setup):
        key = flag.split()[0]
        if any(f.split()[0] == key for f in flags):
            continue
        trial = merge_knob(combined, candidate, setup)
        estimate = estimate_memory(shape, trial)
        if estimate.peak_bytes < current.peak_bytes:
            combined, flags, current = trial, [*flags, flag], estimate
            if current.peak_gib <= budget_gib:
                return [Knob(" ".join(flags), current, "all of these together")]
    return []


@dataclass(frozen=True)
class MicroBatchPick:
    """A padding-free run's pick: the largest micro-batch (with its GA) whose expected estimate fits, that
    micro-batch's padded worst case, and the largest micro-batch the padded layout fits (None: none)."""

    micro_batch: int
    gradient_accumulation_steps: int
    estimate: MemoryEstimate
    worst: MemoryEstimate
    padded_micro_batch: int | None


@dataclass(frozen=True)
class MemoryFit:
    """A run's estimate against its limit.

    Attributes:
        estimate: the run as the recipe states it.
        limit_gib: the limit per training GPU (None: unknown, nothing else is computed).
        choices: `{micro-batch: GA}` the batch arithmetic allows (padding-free runs with a limit; else empty).
        pick: the padding-free pick from `choices`, None when none fits (or not padding-free / no limit).
        knobs: changes that bring an estimate over the limit under it (empty when it fits or none does).
    """

    estimate: MemoryEstimate
    limit_gib: float | None = None
    choices: Mapping[int, int] | None = None
    pick: MicroBatchPick | None = None
    knobs: tuple[Knob, ...] = ()

    @property
    def over(self) -> bool:
        return self.limit_gib is not None and self.estimate.peak_gib > self.limit_gib


def fit_memory(
    shape: ModelShape, setup: TrainingSetup, limit_gib: float | None, choices: Mapping[int, int] | None = None
) -> MemoryFit:
    """The estimate of `setup`, and against `limit_gib`: the padding-free pick among `choices` (`{micro-batch:
    GA}`, `trl_ext.preflight.batch.micro_batch_choices`; given for padding-free runs) and the knobs when over."""
    estimate = estimate_memory(shape, setup)
    if limit_gib is None:
        return MemoryFit(estimate)
    pick = None
    if choices is not None:
        found = largest_fitting_micro_batch(shape, setup, limit_gib, list(choices))
        if found is not None:
            micro_batch, picked = found
            worst = estimate_memory(shape, replace(setup, micro_batch=micro_batch, padding_free=False))
            padded = largest_fitting_micro_batch(shape, replace(setup, padding_free=False), limit_gib, list(choices))
            pick = MicroBatchPick(micro_batch, choices[micro_batch], picked, worst, padded[0] if padded else None)
    knobs = tuple(knobs_to_fit(shape, setup, limit_gib)) if estimate.peak_gib > limit_gib else ()
    return MemoryFit(estimate, limit_gib, choices, pick, knobs)
