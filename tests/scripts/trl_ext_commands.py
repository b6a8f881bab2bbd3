"""Several `trl-ext` commands, one after another in ONE process, each with its own log.

Usage: trl_ext_commands.py LOG ARGS_JSON [LOG ARGS_JSON ...]: for each pair, runs `trl-ext *ARGS` (the CLI's Typer
app, as the `trl-ext` script does) with this process's stdout and stderr (file descriptors 1 and 2, so also what
libraries and their loggers write) sent to LOG. The process pays the imports of torch, transformers and vLLM once
instead of once per command (tests/test_vllm_eval.py: two `trl-ext eval` runs on the CPU engine). The exit status is
the first non-zero status of a command, 0 when all succeeded; every command runs either way, and a failed one's log
tail is printed to this process's own output.
"""

from __future__ import annotations

import json
import os
import sys
import traceback


def run_command(args: list[str], log: str) -> int:
    """`trl-ext *args` with fds 1 and 2 on `log`; its exit status."""
    from trl_ext.cli import app

    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log, "w") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        try:
            status = app(args, prog_name="trl-ext", standalone_mode=False)  # a command's `typer.Exit` code
            status = status if isinstance(status, int) else 0
        except SystemExit as exit_:
            status = exit_.code if isinstance(exit_.code, int) else 1
        except Exception:
            traceback.print_exc()
            status = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
    if status:  # where the caller's log shows it
        tail = open(log, errors="replace").read().splitlines()[-40:]
        print(f"trl-ext {' '.join(args[:2])} ... exited with {status}; last lines of {log}:", *tail, sep="\n")
    return status


def main(pairs: list[str]) -> int:
    statuses = [run_command(json.loads(args), log) for log, args in zip(pairs[::2], pairs[1::2], strict=True)]
    return next((status for status in statuses if status), 0)


if __name__ == "__main__":  # vLLM may spawn processes: they must not rerun this
    sys.exit(main(sys.argv[1:]))
