"""`--backend megakernel` wiring, and its clean refusals on a machine without a GPU."""

from __future__ import annotations

import pytest
import torch

from solo.errors import SoloError
from solo.runtime import BACKENDS, create_runtime


def test_backend_is_listed_and_never_auto(tiny_llama):
    from solo.model.config import ModelConfig
    from solo.model.weights import load_weights

    assert "megakernel" in BACKENDS
    model = load_weights(tiny_llama, ModelConfig.from_file(tiny_llama), torch.float32, torch.device("cpu"))
    assert create_runtime(model, "auto", torch.device("cpu")).name != "megakernel"
    if not torch.cuda.is_available():
        with pytest.raises(SoloError, match="the megakernel backend needs a CUDA GPU"):
            create_runtime(model, "megakernel", torch.device("cpu"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_cli_refuses_in_one_line(tiny_llama, capsys):
    from solo.cli import main

    code = main(["run", str(tiny_llama), "--backend", "megakernel", "--max-tokens", "2", "--prompt", "hi"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and any("the megakernel backend needs a CUDA GPU" in line for line in err)


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    """A tiny bf16 Llama and a MegakernelRuntime whose launches run kernel.cu on the CPU."""
    from _cuda_helpers import TinyCheckpoints

    from solo.runtime.megakernel.emulate import emulator_unavailable_reason
    from solo.runtime.megakernel.runtime import MegakernelRuntime

    if emulator_unavailable_reason() is not None:
        pytest.skip(emulator_unavailable_reason())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    ckpts = TinyCheckpoints(tmp_path_factory.mktemp("mk-rt"))
    model = ckpts.model("llama", dtype=torch.bfloat16)
    yield ckpts, MegakernelRuntime(model, emulate=True, max_launch_tokens=3)
    torch.set_num_threads(threads)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_n_tokens_per_launch_equal_one_per_launch_and_stop_on_device(emulated):
    from _cuda_helpers import PROMPT

    from solo.runtime.cuda.state import SamplingSpec

    _, rt = emulated
    rt.reserve(1, 32)
    first = int(rt.prefill(0, torch.tensor(PROMPT)).argmax())
    blocks = list(rt.iter_blocks(0, first, len(PROMPT), SamplingSpec(), frozenset(), 5))
    assert [len(b) for b in blocks] == [3, 2]  # 3 tokens per launch, streamed per launch here
    tokens = [t for b in blocks for t in b]
    per_token, token = [], first
    for i in range(5):
        logits = rt.decode(torch.tensor([0]), torch.tensor([token]), torch.tensor([len(PROMPT) + i]))
        assert logits.shape == (1, rt.config.vocab_size) and logits.dtype == torch.float32
        token = int(logits[0].argmax())
        per_token.append(token)
    assert tokens == per_token
    stopped = [t for b in rt.iter_blocks(0, first, len(PROMPT), SamplingSpec(), frozenset({tokens[1]}), 5)
               for t in b]
    assert stopped == tokens[:2]
    assert rt.describe()["emulated"] is True
    # A longer cache keeps the program and the kernel (the length is a launch argument).
    program, kernel = rt.program, rt.kernel
    rt.reserve(1, 300)
    assert rt.max_seq >= 300 and rt.program is program and rt.kernel is kernel
    first = int(rt.prefill(0, torch.tensor(PROMPT)).argmax())
    assert [t for b in rt.iter_blocks(0, first, len(PROMPT), SamplingSpec(), frozenset(), 3) for t in b] == tokens[:3]
    # Temperature sampling on the device: seeded by position, so launch sizes do not change it.
    spec = SamplingSpec(temperature=1.3, seed=4)
    sampled = [[t for b in rt.iter_blocks(0, first, len(PROMPT), spec, frozenset(), 4, k=k) for t in b]
               for k in (3, 1)]
    assert sampled[0] == sampled[1] and len(sampled[0]) == 4


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_engine_streams_from_the_megakernel(emulated):
    from solo import Engine, SamplingParams
    from solo.runtime.megakernel.runtime import MegakernelRuntime

    ckpts, _ = emulated
    # The runtime is swapped in after loading, so the prefix cache (built around the first runtime) stays off.
    engine = Engine.load(ckpts.folder("llama"), dtype="bfloat16", backend="eager", prefix_cache_gb=None)
    engine.runtime = MegakernelRuntime(engine.model, emulate=True, max_launch_tokens=2)
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    blocked = engine.complete("def fibonacci(n):", params)
    reference = Engine.load(ckpts.folder("llama"), dtype="bfloat16", backend="eager")
    request = reference.make_request("def fibonacci(n):", params)
    rt = engine.runtime
    rt.reserve(1, len(request.prompt_ids) + 8)
    token = int(rt.prefill(0, torch.tensor(request.prompt_ids)).argmax())
    tokens = [token]
    for i in range(3):
        logits = rt.decode(torch.tensor([0]), torch.tensor([token]), torch.tensor([len(request.prompt_ids) + i]))
        token = int(logits[0].argmax())
        tokens.append(token)
    assert blocked.token_ids == tokens
