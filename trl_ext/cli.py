"""`trl-ext`: the command-line entry point (Typer). Each command imports its heavy machinery lazily."""

from __future__ import annotations

import typer

from trl_ext import discover, evaluation, launch, plotting

app = typer.Typer(no_args_is_help=True, add_completion=False, help="trl_ext: GRPO ablations with verified rewards.")


# A callback keeps `trl-ext` a command group whatever the number of commands (Typer would otherwise collapse a
# single-command app into that command).
@app.callback()
def _root() -> None:
    """trl_ext: GRPO ablations with verified rewards."""


# Each module owns its command's options; their top-level imports are light (torch/trl load inside commands).
evaluation.register(app)
plotting.register(app)
launch.register(app)
discover.register(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
