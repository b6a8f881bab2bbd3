"""Preflight: every check a GRPO run can fail, done before any model loads, server starts or process spawns.

Checks over a parsed plan: the bottom layer under `trl_ext.recipes` (which parses and starts recipes) and
`trl_ext.launch` (which plans and starts launches); nothing here imports either. Modules: `batch` (batch arithmetic
per world size), `models` (parameter counts and head counts from a model config), `setup` (what one training process
holds, read once from the parsed recipe), `memory` (the peak GPU memory estimate, a pure function of the shape and the
setup), `knobs` (the recipe changes that lower it), `fit` (the picker: the estimate against the limit, the micro-batch
that fits, the knobs that fit), `disk` (checkpoint sizes), `environment` (ports, wandb, extras, model and data
sources), `context` (where a run runs: processes, GPUs, free memory, device order), `driver` (the NVIDIA driver
against torch's CUDA), `rundir` (output_dir and explicit resume), `packed_models` (the model types `padding_free` may
pack), `plan` (all of it for one parsed recipe, and the printed plan), `problems` (the error type). Top-level imports
are stdlib only.
"""

from trl_ext.preflight.batch import BatchLayout, check_batches, derive_gradient_accumulation, plan_batches
from trl_ext.preflight.context import RunContext
from trl_ext.preflight.environment import WandbStatus, choose_port, port_is_free, resolve_wandb
from trl_ext.preflight.fit import knobs_to_fit
from trl_ext.preflight.memory import MemoryEstimate, estimate_memory
from trl_ext.preflight.models import KNOWN_CONFIGS, ModelShape, load_model_shape
from trl_ext.preflight.plan import Preflight, check_recipe
from trl_ext.preflight.problems import PreflightError, Problem
from trl_ext.preflight.rundir import RUN_RECORD, plan_output_dir, read_record, write_record
from trl_ext.preflight.setup import TrainingSetup, training_setup

__all__ = [
    "KNOWN_CONFIGS",
    "RUN_RECORD",
    "BatchLayout",
    "MemoryEstimate",
    "ModelShape",
    "Preflight",
    "PreflightError",
    "Problem",
    "RunContext",
    "TrainingSetup",
    "WandbStatus",
    "check_batches",
    "check_recipe",
    "choose_port",
    "derive_gradient_accumulation",
    "estimate_memory",
    "knobs_to_fit",
    "load_model_shape",
    "plan_batches",
    "plan_output_dir",
    "port_is_free",
    "read_record",
    "resolve_wandb",
    "training_setup",
    "write_record",
]
