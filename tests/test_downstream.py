"""Another extension builds against the *installed* fastbus: it cimports the
extension types (fastbus/_core.pxd), calls the C API (fastbus/includes/*.pxd,
headers from fastbus.get_include()) and links the shipped static core."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import fastbus

SETUP = textwrap.dedent("""
    import fastbus
    from Cython.Build import cythonize
    from setuptools import Extension, setup
    setup(
        name="consumer",
        ext_modules=cythonize([Extension(
            "consumer", ["consumer.pyx"],
            include_dirs=[fastbus.get_include()],
            library_dirs=fastbus.get_library_dirs(),
            libraries=["fastbus"],
        )], compiler_directives={"language_level": "3"}),
    )
""")

USE = textwrap.dedent("""
    import fastbus, consumer
    t = fastbus.Trie()
    t.add(b"news.sport", 7)
    assert consumer.route(t, b"news.sport") == [7, 42], consumer.route(t, b"news.sport")
    assert t.match(b"news.x") == [42]          # the C-level add is visible to Python
    box = fastbus.Outbox(max_messages=0)
    assert consumer.fill(box, 3) == 3
    assert fastbus.decode(box.take()) == [(b"t", b"payload")] * 3
    pub = fastbus.Publisher(fastbus.Outbox(), lambda: None)
    pub.publish("news", b"x")
    pub.publish("news", b"y")
    assert consumer.sealed_or_queued(pub) == 2
    assert consumer.check(0) == 0
    try:
        consumer.check(-6)                  # FB_EMALFORMED
    except fastbus.BatchError as exc:        # the core's exception for its status code, with our text
        assert "downstream" in str(exc), exc
    else:
        raise AssertionError("a core error code did not raise")
    print("downstream ok")
""")


def test_downstream_extension_builds_and_runs(tmp_path: Path):
    src = Path(__file__).parent / "downstream" / "consumer.pyx"
    (tmp_path / "consumer.pyx").write_text(src.read_text())
    (tmp_path / "setup.py").write_text(SETUP)
    # Run from tmp_path so nothing but the installed fastbus is importable.
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    build = subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=tmp_path,
                           capture_output=True, text=True, env=env, timeout=600)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    run = subprocess.run([sys.executable, "-c", USE], cwd=tmp_path, capture_output=True, text=True,
                         env=env, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "downstream ok" in run.stdout


def test_get_include_has_the_headers_and_pxds():
    inc = Path(fastbus.get_include())
    for name in ("fastbus.h", "fb_trie.h", "fb_forwarder.h", "fb_outbox.h", "fb_batch.h", "fb_common.h",
                 "fb_trie.pxd", "fb_common.pxd"):
        assert (inc / name).is_file(), name
    assert (Path(fastbus.__file__).parent / "_core.pxd").is_file()
    libs = [p for d in fastbus.get_library_dirs() for p in Path(d).iterdir()]
    assert any(p.name in ("libfastbus.a", "fastbus.lib") for p in libs)
