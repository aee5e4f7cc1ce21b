"""Shared fixtures: tiny checkpoints written by transformers, and the read-only HF metadata fixtures."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

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


def pytest_collection_finish(session: pytest.Session) -> None:
    # The parity tests under lower ISA levels (test_cpu_isa, test_cpu_moe, ...) each need that level's kernels,
    # a compile of ~20 s apiece that would run serially in the middle of the suite. When such tests are
    # collected, the levels this CPU runs besides its own are built in a background thread from the start, on
    # the second core while the first test files run mostly one thread of Python. A test that needs a level
    # being built waits for it (cpu_build's lock file), and any build error is left to the tests to report.
    if os.environ.get("SOLO_TEST_PREBUILD", "1") == "0" or not any("isa" in item.nodeid for item in session.items):
        return
    import threading

    def build() -> None:
        try:
            from solo.runtime import cpu_build

            own = cpu_build.selected_level()
            for level in cpu_build.available_levels():  # scalar and avx2 first: the most tests use them
                if level != own:
                    cpu_build.library_path(level)
        except Exception:  # noqa: BLE001
            pass

    threading.Thread(target=build, name="solo-kernel-prebuild", daemon=True).start()
