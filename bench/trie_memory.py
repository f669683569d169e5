"""Memory per subscription of each table, each built in a fresh process:
the growth of RSS from just before building to just after, divided by the
number of subscriptions; for fastbus also its own accounting; and the time
to build the table from Python (datrie: loaded from bench/.cache, since
building 1M keys takes ~20 minutes).

    python bench/trie_memory.py [--sizes 10000,100000,1000000] [--impls fastbus,datrie,pygtrie,dict]
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        import os
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def child(impl: str, n: int) -> None:
    from workload import build_datrie, build_dict, build_fastbus, build_pygtrie, subscriptions
    build = {"fastbus": build_fastbus, "datrie": build_datrie, "pygtrie": build_pygtrie, "dict": build_dict}[impl]
    if impl != "dict":
        __import__(impl)                 # loading the module is not part of the table
    if impl == "datrie":
        build(subscriptions(n))          # make sure the cached trie exists before measuring
    subs = subscriptions(n)
    gc.collect()
    before = rss_bytes()
    t0 = time.perf_counter()
    t = build(subs)
    seconds = time.perf_counter() - t0
    gc.collect()
    after = rss_bytes()
    out = {"impl": impl, "n": n, "rss_per_sub": (after - before) / n, "build_s": seconds}
    if impl == "fastbus":
        s = t.stats()
        out["live_per_sub"] = s["bytes_live"] / n
        out["reserved_per_sub"] = s["bytes_reserved"] / n
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10000,100000,1000000")
    ap.add_argument("--impls", default="fastbus,datrie,pygtrie,dict")
    ap.add_argument("--child", nargs=2, metavar=("IMPL", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
        return
    sizes = [int(x) for x in args.sizes.split(",")]
    rows = []
    for impl in args.impls.split(","):
        for n in sizes:
            r = subprocess.run([sys.executable, __file__, "--child", impl, str(n)],
                               capture_output=True, text=True, timeout=3600)
            if r.returncode != 0:
                sys.exit(f"{impl} {n} failed:\n{r.stderr}")
            rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
    print("| impl | subscriptions | RSS B/sub | core live B/sub | core reserved B/sub | build s |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        live = f"{r['live_per_sub']:.1f}" if "live_per_sub" in r else ""
        res = f"{r['reserved_per_sub']:.1f}" if "reserved_per_sub" in r else ""
        build = "(cached)" if r["impl"] == "datrie" else f"{r['build_s']:.2f}"
        print(f"| {r['impl']} | {r['n']:,} | {r['rss_per_sub']:.1f} | {live} | {res} | {build} |")


if __name__ == "__main__":
    main()
