"""Build and run the C core's own unit tests (csrc/tests), optimised and
under AddressSanitizer + UndefinedBehaviorSanitizer, with the same C
compiler Python uses.  Needs the source tree (csrc/ next to tests/)."""

import os
import shlex
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parent.parent / "csrc"
CORE = sorted(p.name for p in CSRC.glob("fb_*.c"))
TESTS = sorted(p.stem for p in (CSRC / "tests").glob("test_*.c")) or ["(no C sources)"]
WARNINGS = ["-std=c11", "-Wall", "-Wextra", "-Werror"]
FLAGS = {
    "optimised": ["-O2", "-g"],
    "sanitized": ["-O1", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined",
                  "-fno-sanitize-recover=all"],
}


def _cc() -> list:
    cc = os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc"
    return shlex.split(cc)


@pytest.fixture(scope="module")
def csrc(repo_root: Path) -> Path:
    d = repo_root / "csrc"
    if not (d / "tests").is_dir():
        pytest.skip("C sources not present (testing an installed wheel without the source tree)")
    if shutil.which(_cc()[0]) is None:
        pytest.fail(f"no C compiler {_cc()[0]!r} to build the C unit tests")
    return d


@pytest.fixture(scope="module")
def core_objects(csrc: Path, tmp_path_factory: pytest.TempPathFactory):
    """The core's object files for a variant, compiled once (each test then
    compiles only its own file): ``core_objects(variant)``."""
    built: dict[str, list[str]] = {}

    def objects(variant: str) -> list[str]:
        if variant not in built:
            out = tmp_path_factory.mktemp(f"core-{variant}")
            objs = []
            for source in CORE:
                obj = out / source.replace(".c", ".o")
                cmd = _cc() + [*WARNINGS, *FLAGS[variant], f"-I{csrc}", "-c", str(csrc / source), "-o", str(obj)]
                build = subprocess.run(cmd, capture_output=True, text=True)
                assert build.returncode == 0, f"build failed:\n{' '.join(cmd)}\n{build.stderr}"
                objs.append(str(obj))
            built[variant] = objs
        return built[variant]

    return objects


@pytest.mark.parametrize("variant", sorted(FLAGS))
@pytest.mark.parametrize("name", TESTS)
def test_c_unit_tests(csrc: Path, core_objects, tmp_path: Path, name: str, variant: str):
    exe = tmp_path / name
    cmd = _cc() + [*WARNINGS, *FLAGS[variant], f"-I{csrc}",
                   str(csrc / "tests" / f"{name}.c"), *core_objects(variant), "-o", str(exe)]
    build = subprocess.run(cmd, capture_output=True, text=True)
    assert build.returncode == 0, f"build failed:\n{' '.join(cmd)}\n{build.stderr}"
    env = dict(os.environ, ASAN_OPTIONS="detect_leaks=1:abort_on_error=0",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    env.pop("LD_PRELOAD", None)
    run = subprocess.run([str(exe)], capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, f"{name} ({variant}) failed:\n{run.stdout}\n{run.stderr}"
    assert "all passed" in run.stdout
