"""Compile every decode kernel for Hopper (sm_90) on a machine without a GPU, through its real wrapper.

Run as a script, without TRITON_INTERPRET: each wrapper is called on CPU tensors with the launch
intercepted, and the captured arguments (types, constexprs, launch options) are compiled by Triton down
to a cubin with its bundled ptxas. That catches what the interpreter cannot: code-generation errors,
non-constexpr globals, register spills, and scalar loads where 16-byte vector loads were meant.

    python tests/runtime/compile_sm90.py [--json OUT]     # exit status 1 if any kernel fails a check
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

_TYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32", torch.int64: "i64",
          torch.int32: "i32", torch.int8: "i8", torch.bool: "i1"}
_LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "launch_pdl")
# Kernels whose K loop streams weights: it must not go through shared memory.
_STREAMING_KERNELS = ("gemv_kernel", "rmsnorm_gemv_kernel", "qkv_rope_kernel", "gated_mlp_kernel")


def capture_launches(fn, *args, **kwargs) -> list[tuple[JITFunction, dict, dict]]:
    """Run a wrapper with kernel launches recorded instead of executed."""
    launches = []

    def fake_run(self, *run_args, grid, warmup, **run_kwargs):
        bound = dict(zip(self.arg_names, run_args, strict=False))
        options = {k: run_kwargs.pop(k) for k in _LAUNCH_OPTIONS if k in run_kwargs}
        bound.update(run_kwargs)
        launches.append((self, bound, options))

    original = JITFunction.run
    JITFunction.run = fake_run
    try:
        fn(*args, **kwargs)
    finally:
        JITFunction.run = original
    return launches


def compile_launch(kernel: JITFunction, bound: dict, options: dict):
    """Compile one captured launch for sm_90."""
    signature, constexprs, attrs = {}, {}, {}
    for i, param in enumerate(kernel.params):
        value = bound[param.name]
        if param.is_constexpr:
            signature[param.name] = "constexpr"
            constexprs[param.name] = value
        elif isinstance(value, torch.Tensor):
            signature[param.name] = "*" + _TYPES[value.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool):
            signature[param.name] = "i1"
        elif isinstance(value, int):
            signature[param.name] = "i32" if -(2**31) <= value < 2**31 else "i64"
            if value % 16 == 0 and value != 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(value, float):
            signature[param.name] = "fp32"
        else:
            raise TypeError(f"{kernel.__name__}: cannot type argument {param.name}={value!r}")
    src = ASTSource(kernel, signature, constexprs, attrs=attrs)
    opts = {"num_warps": options.get("num_warps", 4), "num_stages": options.get("num_stages", 3),
            "launch_pdl": options.get("launch_pdl", False)}
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)


def loop_barriers(compiled) -> int:
    """Most CTA barriers (BAR.SYNC) inside one loop of the SASS: a shared-memory round trip per step."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        sass = subprocess.run([str(tool), "-sass", f.name], capture_output=True, text=True).stdout
    code = []
    for line in sass.splitlines():
        m = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            code.append((int(m.group(1), 16), m.group(2)))
    worst = 0
    for addr, text in code:
        target = re.search(r"BRA (?:`\()?(?:\.L_x_\d+\))?\s*0x([0-9a-f]+)", text)
        if target and int(target.group(1), 16) < addr:  # a backward branch closes a loop
            start = int(target.group(1), 16)
            worst = max(worst, sum("BAR.SYNC" in t for a, t in code if start <= a <= addr))
    return worst


def resource_usage(compiled) -> dict:
    """Registers, stack and local memory per thread, from cuobjdump on the cubin."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        text = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True).stdout
    usage = {}
    for field in ("REG", "STACK", "SHARED", "LOCAL"):
        m = re.search(rf"{field}:(\d+)", text)
        if m:
            usage[field.lower()] = int(m.group(1))
    return usage


def _cases():
    """(name, wrapper, args, kwargs) for every kernel at Llama-3.2-1B-like and Laneformer-like sizes."""
    from solo.runtime.triton import attention, gemv, qkv_rope, rmsnorm_gemv, sampling, swiglu

    bf16 = torch.bfloat16
    cases = []
    for n, k, cfg in [(2048, 2048, gemv.GemvConfig(4, 1024, 1, 4)), (3072, 12288, gemv.GemvConfig(8, 1024, 4, 4)),
                      (2048, 8192, gemv.GemvConfig(8, 2048, 1, 8)), (3072, 3072, gemv.GemvConfig(8, 512, 2, 2))]:
        w = torch.empty(n, k, dtype=bf16)
        cases.append((f"gemv_{n}x{k}_s{cfg.split_k}", gemv.gemv, (w, torch.empty(k, dtype=bf16)),
                      dict(out=torch.empty(n, dtype=bf16), residual=torch.empty(n, dtype=bf16), config=cfg)))
    for v, h in [(128256, 2048), (32000, 3072)]:
        cases.append((f"rmsnorm_gemv_{v}x{h}", rmsnorm_gemv.rmsnorm_gemv,
                      (torch.empty(h, dtype=bf16), torch.empty(h, dtype=bf16), torch.empty(v, h, dtype=bf16), 1e-5),
                      dict(out=torch.empty(v), config=rmsnorm_gemv.RmsNormGemvConfig(16, 512, 2))))
    for hq, hkv, hd, hid in [(32, 8, 64, 2048), (32, 16, 96, 3072)]:
        rows = (hq + 2 * hkv) * hd
        cache = torch.empty(2, hkv, 512, hd, dtype=bf16)
        cases.append((f"qkv_rope_{hq}x{hkv}x{hd}", qkv_rope.qkv_rope,
                      (torch.empty(hid, dtype=bf16), torch.empty(hid, dtype=bf16), torch.empty(rows, hid, dtype=bf16),
                       1e-5, torch.empty(512, hd // 2), torch.empty(512, hd // 2), torch.zeros(8, dtype=torch.int64),
                       torch.empty(hq * hd, dtype=bf16), cache, cache.clone()),
                      dict(num_heads=hq, num_kv_heads=hkv, head_dim=hd)))
        for window, softcap, seq in [(None, None, 512), (256, 50.0, 8192)]:
            cache = torch.empty(1, hkv, seq, hd, dtype=bf16)
            cases.append((f"attention_{hq}x{hkv}x{hd}_{seq}_{window}", attention.decode_attention,
                          (torch.empty(hq * hd, dtype=bf16), cache, cache.clone(), torch.zeros(8, dtype=torch.int64),
                           torch.empty(hq * hd, dtype=bf16)),
                          dict(num_heads=hq, num_kv_heads=hkv, head_dim=hd, scale=hd**-0.5, window=window,
                               softcap=softcap)))
    for f, h, act in [(8192, 2048, "silu"), (12288, 3072, "gelu_pytorch_tanh")]:
        cases.append((f"gated_mlp_{f}x{h}_{act}", swiglu.gated_mlp,
                      (torch.empty(h, dtype=bf16), torch.empty(2 * f, h, dtype=bf16)),
                      dict(norm_weight=torch.empty(h, dtype=bf16), activation=act)))
    for mode in (sampling.MODE_GREEDY, sampling.MODE_SAMPLE, sampling.MODE_FILTERED):
        plan = sampling.SamplerPlan(128256, "cpu")
        cases.append((f"sample_step_mode{mode}", sampling.sample_step,
                      (torch.empty(128256), torch.zeros(16, dtype=torch.int64)[:8], torch.zeros(4), torch.zeros(1),
                       torch.zeros(128256, dtype=torch.int8), torch.zeros(8, dtype=torch.int64), 3, mode, plan), {}))
    cases.append(("argmax", sampling.argmax, (torch.empty(1000),), {}))
    # float32 models (the GPU parity tests' tiny checkpoints): the broadcast attention path, fp32 loads.
    f32 = torch.float32
    cache = torch.empty(3, 2, 256, 16)
    cases.append(("attention_f32_gqa_window_softcap", attention.decode_attention,
                  (torch.empty(64), cache, cache.clone(), torch.zeros(8, dtype=torch.int64), torch.empty(64)),
                  dict(num_heads=4, num_kv_heads=2, head_dim=16, scale=0.25, window=8, softcap=50.0)))
    cases.append(("gemv_f32", gemv.gemv, (torch.empty(64, 160, dtype=f32), torch.empty(160, dtype=f32)),
                  dict(bias=torch.empty(64), residual=torch.empty(64), config=gemv.default_config(64, 160, 132, 4))))
    cases.append(("qkv_rope_f32_qwen2", qkv_rope.qkv_rope,
                  (torch.empty(64), torch.empty(64), torch.empty(128, 64), 1e-6, torch.empty(256, 8),
                   torch.empty(256, 8), torch.zeros(8, dtype=torch.int64), torch.empty(64), cache, cache.clone()),
                  dict(num_heads=4, num_kv_heads=2, head_dim=16, bias=torch.empty(128),
                       config=qkv_rope.QkvRopeConfig(4, 512))))
    cases.append(("gated_mlp_f32_gelu_offset", swiglu.gated_mlp, (torch.empty(64), torch.empty(320, 64)),
                  dict(norm_weight=torch.empty(64), activation="gelu", unit_offset=True, bias=torch.empty(320),
                       config=swiglu.GatedMlpConfig(4, 512))))
    # Double-buffered weight tiles (num_stages=2): two tiles per thread in flight, no spills.
    cases.append(("gemv_2048x8192_db", gemv.gemv, (torch.empty(2048, 8192, dtype=bf16), torch.empty(8192, dtype=bf16)),
                  dict(out=torch.empty(2048, dtype=bf16), residual=torch.empty(2048, dtype=bf16),
                       config=gemv.GemvConfig(8, 1024, 1, 4, 2))))
    cases.append(("rmsnorm_gemv_128256x2048_db", rmsnorm_gemv.rmsnorm_gemv,
                  (torch.empty(2048, dtype=bf16), torch.empty(2048, dtype=bf16), torch.empty(128256, 2048, dtype=bf16),
                   1e-5), dict(out=torch.empty(128256), config=rmsnorm_gemv.RmsNormGemvConfig(8, 1024, 4, 2))))
    cases.append(("qkv_rope_32x8x64_db", qkv_rope.qkv_rope,
                  (torch.empty(2048, dtype=bf16), torch.empty(2048, dtype=bf16), torch.empty(3072, 2048, dtype=bf16),
                   1e-5, torch.empty(512, 32), torch.empty(512, 32), torch.zeros(8, dtype=torch.int64),
                   torch.empty(2048, dtype=bf16), torch.empty(2, 8, 512, 64, dtype=bf16),
                   torch.empty(2, 8, 512, 64, dtype=bf16)),
                  dict(num_heads=32, num_kv_heads=8, head_dim=64, config=qkv_rope.QkvRopeConfig(4, 1024, 4, 2))))
    cases.append(("gated_mlp_8192x2048_db", swiglu.gated_mlp,
                  (torch.empty(2048, dtype=bf16), torch.empty(16384, 2048, dtype=bf16)),
                  dict(norm_weight=torch.empty(2048, dtype=bf16), config=swiglu.GatedMlpConfig(4, 1024, 4, 2))))
    # Programmatic dependent launch variants (grid dependency control instructions).
    pdl_cases = []
    for name, fn, fargs, fkwargs in cases:
        if name in ("gemv_3072x12288_s4", "rmsnorm_gemv_32000x3072", "qkv_rope_32x16x96",
                    "attention_32x8x64_8192_256", "gated_mlp_8192x2048_silu", "sample_step_mode1",
                    "gemv_2048x8192_db", "qkv_rope_32x8x64_db"):
            pdl_cases.append((name + "_pdl", fn, fargs, {**fkwargs, "pdl": True}))
    return cases + pdl_cases


def main(argv: list[str] | None = None) -> int:
    """Compile every case; print a table; return 1 if any failed, spilled or lost its vector loads."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", default=None, help="write the results here")
    parser.add_argument("--only", default=None, help="substring filter on case names")
    args = parser.parse_args(argv)
    results, failed = [], 0
    for name, fn, fargs, fkwargs in _cases():
        if args.only and args.only not in name:
            continue
        try:
            launches = capture_launches(fn, *fargs, **fkwargs)
        except Exception as exc:
            results.append({"case": name, "error": f"wrapper: {type(exc).__name__}: {exc}"})
            failed += 1
            continue
        for kernel, bound, options in launches:
            entry = {"case": name, "kernel": kernel.__name__, **options}
            start = time.perf_counter()
            try:
                compiled = compile_launch(kernel, bound, options)
                entry["compile_s"] = round(time.perf_counter() - start, 2)
                entry.update(resource_usage(compiled))
                ptx = compiled.asm["ptx"]
                entry["vector_loads"] = len(re.findall(r"ld\.global(?:\.\w+)*\.v[24]", ptx))
                entry["loop_barriers"] = loop_barriers(compiled)
                if entry.get("local", 0) > 0 or entry.get("stack", 0) > 0:
                    entry["problem"] = "register spills (local memory)"
                    failed += 1
                elif kernel.__name__ in _STREAMING_KERNELS and entry["loop_barriers"]:
                    entry["problem"] = "shared-memory round trip in the weight-streaming loop"
                    failed += 1
            except Exception as exc:
                entry["error"] = f"{type(exc).__name__}: {str(exc)[:2000]}"
                failed += 1
            results.append(entry)
    for r in results:
        status = r.get("error") or r.get("problem") or "ok"
        print(f"{r['case']:<40} {r.get('kernel', ''):<32} reg={r.get('reg', '-'):<4} "
              f"vec={r.get('vector_loads', '-'):<4} bar={r.get('loop_barriers', '-'):<3} "
              f"{r.get('compile_s', '-')}s  {status[:300]}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.exit(main())
