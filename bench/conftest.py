"""Benchmarks (not part of the test run): pytest-benchmark, plus a summary
table of per-topic costs and ratios to the peers, printed at the end.

    pip install ".[bench]"
    pytest bench/ --benchmark-only

FASTBUS_BENCH_SIZES=10000,100000 limits the table sizes (default adds 1M).
"""

import os
import sys
from collections import defaultdict
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

SIZES = [int(x) for x in os.environ.get("FASTBUS_BENCH_SIZES", "10000,100000,1000000").split(",")]
RESULTS: dict = defaultdict(dict)   # (metric) -> {(impl, n): value}


@pytest.fixture(scope="session")
def record():
    def rec(metric: str, impl: str, n: int, value: float) -> None:
        RESULTS[metric][impl, n] = value
    return rec


def pytest_terminal_summary(terminalreporter):
    if not RESULTS:
        return
    w = terminalreporter.write_line
    for metric, values in RESULTS.items():
        sizes = sorted({n for _i, n in values})
        impls = list(dict.fromkeys(i for i, _n in values))
        w("")
        w(f"{metric}:")
        w("| impl | " + " | ".join(f"{n:,}" for n in sizes) + " |")
        w("|---|" + "---|" * len(sizes))
        for impl in impls:
            cells = []
            for n in sizes:
                v = values.get((impl, n))
                base = values.get(("fastbus-batch", n))
                if v is None:
                    cells.append("")
                elif base and impl != "fastbus-batch" and metric.startswith("match"):
                    cells.append(f"{v:,.0f} ({v / base:.1f}x)")
                else:
                    cells.append(f"{v:,.1f}" if v < 100 else f"{v:,.0f}")
            w(f"| {impl} | " + " | ".join(cells) + " |")
