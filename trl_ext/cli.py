"""`trl-ext`: the command-line entry point (Typer). Each command imports its heavy machinery lazily.

Commands are registered here, at the top, from the module that owns each one's options, never from a package's
`__init__`: a library (`trl_ext.evaluation`) stays free of the layers above it.
"""

from __future__ import annotations

import typer

from trl_ext.discover.check import register as register_kissing_check
from trl_ext.discover.cli import register as register_discover
from trl_ext.launch.cli import register as register_launch
from trl_ext.recipes.eval_command import register as register_eval
from trl_ext.reporting.plot import register as register_plot
from trl_ext.study.cli import register as register_study

app = typer.Typer(no_args_is_help=True, add_completion=False, help="trl_ext: GRPO ablations with verified rewards.")


# A callback keeps `trl-ext` a command group whatever the number of commands (Typer would otherwise collapse a
# single-command app into that command).
@app.callback()
def _root() -> None:
    """trl_ext: GRPO ablations with verified rewards."""


# Each module owns its command's options; their top-level imports are light (torch/trl load inside commands).
register_eval(app)
register_plot(app)
register_launch(app)
register_discover(app)
register_kissing_check(app)
register_study(app)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
