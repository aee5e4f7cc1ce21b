"""Merge the outputs of scripts/device_check.sh into OUT_DIR/results.json and print a short table.

    python scripts/device_summary.py OUT_DIR
"""

from __future__ import annotations

import glob
import json
import os
import sys
import xml.etree.ElementTree as ET


def _junit(path: str) -> dict:
    suite = ET.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    failed = [c.get("classname", "") + "::" + c.get("name", "") for c in suite.iter("testcase")
              if c.find("failure") is not None or c.find("error") is not None]
    return {k: suite.get(k) for k in ("tests", "failures", "errors", "skipped", "time")} | {"failed": failed}


def main(out: str) -> int:
    result: dict = {"steps": [], "bench": {}}
    try:
        with open(os.path.join(out, "steps.jsonl")) as f:
            result["steps"] = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as exc:
        result["steps_error"] = repr(exc)
    try:
        from solo.runtime.cuda.bench import summarize_files

        result["bench"] = summarize_files(sorted(glob.glob(os.path.join(out, "bench_*.json"))))
    except Exception as exc:  # the summary must always be written
        result["bench_error"] = repr(exc)
    for name in ("kernels", "triton_tuning"):
        try:
            with open(os.path.join(out, name + ".json")) as f:
                result[name] = json.load(f)
        except (OSError, ValueError) as exc:
            result[name] = {"missing": repr(exc)}
    for name in ("pytest_gpu", "pytest_kern"):
        try:
            result[name] = _junit(os.path.join(out, name + ".xml"))
        except Exception as exc:
            result[name] = {"missing": repr(exc)}
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(result, f, indent=1, default=str)

    for s in result["steps"]:
        print(f"step {s.get('step'):<14} rc={s.get('rc', '-')} {s.get('seconds', '-')}s {s.get('skipped', '')}")
    for shape, s in result["bench"].items():
        roof = (s.get("roofline") or {}).get("tokens_per_s") or 0
        print(f"{shape}: roofline {roof:.0f} tok/s")
        for name, e in sorted(s["engines"].items()):
            if "decode_tok_s" in e:
                frac = e.get("roofline_fraction") or 0
                syncs = e.get("host_syncs_per_token")
                sync_text = f" syncs/tok {syncs:.3f}" if syncs is not None else ""
                print(f"  {name:<26} {e['decode_tok_s']['median']:8.1f} tok/s {100 * frac:5.1f}% roofline "
                      f"TTFT {e['ttft_ms']['median']:6.1f} ms{sync_text}")
            else:
                print(f"  {name:<26} {str(e.get('error', 'no result'))[:200]}")
        if "best_solo" in s:
            ratios = ", ".join(f"{v:.2f}x {k}" for k, v in s.get("speedup_vs_peers", {}).items())
            print(f"  best {s['best_solo']}: {ratios}")
    kernels = result.get("kernels") or {}
    for e in kernels.get("kernels", []) if isinstance(kernels, dict) else []:
        if "graph_gbps" in e:
            frac = 100 * (e.get("graph_hbm_fraction") or 0)
            print(f"  {e['kernel']:<44} {e['graph_gbps']:7.0f} GB/s ({frac:.0f}% HBM)")
        elif "error" in e:
            print(f"  {e['kernel']:<44} ERROR {e['error'][:120]}")
    for name in ("pytest_gpu", "pytest_kern"):
        print(name, result[name])
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main(sys.argv[1]))
