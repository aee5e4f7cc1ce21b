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
