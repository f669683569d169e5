"""Build of fastbus: the C core (csrc/) as a static library, and the Cython
extensions linked against it: fastbus._core (the core's bindings), and the
modules that cimport it (the broker's data plane, the client's engine,
redis-py's message dicts, the queues' item layout).

fastbus/_core.pyx includes its parts by concern, fastbus/core/*.pxi (found
next to it; their .pxd files are included by fastbus/_core.pxd and installed
with it, for `cimport`).

Environment switches:
  FASTBUS_BUILD_JOBS=N compile with N processes (default: one per CPU)
  FASTBUS_SANITIZE=1   -O0 -g -fsanitize=address,undefined (run Python with
                       LD_PRELOAD of libasan; see docs/DEVELOPING.md)
  FASTBUS_DEBUG=1      -O0 -g, no sanitizers

The static library and the C headers are installed inside the package
(fastbus/lib, fastbus/includes) so that other extensions can compile and link
against the core: see fastbus.get_include() and fastbus.get_library_dirs().
"""

import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_clib import build_clib
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
CORE_SOURCES = sorted(p.name for p in (HERE / "csrc").glob("fb_*.c"))
SANITIZE = os.environ.get("FASTBUS_SANITIZE", "") == "1"
DEBUG = SANITIZE or os.environ.get("FASTBUS_DEBUG", "") == "1"
# Every build (a user's pip install, and CI's several) compiles in parallel:
# the Cython translation, the core's C files and the extensions.
JOBS = int(os.environ.get("FASTBUS_BUILD_JOBS") or os.cpu_count() or 1)


def _copy_headers() -> None:
    # csrc/ is the source of truth; the package carries a copy for get_include().
    dest = HERE / "fastbus" / "includes"
    for header in (HERE / "csrc").glob("*.h"):
        target = dest / header.name
        if not target.exists() or target.read_bytes() != header.read_bytes():
            shutil.copyfile(header, target)


def _cflags(compiler_type: str, core: bool) -> list:
    if compiler_type == "msvc":
        return ["/Od", "/Zi"] if DEBUG else ["/O2"]
    flags = ["-fno-strict-aliasing"]
    if core:
        # The same warnings as csrc/Makefile (the core is built both ways).
        flags += ["-std=c11", "-Wall", "-Wextra", "-Wpedantic", "-Wshadow", "-Wstrict-prototypes"]
    if SANITIZE:
        flags += ["-O0", "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined"]
    elif DEBUG:
        flags += ["-O0", "-g"]
    else:
        # No debug information in a release build: it took a third of the
        # compile time of the 2.7 MB generated _core.c and most of the
        # extensions' size (FASTBUS_DEBUG=1 builds with -g).
        flags += ["-O3", "-g0"]
    return flags


def _ldflags(compiler_type: str) -> list:
    if compiler_type == "msvc":
        return []
    # The client's engine runs threads (csrc/fb_sender.c, fb_reader.c): before
    # glibc 2.34 (manylinux2014 builds) pthread is a library of its own.
    flags = ["-pthread"]
    if SANITIZE:
        flags += ["-fsanitize=address,undefined"]
    return flags


class BuildClib(build_clib):
    def build_libraries(self, libraries):
        ct = self.compiler.compiler_type
        for _name, info in libraries:
            info["cflags"] = _cflags(ct, core=True)
            # build_clib compiles one file after another: compile them here,
            # a compiler process per job, and it finds the objects up to date.
            def compile_one(source, info=info):
                self.compiler.compile([source], output_dir=self.build_temp, macros=info.get("macros"),
                                      include_dirs=info.get("include_dirs"), extra_postargs=info["cflags"],
                                      debug=self.debug)
            with ThreadPoolExecutor(JOBS) as pool:
                list(pool.map(compile_one, info["sources"]))
        super().build_libraries(libraries)


class BuildExt(build_ext):
    def finalize_options(self):
        super().finalize_options()
        if not self.parallel:
            self.parallel = JOBS

    def build_extensions(self):
        ct = self.compiler.compiler_type
        for ext in self.extensions:
            ext.extra_compile_args = _cflags(ct, core=False)
            ext.extra_link_args = _ldflags(ct)
        super().build_extensions()

    def run(self):
        super().run()
        # Ship the static core next to the package for downstream linking.
        clib = self.get_finalized_command("build_clib")
        name = self.compiler.library_filename("fastbus") if self.compiler else "libfastbus.a"
        built = Path(clib.build_clib) / name
        root = HERE if self.inplace else Path(self.build_lib)
        dest = root / "fastbus" / "lib"
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, dest / name)


_copy_headers()

setup(
    libraries=[("fastbus", {"sources": [f"csrc/{s}" for s in CORE_SOURCES], "include_dirs": ["csrc"]})],
    ext_modules=cythonize(
        [Extension("fastbus._core", ["fastbus/_core.pyx"], include_dirs=["csrc"], libraries=["fastbus"]),
         # The broker's C data plane: calls the libzmq that pyzmq loaded, found at run time
         # (fastbus/broker/_libzmq.py), so it links nothing but the core.
         Extension("fastbus.broker._relay", ["fastbus/broker/_relay.pyx"], include_dirs=["csrc"],
                   libraries=["fastbus"]),
         # The client's native engine (threads that never take the GIL), the same way.
         Extension("fastbus.client._engine", ["fastbus/client/_engine.pyx"], include_dirs=["csrc"],
                   libraries=["fastbus"]),
         # What knows a Python-level shape, each its own module cimporting _core:
         # the publish path (the engine cimports it), redis-py's message dicts,
         # the queues' item layout.
         Extension("fastbus._publisher", ["fastbus/_publisher.pyx"], include_dirs=["csrc"],
                   libraries=["fastbus"]),
         Extension("fastbus._decoders", ["fastbus/_decoders.pyx"], include_dirs=["csrc"],
                   libraries=["fastbus"]),
         Extension("fastbus.queue._layout", ["fastbus/queue/_layout.pyx"])],
        compiler_directives={"language_level": "3", "embedsignature": True},
        nthreads=JOBS if JOBS > 1 else 0,
    ),
    cmdclass={"build_clib": BuildClib, "build_ext": BuildExt},
)
