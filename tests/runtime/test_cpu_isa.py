"""The CPU kernels' ISA levels: selection, SOLO_CPU_ISA, load-time checks, and the parity tests under every level."""

from __future__ import annotations

import ctypes
import os
import shlex
import shutil
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from solo.runtime import cpu_build
from solo.runtime.cpu_build import IsaError, KernelBuildError, available_levels, selected_level

ROOT = Path(__file__).resolve().parents[2]


def test_the_best_available_level_is_selected_and_a_lower_one_can_be_forced(monkeypatch):
    monkeypatch.delenv("SOLO_CPU_ISA", raising=False)
    levels = available_levels()
    assert levels[0].name == "scalar"
    assert selected_level() == [lv for lv in levels if lv.auto][-1]
    monkeypatch.setenv("SOLO_CPU_ISA", "scalar")
    assert selected_level().name == "scalar"


def test_the_amx_level_is_chosen_where_the_os_grants_it(monkeypatch):
    amx = next(lv for lv in cpu_build.LEVELS if lv.name == "amx")
    monkeypatch.delenv("SOLO_CPU_ISA", raising=False)
    if amx in available_levels():
        assert selected_level() == amx
        monkeypatch.setenv("SOLO_CPU_ISA", "avx512-bf16")  # the row-major kernels stay one setting away
        assert selected_level().name == "avx512-bf16"
    else:
        assert selected_level().name != "amx"


def test_a_level_the_cpu_lacks_or_an_unknown_one_is_refused(monkeypatch):
    names = {lv.name for lv in available_levels()}
    missing = next(lv.name for lv in cpu_build.LEVELS if lv.name not in names)  # neon on x86, avx2 on ARM
    monkeypatch.setenv("SOLO_CPU_ISA", missing)
    with pytest.raises(IsaError, match=f"SOLO_CPU_ISA={missing}: this CPU .*use one of .*scalar"):
        selected_level()
    monkeypatch.setenv("SOLO_CPU_ISA", "sse9")
    with pytest.raises(IsaError, match="not an ISA level; use one of scalar"):
        selected_level()


def test_the_loaded_library_reports_its_level_and_matching_struct_layout():
    from solo.runtime.cpu import _Mat, check_struct_layout, checked_library

    lib = checked_library()
    assert cpu_build.library_isa(lib) == selected_level().name

    class Shifted(ctypes.Structure):  # what a field added on the Python side only would look like
        _fields_ = [("extra", ctypes.c_int32), *_Mat._fields_]

    from solo.runtime import cpu

    original = cpu._Mat
    cpu._layout_checked.clear()
    try:
        cpu._Mat = Shifted
        with pytest.raises(KernelBuildError, match="struct layout differs from solo/runtime/cpu.py at Shifted.sizeof"):
            check_struct_layout(lib)
    finally:
        cpu._Mat = original
        cpu._layout_checked.clear()
    check_struct_layout(lib)


@pytest.fixture
def tiny_kernel_source(monkeypatch, tmp_path):
    """library_path builds a one-function library from tmp_path/tiny.cpp without optimization (fast)."""
    monkeypatch.setattr(cpu_build, "compile_flags", lambda level: ["-O0", "-shared", "-fPIC", "-x", "c++"])
    monkeypatch.setattr(cpu_build, "_MAIN", tmp_path / "tiny.cpp")
    (tmp_path / "tiny.cpp").write_text('extern "C" int solo_tiny(void) { return 1; }\n')


def test_an_unwritable_kernel_cache_falls_back_with_a_warning(monkeypatch, tmp_path, tiny_kernel_source):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder's parent should be")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker / "cache"))
    monkeypatch.setattr(cpu_build, "_fallback_cache_dir", lambda: tmp_path / "fallback")
    with pytest.warns(UserWarning, match="is not writable; building Solo's CPU kernels in"):
        path = cpu_build.library_path(available_levels()[0])
    assert path.parent == tmp_path / "fallback" and path.is_file()
    assert cpu_build.library_path(available_levels()[0]) == path  # found there next time, no rebuild


def test_a_library_in_the_temp_folder_is_not_loaded_beside_a_usable_cache(monkeypatch, tmp_path,
                                                                         tiny_kernel_source):
    # The temp folder is shared: a library found there (another local user's, under the predictable name) was
    # loaded even when the user's own cache could be written.
    monkeypatch.setattr(cpu_build, "_fallback_cache_dir", lambda: tmp_path / "fallback")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "blocker" / "cache"))
    (tmp_path / "blocker").write_text("a file")
    with pytest.warns(UserWarning, match="is not writable"):
        planted = cpu_build.library_path(available_levels()[0])
    assert planted.parent == tmp_path / "fallback"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = cpu_build.library_path(available_levels()[0])
    assert path.parent == tmp_path / "cache" / "solo" / "kernels" and path.name == planted.name


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX owners and modes")
def test_a_cache_folder_anyone_may_write_is_not_loaded_from(monkeypatch, tmp_path, tiny_kernel_source):
    # XDG_CACHE_HOME in a shared folder: a library another user placed under the predictable name was loaded.
    monkeypatch.setattr(cpu_build, "_fallback_cache_dir", lambda: tmp_path / "fallback")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "shared"))
    own = cpu_build.library_path(available_levels()[0])  # (built in the cache while it is this user's alone)
    own.parent.chmod(0o777)
    with pytest.warns(UserWarning, match="is not this user's, or anyone may write it"):
        path = cpu_build.library_path(available_levels()[0])
    assert path.parent == tmp_path / "fallback" and path.name == own.name


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX owners and modes")
def test_the_temp_folder_for_libraries_is_this_users_own(monkeypatch, tmp_path):
    monkeypatch.setattr(cpu_build.tempfile, "gettempdir", lambda: str(tmp_path))
    folder = cpu_build.private_temp_dir("solo-x")
    assert folder == tmp_path / f"solo-x-{os.getuid()}" and stat.S_IMODE(folder.stat().st_mode) & 0o077 == 0
    assert cpu_build.private_temp_dir("solo-x") == folder  # (its own: used again)
    folder.chmod(0o777)  # as one another user made for everyone
    with pytest.raises(KernelBuildError, match="not a folder of this user's that only it may write"):
        cpu_build.private_temp_dir("solo-x")
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / f"solo-y-{os.getuid()}").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(KernelBuildError, match="remove it"):
        cpu_build.private_temp_dir("solo-y")


def test_processes_that_need_one_library_at_once_build_it_once(monkeypatch, tmp_path, tiny_kernel_source):
    import threading
    import time

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    builds, run = [], subprocess.run

    def slow_build(cmd, **kwargs):
        if "-o" in cmd and str(tmp_path) in cmd[cmd.index("-o") + 1]:  # this test's builds (not --version)
            builds.append(cmd)
            time.sleep(0.5)  # the other builder arrives meanwhile
        return run(cmd, **kwargs)

    monkeypatch.setattr(cpu_build.subprocess, "run", slow_build)
    paths = []
    threads = [threading.Thread(target=lambda: paths.append(cpu_build.library_path(available_levels()[0])))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(paths) == 2 and paths[0] == paths[1] and paths[0].is_file()
    assert len(builds) == 1  # the second waited on the lock file, then found the library


def test_a_damaged_library_in_the_cache_is_rebuilt_not_loaded(monkeypatch, tmp_path, tiny_kernel_source):
    # From a break test: a truncated cached library crashed the process inside dlopen (SIGBUS), and a few changed
    # bytes decoded wrong tokens with exit status 0.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("CXX", raising=False)
    level = available_levels()[0]
    path = cpu_build.library_path(level)
    good = path.read_bytes()
    for damage in (good[: len(good) // 2], good[:-8] + b"\x7f" * 8, b""):
        path.write_bytes(damage)
        with pytest.warns(UserWarning, match="is not the library its build wrote .*; rebuilding it"):
            assert cpu_build.library_path(level) == path
        assert path.read_bytes() == good  # (the build is deterministic here)
    checksum = cpu_build._checksum_path(path)
    for bad in ("not text", "fifo", "link to /dev/zero"):  # a traceback, a hang, unbounded memory
        checksum.unlink()
        if bad == "not text":
            checksum.write_bytes(b"\xff\xfe\x00garbage")
        elif bad == "fifo":
            os.mkfifo(checksum)
        else:
            checksum.symlink_to("/dev/zero")
        with pytest.warns(UserWarning, match="rebuilding it"):
            assert cpu_build.library_path(level) == path
    checksum.unlink()  # a library from before checksums: rebuilt once, then trusted
    with pytest.warns(UserWarning, match="rebuilding it"):
        cpu_build.library_path(level)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cpu_build.library_path(level) == path


def test_what_the_compiler_named_by_cxx_does_is_said(monkeypatch, tmp_path, tiny_kernel_source):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    level = available_levels()[0]
    monkeypatch.setenv("CXX", "/nonexistent/g++")  # was skipped silently for the c++ on PATH
    with pytest.raises(KernelBuildError, match=r"CXX='/nonexistent/g\+\+' names no program on PATH"):
        cpu_build.library_path(level)
    monkeypatch.setenv("CXX", "true")  # exits 0, writes nothing: an empty library was cached
    with pytest.raises(KernelBuildError, match="the C\\+\\+ compiler true exited 0 but wrote no library"):
        cpu_build.library_path(level)
    monkeypatch.setenv("CXX", "false")  # failed with an empty message
    with pytest.raises(KernelBuildError, match=r"with false failed \(exit status 1, no output\); point CXX at"):
        cpu_build.library_path(level)
    monkeypatch.setenv("CXX", 'g++ "')
    with pytest.raises(KernelBuildError, match="is not a command \\(No closing quotation\\)"):
        cpu_build.library_path(level)
    assert not [p for p in (tmp_path / "cache" / "solo" / "kernels").iterdir() if p.suffix == ".so"]
    monkeypatch.setenv("CXX", "env c++")  # a command with arguments, as make takes it ("ccache g++")
    first = cpu_build.library_path(level)
    assert first.is_file()
    monkeypatch.setenv("CXX", "env c++ -DSOLO_TINY=1")  # other arguments: another library, not the one above
    assert cpu_build.library_path(level).name != first.name
    spaced = tmp_path / "my tools" / "g++"  # a path with a space, unquoted: split like make splits CXX
    spaced.parent.mkdir()
    spaced.symlink_to(shutil.which("c++"))
    monkeypatch.setenv("CXX", str(spaced))
    with pytest.raises(KernelBuildError, match=r"names no program on PATH: CXX is read as a command with arguments, "
                                               r"so quote a path with spaces inside it"):
        cpu_build.library_path(level)
    monkeypatch.setenv("CXX", f'"{spaced}"')  # quoted: built
    assert cpu_build.library_path(level).is_file()


def test_a_full_cache_folder_builds_in_the_temp_folder(monkeypatch, tmp_path, tiny_kernel_source):
    # From a break test: a full file system failed the build (to eager decoding, ~6x slower) on every run.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(cpu_build, "_fallback_cache_dir", lambda: tmp_path / "fallback")
    run = subprocess.run

    def full_cache(cmd, **kwargs):
        if "-o" in cmd and str(tmp_path / "cache") in cmd[cmd.index("-o") + 1]:
            return subprocess.CompletedProcess(cmd, 1, "", "/usr/bin/ld: final link failed: No space left on device")
        return run(cmd, **kwargs)

    monkeypatch.setattr(cpu_build.subprocess, "run", full_cache)
    with pytest.warns(UserWarning, match=r"kernels is full \(No space left on device\); building .* in .*fallback"):
        path = cpu_build.library_path(available_levels()[0])
    assert path.parent == tmp_path / "fallback" and path.is_file()
    # The next run: the cache's free space says it is full, so the fallback's library is used, no build tried.
    usage, real_usage = type(shutil.disk_usage("/")), shutil.disk_usage
    monkeypatch.setattr(cpu_build.shutil, "disk_usage",
                        lambda p: usage(10**9, 10**9 - 1000, 1000) if str(tmp_path / "cache") in str(p) else
                        real_usage(p))
    monkeypatch.setattr(cpu_build.subprocess, "run", lambda cmd, **kw: pytest.fail(f"built: {cmd}") if "-o" in cmd
                        else run(cmd, **kw))
    assert cpu_build.library_path(available_levels()[0]) == path
    monkeypatch.setattr(cpu_build.shutil, "disk_usage", real_usage)
    monkeypatch.setattr(cpu_build.subprocess, "run", full_cache)
    monkeypatch.setattr(cpu_build, "_fallback_cache_dir", lambda: tmp_path / "cache" / "solo" / "kernels")
    with pytest.raises(KernelBuildError, match="no space left on that file system; free some, or set XDG_CACHE_HOME"):
        cpu_build.library_path(available_levels()[0])


def test_a_noexec_cache_folder_builds_in_the_temp_folder(monkeypatch, tmp_path, tiny_kernel_source):
    # From a break test: a cache on a noexec mount built there, failed to load ("failed to map segment"), and fell
    # back to eager decoding on every run, saying "delete it to rebuild".
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(cpu_build, "_fallback_cache_dir", lambda: tmp_path / "fallback")
    level = available_levels()[0]
    built = cpu_build.library_path(level)  # (cached while the mount allowed programs)
    noexec = {tmp_path / "cache"}
    monkeypatch.setattr(cpu_build, "_noexec", lambda folder: any(p in noexec for p in (folder, *folder.parents)))
    with pytest.warns(UserWarning, match="kernels is on a file system mounted noexec .*; building .* in .*fallback"):
        path = cpu_build.library_path(level)
    assert path.parent == tmp_path / "fallback" and path.name == built.name and path.is_file()
    noexec.add(tmp_path / "fallback")
    with pytest.raises(KernelBuildError, match="the second is on a file system mounted noexec .*set XDG_CACHE_HOME "
                                               "to a writable folder on a file system that allows programs"):
        cpu_build.library_path(level)


@pytest.mark.parametrize("error,said", [
    ("failed to map segment from shared object",
     r"does not let programs be loaded from it \(mounted noexec\?\); set XDG_CACHE_HOME"),
    # clang 22 linked against Debian's libomp 14 (the newer one cannot be installed beside it): the load failed
    # with "delete it to rebuild", which a rebuild does not fix.
    ("undefined symbol: __kmpc_dispatch_deinit",
     r"__kmpc_dispatch_deinit\): the OpenMP runtime it links is older than the compiler that built it; install the "
     r"compiler's own"),
])
def test_a_library_that_cannot_be_loaded_says_why(monkeypatch, tmp_path, error, said):
    def refuse(path, *args, **kwargs):
        raise OSError(f"{path}: {error}")

    monkeypatch.setattr(cpu_build, "_library", None)
    monkeypatch.setattr(cpu_build, "library_path", lambda level=None: tmp_path / "solo_cpu_x.so")
    monkeypatch.setattr(cpu_build.ctypes, "CDLL", refuse)
    with pytest.raises(KernelBuildError, match=said):
        cpu_build.load_library()


def test_the_compiler_keeps_its_temporary_files_in_the_build_folder(monkeypatch, tmp_path, tiny_kernel_source):
    # From a break test: a full TMPDIR failed the compiler (its assembly file), and the build blamed the cache folder.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("TMPDIR", str(tmp_path / "full-tmp"))
    seen = tmp_path / "seen"
    wrapper = tmp_path / "cxx.sh"
    wrapper.write_text(f'echo "$TMPDIR" >> {seen}\nexec c++ "$@"\n')
    monkeypatch.setenv("CXX", f"sh {wrapper}")
    path = cpu_build.library_path(available_levels()[0])
    folder = tmp_path / "cache" / "solo" / "kernels"
    temp = Path(seen.read_text().splitlines()[-1])
    assert path.parent == folder and temp.parent == folder and temp.name.startswith(".solo-kernels-src-")
    assert not temp.exists()  # removed after the build
    old = folder / ".solo-kernels-src-killed"  # a killed build's: removed by a later build once old
    old.mkdir()
    (old / "decode.s").write_text("...")
    os.utime(old, (1, 1))
    path.unlink()
    cpu_build.library_path(available_levels()[0])
    assert not old.exists()


def test_a_file_size_limit_that_stops_the_compiler_is_named(monkeypatch, tmp_path, tiny_kernel_source):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("CXX", raising=False)
    run = subprocess.run

    def limited(cmd, **kwargs):
        if "-o" in cmd:
            return subprocess.CompletedProcess(cmd, 4, "", "c++: internal compiler error: File size limit exceeded "
                                               "signal terminated program cc1plus\nPlease submit a bug report")
        return run(cmd, **kwargs)

    monkeypatch.setattr(cpu_build.subprocess, "run", limited)
    with pytest.raises(KernelBuildError, match=r"the file size limit \(ulimit -f.*\) stopped the compiler; raise it"):
        cpu_build.library_path(available_levels()[0])


@pytest.mark.parametrize("message", [
    "decode.cpp:6:10: fatal error: 'omp.h' file not found\n#include <omp.h>\n1 error generated.",  # clang
    "common.h:6:10: fatal error: omp.h: No such file or directory\ncompilation terminated.",  # GCC
    "/usr/bin/ld: cannot find -lomp: No such file or directory\nclang: error: linker command failed",
    "clang: error: unsupported option '-fopenmp'",
])
def test_a_compiler_without_openmp_is_named_with_the_fix(monkeypatch, tmp_path, tiny_kernel_source, message):
    # clang without libomp-dev: the build failed with 11 compiler errors and no word on what to install.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("CXX", raising=False)
    run = subprocess.run

    def without_openmp(cmd, **kwargs):
        if "-o" in cmd:
            return subprocess.CompletedProcess(cmd, 1, "", message)
        return run(cmd, **kwargs)

    monkeypatch.setattr(cpu_build.subprocess, "run", without_openmp)
    with pytest.raises(KernelBuildError, match=r"the compiler has no OpenMP .* apt-get install libomp-dev.* point "
                                               r"CXX at g\+\+") as caught:
        cpu_build.library_path(available_levels()[0])
    assert message in str(caught.value)  # the compiler's own words stay in the message
    # A versioned clang needs its own version's package (libomp-dev is the default clang's).
    monkeypatch.setattr(cpu_build, "_compiler_id", lambda cxx: "Debian clang version 16.0.6 (15)\nTarget: x86_64")
    with pytest.raises(KernelBuildError, match=r"\(clang 16: apt-get install libomp-16-dev, or your system's libomp"):
        cpu_build.library_path(available_levels()[0])


def _failing_at_avx512_bf16(path, message):
    """A compiler that fails with `message` on the avx512-bf16 level's flags and is c++ for every other level."""
    lines = "".join(f"  echo {shlex.quote(line)} >&2\n" for line in message.splitlines())
    path.write_text(f'#!/bin/sh\ncase "$*" in *-DLEVEL_avx512_bf16*)\n{lines}  exit 1;;\nesac\nexec c++ "$@"\n')
    path.chmod(0o755)
    return str(path)


def test_a_compiler_too_old_for_the_cpus_level_builds_the_best_lower_one(monkeypatch, tmp_path,
                                                                         tiny_kernel_source):
    # A compiler that rejects the best level's flags (as GCC 9 did -mavx512bf16, GCC 10 -mamx-tile) left the CPU
    # with no native kernels at all: the eager runtime, many times slower.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("SOLO_CPU_ISA", raising=False)
    levels = {lv.name: lv for lv in cpu_build.LEVELS}
    monkeypatch.setattr(cpu_build, "available_levels",
                        lambda: [levels[n] for n in ("scalar", "avx2", "avx512", "avx512-bf16")])
    monkeypatch.setattr(cpu_build, "compile_flags", lambda level: ["-O0", "-shared", "-fPIC", "-x", "c++",
                                                                    "-DLEVEL_" + level.name.replace("-", "_")])
    monkeypatch.setenv("CXX", _failing_at_avx512_bf16(tmp_path / "old-g++", "g++: error: unrecognized command-line "
                                                      "option '-mavx512bf16'; did you mean '-mavx512bw'?"))
    with pytest.warns(UserWarning, match=r"old-g\+\+ cannot build Solo's avx512-bf16 kernels for this CPU \(g\+\+: "
                                         r"error: unrecognized command-line option '-mavx512bf16'.*\); using the "
                                         r"avx512 kernels, slower here.*SOLO_CPU_ISA=avx512"):
        path = cpu_build._library_path_for_this_cpu()
    assert path.name.startswith("solo_cpu_avx512_") and path.is_file()
    # Where SOLO_CPU_ISA names the level, the user asked for it: its failure, with the fix.
    monkeypatch.setenv("SOLO_CPU_ISA", "avx512-bf16")
    with pytest.raises(KernelBuildError, match=r"cannot build the avx512-bf16 kernels that SOLO_CPU_ISA names .*point "
                                               r"CXX at a newer compiler"):
        cpu_build._library_path_for_this_cpu()
    monkeypatch.delenv("SOLO_CPU_ISA")
    # A compiler that crashes on the level's code (clang 16 at the amx level) likewise.
    crash = "clang: error: unable to execute command: Segmentation fault\nPLEASE submit a bug report"
    monkeypatch.setenv("CXX", _failing_at_avx512_bf16(tmp_path / "crashing-clang++", crash))
    with pytest.warns(UserWarning, match=r"crashing-clang\+\+ cannot build Solo's avx512-bf16 kernels for this CPU "
                                         r"\(clang: error: unable to execute command: Segmentation fault\); using the "
                                         r"avx512 kernels"):
        assert cpu_build._library_path_for_this_cpu().name.startswith("solo_cpu_avx512_")
    # Any other failure is not the compiler's age: raised as it is, no lower level tried.
    broken = tmp_path / "broken-g++"
    broken.write_text('#!/bin/sh\necho "decode.cpp:1:1: error: expected unqualified-id" >&2\nexit 1\n')
    broken.chmod(0o755)
    monkeypatch.setenv("CXX", str(broken))
    with pytest.raises(KernelBuildError, match="expected unqualified-id") as caught:
        cpu_build._library_path_for_this_cpu()
    assert "avx512-bf16" in str(caught.value)


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX file locks")
def test_a_build_lock_held_too_long_is_said_then_built_beside(monkeypatch, tmp_path, tiny_kernel_source):
    # From a break test: a builder stopped with SIGSTOP left the next process waiting silently for ever.
    import fcntl

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr(cpu_build, "_LOCK_NOTICE_S", 0.1)
    monkeypatch.setattr(cpu_build, "_LOCK_WAIT_S", 0.5)
    level = available_levels()[0]
    folder = cpu_build.cache_dir()
    name = cpu_build.library_path(level).name
    (folder / name).unlink()
    stale, young = folder / "tmpkilled.so", folder / "tmprunning.so"  # a killed build's, one still running
    for leftover in (stale, young):
        leftover.write_bytes(b"")
    os.utime(stale, (0, 0))
    with open(folder / f"{name}.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.warns(UserWarning) as said:
            assert cpu_build.library_path(level) == folder / name
    messages = [str(w.message) for w in said]
    assert any("waiting for another process that builds Solo's CPU kernels (lock " in m for m in messages)
    assert any("longer than a build takes; building Solo's CPU kernels without waiting" in m for m in messages)
    assert not stale.exists() and young.exists()


# The parity tests this file reruns under each other level (a subset, to stay fast): every GEMV format
# against torch, bitwise batch invariance at real widths, the quantized runtime against eager, and
# end-to-end logits / greedy tokens against eager and transformers; mixture-of-experts and lane models too,
# in the same process per level (each process pays seconds of imports before its first test).
_Q, _R = "tests/runtime/test_quant_cpu.py::", "tests/runtime/test_cpu_runtime.py::"
_M, _L = "tests/runtime/test_cpu_moe.py::", "tests/runtime/test_cpu_lanes.py::"
_PARITY = [
    f"{_Q}test_gemv_kernels_match_torch",
    f"{_Q}test_gemv_is_bit_identical_across_batch_sizes",
    f"{_Q}test_quantized_runtime_matches_eager_on_the_same_quantized_model[int4-float]",
    f"{_Q}test_quantized_runtime_matches_eager_on_the_same_quantized_model[int4-int-dot]",
    f"{_Q}test_quantized_runtime_matches_eager_on_the_same_quantized_model[int8-int-dot]",
    f"{_Q}test_integer_dot_decode_is_bit_identical_across_batches_and_threads",
    f"{_R}test_float32_greedy_matches_transformers_and_eager[qwen3]",
    f"{_R}test_bfloat16_logits_match_eager[llama]",
    f"{_R}test_bfloat16_logits_match_eager[gemma3]",  # per-layer RoPE tables, (1 + w) q/k norms
    f"{_R}test_bfloat16_logits_match_eager[smollm3]",  # NoPE layers
    f"{_R}test_grouped_attention_matches_eager[torch.bfloat16-qwen2-64-4-1]",
    f"{_R}test_batched_decode_is_bit_identical_at_real_widths",
    "tests/runtime/test_decode_spans.py::test_a_rows_span_is_bit_identical_alone_and_in_any_mixed_batch[gqa64-torch.bfloat16]",
    "tests/runtime/test_decode_spans.py::test_a_rows_span_is_bit_identical_alone_and_in_any_mixed_batch[gemma2-torch.bfloat16]",
    "tests/runtime/test_verify_kv.py::test_cpu_verify_equals_decode_steps_bit_for_bit_in_every_format",
    "tests/runtime/test_cpu_packed.py",  # skipped below the avx512-bf16 level
    "tests/runtime/test_amx.py",  # skipped below the amx level
    "tests/runtime/test_span_tile.py::test_tiles_give_batch_1_bits_at_real_widths",
    f"{_M}test_float32_greedy_matches_transformers_and_eager",
    f"{_M}test_bfloat16_greedy_and_logits_match_eager[qwen2_moe]",
    f"{_M}test_bfloat16_greedy_and_logits_match_eager[olmoe]",
    f"{_M}test_router_ties_break_like_transformers[some]",
    f"{_M}test_quantized_experts_match_eager_on_the_same_quantized_model[qwen2_moe-int8]",
    f"{_M}test_quantized_experts_match_eager_on_the_same_quantized_model[olmoe-int4]",
    f"{_M}test_batched_decode_is_bit_identical_at_real_widths",
    # lanes: every delay mode and head type once, both dtypes, grouped attention, batching
    *(f"{_L}test_float32_decode_matches_eager[{name}]" for name in
      ("L2-d0", "L4-d2-no-early", "L2-d1-no-early-mixed-flags", "L4-d2-window", "L3-d1-replicate",
       "L4-d1-pre-norm", "L4-d1-lane-head", "L4-d2-vocab-parallel")),
    f"{_L}test_bfloat16_decode_matches_eager[L4-d2-window]",
    f"{_L}test_bfloat16_decode_matches_eager[L3-d1-replicate]",
    f"{_L}test_grouped_attention_widths_match_eager",
    f"{_L}test_batched_decode_is_bit_identical_to_batch_1[L4-d2-window-float32]",
    f"{_L}test_batched_decode_is_bit_identical_to_batch_1[L4-d2-window-bfloat16]",
]


@pytest.mark.slow
@pytest.mark.parametrize("isa", [lv.name for lv in cpu_build.LEVELS])
def test_parity_under_every_isa_level_this_cpu_runs(isa):
    available = [lv.name for lv in available_levels()]
    if isa not in available:
        pytest.skip(f"this CPU cannot run the {isa} level")
    if isa == selected_level().name:
        pytest.skip(f"{isa} is this session's level: the whole suite runs on it")
    # No spinning at the step's barriers: these runs exercise the sleep / wake path, as the suite's workers do
    # (tests/conftest.py); test_cpu_split_kv.py's avx2 run spins. One process per level (-n 0: no workers).
    env = {**os.environ, "SOLO_CPU_ISA": isa, "SOLO_CPU_SPIN_US": "0"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:cacheprovider", *_PARITY,
         "-k", "not 130-320"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    output = result.stdout[-4000:] + result.stderr[-2000:]
    assert result.returncode == 0, f"parity tests under SOLO_CPU_ISA={isa}:\n{output}"


def test_software_prefetch_follows_the_cpu_and_the_override(monkeypatch):
    monkeypatch.delenv("SOLO_CPU_PREFETCH", raising=False)
    # Off on AMD before Zen 5 (family 26) but Zen 3: 4 KiB ahead cost 10-25% on Zen 4, gained on Zen 5; on
    # Zen 3 1 KiB ahead gained and 4 KiB cost.
    level = available_levels()[0]
    for vendor, family, model, expected in (
            ("GenuineIntel", 6, 143, 4096), ("AuthenticAMD", 25, 17, 0), ("AuthenticAMD", 25, 97, 0),
            ("AuthenticAMD", 25, 1, 1024), ("AuthenticAMD", 25, 33, 1024), ("AuthenticAMD", 23, 49, 0),
            ("AuthenticAMD", 26, 2, 4096), ("AuthenticAMD", None, None, 0), ("", None, None, 4096)):
        monkeypatch.setattr(cpu_build, "cpu_vendor", lambda vendor=vendor: vendor)
        monkeypatch.setattr(cpu_build, "cpu_family", lambda family=family: family)
        monkeypatch.setattr(cpu_build, "cpu_model_number", lambda model=model: model)
        assert cpu_build.prefetch_distance_bytes() == expected, (vendor, family, model)
        flags = cpu_build.compile_flags(level)
        assert ("-DSOLO_NO_SW_PREFETCH" in flags) is (expected == 0)
        assert (f"-DSOLO_PREFETCH={expected}" in flags) is (expected > 0)
    monkeypatch.setenv("SOLO_CPU_PREFETCH", "0")
    assert cpu_build.prefetch_distance_bytes() == 0
    monkeypatch.setattr(cpu_build, "cpu_vendor", lambda: "AuthenticAMD")
    monkeypatch.setattr(cpu_build, "cpu_family", lambda: 25)
    monkeypatch.setattr(cpu_build, "cpu_model_number", lambda: 17)
    monkeypatch.setenv("SOLO_CPU_PREFETCH", "1")
    assert cpu_build.prefetch_distance_bytes() == 4096
    monkeypatch.setenv("SOLO_CPU_PREFETCH", "2048")
    assert cpu_build.prefetch_distance_bytes() == 2048
    monkeypatch.setenv("SOLO_CPU_PREFETCH", "Off")  # (the spellings every switch takes)
    assert cpu_build.prefetch_distance_bytes() == 0
    for bad in ("maybe", "100", "-64", "\u00b2"):
        monkeypatch.setenv("SOLO_CPU_PREFETCH", bad)
        with pytest.raises(cpu_build.CpuSettingError, match="SOLO_CPU_PREFETCH"):
            cpu_build.prefetch_distance_bytes()


@pytest.mark.parametrize("setting,flag,zen4,elsewhere", [
    # Two row streams on AMD Zen 4 (family 25), where they read 1.02-1.08x faster than four; four elsewhere
    # (1.39-1.50x one stream on a Xeon with AMX).
    ("bf16_stream_count", "SOLO_BF16_STREAMS", 2, 4),
    # One k block of 8192 on Zen 4, where the span prefill's down projections ran 1.10-1.16x faster than in
    # blocks of 2048; 2048 elsewhere (best on Zen 5).
    ("bf16_pass_k_block", "SOLO_BF16_PASS_KB", 8192, 2048),
])
def test_bf16_kernel_settings_follow_the_cpu(monkeypatch, setting, flag, zen4, elsewhere):
    # Each reaches the build as a flag, so each value has its own cached library.
    level = available_levels()[0]
    for vendor, family, expected in (("GenuineIntel", 6, elsewhere), ("AuthenticAMD", 25, zen4),
                                     ("AuthenticAMD", 26, elsewhere), ("AuthenticAMD", 23, elsewhere),
                                     ("AuthenticAMD", None, elsewhere), ("", None, elsewhere)):
        monkeypatch.setattr(cpu_build, "cpu_vendor", lambda vendor=vendor: vendor)
        monkeypatch.setattr(cpu_build, "cpu_family", lambda family=family: family)
        assert getattr(cpu_build, setting)() == expected, (vendor, family)
        assert f"-D{flag}={expected}" in cpu_build.compile_flags(level)


def test_the_kernels_own_knobs_are_checked_and_spelled_as_the_kernels_read_them(monkeypatch):
    # The kernels read these with getenv and saw only "0" as off: SOLO_CPU_SPLIT_KV=off left the split on,
    # SOLO_CPU_SPIN_US=abc became 0 and a huge value overflowed.
    from solo.env import EnvSettingError
    from solo.runtime.cpu import int_dot_enabled

    monkeypatch.setenv("SOLO_CPU_SPLIT_KV", "off")
    monkeypatch.setenv("SOLO_CPU_PLACE_WORKERS", " True")
    monkeypatch.setenv("SOLO_CPU_SPIN_US", " 500")
    monkeypatch.setenv("SOLO_MOE_SCHEDULE", "Static")
    cpu_build.check_kernel_env()
    assert (os.environ["SOLO_CPU_SPLIT_KV"], os.environ["SOLO_CPU_PLACE_WORKERS"]) == ("0", "1")
    assert (os.environ["SOLO_CPU_SPIN_US"], os.environ["SOLO_MOE_SCHEDULE"]) == ("500", "static")
    for name, bad, words in (("SOLO_CPU_SPLIT_KV", "nope", "is not a switch"),
                             ("SOLO_CPU_SPIN_US", "abc", "whole number from 0 to 10000000 microseconds"),
                             ("SOLO_CPU_SPIN_US", "99999999999999999999", "whole number"),
                             ("SOLO_MOE_SCHEDULE", "fast", "is not one of dynamic, static")):
        monkeypatch.setenv(name, bad)
        with pytest.raises(EnvSettingError, match=words):
            cpu_build.check_kernel_env()
        monkeypatch.delenv(name)
    monkeypatch.setenv("SOLO_CPU_INT_DOT", "off")
    assert int_dot_enabled() is False


def test_libraries_unused_for_30_days_are_removed_at_the_next_build(tmp_path):
    # Every upgrade that changed the kernels left its library (0.7 MB and its checksum) in the cache for good.
    import time

    old, recent = tmp_path / "solo_cpu_avx2_0123456789abcdef.so", tmp_path / "solo_cpu_avx2_fedcba9876543210.so"
    for library in (old, recent):
        library.write_bytes(b"lib")
        cpu_build._checksum_path(library).write_text("sum")
    long_ago = time.time() - 31 * 86400
    os.utime(old, (long_ago, long_ago))
    os.utime(recent, (long_ago, long_ago))
    assert cpu_build._mark_used(recent) == recent  # (a load dates it)
    cpu_build._remove_stale_builds(tmp_path)
    assert not old.exists() and not cpu_build._checksum_path(old).exists()
    assert recent.exists() and cpu_build._checksum_path(recent).exists()
