"""Pre-quantized checkpoints Solo cannot run (GPTQ, AWQ, bitsandbytes, FP8) are refused by name."""

from __future__ import annotations

import json
import shutil

import pytest

from solo.cli import main
from solo.errors import UnsupportedArchitectureError
from solo.model.config import ModelConfig

BASE = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 100}


@pytest.mark.parametrize("quant, name", [
    ({"quant_method": "gptq", "bits": 4, "group_size": 128}, "GPTQ"),
    ({"quant_method": "awq", "bits": 4}, "AWQ"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "bitsandbytes"),
    ({"load_in_8bit": True}, "bitsandbytes"),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "FP8"),
    ({"quant_method": "compressed-tensors"}, "compressed-tensors"),
])
def test_quantized_configs_are_refused_by_name(quant, name):
    with pytest.raises(UnsupportedArchitectureError, match=f"weights are {name}-quantized"):
        ModelConfig.from_dict({**BASE, "quantization_config": quant})


def test_plain_config_still_loads():
    assert ModelConfig.from_dict(BASE).architecture == "LlamaForCausalLM"


def test_gptq_folder_via_cli(capsys, tmp_path, tiny_llama):
    folder = tmp_path / "gptq"
    shutil.copytree(tiny_llama, folder)
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "gptq", "bits": 4}
    (folder / "config.json").write_text(json.dumps(config))
    assert main(["run", str(folder), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "GPTQ-quantized" in err and "does not belong" not in err
