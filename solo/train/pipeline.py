"""The end-to-end recipe: corpus -> tokenizer -> training -> Hugging Face folder -> evaluation.

Everything a run needs to resume (configuration, tokenizer, tokenised stream, checkpoint, log)
lives in its run folder; the finished model folder is assembled in ``<run>/export`` and moved to
``--out`` only once it is complete, so a half-written model never appears there.
"""

from __future__ import annotations

import errno
import json
import math
import os
import platform
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from solo.train.config import TrainConfig
from solo.train.corpus import CORPUS_LICENSE, Corpus, SourceFile, load_corpus, select_eval_subset
from solo.train.data import BatchSchedule, pack_documents
from solo.train.evaluate import evaluate_documents, xz_bits_per_byte
from solo.train.model_card import render_model_card
from solo.train.tokenizer_training import (
    BOS_TOKEN,
    EOS_TOKEN,
    PAD_TOKEN,
    encode_documents,
    load_tokenizer,
    save_tokenizer,
    tokenizer_sha256,
    train_tokenizer,
)
from solo.train.trainer import (
    CHECKPOINT_NAME,
    Trainer,
    autocast_dtype,
    build_model,
    count_parameters,
    resolve_device,
)

#: Prompts whose greedy continuations go into the model card.
SAMPLE_PROMPTS = ("def fibonacci(n):", "import os\n", "class Stack:")
RUN_CONFIG = "run_config.json"
SUMMARY_NAME = "training_summary.json"
EVAL_SUBSET_NAME = "eval_subset.json"


@dataclass(frozen=True)
class RunOptions:
    """Run-time choices that do not change what is learned (beyond float rounding).

    Attributes:
        out: destination model folder.
        run_dir: working folder (checkpoints, caches, logs).
        device: ``auto|cpu|cuda``.
        precision: ``auto|bf16|fp32`` autocast for training forward passes.
        compile: wrap the training forward pass in ``torch.compile``.
        threads: CPU threads for torch (``None`` keeps torch's default).
        resume: continue the run in ``run_dir`` from its last checkpoint.
        overwrite: replace an existing ``out`` model folder (one an earlier run wrote: ``check_out``) and
            discard an existing run in ``run_dir``.
        eval_batch_size: windows per forward pass in the final evaluation.
    """

    out: Path
    run_dir: Path
    device: str = "auto"
    precision: str = "auto"
    compile: bool = False
    threads: int | None = None
    resume: bool = False
    overwrite: bool = False
    eval_batch_size: int = 8


def _describe_device(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({torch.get_num_threads()} threads)"


def check_out(out: Path, run_dir: Path | None, own_file: str = SUMMARY_NAME) -> None:
    """Refuse an ``out`` folder whose replacement would delete what is not a model this recipe wrote.

    The export replaces ``out`` whole, so ``out`` must be new, empty, or a model folder of an earlier run (it
    holds ``own_file``: ``training_summary.json``, `solo train chat`'s ``chat_tuning.json``); never the working
    folder, a folder above it, the home folder or the run folder (``--out ""`` was the working folder, and
    ``--overwrite`` deleted it).

    Args:
        out: the model folder to write.
        run_dir: the run's working folder, or None for a recipe without one.
        own_file: the file every model folder the recipe writes holds.

    Raises:
        ValueError: ``out`` is one of those folders, or its folder cannot be written (read-only, no permission).
        FileExistsError: ``out`` is a file, or a folder holding other files.
    """
    where, cwd = out.expanduser().resolve(), Path.cwd().resolve()
    run = run_dir.expanduser().resolve() if run_dir is not None else None
    if where == cwd or where in cwd.parents or where == Path.home().resolve() or (
            run is not None and (where == run or where in run.parents)):
        also = "" if run is None else f" or the run folder (--run-dir, default runs/<name of --out>: {run})"
        raise ValueError(f"--out {str(out)!r} is {where}: the working folder, one above it, the home folder{also}, "
                         "which the model folder would replace; name another folder, e.g. --out my-model")
    if where.exists() and not where.is_dir():
        raise FileExistsError(f"--out {out} is a file; name a folder for the model")
    if where.is_dir() and any(where.iterdir()) and not (where / own_file).is_file():
        raise FileExistsError(f"{out} holds files that are not a model this recipe wrote ({own_file} missing); "
                              "Solo replaces only its own model folders: name another --out, or empty this one")
    # The model is written next to ``out`` and renamed into place: its folder must take new entries (checked now,
    # not after the training).
    folder = next((p for p in where.parents if p.exists()), None)
    if folder is not None and not folder.is_dir():
        raise ValueError(f"--out {out}: {folder} is a file, not a folder; name a folder for the model")
    if folder is not None and not os.access(folder, os.W_OK | os.X_OK):
        why = "a read-only file system" if os.statvfs(folder).f_flag & getattr(os, "ST_RDONLY", 0) else (
            "no write permission")
        raise ValueError(f"--out {out}: cannot write in {folder} ({why}); name a folder you can write")


def replace_model_folder(export: Path, out: Path, run_dir: Path | None, own_file: str = SUMMARY_NAME) -> None:
    """Move a finished model folder to ``out``, replacing an earlier run's model there (`check_out`, again).

    The folder is first moved (or, across file systems, copied) beside ``out`` under a temporary name, then
    renamed: a failed copy (a full disk) leaves neither a half-written ``out`` nor a lost earlier model.

    Raises:
        FileExistsError: ``out`` became something the recipe may not replace during the run; the message says
            where the model is.
        RuntimeError: ``out`` could not be written (full, read-only); the message says where the model is.
    """
    if out.exists():
        try:
            check_out(out, run_dir, own_file)  # (again: it may have changed during the run)
        except (ValueError, FileExistsError) as exc:
            raise FileExistsError(f"{exc}; the trained model is in {export}: move it where you want it") from None
    staged = out.with_name(f".{out.name}.partial-{os.getpid()}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.rename(export, staged)
            copied = False
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            shutil.copytree(export, staged)
            copied = True
        if out.exists():
            shutil.rmtree(out)
        os.rename(staged, out)
    except OSError as exc:
        if staged.exists() and export.exists():
            shutil.rmtree(staged, ignore_errors=True)
        elif staged.exists():  # (moved, then the rename failed: the model is there)
            export = staged
        # shutil.Error holds one (source, destination, reason) per file that failed: the first says why
        reason = exc.args[0][0][2] if isinstance(exc, shutil.Error) and exc.args and exc.args[0] else (
            exc.strerror or str(exc))
        raise RuntimeError(f"cannot write the model to {out} ({reason}); the trained model is in {export}: free "
                           "space there or move it yourself") from None
    if copied:
        shutil.rmtree(export, ignore_errors=True)


def _prepare_run_dir(cfg: TrainConfig, opts: RunOptions, log: Callable[[str], None]) -> TrainConfig:
    run_dir = opts.run_dir
    config_path = run_dir / RUN_CONFIG
    check_out(opts.out, run_dir)
    if opts.resume:
        if not config_path.is_file():
            raise FileNotFoundError(f"--resume: no run to resume in {run_dir} ({RUN_CONFIG} missing)")
        saved = TrainConfig.from_dict(json.loads(config_path.read_text())["config"])
        if saved != cfg:
            log("--resume: using the configuration stored in the run folder; model/schedule flags are ignored")
        return saved
    if opts.out.exists() and any(opts.out.iterdir()) and not opts.overwrite:
        raise FileExistsError(f"{opts.out} exists; pass --overwrite to replace it")
    if (run_dir / CHECKPOINT_NAME).exists() and not opts.overwrite:
        raise FileExistsError(f"{run_dir} holds a run; pass --resume to continue it or --overwrite to restart")
    if run_dir.exists():
        for name in (CHECKPOINT_NAME, "train_log.jsonl", "train_tokens.npy", RUN_CONFIG):
            (run_dir / name).unlink(missing_ok=True)
        for name in ("tokenizer", "export"):
            shutil.rmtree(run_dir / name, ignore_errors=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path.write_text(json.dumps({"config": cfg.to_dict()}, indent=2) + "\n")
    return cfg


def _run_precision(opts: RunOptions, log: Callable[[str], None]) -> str:
    """The run's --precision, recorded in the run config: a resumed run keeps its own unless another is given.

    (It was not recorded, so a float32 run resumed with the default "auto" went on in bfloat16, unsaid.)
    """
    path = opts.run_dir / RUN_CONFIG
    data = json.loads(path.read_text())
    stored, precision = data.get("precision"), opts.precision
    if opts.resume and stored is not None and precision != stored:
        if precision == "auto":  # (the flag's default: not given)
            precision = stored
        else:
            log(f"--resume: training goes on with --precision {precision} (the run started with {stored})")
    data["precision"] = precision
    _write_run_config(path, data)
    return precision


def _write_run_config(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")  # (whole or not at all: an interrupt must not leave a cut run config)
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    os.replace(tmp, path)


def _check_recorded(run_dir: Path, key: str, value: str, resume: bool) -> None:
    """Record a fingerprint in the run config, or on resume check it has not changed."""
    path = run_dir / RUN_CONFIG
    data = json.loads(path.read_text())
    if resume and key in data and data[key] != value:
        raise ValueError(f"--resume: {key} changed since the run started ({data[key]} -> {value})")
    data[key] = value
    _write_run_config(path, data)


def _tokenize(cfg: TrainConfig, corpus: Corpus, opts: RunOptions, log: Callable[[str], None]):
    tok_dir = opts.run_dir / "tokenizer"
    if opts.resume and (tok_dir / "tokenizer.json").is_file():
        tokenizer = load_tokenizer(tok_dir)
    else:
        t0 = time.monotonic()
        texts = [f.text for f in corpus.train]
        tokenizer = train_tokenizer(texts, cfg.vocab_size, n_texts=len(texts))
        save_tokenizer(tokenizer, tok_dir, cfg.context)
        log(f"tokenizer: {tokenizer.get_vocab_size()} tokens trained in {time.monotonic() - t0:.1f} s")
    if tokenizer.get_vocab_size() != cfg.vocab_size:
        raise ValueError(
            f"tokenizer has {tokenizer.get_vocab_size()} tokens, expected {cfg.vocab_size} "
            "(corpus too small for this vocabulary?)"
        )
    _check_recorded(opts.run_dir, "tokenizer_sha256", tokenizer_sha256(tokenizer), opts.resume)

    cache = opts.run_dir / "train_tokens.npy"
    if opts.resume and cache.is_file():
        train_tokens = np.load(cache)
    else:
        t0 = time.monotonic()
        train_tokens = pack_documents(encode_documents(tokenizer, [f.text for f in corpus.train]))
        tmp = cache.with_suffix(".tmp")  # (a cache cut by an interrupt would be loaded by --resume)
        with open(tmp, "wb") as f:
            np.save(f, train_tokens)
        os.replace(tmp, cache)
        log(f"train stream: {len(train_tokens):,} tokens, encoded in {time.monotonic() - t0:.1f} s")
    heldout_docs = encode_documents(tokenizer, [f.text for f in corpus.heldout])
    return tokenizer, train_tokens, heldout_docs


def _export(model: torch.nn.Module, tokenizer, cfg: TrainConfig, folder: Path) -> None:
    """Write weights (bfloat16), config, generation config and tokenizer files to ``folder``."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    if cfg.num_lanes:  # a lane model: Laneformer layout (solo.train.lanes)
        from solo.train.lanes import export_lane_model

        export_lane_model(model, folder)
        generation = {"bos_token_id": model.config.bos_token_id, "eos_token_id": model.config.eos_token_id,
                      "pad_token_id": model.config.pad_token_id, "do_sample": False,
                      "repetition_penalty": DEFAULT_REPETITION_PENALTY}
        (folder / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
        save_tokenizer(tokenizer, folder, cfg.context)
        return
    export_model = build_model(cfg, model.config.bos_token_id, model.config.eos_token_id, model.config.pad_token_id)
    export_model.load_state_dict(model.state_dict())
    export_model = export_model.to(torch.bfloat16)
    export_model.config.dtype = torch.bfloat16
    export_model.generation_config = GenerationConfig(
        bos_token_id=model.config.bos_token_id,
        eos_token_id=model.config.eos_token_id,
        pad_token_id=model.config.pad_token_id,
        do_sample=False,
        # A 16M-parameter model loops under plain greedy decoding; a mild penalty keeps it writing code.
        repetition_penalty=DEFAULT_REPETITION_PENALTY,
    )
    export_model.save_pretrained(folder)
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config.pop("attn_implementation", None)
    # Older readers look for these spellings; they agree with the newer fields.
    config.setdefault("torch_dtype", config.get("dtype", "bfloat16"))
    config.setdefault("rope_theta", cfg.rope_theta)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    save_tokenizer(tokenizer, folder, cfg.context)


def _make_readable(folder: Path) -> None:
    """Give every file mode 0644 (safetensors writes 0600, which breaks shared installs)."""
    for path in folder.iterdir():
        if path.is_file():
            path.chmod(0o644)


DEFAULT_REPETITION_PENALTY = 1.3
"""Repetition penalty written into the exported generation_config.json (transformers' definition)."""


def _samples(model: torch.nn.Module, hf_tokenizer, max_new_tokens: int, device: torch.device) -> list[dict[str, str]]:
    samples = []
    for prompt in SAMPLE_PROMPTS:
        ids = hf_tokenizer(prompt, return_tensors="pt")["input_ids"].to(device)
        with torch.no_grad():
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                repetition_penalty=DEFAULT_REPETITION_PENALTY,
            )
        completion = hf_tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
        samples.append({"prompt": prompt, "completion": completion})
    return samples


def _lane_samples(folder: Path, max_new_tokens: int) -> list[dict[str, str]]:
    # transformers has no lane model: Solo's engine generates the samples (greedy + the same penalty).
    from solo.engine.engine import Engine
    from solo.engine.sampling import SamplingParams

    engine = Engine.load(folder, dtype="float32")
    params = SamplingParams(max_tokens=max_new_tokens, temperature=0, repetition_penalty=DEFAULT_REPETITION_PENALTY)
    return [{"prompt": p, "completion": engine.complete(p, params.copy()).text} for p in SAMPLE_PROMPTS]


def evaluate_folder(
    folder: Path,
    files: list[SourceFile],
    stride: int,
    device: torch.device | str = "cpu",
    batch_size: int = 8,
    amp_dtype: torch.dtype | None = None,
) -> dict[str, object]:
    """Score files with a saved model folder (weights upcast to float32 from their stored dtype).

    Args:
        folder: a Hugging Face folder with ``tokenizer.json`` and weights.
        files: files to score (their ``text`` and ``n_bytes`` are used).
        stride: window advance in tokens (see :func:`~solo.train.evaluate.scoring_windows`).
        device: where to run.
        batch_size: windows per forward pass.
        amp_dtype: autocast dtype for the forward pass, ``None`` for float32 compute.

    Returns:
        :meth:`HeldoutResult.as_dict` plus ``context``, ``stride`` and ``compute``.

    Raises:
        OSError: if the folder cannot be loaded by ``transformers``.
    """
    if json.loads((folder / "config.json").read_text()).get("model_type") == "laneformer":
        from solo.train.lanes import load_lane_model

        model = load_lane_model(folder, device)
    else:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device)
    tokenizer = load_tokenizer(folder)
    context = model.config.max_position_embeddings
    docs = encode_documents(tokenizer, [f.text for f in files])
    result = evaluate_documents(
        model,
        docs,
        sum(f.n_bytes for f in files),
        context,
        stride=stride,
        batch_size=batch_size,
        device=device,
        autocast_dtype=amp_dtype,
        pad_id=tokenizer.token_to_id(PAD_TOKEN),
    )
    compute = "float32" if amp_dtype is None else f"{amp_dtype} autocast".replace("torch.", "")
    return {**result.as_dict(), "context": context, "stride": stride, "compute": compute}


def run_recipe(cfg: TrainConfig, opts: RunOptions, log: Callable[[str], None] = print) -> dict[str, object]:
    """Run (or resume) the whole recipe and write the model folder to ``opts.out``.

    Args:
        cfg: hyper-parameters (ignored in favour of the stored ones when resuming).
        opts: run-time options.
        log: receives human-readable progress lines.

    Returns:
        The training summary (also written to ``<out>/training_summary.json``).

    Raises:
        FileExistsError: if ``out`` or an earlier run exists and neither ``resume`` nor
            ``overwrite`` is set.
        FileNotFoundError: on ``resume`` without a run to resume.
        ValueError: on an invalid configuration or a corpus/tokenizer that changed under a resumed run.
    """
    t_start = time.monotonic()
    cfg.validate()
    if opts.threads:
        torch.set_num_threads(opts.threads)
    cfg = _prepare_run_dir(cfg, opts, log)
    device = resolve_device(opts.device)
    amp = autocast_dtype(device, _run_precision(opts, log))
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    corpus = load_corpus(heldout_permille=cfg.heldout_permille, max_files=cfg.max_files)
    _check_recorded(opts.run_dir, "file_list_sha256", corpus.file_list_sha256, opts.resume)
    desc = corpus.describe()
    log(
        f"corpus: Python {corpus.python_version}, {desc['train_files']} train files "
        f"({desc['train_bytes']:,} bytes), {desc['heldout_files']} held-out files "
        f"({desc['heldout_bytes']:,} bytes), file-list sha256 {corpus.file_list_sha256[:16]}"
    )
    tokenizer, train_tokens, heldout_docs = _tokenize(cfg, corpus, opts, log)

    torch.manual_seed(cfg.seed)
    bos, eos, pad = (tokenizer.token_to_id(t) for t in (BOS_TOKEN, EOS_TOKEN, PAD_TOKEN))
    model = build_model(cfg, bos, eos, pad).to(device)
    n_params = count_parameters(model)
    log(
        f"model: {n_params:,} parameters; device {_describe_device(device)}; "
        f"autocast {amp if amp is not None else 'off (float32)'}; compile {opts.compile}"
    )

    schedule = BatchSchedule(train_tokens, cfg.context, cfg.batch_size, cfg.seed)
    trainer = Trainer(model, cfg, schedule, pack_documents(heldout_docs), opts.run_dir, device, amp, opts.compile, log)
    if opts.resume and (opts.run_dir / CHECKPOINT_NAME).is_file():
        trainer.load_checkpoint(opts.run_dir / CHECKPOINT_NAME)
        log(f"resumed at step {trainer.state.step} ({trainer.state.elapsed_s / 60:.1f} min trained)")
    elif opts.resume:
        log(f"--resume: {opts.run_dir} holds no checkpoint yet; training starts at step 0")
    state = trainer.train()

    # Everything below measures the folder exactly as shipped: bfloat16 weights, reloaded.
    export = opts.run_dir / "export"
    _export(model, tokenizer, cfg, export)
    del trainer
    t_eval = time.monotonic()
    # The full set runs at training precision (it is large); the small subset runs in float32 on
    # CPU so that tests on any machine can reproduce it closely.
    heldout = evaluate_folder(export, corpus.heldout, cfg.stride, device, opts.eval_batch_size, amp)
    subset_files = select_eval_subset(corpus.heldout)
    subset = evaluate_folder(export, subset_files, cfg.stride, "cpu", opts.eval_batch_size, None)
    xz_all = xz_bits_per_byte([f.text for f in corpus.heldout])
    xz_subset = xz_bits_per_byte([f.text for f in subset_files])
    log(
        f"held-out: loss {heldout['loss']:.4f} nats/token, {heldout['bits_per_byte']:.4f} bits/byte; "
        f"xz -9e {xz_all['concatenated_bits_per_byte']:.4f} (concatenated), "
        f"{xz_all['per_file_bits_per_byte']:.4f} (per file); evaluated in {time.monotonic() - t_eval:.0f} s"
    )

    if cfg.num_lanes:
        samples = _lane_samples(export, cfg.sample_tokens)
    else:
        hf_model = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32).to(device).eval()
        hf_tokenizer = AutoTokenizer.from_pretrained(export)
        samples = _samples(hf_model, hf_tokenizer, cfg.sample_tokens, device)

    history = state.history
    train_losses = [r["train_loss"] for r in history if "train_loss" in r]
    window_rates = [r["tokens_per_s"] for r in history if "tokens_per_s" in r]
    epochs = state.tokens_seen / max(1, len(train_tokens))
    time_limited = state.step < cfg.steps
    summary: dict[str, object] = {
        "model_name": opts.out.name,
        "architecture": "LaneformerForCausalLM" if cfg.num_lanes else "LlamaForCausalLM",
        "parameters": n_params,
        "non_embedding_parameters": n_params - cfg.vocab_size * cfg.hidden_size,
        "weights_dtype": "bfloat16",
        "config": cfg.to_dict(),
        "corpus": desc,
        "tokenizer": {
            "type": "byte-level BPE (Hugging Face tokenizers)",
            "vocab_size": tokenizer.get_vocab_size(),
            "sha256": tokenizer_sha256(tokenizer),
            "bos_token": BOS_TOKEN,
            "eos_token": EOS_TOKEN,
            "pad_token": PAD_TOKEN,
            "heldout_bytes_per_token": heldout["n_bytes"] / heldout["n_tokens"],
        },
        "training": {
            "steps": state.step,
            "tokens": state.tokens_seen,
            "epochs": epochs,
            "train_stream_tokens": int(len(train_tokens)),
            "train_time_s": state.elapsed_s,
            "tokens_per_s": state.tokens_seen / max(state.elapsed_s, 1e-9),
            "median_window_tokens_per_s": float(np.median(window_rates)) if window_rates else math.nan,
            "stopped_by_time_budget": time_limited,
            "final_train_loss": train_losses[-1] if train_losses else math.nan,
            "heldout_loss_curve": [(r["step"], r["heldout_loss"]) for r in history if "heldout_loss" in r],
            "device": device.type,
            "device_description": _describe_device(device),
            "precision": f"{'bfloat16 autocast' if amp is not None else 'float32'}, float32 weights and AdamW state",
            "compile": opts.compile,
            "torch_version": torch.__version__,
            "transformers_version": transformers.__version__,
            "python_version": platform.python_version(),
        },
        "heldout": {**heldout, "weights": "stored bfloat16 weights, upcast to float32"},
        "xz_heldout": {**xz_all, "preset": "9 | PRESET_EXTREME (xz -9e), .xz container"},
        "beats_xz": heldout["bits_per_byte"]
        < min(xz_all["concatenated_bits_per_byte"], xz_all["per_file_bits_per_byte"]),
        "eval_subset": {
            **subset,
            "file": EVAL_SUBSET_NAME,
            "files": [{"path": f.rel_path, "sha256": f.sha256, "n_bytes": f.n_bytes} for f in subset_files],
            "xz": xz_subset,
            "device": "cpu",
        },
        "samples": samples,
        "repetition_penalty": DEFAULT_REPETITION_PENALTY,
        "accounting": (
            "Each file is encoded BOS + text + EOS; BOS is given and not scored; text tokens and EOS are "
            "scored once each, files longer than the context in overlapping windows (see stride). "
            "bits_per_byte = summed NLL in bits / UTF-8 bytes of the files' text."
        ),
    }
    summary["wall_time_s"] = time.monotonic() - t_start  # this session only, when resumed

    (export / SUMMARY_NAME).write_text(json.dumps(summary, indent=2) + "\n")
    (export / EVAL_SUBSET_NAME).write_text(
        json.dumps(
            {
                "description": "Fixed subset of held-out files for re-checking the model's loss.",
                "license": CORPUS_LICENSE,
                "source": f"CPython {corpus.python_version} standard library",
                "files": [{"path": f.rel_path, "sha256": f.sha256, "text": f.text} for f in subset_files],
            },
            indent=1,
        )
        + "\n"
    )
    (export / "README.md").write_text(render_model_card(summary))
    _make_readable(export)

    replace_model_folder(export, opts.out, opts.run_dir)
    log(f"model folder written to {opts.out} in {summary['wall_time_s'] / 60:.1f} min")
    return summary
