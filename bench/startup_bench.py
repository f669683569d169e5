"""What a process pays to start with fastbus: the CPU seconds (user +
system, the process and its children) of importing it and of the commands
that only parse their arguments, beside a bare interpreter and redis-py's
import, in the same run.

Every broker a test or an operator starts, and every ``fastbus ...``
command, pays this before it does anything (the test suite starts about
200 brokers and 60 commands).

    python bench/startup_bench.py [--runs 15]

Run it from outside the repository root (or with ``python -P``) so that the
installed package is measured, not the source tree.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

CASES = [
    ("python -c pass (the interpreter alone)", [sys.executable, "-c", "pass"]),
    ("python -c 'import redis' (redis-py, a peer's client)", [sys.executable, "-c", "import redis"]),
    ("python -c 'import fastbus'", [sys.executable, "-P", "-c", "import fastbus"]),
    ("python -m fastbus --version", [sys.executable, "-P", "-m", "fastbus", "--version"]),
    ("python -m fastbus broker --help", [sys.executable, "-P", "-m", "fastbus", "broker", "--help"]),
    ("python -m fastbus queue --help", [sys.executable, "-P", "-m", "fastbus", "queue", "--help"]),
]


def cpu_of(cmd: list[str]) -> float:
    """CPU seconds (user + system) the command took, from its rusage."""
    before = os.times()
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=60)
    after = os.times()
    return (after.children_user - before.children_user) + (after.children_system - before.children_system)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=15, help="runs of each command, interleaved (default 15)")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be >= 1")
    times: dict[str, list[float]] = {name: [] for name, _cmd in CASES}
    for _ in range(args.runs):                    # interleaved: the machine's noise hits each alike
        for name, cmd in CASES:
            times[name].append(cpu_of(cmd))
    print(f"CPU seconds per start, {args.runs} runs each: min / median / max")
    for name, ts in times.items():
        print(f"  {name:<55} {min(ts):.3f} / {statistics.median(ts):.3f} / {max(ts):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
