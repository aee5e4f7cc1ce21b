"""Shared fixtures: tiny checkpoints written by transformers, and the read-only HF metadata fixtures."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

# The suite runs in two pytest-xdist workers (pyproject's addopts), one per core of the machines it is sized
# for. A worker's decode threads and OpenMP threads then sleep at once when they wait instead of spinning:
# spinning threads of one worker took the cores the other needed (the suite ran 1.3x faster than in one
# process with spinning, 1.5x without). Set before torch (and OpenMP) or the kernels load.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("SOLO_CPU_SPIN_US", "0")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from checkpoints import make_checkpoint  # noqa: E402

# Read-only metadata of real models (configs, tokenizers, chat templates) beside the repository; absent in
# a user's fresh clone, where the tests that need it skip.
SHARED_HF = Path(os.environ.get("SOLO_SHARED_FIXTURES", Path(__file__).resolve().parents[2] / "shared")) / \
    "fixtures" / "hf"


@pytest.fixture(scope="session")
def shared_hf() -> Path:
    if not SHARED_HF.is_dir():
        pytest.skip("the shared HF metadata fixtures (../shared/fixtures/hf) are not present in this checkout")
    return SHARED_HF


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Path:
    """A tiny float32 Llama checkpoint with a chat template."""
    return make_checkpoint(tmp_path_factory.mktemp("tiny-llama"), "llama")


# Tests that run the suite's parity subsets under each lower ISA level, each needing that level's kernels.
_LOWER_LEVEL_TESTS = ("test_parity_under_every_isa_level_this_cpu_runs", "test_split_kv_under_the_avx2_kernels")


def pytest_collection_finish(session: pytest.Session) -> None:
    # Those levels' kernels are a compile of ~20 s apiece that would otherwise run one after another in the
    # middle of the suite. When such tests are collected, a child process builds them from the start (on the
    # second core while the first test files run mostly one thread of Python), with the environment as it is
    # now: no test's monkeypatching reaches it, and it finishes its builds if the run ends first. A test that
    # needs a level being built waits for it (cpu_build's lock file); build errors are left to the tests.
    # Not in the parity runs themselves (SOLO_CPU_ISA set) nor with SOLO_TEST_PREBUILD=0; in one xdist worker.
    wanted = any(item.name.startswith(_LOWER_LEVEL_TESTS) for item in session.items)
    if not wanted or session.config.option.collectonly or os.environ.get("SOLO_TEST_PREBUILD", "1") == "0" or \
            os.environ.get("SOLO_CPU_ISA") or os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":
        return
    import subprocess

    try:
        from solo.runtime import cpu_build

        own = cpu_build.selected_level()
        levels = [lv.name for lv in cpu_build.available_levels() if lv != own]  # scalar and avx2 first
    except Exception:  # noqa: BLE001 (the tests report it)
        return
    if levels:  # (started by a shell that exits at once: no Popen left running, which warned when collected)
        subprocess.run(["sh", "-c", '"$0" "$@" >/dev/null 2>&1 </dev/null &', sys.executable, "-c",
                        "import sys; from solo.runtime import cpu_build as b; "
                        "[b.library_path(lv) for lv in b.LEVELS if lv.name in sys.argv[1:]]", *levels],
                       start_new_session=True, check=False)


@pytest.fixture(autouse=True, scope="session")
def _tensor_parallel_failures_never_end_the_test_process():
    # A failed tensor-parallel runtime SIGTERMs its own process after EXIT_AFTER_FAILURE_S (a server then exits
    # non-zero). Rank 0 runs inside the test process here: a rank failure noticed late (once a test that set the
    # delay high had ended, under a heavily loaded machine) ended the whole test run ("Terminated").
    from solo.distributed import runtime

    saved, runtime.EXIT_AFTER_FAILURE_S = runtime.EXIT_AFTER_FAILURE_S, 1e9
    yield
    runtime.EXIT_AFTER_FAILURE_S = saved
