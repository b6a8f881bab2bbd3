"""The server watchdog (`trl_ext.grpo.vllm.watchdog`) without a server: its timer, its message, its exit.

The real server stopped mid-generation and mid-sync: tests/test_vllm_server_sync.py.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from trl_ext.grpo.vllm.watchdog import STALL_EXIT_CODE, ServerSyncError, Watchdog


def test_a_stall_names_step_operation_tensor_and_the_logs_tail(tmp_path):
    log = tmp_path / "server.log"
    log.write_text("".join(f"line {i}\n" for i in range(30)))
    messages: list[str] = []
    dog = Watchdog(0.2, step=lambda: 7, server_log=str(log), on_stall=messages.append)
    with dog.watch("weight sync"):
        dog.progress("model.layers.1.mlp.up_proj.weight", 4, 23)
        time.sleep(0.6)
    (message,) = messages
    assert message.startswith(
        "vLLM server watchdog: weight sync at step 7, tensor 'model.layers.1.mlp.up_proj.weight' (5 of 23) did not "
        "finish in 0."
    )
    assert "(vllm_server_timeout 0.2 s)" in message
    assert f"last 20 lines of the server log {log}:\nline 10\n" in message and message.endswith("line 29\n")


def test_an_operation_in_time_or_failing_does_not_fire(tmp_path):
    messages: list[str] = []
    dog = Watchdog(0.3, step=lambda: 2, server_log="", on_stall=messages.append)
    with dog.watch("generation request (generate)"):
        pass
    with pytest.raises(ServerSyncError, match=r"^generation request \(generate\) at step 2 failed: OSError: gone$"):
        with dog.watch("generation request (generate)"):
            raise OSError("gone")
    time.sleep(0.6)
    assert messages == []  # both timers were cancelled


def test_a_stall_ends_the_process_with_its_exit_code_and_message(tmp_path):
    """The default on a stall: the message on stderr, then `os._exit(3)` (a blocked call cannot be unwound)."""
    script = textwrap.dedent(
        """
        import time
        from trl_ext.grpo.vllm.watchdog import Watchdog
        dog = Watchdog(0.5, step=lambda: 1, server_log="")
        print(time.time(), flush=True)
        with dog.watch("weight sync"):
            time.sleep(30)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == STALL_EXIT_CODE
    assert "vLLM server watchdog: weight sync at step 1 did not finish" in proc.stderr
    assert "the server's log is not known" in proc.stderr
    assert time.time() - float(proc.stdout) < 10  # cut short at 0.5 s, not after the 30 s sleep
