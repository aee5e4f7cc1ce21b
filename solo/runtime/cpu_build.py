"""Build and load the CPU decode kernels (`cpu_kernels/*.cpp, *.h`) as a plain shared library, per ISA level.

One portable source is compiled once per ISA level with that level's flags, and the level is chosen at
run time from the CPU's features (`/proc/cpuinfo`):

    scalar       plain loops, any CPU (`-DSOLO_SCALAR`)
    avx2         x86-64-v3: AVX2 + FMA + F16C; the portable vector-extension kernels (simd.h)
    avx512       x86-64-v4: AVX-512 F/BW/CD/DQ/VL; hand-tuned AVX-512 kernels, bf16 weights widened to float32
    avx512-bf16  avx512 + AVX512-BF16 + AVX512-VNNI: bf16 dot-product instructions; bf16 weights packed in
                 the AMX tiles' layout (cpu_kernels/packed.h), decode on instructions that give the tiles'
                 bits, prompts (span prefill) as outer products over the packed rows. On a 2-core Zen 4:
                 prompts 1.23-1.40x the row-major kernels', decode 1.0-1.04x
    amx          avx512-bf16 + AMX-BF16 tiles (Sapphire Rapids and later Xeons): prompts multiplied on AMX
                 tiles (cpu_kernels/amx.h); needs the OS to grant the tile state (Linux >= 5.16, asked for
                 with arch_prctl). On a 2-core Xeon: prompts ~4-5x faster than avx512-bf16 with row-major
                 weights, decode 0.95-0.98x
    neon         ARM64 (ARMv8-A NEON); the portable vector-extension kernels
    neon-bf16    neon + the BF16 and dot-product extensions: bf16 weights through BFDOT, int8 / int4 weights
                 through SDOT (every CPU with BF16 has the dot product: Armv8.4 made it mandatory)

The best level the CPU has is used; `SOLO_CPU_ISA=<level>` forces another (every path a machine can run can
be tested on it; `avx512-bf16` on an AMX CPU keeps the last few percent of decode speed at the cost of
slower prompts), and a level the CPU lacks is refused with `IsaError`.

Each library is cached under the user's cache folder keyed by a hash of the source, the compiler and
the flags; an unwritable cache folder falls back to a per-user folder under the system temp folder, with
a warning. Processes that need the same library at once (tensor-parallel ranks, test runs) build it once:
the others wait on a lock file beside it. A library is loaded only if its bytes are those its build wrote
(a sha256 beside it); a damaged one is rebuilt, and a full cache folder falls back to the temp folder. The
library has no Python or PyTorch headers, so it builds in seconds, and is called through `ctypes` (which
releases the GIL). It links libgomp by its soname, so inside a PyTorch process it shares PyTorch's OpenMP
runtime instead of starting a second thread pool.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import logging
import os
import platform
import re
import shlex
import shutil
import stat
import subprocess
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from solo.env import EnvSettingError, env_choice, env_int, env_switch, parse_switch, solo_cache_home
from solo.errors import SoloError, SoloWarning

log = logging.getLogger(__name__)

_SOURCES = Path(__file__).with_name("cpu_kernels")
_MAIN = _SOURCES / "decode.cpp"
# -ffp-contract=fast: GCC's default (in every -std mode), which every measurement and bit-for-bit test here was
# made with; clang's default fuses only a multiply and add written in one expression, and a float32 Mixtral's
# logits then depended on the thread count (the server's batched steps differed from batch-1 ones).
_COMMON_FLAGS = ["-O3", "-fopenmp", "-shared", "-fPIC", "-std=c++17", "-fno-math-errno", "-ffp-contract=fast"]
_lock = threading.Lock()
_library: ctypes.CDLL | None = None


class KernelBuildError(SoloError):
    """The CPU kernels could not be compiled or loaded (no C++ compiler, or it failed)."""


class CpuSettingError(EnvSettingError):
    """A `SOLO_CPU_*` environment variable holds a value the CPU kernels cannot use."""


class IsaError(CpuSettingError):
    """`SOLO_CPU_ISA` names an unknown ISA level, or one this CPU lacks."""


@dataclass(frozen=True)
class IsaLevel:
    """One ISA level the kernels are compiled for.

    Attributes:
        name: the level's name (the values `SOLO_CPU_ISA` takes).
        arch: the machine architecture it runs on (`platform.machine()`), or None for any.
        flags: compiler flags that select it.
        requires: CPU feature flags (as /proc/cpuinfo spells them) it needs.
        description: what it uses, for reports.
        auto: whether it is picked without `SOLO_CPU_ISA` naming it (False: only on request).
    """

    name: str
    arch: str | None
    flags: tuple[str, ...]
    requires: frozenset[str]
    description: str
    auto: bool = True


_V3 = frozenset({"avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "abm", "movbe"})
# Explicit feature flags rather than -march=x86-64-v3/v4, which compilers before GCC 11 / Clang 12 lack.
_V3_FLAGS = ("-mavx", "-mavx2", "-mfma", "-mf16c", "-mbmi", "-mbmi2", "-mlzcnt", "-mmovbe")
_V4_FLAGS = (*_V3_FLAGS, "-mavx512f", "-mavx512bw", "-mavx512cd", "-mavx512dq", "-mavx512vl")
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
LEVELS: tuple[IsaLevel, ...] = (
    IsaLevel("scalar", None, ("-DSOLO_SCALAR=1",), frozenset(), "scalar loops"),
    IsaLevel("avx2", "x86_64", _V3_FLAGS, _V3, "x86-64-v3 (AVX2+FMA+F16C) vector kernels"),
    IsaLevel("avx512", "x86_64", _V4_FLAGS, _V4, "AVX-512 kernels (bf16 weights widened to fp32)"),
    IsaLevel("avx512-bf16", "x86_64", (*_V4_FLAGS, "-mavx512bf16", "-mavx512vnni"),
             _V4 | {"avx512_bf16", "avx512_vnni"}, "AVX-512 kernels with AVX512-BF16 dot products"),
    IsaLevel("amx", "x86_64", (*_V4_FLAGS, "-mavx512bf16", "-mavx512vnni", "-mamx-tile", "-mamx-bf16"),
             _V4 | {"avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16"},
             "AVX-512 kernels with AVX512-BF16, bf16 prompts on AMX tiles (weights packed for them)"),
    IsaLevel("neon", "aarch64", ("-march=armv8-a",), frozenset({"asimd"}), "ARMv8-A NEON vector kernels"),
    IsaLevel("neon-bf16", "aarch64", ("-march=armv8.2-a+bf16+dotprod",), frozenset({"asimd", "bf16", "asimddp"}),
             "ARMv8.2-A NEON kernels with BF16 dot products (BFDOT) and int8 dot products (SDOT)"),
)


def cpu_features() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (`flags` on x86, `Features` on ARM); empty if unreadable."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("flags", "Features"):
                return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


_amx_permission: bool | None = None


def amx_permitted() -> bool:
    """Whether Linux lets this process use AMX tile data (asks once: arch_prctl ARCH_REQ_XCOMP_PERM).

    Linux (>= 5.16) keeps the tile state off until a process requests it; the request is process-wide.
    False off Linux/x86-64, on older kernels, or when the request is refused.
    """
    global _amx_permission
    if _amx_permission is None:
        _amx_permission = False
        if platform.system() == "Linux" and platform.machine().lower() in ("x86_64", "amd64"):
            try:
                libc = ctypes.CDLL(None, use_errno=True)
                sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata = 158, 0x1023, 18
                _amx_permission = libc.syscall(sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0
            except (OSError, AttributeError):
                pass
    return _amx_permission


def available_levels() -> list[IsaLevel]:
    """The ISA levels this machine can run, lowest (scalar) first (AMX only where the OS grants it)."""
    machine, features = platform.machine().lower(), cpu_features()
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    return [lv for lv in LEVELS if (lv.arch is None or lv.arch == machine) and lv.requires <= features
            and ("amx_tile" not in lv.requires or amx_permitted())]


def _requested_isa() -> str:
    """The level `SOLO_CPU_ISA` names (lower case), or "" where it is unset or asks for the best one."""
    wanted = os.environ.get("SOLO_CPU_ISA", "").strip().lower()
    return "" if wanted in ("auto", "native", "best") else wanted


def selected_level() -> IsaLevel:
    """The level the kernels run at: `SOLO_CPU_ISA` if set (and available), else the best available.

    Raises:
        IsaError: `SOLO_CPU_ISA` names an unknown level or one this CPU lacks.
    """
    available = available_levels()
    wanted = _requested_isa()
    if not wanted:
        return [lv for lv in available if lv.auto][-1]
    names = [lv.name for lv in LEVELS]
    if wanted not in names:
        raise IsaError(f"SOLO_CPU_ISA={wanted} is not an ISA level; use one of {', '.join(names)} "
                       f"(this CPU runs {', '.join(lv.name for lv in available)})")
    for lv in available:
        if lv.name == wanted:
            return lv
    level = next(lv for lv in LEVELS if lv.name == wanted)
    missing = sorted(level.requires - cpu_features()) if level.arch in (None, platform.machine()) else []
    if missing:
        why = f"lacks {', '.join(missing)}"
    elif level.arch == platform.machine():
        why = "has AMX but the operating system refused the tile state (Linux >= 5.16 grants it)"
    else:
        why = f"is {platform.machine()}, not {level.arch}"
    raise IsaError(f"SOLO_CPU_ISA={wanted}: this CPU {why}; use one of "
                   f"{', '.join(lv.name for lv in available)}")


def cache_dir() -> Path:
    """Folder that holds compiled kernels (`$XDG_CACHE_HOME/solo/kernels`, default ~/.cache/solo/kernels)."""
    return solo_cache_home() / "kernels"


def private_temp_dir(name: str) -> Path:
    """A folder of this user's own in the temp folder, `<tmp>/<name>-<uid>`, for libraries this process loads.

    Created with mode 0700. One that exists is used only if it is a folder (not a link) this user owns and no
    one else may write: the temp folder is shared, and a library another local user placed there under the
    predictable name would run in this process.

    Raises:
        KernelBuildError: the folder cannot be created, or exists and fails those checks.
    """
    uid = os.getuid() if hasattr(os, "getuid") else None
    folder = Path(tempfile.gettempdir()) / (name if uid is None else f"{name}-{uid}")
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        info = os.lstat(folder)
    except OSError as exc:
        raise KernelBuildError(f"cannot create the folder {folder} ({exc}); set XDG_CACHE_HOME to a writable "
                               "folder of your own") from None
    if uid is not None and (not stat.S_ISDIR(info.st_mode) or info.st_uid != uid or info.st_mode & 0o022):
        raise KernelBuildError(f"{folder} is not a folder of this user's that only it may write (another user may "
                               "have made it), so nothing is built in or loaded from it; remove it, or set "
                               "XDG_CACHE_HOME to a writable folder of your own")
    return folder


def _fallback_cache_dir() -> Path:
    return private_temp_dir("solo-kernels")


def _compiler() -> list[str]:
    # $CXX as make reads it (a command with arguments: "ccache g++"), else the first compiler on PATH.
    explicit = os.environ.get("CXX", "").strip()
    if explicit:
        try:
            command = shlex.split(explicit)
        except ValueError as exc:
            raise KernelBuildError(f"CXX={explicit!r} is not a command ({exc}); point it at a C++ compiler (g++ or "
                                   "clang++) or unset it") from None
        if not shutil.which(command[0]):
            if len(command) > 1 and os.access(explicit, os.X_OK) and not os.path.isdir(explicit):
                # CXX is split like a command line (as make does), so a path with spaces needs quotes in it.
                raise KernelBuildError(f"CXX={explicit!r} names no program on PATH: CXX is read as a command with "
                                       f"arguments, so quote a path with spaces inside it: CXX='\"{explicit}\"'")
            raise KernelBuildError(f"CXX={explicit!r} names no program on PATH to build Solo's CPU kernels; point "
                                   "it at a C++ compiler (g++ or clang++) or unset it")
        return command
    for name in ("c++", "g++", "clang++"):
        if shutil.which(name):
            return [name]
    raise KernelBuildError("no C++ compiler (c++, g++ or clang++) on PATH to build Solo's CPU kernels")


def _lacks_openmp(output: str) -> bool:
    """Whether a failed build's compiler output says OpenMP is missing (its header or its library)."""
    header = any("omp.h" in line and ("file not found" in line or "No such file" in line)
                 for line in output.splitlines())
    unsupported = "unsupported option '-fopenmp'" in output  # Apple's clang
    return header or unsupported or "cannot find -lomp" in output or "cannot find -lgomp" in output


def _compiler_id(cxx: list[str]) -> str:
    try:
        return subprocess.run([*cxx, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise KernelBuildError(f"cannot run the C++ compiler {shlex.join(cxx)!r} ({exc})") from None


def _cpuinfo_field(name: str) -> str:
    """The first value of `name` in /proc/cpuinfo ("" on a system without it or if unreadable)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == name:
                return value.strip()
    except OSError:
        pass
    return ""


def cpu_vendor() -> str:
    """The CPU's vendor id from /proc/cpuinfo ("GenuineIntel", "AuthenticAMD"; "" on ARM or if unreadable)."""
    return _cpuinfo_field("vendor_id")


def _cpuinfo_int(name: str) -> int | None:
    value = _cpuinfo_field(name)
    return int(value) if value.isascii() and value.isdecimal() else None


def cpu_family() -> int | None:
    """The x86 CPU family from /proc/cpuinfo (AMD: 23 = Zen 1/2, 25 = Zen 3/4, 26 = Zen 5), or None."""
    return _cpuinfo_int("cpu family")


def cpu_model_number() -> int | None:
    """The x86 CPU model number within its family from /proc/cpuinfo, or None.

    Not the model's name: that is solo.bench.report.cpu_model.
    """
    return _cpuinfo_int("model")


def _is_zen3(family: int | None, model: int | None) -> bool:
    # Family 25 holds Zen 3 (models 0x00-0x0f Milan, 0x20-0x2f Vermeer, 0x40-0x5f Rembrandt / Cezanne) and
    # Zen 4 (0x10-0x1f Genoa, 0x60-0x7f Raphael / Phoenix, 0xa0-0xaf Bergamo).
    return family == 25 and model is not None and (model < 0x10 or 0x20 <= model < 0x60)


def prefetch_distance_bytes() -> int:
    """How far ahead the GEMV kernels prefetch weights in software (common.h: PREFETCH), 0 for not at all.

    4096 by default; 1024 on AMD Zen 3; 0 on other AMD CPUs before Zen 5 (family < 26). On a 2-core
    Sapphire Rapids the prefetches raised row-by-row GEMV from ~70% to ~90% of the streaming bandwidth; on a
    2-core AMD EPYC (Zen 4) turning them off raised the AVX512-BF16 GEMV of one Qwen2.5-0.5B decode token by
    10-25% (interleaved runs). On a 2-core Zen 5 they help again: whole decode steps, same process,
    same-round ratios (benchmarks/step_ab.py): the AVX2 kernels 1.24x (Qwen2.5-0.5B) and 1.38x
    (Llama-3.2-1B), int8 1.12x, AVX512-BF16 1.01-1.05x, OLMoE 1.02x. On a 2-core Zen 3 (EPYC, family 25
    model 1, AVX2) 4 KiB ahead cost 8-10% but 1 KiB ahead gained (same measure, against none): AVX2
    1.06-1.18x (Qwen2.5-0.5B), 1.04x (Llama-3.2-1B), int8 1.16x; 512 bytes 0.97x, 2 and 8 KiB 0.92-0.96x.
    Zen 2 (family 23) is untested and stays off. `SOLO_CPU_PREFETCH=0|1` (off, 4096; or another switch spelling)
    or a distance in bytes (a multiple of 64) overrides.

    Raises:
        CpuSettingError: SOLO_CPU_PREFETCH is set to something else (a SoloError: the command line prints it
            as one error line).
    """
    forced = os.environ.get("SOLO_CPU_PREFETCH", "").strip()
    if forced:
        if (switch := parse_switch(forced)) is not None:  # (0 / 1 as every switch: off, on, ...)
            return 4096 if switch else 0
        if not (forced.isascii() and forced.isdecimal()) or int(forced) % 64 or int(forced) > 1 << 20:
            raise CpuSettingError(f"SOLO_CPU_PREFETCH={forced!r}: use 0 / off, 1 / on (4096 bytes ahead) or a distance "
                                  "in bytes that is a multiple of 64, up to 1048576")
        return int(forced)
    if cpu_vendor() != "AuthenticAMD":
        return 4096
    family = cpu_family()
    if family is not None and family >= 26:
        return 4096
    return 1024 if _is_zen3(family, cpu_model_number()) else 0


def _is_amd_family_25() -> bool:
    """AMD family 25 (Zen 3 and Zen 4; of these only Zen 4 has AVX512-BF16, where the two knobs below act)."""
    return cpu_vendor() == "AuthenticAMD" and cpu_family() == 25


def bf16_stream_count() -> int:
    """Rows the AVX512-BF16 decode kernel reads side by side, each from its own run of rows (gemv.h).

    4 by default; 2 on AMD family 25 (Zen 4, the family's only CPUs with AVX512-BF16). Measured with
    benchmarks/step_ab.py, whole decode steps, same process, same-round ratios: on a 2-core Intel Xeon with
    AMX four streams against one 1.50x (Qwen2.5-0.5B) and 1.39x (Llama-3.2-1B); on a 2-core AMD EPYC Zen 4
    (family 25, model 17) two streams against four 1.02-1.08x (Qwen2.5-0.5B) and 1.03-1.06x (Llama-3.2-1B), one
    stream against four 1.03-1.10x and 1.00x (benchmarks/results/amd-epyc-zen4/bf16-streams-2026-12-07.md).
    Every count gives the same bits; the kernels' knob "bf16_streams" changes it between steps (measurement).
    """
    return 2 if _is_amd_family_25() else 4


def bf16_pass_k_block() -> int:
    """Elements of k per block of the AVX512-BF16 pass tile (tile.h), which runs a span prefill's long products.

    2048 by default (best on a 2-core AMD EPYC Zen 5, family 26); 8192 on AMD family 25 (Zen 4): one block for
    K up to 8192. Measured with benchmarks/prefill_ab.py (span prefill, same process, same-round ratios) on a
    2-core Zen 4 (family 25, model 17): against 2048 the down projection 1.15-1.16x and the whole prefill
    1.05x (Llama-3.2-1B, 128 tokens), 1.10-1.11x and 1.01-1.02x (Qwen2.5-0.5B, 128 and 512 tokens); 4096
    1.06-1.08x the down projection, 1024 0.92x (benchmarks/results/amd-epyc-zen4/pass-k-block-2026-12-07.md).
    Every block gives the same bits; the kernels' knob "bf16_pass_kb" changes it between calls (measurement).
    """
    return 8192 if _is_amd_family_25() else 2048


def compile_flags(level: IsaLevel) -> list[str]:
    """Every compiler flag of the library for `level` (after the compiler, before the source)."""
    distance = prefetch_distance_bytes()
    prefetch = [f"-DSOLO_PREFETCH={distance}"] if distance else ["-DSOLO_NO_SW_PREFETCH"]
    return [*_COMMON_FLAGS, *level.flags, *prefetch, f"-DSOLO_BF16_STREAMS={bf16_stream_count()}",
            f"-DSOLO_BF16_PASS_KB={bf16_pass_k_block()}", f'-DSOLO_ISA_NAME="{level.name}"']


def _own(path: Path, follow: bool = True) -> bool:
    # A path this process may load a library from: this user's (or root's, which a user trusts anyway), and
    # no one else may write it; group-writable is fine (per-user groups, umask 002). Without POSIX owners: true.
    if not hasattr(os, "getuid"):
        return True
    try:
        info = os.stat(path) if follow else os.lstat(path)
    except OSError:
        return False
    return info.st_uid in (os.getuid(), 0) and not info.st_mode & stat.S_IWOTH and not (
        not follow and stat.S_ISLNK(info.st_mode))


def _writable_dir(folder: Path) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder)
        os.close(fd)
        os.unlink(probe)
        return True
    except OSError:
        return False


def library_path(level: IsaLevel | None = None) -> Path:
    """Path of the compiled library for `level` (default: `selected_level()`), building it if not cached.

    Raises:
        KernelBuildError: no compiler, no writable folder, or compilation failed (the message holds the
            compiler's output).
        IsaError: see `selected_level`.
    """
    level = level or selected_level()
    cxx = _compiler()
    flags = compile_flags(level)
    # The sources are read once: the hash names exactly the bytes compiled (a source edited during a build
    # must not end up cached under the old name).
    sources = {f.name: f.read_bytes() for f in sorted(_SOURCES.iterdir()) if f.suffix in (".cpp", ".h")}
    sources[_MAIN.name] = _MAIN.read_bytes()
    digest = hashlib.sha256()
    for source_name, text in sources.items():
        digest.update(source_name.encode() + text)
    digest.update((" ".join(flags) + _compiler_id(cxx)).encode())
    digest.update(shlex.join(cxx[1:]).encode())  # CXX's own arguments ("g++ -O0"): nothing without them
    name = f"solo_cpu_{level.name}_{digest.hexdigest()[:16]}.so"
    folder = cache_dir()
    if not _noexec(folder) and _usable(folder, name):
        return _mark_used(folder / name)
    why = _unusable_reason(folder)
    if why is None:
        try:
            return _build(cxx, flags, sources, level, folder, name)
        except _NoSpace as exc:
            if folder == _fallback_cache_dir():
                raise KernelBuildError(f"building Solo's CPU kernels in {folder} failed: no space left on that file "
                                       "system; free some, or set XDG_CACHE_HOME to a folder with room") from None
            why = f"is full ({exc})"
    # Only now the temp folder: never a library there beside a usable cache.
    fallback = _fallback_cache_dir()
    if _noexec(fallback):
        raise KernelBuildError(f"neither the kernel cache folder {folder} nor {fallback} can hold Solo's CPU kernels: "
                               f"the first {why}, the second {_NOEXEC}; set XDG_CACHE_HOME to a writable folder "
                               "on a file system that allows programs")
    if _usable(fallback, name):
        return _mark_used(fallback / name)
    warnings.warn(f"the kernel cache folder {folder} {why}; building Solo's CPU kernels in {fallback} instead "
                  "(set XDG_CACHE_HOME to a writable folder of your own, with room, to keep them)", SoloWarning,
                  stacklevel=2)
    if not _writable_dir(fallback):
        raise KernelBuildError(f"neither {folder} nor {fallback} is writable to build Solo's CPU kernels; "
                               "set XDG_CACHE_HOME to a writable folder")
    try:
        return _build(cxx, flags, sources, level, fallback, name)
    except _NoSpace:
        raise KernelBuildError(f"building Solo's CPU kernels failed: no space left in {folder} nor in {fallback}; "
                               "free some, or set XDG_CACHE_HOME to a folder with room") from None


def _noexec(folder: Path) -> bool:
    # The folder (or, before it exists, its nearest existing parent) is on a file system mounted noexec: dlopen
    # cannot map a library there ("failed to map segment from shared object").
    for path in (folder, *folder.parents):
        try:
            return bool(os.statvfs(path).f_flag & getattr(os, "ST_NOEXEC", 0))
        except FileNotFoundError:
            continue
        except OSError:
            return False
    return False


_NOEXEC = "is on a file system mounted noexec (a library there cannot be loaded)"


def _unusable_reason(folder: Path) -> str | None:
    # Why the kernels cannot be built in the cache folder, or None.
    if _noexec(folder):
        return _NOEXEC
    if not _writable_dir(folder):
        return "is not writable"
    if not _own(folder):
        return "is not this user's, or anyone may write it (a library there could be another user's)"
    if (free := _free_bytes(folder)) < _BUILD_SPACE_BYTES:
        return f"has {free >> 10} KiB free, too little for a build"
    return None


# Free space a build needs in its folder: the sources, the compiler's temporary files (TMPDIR is pointed there:
# ~4 MB of assembly and object code) and the library (~1 MB).
_BUILD_SPACE_BYTES = 16 << 20


def _free_bytes(folder: Path) -> int:
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return _BUILD_SPACE_BYTES  # (unknown: the build finds out)


class _NoSpace(Exception):
    """The build's file system is full (ENOSPC, from Python or in the compiler's output)."""


def _checksum_path(library: Path) -> Path:
    return library.with_name(library.name + ".sha256")


def _intact(library: Path) -> bool:
    # The bytes its build wrote (the sha256 recorded beside it): a truncated or damaged library (a full disk, a
    # killed copy, a bad block) crashed the process inside dlopen (SIGBUS) or decoded wrong tokens.
    try:  # (a checksum that is a link, a pipe or a device is not one this build wrote)
        fd = os.open(_checksum_path(library), os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
        try:
            recorded = os.read(fd, 128) if stat.S_ISREG(os.fstat(fd).st_mode) else b""
        finally:
            os.close(fd)
        return hashlib.sha256(library.read_bytes()).hexdigest().encode() == recorded.strip()
    except OSError:
        return False


def _usable(folder: Path, name: str) -> bool:
    library = folder / name
    return library.is_file() and _own(folder) and _own(library, follow=False) and _intact(library)


# A build runs at most this long; a temporary library twice that old in the cache folder is a killed build's.
_BUILD_TIMEOUT_S = 600
# A process waiting for another's build says so after _LOCK_NOTICE_S, and builds beside it after _LOCK_WAIT_S
# (the holder is stopped or hung).
_LOCK_NOTICE_S = 2.0
_LOCK_WAIT_S = _BUILD_TIMEOUT_S + 60.0


def _build(cxx: list[str], flags: list[str], sources: dict[str, bytes], level: IsaLevel, folder: Path,
           name: str) -> Path:
    target = folder / name
    with _build_lock(folder / f"{name}.lock"):
        if _usable(folder, name):  # another process built it while this one waited
            return target
        if target.exists():
            warnings.warn(f"{target} is not the library its build wrote (damaged, or from an older Solo); "
                          "rebuilding it", SoloWarning, stacklevel=3)
        _remove_stale_builds(folder)
        # Build into a temporary name and rename: a reader never sees a half-written library. The checksum is
        # written first, so a library in place always has its own.
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
        os.close(fd)
        checksum = _checksum_path(target)
        checksum_tmp = checksum.with_name(checksum.name + f".{os.getpid()}")
        try:
            # The sources and the compiler's own temporary files (TMPDIR) go in the build's folder too: a full
            # or unusable temp folder then cannot fail a build that the cache folder has room for.
            with tempfile.TemporaryDirectory(prefix=_SOURCE_PREFIX, dir=folder) as src:
                for source_name, text in sources.items():
                    Path(src, source_name).write_bytes(text)
                try:
                    result = subprocess.run([*cxx, *flags, str(Path(src, _MAIN.name)), "-o", tmp],
                                            capture_output=True, text=True, timeout=_BUILD_TIMEOUT_S,
                                            env={**os.environ, "TMPDIR": src})
                except subprocess.TimeoutExpired:
                    raise KernelBuildError(f"building Solo's CPU kernels ({level.name}) with {shlex.join(cxx)} took "
                                           f"over {_BUILD_TIMEOUT_S} s; stopped") from None
            output = (result.stderr.strip() or result.stdout.strip())[-4000:]
            if result.returncode != 0:
                if "No space left on device" in output:
                    raise _NoSpace("No space left on device")
                if "File size limit exceeded" in output:  # the compiler died of SIGXFSZ: an "internal error"
                    raise KernelBuildError(f"building Solo's CPU kernels ({level.name}) failed: the file size limit "
                                           f"({_file_size_limit()}) stopped the compiler; raise it (ulimit -f "
                                           "unlimited)")
                if not output:
                    raise KernelBuildError(f"building Solo's CPU kernels ({level.name}) with {shlex.join(cxx)} failed "
                                           f"(exit status {result.returncode}, no output); point CXX at a working "
                                           "compiler (g++ or clang++)")
                if _lacks_openmp(output):
                    clang = re.search(r"clang version (\d+)", _compiler_id(cxx))
                    package = f"clang {clang[1]}: apt-get install libomp-{clang[1]}-dev" if clang else \
                        "clang: apt-get install libomp-dev"
                    raise KernelBuildError(f"building Solo's CPU kernels ({level.name}) with {shlex.join(cxx)} failed: "
                                           "the compiler has no OpenMP (-fopenmp found no omp.h or OpenMP library); "
                                           f"install it ({package}, or your system's libomp; GCC ships libgomp) or "
                                           f"point CXX at g++:\n{output}")
                raise KernelBuildError(f"building Solo's CPU kernels ({level.name}) with {shlex.join(cxx)} failed "
                                       f"(exit status {result.returncode}):\n{output}")
            built = Path(tmp).read_bytes()
            if not built:
                raise KernelBuildError(f"the C++ compiler {shlex.join(cxx)} exited 0 but wrote no library; point CXX "
                                       "at a working compiler (g++ or clang++)")
            checksum_tmp.write_text(hashlib.sha256(built).hexdigest() + "\n")
            os.replace(checksum_tmp, checksum)
            os.replace(tmp, target)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise _NoSpace(exc.strerror) from None
            if exc.errno == errno.EFBIG:
                raise KernelBuildError(f"cannot write Solo's CPU kernels to {target}: the file size limit "
                                       f"({_file_size_limit()}) is too low; raise it (ulimit -f unlimited)") from None
            raise KernelBuildError(f"cannot write Solo's CPU kernels to {target} ({exc.strerror}: {exc.filename}); "
                                   "remove what is in the way, or set XDG_CACHE_HOME to a writable folder") from None
        finally:
            for leftover in (tmp, checksum_tmp):
                with contextlib.suppress(OSError):
                    os.unlink(leftover)
    return target


def _file_size_limit() -> str:
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    except (ImportError, OSError, ValueError):
        return "ulimit -f"
    return "ulimit -f: unlimited" if soft == resource.RLIM_INFINITY else f"ulimit -f: {soft >> 10} KiB"


# The folder of a build's sources and compiler temporary files, inside the build's folder.
_SOURCE_PREFIX = ".solo-kernels-src-"


def _remove_stale_builds(folder: Path) -> None:
    # The temporary libraries and source folders of builds killed mid-way (SIGKILL runs no cleanup; young ones may
    # be running), and the libraries no Solo has loaded for _UNUSED_LIBRARY_S (each upgrade that changes the
    # kernels leaves one behind; a build is when they are looked for: after such an upgrade).
    now = time.time()
    for leftover in (*folder.glob("tmp*.so"), *folder.glob(_SOURCE_PREFIX + "*")):
        with contextlib.suppress(OSError):
            if now - leftover.lstat().st_mtime > 2 * _BUILD_TIMEOUT_S:
                if leftover.is_dir() and not leftover.is_symlink():
                    shutil.rmtree(leftover)
                else:
                    leftover.unlink()
    for library in folder.glob("solo_cpu_*.so"):
        with contextlib.suppress(OSError):
            if now - library.stat().st_mtime > _UNUSED_LIBRARY_S:
                library.unlink()
                _checksum_path(library).unlink(missing_ok=True)


# A cached library unused this long (seconds; `_mark_used` dates each load) is removed at the next build.
_UNUSED_LIBRARY_S = 30 * 86400


def _mark_used(library: Path) -> Path:
    # Its modification time says when a Solo last loaded it (`_remove_stale_builds`); a read-only cache keeps its own.
    with contextlib.suppress(OSError):
        os.utime(library)
    return library


@contextlib.contextmanager
def _build_lock(path: Path):  # noqa: ANN202
    # An exclusive lock on `path` (created if needed, never removed: removing it would let a third builder lock
    # a new file while the second still holds the old one) for one library's build. Without fcntl (not POSIX),
    # or where the lock file cannot be opened or locked (some network file systems), no lock: concurrent builds
    # are still safe (each lands by an atomic rename), only duplicated.
    handle = None
    try:
        import fcntl

        handle = open(path, "a")  # noqa: SIM115
        start, announced = time.monotonic(), False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)  # (released when the handle closes)
                break
            except BlockingIOError:
                waited_s = time.monotonic() - start
                if waited_s > _LOCK_WAIT_S:
                    warnings.warn(f"another process has held {path} longer than a build takes; building Solo's "
                                  "CPU kernels without waiting for it", SoloWarning, stacklevel=4)
                    raise OSError("lock not taken") from None
                if waited_s > _LOCK_NOTICE_S and not announced:
                    warnings.warn(f"waiting for another process that builds Solo's CPU kernels (lock {path})",
                                  SoloWarning, stacklevel=4)
                    announced = True
                time.sleep(0.2)
    except (ImportError, OSError):
        if handle is not None:
            handle.close()
        handle = None
    try:
        yield
    finally:
        if handle is not None:
            handle.close()


def declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Declare the argument and return types of the library's exported functions; returns `lib`."""
    p, i, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t
    lib.solo_workspace_bytes.argtypes = [p, i, i]
    lib.solo_workspace_bytes.restype = sz
    lib.solo_decode.argtypes = [p, i, p, p, p, p, p, p, p, i]
    lib.solo_decode.restype = i
    lib.solo_decode_span.argtypes = [p, i, p, p, p, p, p, p, p, i, i]
    lib.solo_decode_span.restype = i
    lib.solo_decode_span_layers.argtypes = [p, i, p, p, p, p, p, p, p, i, i, i, i]
    lib.solo_decode_span_layers.restype = i
    lib.solo_set_knob.argtypes = [ctypes.c_char_p, i]
    lib.solo_set_knob.restype = i
    lib.solo_profile.argtypes = [p, i]
    lib.solo_profile.restype = ctypes.c_int64
    lib.solo_gemv.argtypes = [p, p, i, p, p, i]
    lib.solo_gemv.restype = None
    lib.solo_placement_probe.argtypes = [i]
    lib.solo_placement_probe.restype = i
    lib.solo_stream_read.argtypes = [p, sz, i, i, i]
    lib.solo_stream_read.restype = ctypes.c_double
    lib.solo_prefill_norm.argtypes = [p, p, i, p, p, i]
    lib.solo_prefill_qkv.argtypes = [p, i, p, i, i, i, p, p, p, i]
    lib.solo_prefill_residual.argtypes = [p, p, p, i, p, p, p, i]
    lib.solo_prefill_act.argtypes = [p, p, i, p, i]
    for fn in (lib.solo_prefill_norm, lib.solo_prefill_qkv, lib.solo_prefill_residual, lib.solo_prefill_act):
        fn.restype = None
    lib.solo_dequantize.argtypes = [p, p, i, i]
    lib.solo_dequantize.restype = None
    lib.solo_pack_bf16_amx.argtypes = [p, i, i, p, i]
    lib.solo_pack_bf16_amx.restype = None
    lib.solo_isa.argtypes = []
    lib.solo_isa.restype = ctypes.c_char_p
    lib.solo_qdot.argtypes = []
    lib.solo_qdot.restype = ctypes.c_char_p
    lib.solo_quantize_q8.argtypes = [p, i, i, p, i]
    lib.solo_quantize_q8.restype = None
    lib.solo_fake_quantize_q8.argtypes = [p, i, i, i, i]
    lib.solo_fake_quantize_q8.restype = None
    lib.solo_input_bf16.argtypes = [i]
    lib.solo_input_bf16.restype = i
    lib.solo_struct_layout.argtypes = [ctypes.POINTER(ctypes.c_int64), i]
    lib.solo_struct_layout.restype = i
    return lib


# The switches the kernels read with getenv (decode.cpp, common.h), which see only "0" as off.
_KERNEL_SWITCHES = ("SOLO_CPU_SPLIT_KV", "SOLO_CPU_PLACE_WORKERS")


def check_kernel_env() -> None:
    """Check the environment variables the kernels read themselves, and spell their switches as they read them.

    SOLO_CPU_SPLIT_KV and SOLO_CPU_PLACE_WORKERS (switches: `solo.env.env_switch`) are rewritten as 0 or 1,
    SOLO_CPU_SPIN_US must be a whole number of microseconds up to 10 s, SOLO_MOE_SCHEDULE dynamic or static.

    Raises:
        EnvSettingError: a value the kernels cannot read (they would take it as the default or as 0).
    """
    def spell(name: str, value: str) -> None:
        if os.environ.get(name, "").strip() and os.environ[name] != value:  # (unset stays unset: the default)
            os.environ[name] = value

    for name in _KERNEL_SWITCHES:
        spell(name, "1" if env_switch(name, True) else "0")
    spell("SOLO_CPU_SPIN_US", str(env_int("SOLO_CPU_SPIN_US", 2000, 0, 10_000_000, "microseconds")))
    spell("SOLO_MOE_SCHEDULE", env_choice("SOLO_MOE_SCHEDULE", ("dynamic", "static"), "dynamic"))


# What a compiler says when it cannot emit an ISA level's instructions (older than its flags or intrinsics): GCC
# and clang rejecting a -m flag, GCC's intrinsics compiled without their target, clang's the same; or when it
# crashes on that level's code (clang 16 at the amx level: a segmentation fault in its optimizer).
_LEVEL_UNSUPPORTED = ("unrecognized command-line option", "unrecognized command line option", "unknown argument",
                      "unsupported option '-m", "target specific option mismatch", "requires target feature",
                      "internal compiler error", "unable to execute command", "PLEASE submit a bug report")


def _unsupported_level_line(message: str) -> str | None:
    """The line of a failed build's message saying the compiler cannot target the level, or None."""
    for line in message.splitlines():
        if any(text in line for text in _LEVEL_UNSUPPORTED):
            return line.strip()
    return None


def _library_path_for_this_cpu() -> Path:
    """`library_path()` for `selected_level()`, or for the best lower level where the compiler cannot build it.

    A compiler older than a level's instructions (GCC < 11 or clang < 12 for amx, older ones for avx512-bf16)
    would otherwise leave the CPU without native kernels at all (the eager runtime, many times slower). Where
    `SOLO_CPU_ISA` names the level, its failure is raised instead, with the fix.

    Raises:
        KernelBuildError: see `library_path`; also when no level the CPU runs can be built.
        IsaError: see `selected_level`.
    """
    level = selected_level()
    try:
        return library_path(level)
    except KernelBuildError as exc:
        reason = _unsupported_level_line(str(exc))
        if reason is None:
            raise
        compiler = shlex.join(_compiler())
        if _requested_isa():
            raise KernelBuildError(f"{exc}\n{compiler} cannot build the {level.name} kernels that SOLO_CPU_ISA names "
                                   f"({reason}); point CXX at a newer compiler (GCC >= 11 or clang >= 12) or choose "
                                   "a lower level") from None
        failure = exc
    lower = [lv for lv in available_levels() if lv.auto]
    for candidate in reversed(lower[:lower.index(level)] if level in lower else []):
        try:
            path = library_path(candidate)
        except KernelBuildError as exc:
            if _unsupported_level_line(str(exc)) is not None:
                continue
            raise
        warnings.warn(f"{compiler} cannot build Solo's {level.name} kernels for this CPU ({reason}); using the "
                      f"{candidate.name} kernels, slower here. A newer compiler (GCC >= 11 or clang >= 12) builds "
                      f"them: set CXX to one; or set SOLO_CPU_ISA={candidate.name} to keep this level without this "
                      "warning", SoloWarning, stacklevel=3)
        return path
    raise failure


def load_library() -> ctypes.CDLL:
    """The loaded kernel library for `selected_level()`, with argument types declared (built on first use).

    Where the compiler cannot build that level, the best lower one it can, with a warning (`library_isa`
    names the level loaded).

    Raises:
        KernelBuildError: see `library_path`, or the library cannot be loaded.
        IsaError: see `selected_level`.
        EnvSettingError: see `check_kernel_env`.
    """
    global _library
    with _lock:
        if _library is None:
            check_kernel_env()
            import torch  # noqa: F401  (loads PyTorch's libgomp first, so the kernels share its threads)

            path = _library_path_for_this_cpu()
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as exc:  # e.g. a damaged cached build: callers fall back to eager on KernelBuildError
                if "failed to map segment" in str(exc):  # (noexec found after the check, or a security module)
                    raise KernelBuildError(f"cannot load {path} ({exc}): its file system does not let programs "
                                           "be loaded from it (mounted noexec?); set XDG_CACHE_HOME to a folder on "
                                           "one that does") from None
                if "undefined symbol: __kmpc_" in str(exc) or "undefined symbol: omp_" in str(exc):
                    raise KernelBuildError(f"cannot load {path} ({exc}): the OpenMP runtime it links is older than the "
                                           "compiler that built it; install the compiler's own (clang N: libomp-N-dev) "
                                           "or point CXX at g++") from None
                raise KernelBuildError(f"cannot load {path} ({exc}); delete it to rebuild") from None
            try:
                _library = declare(lib)
            except AttributeError as exc:
                raise KernelBuildError(f"{path} lacks a kernel entry point ({exc}); delete it to rebuild") from None
        return _library


def library_isa(lib: ctypes.CDLL | None = None) -> str:
    """The ISA level the loaded library was compiled for (e.g. "avx2")."""
    return (lib or load_library()).solo_isa().decode()
