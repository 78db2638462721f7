"""The native parts: the lanes (``runtime/native/lanes_module.cc``, no library), the gRPC edge
(``runtime/grpc/native_edge.cc``), built against the system's libgrpc++ where pkg-config finds it (Debian and
Ubuntu: ``libgrpc++-dev``), the JSON number arrays (``runtime/http/json_numbers.cc``, no library) and Python's own
arenas from glibc's heap (``runtime/python_arenas.cc``, no library). Without any of them the package installs all
the same: every request then goes through the core, gRPC is served by grpcio (the server logs that it is), JSON
tensors are read and written by msgspec, more slowly, and Python maps its arenas itself. Everything else about the
package is in pyproject.toml."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


def grpcpp_flags() -> list[str] | None:
    """The compiler and linker flags for libgrpc++ (None: not installed)."""
    try:
        found = subprocess.run(["pkg-config", "--cflags", "--libs", "grpc++"], capture_output=True, text=True,
                               check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return found.stdout.split()


class OptionalBuildExt(build_ext):
    """A failed build of a native part leaves that part to Python instead of failing the install."""

    def build_extension(self, ext: Extension) -> None:
        try:
            import pybind11

            ext.include_dirs.append(pybind11.get_include())
            super().build_extension(ext)
        except Exception as error:  # noqa: BLE001 - any compiler or header failure: install without the edge
            print(f"warning: {ext.name} was not built ({error}); Python serves its part")


def sanitizer_flags() -> list[str]:
    """``NATIVE_EDGE_SANITIZE=1``: the edge built with AddressSanitizer and UndefinedBehaviorSanitizer, for the
    native suites (scripts/native_sanitized.sh runs them so, with libasan preloaded into Python)."""
    if os.environ.get("NATIVE_EDGE_SANITIZE") != "1":
        return []
    return ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer", "-g"]


def lanes_abi() -> str:
    """A digest of the lanes' headers, built into both modules that run them (the lanes' and the gRPC edge's): the
    edge refuses a lane table from a module built from other headers (runtime/native/lane_table.h)."""
    digest = hashlib.sha256()
    for header in sorted(Path("runtime/native").glob("*.h")):
        digest.update(header.name.encode() + b"\0" + header.read_bytes())
    return digest.hexdigest()[:16]


def extensions() -> list[Extension]:
    sanitize = sanitizer_flags()
    native_headers = sorted(str(header) for header in Path("runtime/native").glob("*.h"))
    abi = [("NATIVE_LANES_ABI", f'"{lanes_abi()}"')]
    lanes = Extension(
        "runtime.native._native_lanes", ["runtime/native/lanes_module.cc"], depends=native_headers,
        define_macros=abi, language="c++",
        extra_compile_args=["-std=c++17", "-O1" if sanitize else "-O2", "-fvisibility=hidden", *sanitize],
        extra_link_args=sanitize)
    json_numbers = Extension(
        "runtime.http._json_numbers", ["runtime/http/json_numbers.cc"], depends=["runtime/http/json_numbers.h"],
        language="c++",
        extra_compile_args=["-std=c++17", "-O1" if sanitize else "-O2", "-fvisibility=hidden", *sanitize],
        extra_link_args=sanitize)
    arenas = Extension(
        "runtime._python_arenas", ["runtime/python_arenas.cc"], language="c++",
        extra_compile_args=["-std=c++17", "-O1" if sanitize else "-O2", "-fvisibility=hidden", *sanitize],
        extra_link_args=sanitize)
    flags = grpcpp_flags()
    if flags is None:
        print("warning: libgrpc++ not found (pkg-config grpc++): the native gRPC edge is not built")
        return [lanes, json_numbers, arenas]
    return [lanes, json_numbers, arenas, Extension(
        "runtime.grpc._native_edge", ["runtime/grpc/native_edge.cc"],
        depends=[*sorted(str(header) for header in Path("runtime/grpc").glob("*.h")), *native_headers],
        include_dirs=["."], define_macros=abi,
        libraries=["z"],  # native_inflate.h
        language="c++",
        extra_compile_args=["-std=c++17", "-O1" if sanitize else "-O2", "-fvisibility=hidden", *sanitize,
                            *[flag for flag in flags if flag.startswith(("-I", "-D"))]],
        extra_link_args=[*sanitize, *[flag for flag in flags if not flag.startswith(("-I", "-D"))]],
    )]


setup(ext_modules=extensions(), cmdclass={"build_ext": OptionalBuildExt})
