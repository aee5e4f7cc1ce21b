"""Model card (``README.md``) for a trained folder, rendered from its ``training_summary.json``."""

from __future__ import annotations

from typing import Any


def _fmt_int(n: int) -> str:
    return f"{n:,}"


def _code_block(text: str) -> str:
    # A fence longer than any backtick run inside keeps generated text from closing it early.
    fence = "```"
    while fence in text:
        fence += "`"
    return f"{fence}python\n{text}\n{fence}"


def render_model_card(summary: dict[str, Any]) -> str:
    """Render the model card from a training summary.

    Args:
        summary: the dict written to ``training_summary.json`` by the recipe (keys ``model_name``,
            ``parameters``, ``config``, ``corpus``, ``tokenizer``, ``training``, ``heldout``,
            ``xz_heldout``, ``eval_subset``, ``samples``).

    Returns:
        Markdown text with a YAML front-matter block.

    Raises:
        KeyError: if a required summary field is missing.
    """
    name = summary["model_name"]
    cfg = summary["config"]
    corpus = summary["corpus"]
    tok = summary["tokenizer"]
    train = summary["training"]
    held = summary["heldout"]
    xz = summary["xz_heldout"]
    subset = summary["eval_subset"]
    minutes = train["train_time_s"] / 60.0

    lines = [
        "---",
        "license: apache-2.0",
        "library_name: transformers",
        "pipeline_tag: text-generation",
        "tags: [code, python, llama, solo]",
        "---",
        "",
        f"# {name}",
        "",
        f"`{name}` is a small **Python code completion model** with the standard Llama architecture,",
        "trained from scratch by Solo's own recipe (`python -m solo.train`; the exact command for Solo's",
        "bundled default is in `scripts/train_default_model.sh`). Solo bundles a model built this way so that",
        "it works offline with no downloaded weights, and so the engine's grouped-query-attention and",
        "tied-embedding paths are exercised. It continues source code; it does not follow instructions.",
        "It has **no chat template**; `solo chat` needs a chat model.",
        "",
        "## Model",
        "",
        f"- Architecture: `LlamaForCausalLM`, {cfg['num_layers']} layers, hidden size {cfg['hidden_size']}, "
        f"{cfg['num_heads']} query heads / {cfg['num_kv_heads']} key-value heads (GQA), head dim {cfg['head_dim']}, "
        f"SwiGLU FFN {cfg['ffn_size']}, RoPE (theta {cfg['rope_theta']:g}), context {cfg['context']} tokens, "
        "tied input/output embeddings.",
        f"- Parameters: {_fmt_int(summary['parameters'])} "
        f"({_fmt_int(summary['non_embedding_parameters'])} excluding the embedding matrix).",
        f"- Weights stored in {summary['weights_dtype']} (`model.safetensors`).",
        f"- Tokenizer: byte-level BPE, {_fmt_int(tok['vocab_size'])} tokens, trained on the training split; "
        f"`{tok['bos_token']}` / `{tok['eos_token']}` wrap every document. Encoding a prompt with special "
        f"tokens prepends `{tok['bos_token']}`, exactly as training documents start; decoding reproduces "
        "source text byte for byte.",
        "",
        "## Training data",
        "",
        f"The `*.py` files of the CPython {corpus['python_version']} standard library "
        "(third-party `site-packages` excluded), licensed under the "
        "[PSF License Agreement](https://docs.python.org/3/license.html) (PSF-2.0). Files that are not "
        "valid UTF-8 are skipped and byte-identical files are kept once; files are split into train and "
        "held-out sets by a hash of their path.",
        "",
        "| | |",
        "|---|---|",
        f"| Python | {corpus['python_implementation']} {corpus['python_version']} |",
        f"| File-list SHA-256 | `{corpus['file_list_sha256']}` |",
        f"| Files found / non-UTF-8 skipped / duplicates removed | {corpus['files_found']} / "
        f"{corpus['skipped_non_utf8']} / {corpus['duplicates_removed']} |",
        f"| Train files / bytes | {corpus['train_files']} / {_fmt_int(corpus['train_bytes'])} |",
        f"| Held-out files / bytes | {corpus['heldout_files']} / {_fmt_int(corpus['heldout_bytes'])} |",
        f"| Train tokens per epoch | {_fmt_int(train['train_stream_tokens'])} |",
        "",
        "## Training",
        "",
        "| | |",
        "|---|---|",
        f"| Seed | {cfg['seed']} |",
        f"| Optimiser | AdamW (beta 0.9/0.95, weight decay {cfg['weight_decay']}), peak LR {cfg['lr']:g}, "
        f"{cfg['warmup_steps']} warm-up steps, cosine to {cfg['min_lr_ratio']:g}x |",
        f"| Batch | {cfg['batch_size']} x {cfg['context']} tokens |",
        f"| Steps | {_fmt_int(train['steps'])} |",
        f"| Training tokens | {_fmt_int(train['tokens'])} ({train['epochs']:.2f} epochs) |",
        f"| Training time | {minutes:.1f} min on {train['device_description']} |",
        f"| Throughput | {train['tokens_per_s']:,.0f} tokens/s averaged over the whole loop (compilation and "
        "periodic evaluation included)"
        + (
            f"; {train['median_window_tokens_per_s']:,.0f} tokens/s median per logging window |"
            if "median_window_tokens_per_s" in train
            else " |"
        ),
        f"| Precision | {train['precision']} |",
        f"| Software | torch {train['torch_version']}, transformers {train['transformers_version']} |",
        "",
        "## Evaluation (held-out files)",
        "",
        "Every held-out file is encoded as BOS + text + EOS; BOS is given, each text token and the final "
        "EOS are scored. Files longer than the context are scored in overlapping windows of "
        f"{held['context']} tokens advancing by {held['stride']}, so each token is scored once with at "
        f"least {held['context'] - held['stride']} tokens of context after the first window. Bits per "
        "byte = total negative log-likelihood in bits / UTF-8 bytes of the files. The xz baseline uses "
        "`lzma` preset 9 | extreme (`xz -9e`) on the same files.",
        "",
        "| | bits per byte |",
        "|---|---|",
        f"| **{name}** (loss {held['loss']:.4f} nats/token over {_fmt_int(held['n_tokens'])} tokens) | "
        f"**{held['bits_per_byte']:.4f}** |",
        f"| xz -9e, all held-out files concatenated | {xz['concatenated_bits_per_byte']:.4f} |",
        f"| xz -9e, each file separately | {xz['per_file_bits_per_byte']:.4f} |",
        "",
        f"Held-out set: {held['n_files']} files, {_fmt_int(held['n_bytes'])} bytes; stored bfloat16 weights "
        f"evaluated with {held['compute']} compute.",
        f"A fixed subset of {len(subset['files'])} held-out files ({_fmt_int(subset['n_bytes'])} bytes, "
        f"stored in `eval_subset.json`) scores loss {subset['loss']:.4f} nats/token, "
        f"{subset['bits_per_byte']:.4f} bits/byte (xz -9e per file: {subset['xz']['per_file_bits_per_byte']:.4f}); "
        "Solo's tests re-check these numbers.",
        "",
        "## Greedy samples",
        "",
        f"Greedy decoding with the repetition penalty of `generation_config.json` "
        f"({summary.get('repetition_penalty', 1.0)}), {cfg['sample_tokens']} new tokens at most, prompt encoded "
        "with BOS.",
        "",
    ]
    for sample in summary["samples"]:
        lines += [f"Prompt `{sample['prompt']!r}`:", "", _code_block(sample["prompt"] + sample["completion"]), ""]
    lines += [
        "## Reproducing",
        "",
        "`scripts/train_default_model.sh` reruns the recipe (seeded: weight init, data order and split are "
        "fixed). The corpus is the standard library of the interpreter that runs it, so a different Python "
        "version or a distribution that strips parts of the standard library (such as its test suite) "
        "gives a different file list; compare the file-list hash above. Training stops at the step count "
        "or the time budget, whichever comes first, so a slow machine trains on fewer tokens.",
        "",
        "## Limitations",
        "",
        "A model this small produces plausible-looking but often wrong code; it is a test and demo model for "
        "an inference engine, not a coding assistant. It has only seen the standard library's own code.",
        "",
    ]
    return "\n".join(lines)
