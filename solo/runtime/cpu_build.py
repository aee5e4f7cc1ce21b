"""Build and load the CPU decode kernels (`cpu_kernels/*.cpp, *.h`) as a plain shared library.

The library is compiled once per machine with the system C++ compiler (`-O3 -march=native -fopenmp`,
so the AVX-512/AVX512-BF16 paths are used where the CPU has them) and cached under the user's cache
folder keyed by a hash of the source, the compiler and the flags. It has no Python or PyTorch headers,
so it builds in a couple of seconds, and is called through `ctypes` (which releases the GIL).

It links libgomp by its soname, so inside a PyTorch process it shares PyTorch's OpenMP runtime instead
of starting a second thread pool.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

from solo.errors import SoloError

_SOURCES = Path(__file__).with_name("cpu_kernels")
_MAIN = _SOURCES / "decode.cpp"
_FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-fno-math-errno"]
_lock = threading.Lock()
_library: ctypes.CDLL | None = None


class KernelBuildError(SoloError):
    """The CPU kernels could not be compiled or loaded (no C++ compiler, or it failed)."""


def cache_dir() -> Path:
    """Folder that holds compiled kernels (`$XDG_CACHE_HOME/solo/kernels`, default ~/.cache/solo/kernels)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "solo" / "kernels"


def _compiler() -> str:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return name
    raise KernelBuildError("no C++ compiler (c++, g++ or clang++) on PATH to build Solo's CPU kernels")


def _compiler_id(cxx: str) -> str:
    try:
        return subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KernelBuildError(f"cannot run the C++ compiler {cxx!r} ({exc})") from None


def _cpu_id() -> str:
    # -march=native code must not be reused on another CPU model sharing the same home folder.
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return ""


def library_path() -> Path:
    """Path of the compiled library, building it first if the cache lacks it.

    Raises:
        KernelBuildError: no compiler, or compilation failed (the message holds the compiler's output).
    """
    cxx = _compiler()
    digest = hashlib.sha256()
    for source in sorted(_SOURCES.iterdir()):
        if source.suffix in (".cpp", ".h"):
            digest.update(source.name.encode() + source.read_bytes())
    digest.update((" ".join(_FLAGS) + _compiler_id(cxx) + _cpu_id()).encode())
    key = digest.hexdigest()[:16]
    target = cache_dir() / f"solo_cpu_{key}.so"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Build into a temporary name and rename: concurrent builders never see a half-written library.
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        result = subprocess.run(
            [cxx, *_FLAGS, str(_MAIN), "-o", tmp], capture_output=True, text=True, timeout=600
        )
        if result.returncode != 0:
            raise KernelBuildError(f"building Solo's CPU kernels failed:\n{result.stderr[-4000:]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def load_library() -> ctypes.CDLL:
    """The loaded kernel library with argument types declared (built on first use).

    Raises:
        KernelBuildError: see `library_path`.
    """
    global _library
    with _lock:
        if _library is None:
            import torch  # noqa: F401  (loads PyTorch's libgomp first, so the kernels share its threads)

            path = library_path()
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as exc:  # e.g. a damaged cached build: callers fall back to eager on KernelBuildError
                raise KernelBuildError(f"cannot load {path} ({exc}); delete it to rebuild") from None
            p, i, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
            lib.solo_workspace_bytes.argtypes = [p, i, i]
            lib.solo_workspace_bytes.restype = sz
            lib.solo_decode.argtypes = [p, i, p, p, p, p, p, p, p, i]
            lib.solo_decode.restype = None
            lib.solo_gemv.argtypes = [p, p, i, p, p, i]
            lib.solo_gemv.restype = None
            lib.solo_stream_read.argtypes = [p, sz, i, i]
            lib.solo_stream_read.restype = ctypes.c_double
            lib.solo_prefill_norm.argtypes = [p, p, i, p, p, i]
            lib.solo_prefill_qkv.argtypes = [p, i, p, i, i, i, p, p, p, i]
            lib.solo_prefill_residual.argtypes = [p, p, p, i, p, p, p, i]
            lib.solo_prefill_act.argtypes = [p, p, i, p, i]
            for fn in (lib.solo_prefill_norm, lib.solo_prefill_qkv, lib.solo_prefill_residual, lib.solo_prefill_act):
                fn.restype = None
            lib.solo_dequantize.argtypes = [p, p, i, i]
            lib.solo_dequantize.restype = None
            lib.solo_has_avx512_bf16.argtypes = []
            lib.solo_has_avx512_bf16.restype = i
            _library = lib
        return _library
