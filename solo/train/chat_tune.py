"""`solo train chat`: instruction-tune the bundled code model so that it chats (and still completes code).

Data, built from the same CPython standard library as the base recipe (same train / held-out file split):
- instruction pairs: for each function or method with a docstring, the request is the docstring's summary plus
  the signature ("Write a Python function `name(args)`: <summary>"), the answer is the function's source;
- plain code windows from the training files, so the model keeps completing code.

The model gets ChatML turn markers (`<|im_start|>`, `<|im_end|>`, two new tokens whose embeddings start at the
mean of the others), a chat template, and a 2,048-token context (RoPE positions beyond the base's 512 are
trained on longer code windows). Loss on pairs covers the answer and its `<|im_end|>` only. The held-out loss is
the mean answer-token loss over pairs from held-out files, before and after tuning.
"""

from __future__ import annotations

import ast
import json
import math
import random
import shutil
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

IM_START, IM_END = "<|im_start|>", "<|im_end|>"
TUNING_NAME = "chat_tuning.json"
"""The summary every folder `solo train chat` writes holds (and a folder its --out may replace)."""

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}{{ '<|im_start|>system\\n' }}"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\\n\\n' }}{% endif %}"
    "{{ 'You may call these functions; to call one, reply with <tool_call>{\"name\": ..., \"arguments\": {...}}"
    "</tool_call>.\\n<tools>\\n' }}"
    "{% for tool in tools %}{{ tool | tojson }}{{ '\\n' }}{% endfor %}"
    "{{ '</tools><|im_end|>\\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if not (tools and loop.first and message['role'] == 'system') %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% endif %}"
    "{% if message.get('tool_calls') %}{% for call in message['tool_calls'] %}"
    "{{ '<tool_call>{\"name\": \"' + call['function']['name'] + '\", \"arguments\": ' }}"
    "{{ call['function']['arguments'] if call['function']['arguments'] is string else "
    "call['function']['arguments'] | tojson }}{{ '}</tool_call>' }}{% endfor %}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML turns after BOS; tool definitions (if any) go in a system turn, as Qwen2.5's template does."""


@dataclass
class Pair:
    """One instruction pair: `request` (user turn) and `answer` (assistant turn)."""

    request: str
    answer: str


def _summary(doc: str) -> str:
    first = doc.strip().split("\n\n")[0]
    return " ".join(first.split())


def pairs_from_source(text: str, max_answer_chars: int = 1600) -> list[Pair]:
    """Instruction pairs from one Python file: every function or method with a docstring of 20+ characters.

    Args:
        text: the file's source.
        max_answer_chars: longer functions are left out (they would not fit a training sequence).
    """
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    pairs = []
    all_lines = text.splitlines()
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        doc = ast.get_docstring(node)
        if not doc or len(doc) < 20 or node.name.startswith("__"):
            continue
        start = node.decorator_list[0].lineno if node.decorator_list else node.lineno
        lines = all_lines[start - 1:node.end_lineno]
        source = textwrap.dedent("\n".join(lines))
        if len(source) > max_answer_chars:
            continue
        args = ast.unparse(node.args)
        kind = "async function" if isinstance(node, ast.AsyncFunctionDef) else "function"
        request = f"Write a Python {kind} `{node.name}({args})`: {_summary(doc)}"
        pairs.append(Pair(request, f"```python\n{source}\n```"))
    return pairs


def render(tokenizer: Any, pair: Pair, bos: int, start: int, end: int) -> tuple[list[int], list[int]]:  # noqa: ANN401
    """Token ids of one chat turn pair and its labels (-100 on everything but the answer and its end marker)."""
    nl = tokenizer.encode("\n", add_special_tokens=False).ids
    user = tokenizer.encode("user\n" + pair.request, add_special_tokens=False).ids
    asst = tokenizer.encode("assistant\n", add_special_tokens=False).ids
    answer = tokenizer.encode(pair.answer, add_special_tokens=False).ids
    prompt = [bos, start, *user, end, *nl, start, *asst]
    ids = prompt + answer + [end, *nl]
    labels = [-100] * len(prompt) + answer + [end] + [-100] * len(nl)
    return ids, labels


def main(argv: list[str] | None = None) -> int:  # noqa: C901
    """Run the chat tuning; returns the exit status."""
    from solo.cli import OneLineErrorParser

    p = OneLineErrorParser(prog="solo train chat", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--base", type=Path, default=None, help="model folder to start from (default: the bundled one)")
    p.add_argument("--out", type=Path, required=True, help="folder to write")
    p.add_argument("--minutes", type=float, default=20.0, help="wall-clock budget of the training loop")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--context", type=int, default=2048, help="the tuned model's context (default: 2048)")
    p.add_argument("--seq", type=int, default=768, help="tokens per training row (default: 768)")
    p.add_argument("--rows", type=int, default=2, help="rows per step (default: 2)")
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--heldout-pairs", type=int, default=96)
    p.add_argument("--long-every", type=int, default=12, help="every Nth step is one code window of --context")
    args = p.parse_args(argv)
    from solo.train.pipeline import check_out, replace_model_folder

    try:  # (before the training: the model it writes replaces --out at the end)
        check_out(args.out, None, TUNING_NAME)
    except (ValueError, FileExistsError) as exc:
        p.error(str(exc))

    import numpy as np
    import torch
    from tokenizers import AddedToken, Tokenizer
    from transformers import GenerationConfig, LlamaForCausalLM

    from solo.model.default_model import default_model_path
    from solo.train.corpus import load_corpus

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    rng = random.Random(args.seed)
    base = args.base or default_model_path()
    t_start = time.monotonic()

    def log(line: str) -> None:
        print(f"[{(time.monotonic() - t_start) / 60:5.1f} min] {line}", flush=True)

    corpus = load_corpus(heldout_permille=30)
    train_pairs = [q for f in corpus.train for q in pairs_from_source(f.text)]
    held_pairs = [q for f in corpus.heldout for q in pairs_from_source(f.text)]
    rng.shuffle(train_pairs)
    random.Random(args.seed + 1).shuffle(held_pairs)
    held_pairs = held_pairs[:args.heldout_pairs]
    log(f"pairs: {len(train_pairs)} from {len(corpus.train)} train files, {len(held_pairs)} held out "
        f"(from {len(corpus.heldout)} held-out files); Python {corpus.python_version}")

    tokenizer = Tokenizer.from_file(str(base / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken(IM_START, special=True, normalized=False),
                                  AddedToken(IM_END, special=True, normalized=False)])
    bos, eos, pad = (tokenizer.token_to_id(t) for t in ("<|bos|>", "<|eos|>", "<|pad|>"))
    start, end = tokenizer.token_to_id(IM_START), tokenizer.token_to_id(IM_END)

    model = LlamaForCausalLM.from_pretrained(base, dtype=torch.float32)
    model.resize_token_embeddings(tokenizer.get_vocab_size(), mean_resizing=True)
    model.config.max_position_embeddings = args.context
    model.config.eos_token_id = [eos, end]

    def encode_pairs(pairs: list[Pair]) -> list[tuple[list[int], list[int]]]:
        out = [render(tokenizer, q, bos, start, end) for q in pairs]
        return [x for x in out if len(x[0]) <= args.seq]

    train_enc = encode_pairs(train_pairs)
    held_enc = encode_pairs(held_pairs)
    code_files = [f.text for f in corpus.train]
    rng.shuffle(code_files)
    code = np.array([t for text in code_files[:120] for t in [bos, *tokenizer.encode(text).ids, eos]], dtype=np.int64)
    log(f"{len(train_enc)} train pairs and {len(held_enc)} held-out pairs fit {args.seq} tokens; "
        f"code stream {len(code):,} tokens")

    def heldout_loss() -> float:
        model.eval()
        total, count = 0.0, 0
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            for ids, labels in held_enc:
                out = model(input_ids=torch.tensor([ids]))
                logits = out.logits[0, :-1].float()
                target = torch.tensor(labels[1:])
                mask = target != -100
                total += float(torch.nn.functional.cross_entropy(logits[mask], target[mask], reduction="sum"))
                count += int(mask.sum())
        model.train()
        return total / count

    before = heldout_loss()
    log(f"held-out answer loss before tuning: {before:.4f} nats/token")

    def pair_batch(cursor: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        rows_ids, rows_labels = [], []
        for _ in range(args.rows):
            ids, labels = [], []
            while cursor < len(train_enc) and len(ids) + len(train_enc[cursor][0]) <= args.seq:
                ids += train_enc[cursor][0]
                labels += train_enc[cursor][1]
                cursor += 1
            if cursor >= len(train_enc):
                cursor = 0
            rows_ids.append(ids + [pad] * (args.seq - len(ids)))
            rows_labels.append(labels + [-100] * (args.seq - len(labels)))
        return torch.tensor(rows_ids), torch.tensor(rows_labels), cursor

    def code_batch(length: int, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        starts = [rng.randrange(0, len(code) - length - 1) for _ in range(rows)]
        x = torch.tensor(np.stack([code[s:s + length] for s in starts]))
        return x, x.clone()

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    budget_s = args.minutes * 60
    t_train = time.monotonic()
    step, cursor, tokens, pair_steps = 0, 0, 0, 0
    window: list[float] = []
    model.train()
    while (elapsed := time.monotonic() - t_train) < budget_s:
        progress = elapsed / budget_s
        lr = args.lr * min(1.0, (step + 1) / 20) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for group in opt.param_groups:
            group["lr"] = lr
        if step % args.long_every == args.long_every - 1:
            x, y = code_batch(args.context, 1)
        elif step % 3 == 2:
            x, y = code_batch(args.seq, args.rows)
        else:
            x, y, cursor = pair_batch(cursor)
            pair_steps += 1
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=x, labels=y).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step += 1
        tokens += x.numel()
        window.append(float(loss.detach()))
        if step % 10 == 0:
            left = (budget_s - (time.monotonic() - t_train)) / 60
            log(f"step {step} | loss {sum(window) / len(window):.4f} | lr {lr:.2e} | "
                f"{tokens / (time.monotonic() - t_train):.0f} tok/s | pairs seen {cursor} | about {left:.1f} min left")
            window = []
    train_s = time.monotonic() - t_train
    after = heldout_loss()
    log(f"held-out answer loss after tuning: {after:.4f} nats/token (before {before:.4f}); {step} steps, "
        f"{tokens:,} tokens in {train_s / 60:.1f} min")

    out = args.out.expanduser().resolve()
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    export = model.to(torch.bfloat16)
    export.config.dtype = torch.bfloat16
    base_gen = json.loads((base / "generation_config.json").read_text())
    export.generation_config = GenerationConfig(
        bos_token_id=bos, eos_token_id=[eos, end], pad_token_id=pad, do_sample=False,
        repetition_penalty=base_gen.get("repetition_penalty", 1.3))
    export.save_pretrained(tmp)
    config = json.loads((tmp / "config.json").read_text())
    config.pop("attn_implementation", None)
    config.setdefault("torch_dtype", "bfloat16")
    config.setdefault("rope_theta", config.get("rope_parameters", {}).get("rope_theta", 10000.0))
    (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tokenizer.save(str(tmp / "tokenizer.json"))
    tok_config = json.loads((base / "tokenizer_config.json").read_text())
    tok_config.update(model_max_length=args.context, chat_template=CHAT_TEMPLATE)
    (tmp / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    shutil.copy(base / "special_tokens_map.json", tmp / "special_tokens_map.json")
    summary = {
        "base": base.name, "method": (__doc__ or "").split("\n\n")[1:3],
        "python_version": corpus.python_version, "train_pairs": len(train_enc), "heldout_pairs": len(held_enc),
        "pairs_seen": pair_steps and cursor, "steps": step, "tokens": tokens, "train_time_s": round(train_s, 1),
        "threads": args.threads, "seq": args.seq, "rows": args.rows, "context": args.context, "lr": args.lr,
        "heldout_answer_loss_before": before, "heldout_answer_loss_after": after,
        "device": "cpu", "torch_version": torch.__version__,
    }
    (tmp / TUNING_NAME).write_text(json.dumps(summary, indent=2) + "\n")
    for path in tmp.iterdir():
        path.chmod(0o644)
    try:
        replace_model_folder(tmp, out, None, TUNING_NAME)  # (it stayed in --out's name + ".tmp")
    except (FileExistsError, RuntimeError) as exc:
        print(f"solo train chat: error: {exc}", file=sys.stderr)
        return 1
    log(f"wrote {args.out}; summary {json.dumps(summary)}")
    return 0
