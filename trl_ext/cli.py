"""`trl-ext`: the command-line entry point (Typer). Each command imports its heavy machinery lazily."""

from __future__ import annotations

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help="trl_ext: GRPO ablations with verified rewards.")


# A callback keeps `trl-ext` a command group even while only one module has registered a command (Typer would
# otherwise collapse it to that command and read `launch` as its first argument).
@app.callback()
def _root() -> None:
    """trl_ext: GRPO ablations with verified rewards."""


# Commands are registered by their modules' `register(app)` functions so each module owns its options.
for _module in ("trl_ext.launch", "trl_ext.evaluation", "trl_ext.plotting"):
    try:
        __import__(_module, fromlist=["register"]).register(app)
    except (ImportError, AttributeError):  # a module not written yet registers nothing
        pass


def main() -> None:
    app()


if __name__ == "__main__":
    main()
