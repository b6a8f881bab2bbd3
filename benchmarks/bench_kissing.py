"""Kissing verifier speed, reference constructions, and the sandbox's verdicts on hostile programs.

1. Verifier time for n points in dimension 11 (seeded random integers in [-50, 50], n = 1,000 by default, plus the
   582-point construction and 10,000 points), median of `--repeats` runs, against a plain Python double loop over
   the pairs (the baseline, timed once; it is the reference the tests compare with), measured in the same run.
2. The reference constructions (D11 roots, the weight-4 constant-weight code) through the verifier.
3. Hostile programs through `run_python`: each case's verdict and wall time (limit `--time-limit` s for the ones
   that must be killed), and whether any process of the run's private uid is alive afterwards.

Writes benchmarks/results/kissing.json. On a shared machine timings are noisy; the ratio is measured alternately.

    python benchmarks/bench_kissing.py
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results" / "kissing.json"

HOSTILE = {
    "infinite loop": ("while True:\n    pass", {}),
    "sleeps forever": ("import time\nwhile True:\n    time.sleep(1)", {}),
    "fork bomb (os.fork)": ("import os\nwhile True:\n    os.fork()", {}),
    "fork bomb (libc fork via ctypes)": ("import ctypes\nlibc = ctypes.CDLL(None)\nwhile True:\n    libc.fork()", {}),
    "memory bomb": ("x = []\nwhile True:\n    x.append(bytearray(10**7))", {}),
    "huge points (20,000 x 11)": ("points = [[123456789] * 11] * 20000", {"max_result_bytes": 1 << 20}),
    "prints 5 MB": ("print('x' * 5_000_000)\npoints = [[1] * 11]", {}),
    "fills the disk": ("f = open('big', 'wb')\nwhile True:\n    f.write(b'x' * 10**6)", {}),
    "writes outside its directory": ("open('/etc/trl_ext_probe', 'w').write('x')", {}),
    "writes outside via libc": (
        "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "fd = libc.open(b'/etc/trl_ext_probe', os.O_CREAT | os.O_WRONLY, 0o644)\n"
        "points = [[fd, ctypes.get_errno()]]",
        {},
    ),
    "opens a socket": ("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=1)", {}),
    "socket via libc": (
        "import ctypes, socket, struct\nlibc = ctypes.CDLL(None, use_errno=True)\n"
        "fd = libc.socket(socket.AF_INET, socket.SOCK_STREAM, 0)\n"
        "addr = struct.pack('=H', socket.AF_INET) + struct.pack('!H', 80) + bytes([1, 1, 1, 1]) + bytes(8)\n"
        "points = [[fd, libc.connect(fd, addr, 16), ctypes.get_errno()]]",
        {},
    ),
    "escapes the session (setsid)": (
        "import ctypes, os, time\nlibc = ctypes.CDLL(None)\n"
        "if libc.fork() == 0:\n    libc.setsid()\n    time.sleep(60)\n    os._exit(0)\npoints = [[1]]",
        {},
    ),
    "points is not a list": ("points = 'hello'", {}),
    "valid (D11 roots)": (None, {}),
}


def plain_loop(points: list[list[int]]) -> tuple[bool, int, int]:
    norms = [sum(c * c for c in p) for p in points]
    dists = [sum((a - b) ** 2 for a, b in zip(p, q, strict=True)) for p, q in itertools.combinations(points, 2)]
    return min(dists) >= max(norms), min(dists), max(norms)


def verifier_timings(repeats: int) -> dict:
    from trl_ext.rewards.kissing import verify_kissing_configuration
    from trl_ext.rewards.kissing_constructions import constant_weight_configuration, quadruple_packing

    rng = random.Random(0)
    cases = {
        "random_1000": [[rng.randint(-50, 50) for _ in range(11)] for _ in range(1000)],
        "construction_582": constant_weight_configuration(quadruple_packing(11, 35), 11),
        "random_10000": [[rng.randint(-50, 50) for _ in range(11)] for _ in range(10_000)],
    }
    out = {}
    for name, points in cases.items():
        ours, loop = [], None
        for i in range(repeats):
            t0 = time.perf_counter()
            result = verify_kissing_configuration(points)
            ours.append(time.perf_counter() - t0)
            if i == 0 and len(points) <= 1000:  # the O(n^2) Python loop, alternated with our runs
                t0 = time.perf_counter()
                reference = plain_loop(points)
                loop = time.perf_counter() - t0
                ours_check = (result["validity"] == 1.0, result["min_squared_distance"], result["max_squared_norm"])
                assert reference == ours_check, (reference, ours_check)
        out[name] = {
            "n": len(points),
            "verifier_s": statistics.median(ours),
            "plain_loop_s": loop,
            "speedup": None if loop is None else loop / statistics.median(ours),
            "message": result["message"],
        }
        speed = "" if loop is None else f", plain loop {loop:.3f} s ({loop / statistics.median(ours):.0f}x)"
        print(f"verifier {name:>18}: {statistics.median(ours) * 1000:8.1f} ms{speed}  [{result['message'][:60]}]")
    return out


def hostile_table(time_limit: float) -> list[dict]:
    from trl_ext.rewards.kissing_constructions import configuration_program, root_system_dn
    from trl_ext.rewards.sandbox import SandboxLimits, _live_pids, run_python

    rows = []
    for case, (source, limits) in HOSTILE.items():
        source = source or configuration_program(root_system_dn(11))
        result = run_python(source, "points", SandboxLimits(time_limit_s=time_limit, **limits))
        uid = result["isolation"].get("uid")
        alive = _live_pids(uid) if uid is not None and uid != os.getuid() else []
        value = result["value"]
        verdict = (result["error"] or f"ok: points = {json.dumps(value)[:60]}").split("\n")[0]
        if value is not None and len(value) > 5:
            verdict = f"ok: {len(value)} points"
        rows.append({"case": case, "verdict": verdict, "seconds": round(result["seconds"], 2), "left_alive": alive})
        print(f"{case:>34} | {result['seconds']:5.2f} s | {verdict[:110]}{' | LEFT ALIVE' if alive else ''}")
    print("isolation:", json.dumps(result["isolation"]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--time-limit", type=float, default=5.0)
    args = parser.parse_args()
    from trl_ext.rewards.kissing import verify_kissing_configuration
    from trl_ext.rewards.kissing_constructions import constant_weight_configuration, quadruple_packing, root_system_dn

    load = os.getloadavg()
    timings = verifier_timings(args.repeats)
    constructions = {
        "d11_roots": verify_kissing_configuration(root_system_dn(11)),
        "constant_weight_code": verify_kissing_configuration(constant_weight_configuration(quadruple_packing(), 11)),
    }
    for name, result in constructions.items():
        print(f"construction {name}: {result['message']}")
    table = hostile_table(args.time_limit)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "loadavg_at_start": load},
                "verifier": timings,
                "constructions": {k: v["num_points"] if v["validity"] == 1.0 else 0 for k, v in constructions.items()},
                "hostile": table,
                "time_limit_s": args.time_limit,
            },
            indent=1,
        )
    )
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    main()
