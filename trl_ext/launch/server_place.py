"""Where `trl-ext launch` put the vLLM server, told to the trainer and to a user whose GPUs are all taken.

- The trainer runs its own preflight (`trl_ext.preflight.plan`), which cannot see the server: the launcher hands it
  the server's place in `LAUNCH_SERVER_ENV` when it starts it, so the trainer's plan line names it instead of "a
  server you start".
- The fix of "no free GPU left for the vLLM server" proposes training on half the GPUs; the server GPUs it names are
  those the tensor-parallel rule (`trl_ext.launch.planning.server_parallelism`) would give the server on the rest (on
  4 GPUs and a model the rule serves with tp 1: GPU 2, GPU 3 left idle), not every remaining GPU.
"""

from __future__ import annotations

from collections.abc import Sequence

from trl_ext.launch.configs import LaunchError
from trl_ext.launch.planning import LaunchPlan, server_parallelism
from trl_ext.preflight.context import LAUNCH_SERVER_ENV
from trl_ext.preflight.models import load_model_shape


def gpu_server_place(gpus: Sequence[str], tp: int, dp: int) -> str:
    """`GPU(s) 2,3 (tp 2, dp 1), started by trl-ext launch`."""
    return f"GPU(s) {','.join(gpus)} (tp {tp}, dp {dp}), started by trl-ext launch"


def cpu_server_place(cores: Sequence[int]) -> str:
    """`CPU core(s) 0 (vLLM's CPU build; weights synced over gloo), started by trl-ext launch` (no cores: unpinned)."""
    where = f"CPU core(s) {','.join(map(str, cores))}" if cores else "CPU"
    return f"{where} (vLLM's CPU build; weights synced over gloo), started by trl-ext launch"


def server_place_env(plan: LaunchPlan) -> dict[str, str]:
    """`{LAUNCH_SERVER_ENV: place}` for the trainer of `plan` (`trl_ext.launch.supervision.run_launch` adds it when it
    starts the trainer; the printed commands leave it out); empty without a server."""
    if plan.server is None:
        return {}
    if plan.server_gpus:
        return {LAUNCH_SERVER_ENV: gpu_server_place(plan.server_gpus, plan.tp, plan.dp)}
    return {LAUNCH_SERVER_ENV: cpu_server_place(plan.server_cores)}


def proposed_server_gpus(rest: Sequence[str], model: str | None, tp: int | None, dp: int | None) -> list[str]:
    """The GPUs of `rest` the server would get by the tensor-parallel rule (all of `rest` when the sizes given do
    not fit them or the rule cannot run)."""
    shape = load_model_shape(model)[0] if model else None
    try:
        gpus, _, _ = server_parallelism(list(rest), tp, dp, shape)
    except LaunchError:
        return list(rest)
    return gpus
