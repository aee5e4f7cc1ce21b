"""`Engine`: load a model once, then generate from prompts or chat messages.

Example:
>>> engine = Engine.load("path/or/org-name", device="cpu", dtype="auto")
>>> for event in engine.generate("def fibonacci(n):", SamplingParams(max_tokens=64)):
...     print(event.text, end="")
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from solo.chat_template import (
    allows_parallel_calls,
    chat_template_origin,
    check_continued,
    check_template_kwargs,
    read_chat_template,
    template_messages,
)
from solo.cpus import usable_cpus
from solo.engine.block_decoding import can_run_in_blocks, run_in_blocks
from solo.engine.client import EngineCapabilities, EngineDeadError
from solo.engine.constraints import ConstraintCompiler
from solo.engine.fim import Fim, InfillLayout, detect_fim, infill_layout
from solo.engine.logits_processors import LogitsProcessors, bad_word_token_ids
from solo.engine.output_reader import OutputReader, splits_reasoning
from solo.engine.prefix_cache import DEFAULT_PREFIX_CACHE_GB, PrefixCache
from solo.engine.reasoning import continues_reasoning, detect_reasoning, prompt_opens_reasoning
from solo.engine.request import GenerationEvent, GenerationResult, Request
from solo.engine.sampling import SamplingParams, python_ints
from solo.engine.speculative import (
    SPECULATIVE_MODES,
    DraftProposer,
    SessionHistory,
    SpeculativeConfig,
    resolve_speculative,
    speculative_step,
)
from solo.engine.tool_calls import (
    TOOL_FORMATS,
    arguments_as_objects,
    check_prefill_opens_no_call,
    check_tools,
    output_constraint,
    tool_parameters,
)
from solo.errors import CheckpointError, ContextLengthError, InvalidRequestError, SoloError, SoloWarning
from solo.model.config import ModelConfig
from solo.model.generation_config import GenerationDefaults
from solo.model.hub import DTYPE_CHOICES, resolve_dtype, resolve_model_dir
from solo.model.transformer import Transformer
from solo.model.weights import checkpoint_dtype, load_weights
from solo.runtime import after_fork, create_runtime
from solo.runtime.base import DecodeRuntime, runtime_capabilities
from solo.tokenizer import Tokenizer

Prompt = str | Sequence[Mapping[str, Any]] | Sequence[int]
"""A prompt: text, chat messages ([{"role", "content"}, ...]) or token ids (ints, NumPy's too, or a 1-D NumPy array
or torch tensor of them)."""

_HANDOFF_WAIT_S = 1.0  # how long a thread holding an open stream waits for another to take it over
_CLOSED = "this engine was closed (Engine.close()); load another with Engine.load(...) to generate"

_log = logging.getLogger(__name__)


def resolve_device(device: str | torch.device) -> torch.device:
    """Validate a device name ("cpu", "cuda", "cuda:1").

    Raises:
        SoloError: CUDA was asked for but is not available, or the name is unknown.
    """
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise SoloError(f"unknown device {device!r}; use cpu or cuda") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SoloError("--device cuda was asked for but no CUDA GPU is visible to PyTorch; use --device cpu")
    if dev.type not in ("cpu", "cuda"):
        raise SoloError(f"unsupported device {device!r}; use cpu or cuda")
    return dev


def check_load_flags(device: torch.device, backend: str, tp: int, quantize: str | None, speculative: str) -> None:
    """Refuse flags that cannot go together whatever the model (as `Engine.load` would, before it loads one).

    Raises:
        SoloError: a CUDA-only backend on another device; --tp beside --quantize, a backend other than the
            eager one, or speculative decoding other than auto / off.
    """
    if backend in ("cuda-graph", "megakernel") and device.type != "cuda":
        raise SoloError(f"the {backend} backend runs on a CUDA GPU, and the device is {device.type}; use --backend "
                        "auto, cpu or eager (or --device cuda)")
    if tp != 1 and (quantize is not None or backend not in ("auto", "eager")):
        raise SoloError("--tp runs the eager model on every rank; drop --quantize and --backend")
    if tp != 1 and speculative not in ("auto", "off"):
        raise SoloError(f"--speculative {speculative} needs a runtime with multi-token verify; the "
                        "tensor-parallel runtime (--tp) has none: use --speculative off (or auto)")


@dataclass
class PreparedPrompt:
    """A prompt turned into token ids, with the generation budget it fits.

    Attributes:
        token_ids: the prompt ids.
        max_new_tokens: tokens that may be generated.
    """

    token_ids: list[int]
    max_new_tokens: int


def _room_note(limit: int, max_tokens: int | None, param: str) -> str:
    # How long a prompt may be, for an error about one that alone fills the context.
    if max_tokens is None:
        return f"at most {limit - 1} prompt tokens leave room for one new token"
    if max_tokens < limit:
        return f"at most {limit - max_tokens} prompt tokens leave room for {param} {max_tokens}"
    return f"and {param} {max_tokens} alone does not fit either: lower it below {limit}"


def context_budget(prompt_len: int, max_tokens: int | None, limit: int, context_name: str,
                   param: str = "max_tokens", prompt_param: str = "prompt") -> int:
    """Tokens a request may generate: `max_tokens`, or what is left of `limit` when None.

    Args:
        prompt_len: prompt tokens.
        max_tokens: what the request asked for, or None.
        limit: tokens the prompt and the completion may take together.
        context_name: what `limit` is, for the error ("the model's context", "this server's --max-model-len").
        param: the request field that set max_tokens; prompt_param: the one that holds the prompt.

    Raises:
        ContextLengthError: the prompt alone, or with max_tokens, exceeds `limit`; the message gives the
            numbers. Never truncated silently.
    """
    if prompt_len >= limit:
        need = (f"{prompt_len + max_tokens} tokens (prompt {prompt_len} + {param} {max_tokens})"
                if max_tokens is not None else f"at least {prompt_len + 1} tokens (prompt {prompt_len} + 1 new token)")
        raise ContextLengthError(
            f"this request needs {need} but {context_name} is {limit}; shorten the prompt (the prompt alone "
            f"{'fills' if prompt_len == limit else 'exceeds'} it; {_room_note(limit, max_tokens, param)})",
            param=prompt_param, prompt_tokens=prompt_len, max_tokens=max_tokens, limit=limit)
    room = limit - prompt_len
    if max_tokens is None:
        return room
    if max_tokens > room:
        raise ContextLengthError(
            f"this request needs {prompt_len + max_tokens} tokens (prompt {prompt_len} + {param} {max_tokens}) "
            f"but {context_name} is {limit}; lower {param} to at most {room} or shorten the prompt", param=param,
            prompt_tokens=prompt_len, max_tokens=max_tokens, limit=limit)
    return max_tokens


def _cpu_kernels_run(config: ModelConfig) -> bool:
    from solo.runtime.cpu import cpu_config_unsupported_reason

    return cpu_config_unsupported_reason(config) is None


def load_dtype(dtype: str | torch.dtype, config: ModelConfig, folder: Path | None, device: torch.device,
               backend: str = "auto", tp: int = 1) -> torch.dtype:
    """The dtype `Engine.load` loads a model's weights in (`solo bench` loads them so too).

    "auto" is the checkpoint's dtype: config.json's `dtype` (or `torch_dtype`), else (none, transformers' "auto",
    or one Solo does not load in: a SoloWarning for the last) that of the first floating-point tensor of its
    weights (as transformers reads it), else float32; float16 then becomes bfloat16 where the native CPU kernels
    will run the model (they read bfloat16 and float32; float16 would run on the eager reference). float32 on the
    conversion of a quantized GGUF file (stored dequantized to bfloat16) warns that it computes with those values.

    Args:
        dtype: "auto", a dtype name or a torch dtype (`solo.model.hub.resolve_dtype`).
        config: the model's config.
        folder: the model folder (its weights' dtype where config.json names none), or None (random weights).
        device, backend, tp: where and how the model will run.

    Raises:
        SoloError: an unknown dtype.
    """
    named = config.torch_dtype
    # (config.json naming none, transformers' "auto", or a dtype Solo does not load in: the weights' own, read from
    # their header as transformers reads it where config.json names none)
    weights = checkpoint_dtype(folder) if dtype == "auto" and folder is not None \
        and str(named) not in DTYPE_CHOICES[1:] else None
    torch_dtype = resolve_dtype(dtype, named, weights)
    if torch_dtype == torch.float16 and dtype == "auto" and device.type == "cpu" and backend in ("auto", "cpu") \
            and tp == 1 and config.lanes is None and _cpu_kernels_run(config):
        # As vLLM on CPUs: the native kernels read bfloat16 (float16 would run on the eager reference, 100x+
        # slower); exact for weights that came from bfloat16 (most F16 GGUF files).
        _log.warning("float16 weights are loaded as bfloat16 for the CPU kernels (--dtype float32 keeps every bit; "
                     "--dtype float16 runs the slow eager reference)")
        torch_dtype = torch.bfloat16
    if folder is not None and torch_dtype.itemsize > 2:
        from solo.model.gguf import stored_dequantized

        if (held := stored_dequantized(folder)) is not None:  # (said when loaded: the conversion says it once)
            warnings.warn(f"{held[0]} held {', '.join(held[1])} weights, which its conversion stores dequantized to "
                          f"{held[2]}: {str(torch_dtype).removeprefix('torch.')} computes with those {held[2]} values, "
                          "not the file's exact ones (they need more bits); the original checkpoint (safetensors, or "
                          "an F16 / BF16 GGUF file) keeps every bit", SoloWarning, stacklevel=2)
    return torch_dtype


def _context_name(config: ModelConfig, context_length: int | None) -> str | None:
    # What a too-long prompt's error calls the limit: the user's own setting when they gave one; a LongRoPE
    # model's original context names the way to its long one.
    if context_length is not None:
        return "the context it was loaded with (context_length, --max-model-len)"
    if config.max_context_length > config.context_length:
        return (f"the model's original context (--max-model-len up to {config.max_context_length} extends it, with "
                "LongRoPE's long factors)")
    return None


class Engine:
    """A loaded model ready to generate.

    Build one with `Engine.load`. `generate` streams `GenerationEvent`s; `complete` returns a
    `GenerationResult`. Calls from several threads run one at a time. The CLI and the server read it
    through `solo.engine.client.EngineInfo` (backend, device, capabilities, health), not its runtime.

    Args:
        model: the eager reference model (weights).
        tokenizer: the model's tokenizer.
        defaults: generation defaults from generation_config.json.
        runtime: the decode runtime.
        model_dir: the folder the model came from.
        name: a display name for the model.
        prefix_cache_gb: bound of the prefix cache's snapshot store in GB (10^9 bytes); None turns prefix
            caching off (see `solo.engine.prefix_cache`).
        speculative: "auto", "off", "ngram" or "suffix" (see `solo.engine.speculative`).
        context_name: what errors call `config.context_length`; None: "the model's context".

    Attributes:
        prefix_cache: the `PrefixCache`, or None when off.
        speculative: the speculative mode in use ("off", "ngram" or "suffix").
        context_name: what errors call `config.context_length` ("the model's context", or the setting the
            engine was loaded with).

    Raises:
        SoloError: a negative prefix_cache_gb, an unknown speculative mode, or one the runtime cannot run.
    """

    def __init__(self, model: Transformer, tokenizer: Tokenizer, defaults: GenerationDefaults,
                 runtime: DecodeRuntime, model_dir: Path, name: str, prefix_cache_gb: float | None = None,
                 speculative: str = "off", context_name: str | None = None) -> None:
        self.model = model
        self.config: ModelConfig = model.config
        self.tokenizer = tokenizer
        self.defaults = defaults
        self.runtime = runtime
        self.model_dir = model_dir
        self.name = name
        self.context_name = context_name or "the model's context"
        self.eos_ids = set(defaults.eos_token_ids) or set(self.config.eos_token_ids)
        self._lock = threading.Lock()
        self._owner: int | None = None  # thread running a generation: a second one there would deadlock
        self._closed = False
        self._constraints: ConstraintCompiler | None = None
        self._constraints_lock = threading.Lock()
        if prefix_cache_gb is not None and not 0 <= prefix_cache_gb < float("inf"):
            raise SoloError(f"--prefix-cache-gb must be a number of GB >= 0, got {prefix_cache_gb}")
        if self.config.rope.prefills_whole:  # (a cached prefix keeps its own, shorter length's rotation)
            prefix_cache_gb = None
        self.prefix_cache = None if prefix_cache_gb is None else PrefixCache(runtime, int(prefix_cache_gb * 1e9))
        self.speculative = resolve_speculative(speculative, runtime)
        self.speculative_config = SpeculativeConfig.for_mode(self.speculative)
        self.session_history = SessionHistory() if self.speculative == "suffix" else None
        self._runtime_capabilities = runtime_capabilities(runtime)
        self._forked_mid_generation = False  # (after_fork_in_child)
        after_fork.track(self)  # a forked child runs it on one thread instead of hanging

    # ------------------------------------------------------------------- the client interface (EngineInfo)

    @property
    def backend_name(self) -> str:
        """The runtime's short name ("cpu", "eager", "cuda-graph", ...)."""
        return self._runtime_capabilities.name

    @property
    def device(self) -> torch.device:
        """Where the model runs (logits come back there)."""
        return self.runtime.device

    @property
    def capabilities(self) -> EngineCapabilities:
        """What the runtime declares (verify, KV snapshots, block decoding) and what this engine turned on."""
        cache = self.prefix_cache
        return EngineCapabilities(runtime=self._runtime_capabilities, prefix_cache=cache is not None,
                                  prefix_cache_store=cache is not None and cache.capacity_bytes > 0,
                                  speculative=self.speculative)

    @property
    def errored(self) -> bool:
        """True once the runtime failed for good (a tensor-parallel rank died)."""
        return bool(getattr(self.runtime, "failed", None))

    @property
    def is_running(self) -> bool:
        """True while the engine can generate (not failed, not closed)."""
        return not self.errored and not self._closed

    def check_health(self) -> None:
        """Return if the engine can generate.

        Raises:
            EngineDeadError: the runtime failed, or the engine was closed (the message says which).
        """
        failed = getattr(self.runtime, "failed", None)
        if failed:
            raise EngineDeadError(f"the {self.backend_name} runtime stopped: {failed}")
        if self._closed:
            raise EngineDeadError(_CLOSED)

    @property
    def kv_cache_element_bytes(self) -> int:
        """Bytes per element of the KV cache (every runtime keeps it in the model's dtype)."""
        return torch.empty((), dtype=self.model.dtype).element_size()

    @property
    def kv_heads_in_memory(self) -> int:
        """KV heads per layer whose cache the memory of `device` holds (what the server sizes the KV cache with).

        The model's count, or a tensor-parallel runtime's: on the CPU every rank's, a KV head copied to several
        ranks once per rank; on CUDA rank 0's share.
        """
        heads = getattr(self.runtime, "kv_heads_in_memory", None)
        return self.config.num_kv_heads if heads is None else heads

    def step_memory_bytes(self, rows: int, max_seq: int, entries: int) -> int:
        """Bytes a decode step may allocate beside a KV cache of `rows` x `max_seq` tokens, for calls of `entries`.

        `entries`: the most sequence-tokens one step feeds (decode rows with their drafts, plus prompt pieces).
        The runtime's own figure where it allocates such memory as steps grow (the native CPU runtime's
        workspace: `CpuRuntime.step_memory_bytes`), else 0. What a server sets aside beside the KV cache.
        """
        measure = getattr(self.runtime, "step_memory_bytes", None)
        return 0 if measure is None else int(measure(rows, max_seq, entries))

    def reserve_step_memory(self, entries: int) -> None:
        """Allocate now what `step_memory_bytes` counts at the runtime's reserved cache (where the runtime has it).

        Raises:
            KVCacheMemoryError: it does not fit in the memory left.
        """
        reserve = getattr(self.runtime, "reserve_step_memory", None)
        if reserve is not None:
            reserve(entries)

    def close(self) -> None:
        """Release what the engine holds besides memory (idempotent).

        A tensor-parallel runtime's follower processes and process group go, so that another `tp` engine can
        load in this process; a single-process runtime holds nothing to release. Whatever the runtime, the
        engine generates no more afterwards (`is_running` turns False; a generation or `warm_up` raises
        `SoloError`, and so does one running in another thread or an open stream, at its next step).
        `with Engine.load(...) as engine:` closes it on leaving the block.
        """
        self._closed = True
        close = getattr(self.runtime, "close", None)
        if callable(close):
            close()

    def after_fork_in_child(self) -> None:
        """Called in a child made by `os.fork()` (by `solo.runtime.after_fork`).

        A generation that another thread was running at the fork holds the lock and the KV cache there, half
        done, for ever: the engine refuses its calls instead of waiting for it.
        """
        if self._lock.locked() and self._owner != threading.get_ident():
            self._forked_mid_generation = True
            self._lock = threading.Lock()  # (its holder does not exist here)

    @contextmanager
    def _held(self, refusal: str) -> Iterator[None]:
        # The engine's lock. A thread that holds an open stream (the last to read it) and waits here would
        # wait forever: refused, unless another thread takes the stream over (reads it) within a second, as a
        # thread pool does with a server's streams (an immediate refusal failed the next stream that the pool
        # happened to start on the same thread).
        me = threading.get_ident()
        deadline = time.monotonic() + _HANDOFF_WAIT_S
        acquired = False
        while self._owner == me and not acquired:
            acquired = self._lock.acquire(timeout=0.02)
            if not acquired and self._closed:
                raise SoloError(_CLOSED)
            if not acquired and time.monotonic() > deadline:
                raise SoloError(refusal)
        if not acquired:
            self._lock.acquire()
        try:
            yield
        finally:
            self._lock.release()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def warm_up(self) -> None:
        """Run one prefill and one decode step in row 0 (one-time costs stay off the first request's TTFT).

        The allocator and kernel selection pay their first-call costs here. Row 0's KV is overwritten (and
        forgotten by the prefix cache); a cache of at least 1 row x 2 tokens is reserved where none is. Takes
        the engine's lock as a generation does (another thread's call waits for it).

        Raises:
            SoloError: the engine was closed, or a stream from it is still open in this thread (this thread read
                it last, and no other takes it over within a second).
        """
        if self._closed:
            raise SoloError(_CLOSED)
        with self._held("warm_up() while a stream from this engine is open in this thread would overwrite its "
                        "KV cache; read the stream to the end or close() it first"):
            if self._closed:  # (closed while this waited for a generation to finish)
                raise SoloError(_CLOSED)
            runtime = self.runtime
            if self.prefix_cache is not None:
                self.prefix_cache.reserve(1, 2)
                self.prefix_cache.forget(0)
            else:
                runtime.reserve(1, 2)
            runtime.prefill(0, torch.zeros(1, dtype=torch.long))
            runtime.decode(torch.zeros(1, dtype=torch.long), torch.zeros(1, dtype=torch.long),
                           torch.ones(1, dtype=torch.long))

    @functools.cached_property
    def fim(self) -> Fim | None:
        """The model's fill-in-the-middle format (`solo.engine.fim`), or None when its vocabulary has none."""
        return detect_fim(self.tokenizer.backend.token_to_id)

    def infill_prompt(self, prefix: str, suffix: str) -> str:
        """The prompt text whose continuation fills the gap between `prefix` and `suffix` (FIM).

        Raises:
            InvalidRequestError: the model has no FIM tokens, or prefix / suffix is not a string.
        """
        if self.fim is None:
            raise InvalidRequestError("this model has no fill-in-the-middle tokens (such as Qwen2.5-Coder's "
                                      "<|fim_prefix|>, StarCoder's <fim_prefix>, DeepSeek-Coder's <｜fim▁begin｜>), "
                                      "so it cannot fill in a suffix; leave suffix out, or serve a code model "
                                      "trained for it", param="suffix")
        if not isinstance(prefix, str) or not isinstance(suffix, str):
            raise InvalidRequestError("fill-in-the-middle takes text: the prompt (before the gap) and suffix (after "
                                      "it) must be strings", param="suffix")
        return self.fim.format.prompt(prefix, suffix)

    def infill_ids(self, prefix: str, suffix: str) -> list[int]:
        """Token ids of `infill_prompt(prefix, suffix)`, the code read as text.

        The whole prompt is encoded as transformers encodes it (the tokenizer's own additions, such as BOS,
        included). Where the code itself holds an added token's text (a FIM marker in a tokenizer's config being
        edited), that text stays text instead of becoming a marker that breaks the layout: the code between the
        markers is encoded plain (`Tokenizer.encode_plain`).

        Raises:
            InvalidRequestError: see `infill_prompt`.
        """
        text = self.infill_prompt(prefix, suffix)
        ids = self.tokenizer.encode(text)
        if not any(marker in prefix or marker in suffix for marker in self.tokenizer.added_token_texts()):
            return ids
        fmt, token = self.fim.format, self.tokenizer.backend.token_to_id  # type: ignore[union-attr]
        first, last = ids.index(token(fmt.prefix)), len(ids) - 1 - ids[::-1].index(token(fmt.middle))
        plain = self.tokenizer.encode_plain
        return [*ids[:first], token(fmt.prefix), *plain(prefix), token(fmt.suffix), *plain(suffix), token(fmt.middle),
                *ids[last + 1:]]

    def infill_layout(self, prefix: str, suffix: str, files: Sequence[tuple[str, str]] = (),
                      budget: int | None = None) -> InfillLayout:
        """A fill-in-the-middle prompt with other files' code, fitted in `budget` tokens.

        llama-server's `/infill` layout (`solo.engine.fim.infill_layout`): the files first, then `infill_ids(prefix,
        suffix)`; to fit, the oldest files are left out, then the prefix's start and the suffix's end are cut, and
        the result says what was.

        Args:
            prefix, suffix: the code before and after the gap.
            files: (path, text) of other files, oldest first.
            budget: the most tokens the prompt may take (None: no limit).

        Raises:
            InvalidRequestError: see `infill_prompt`; a path or text is not a string; the budget cannot hold
                the layout's markers (param "budget").
        """
        whole = self.infill_ids(prefix, suffix)
        for path, text in files:
            if not isinstance(path, str) or not isinstance(text, str):
                raise InvalidRequestError("each other file is a path and its text, both strings", param="files")
        assert self.fim is not None  # (infill_ids refused a model without)
        try:
            return infill_layout(self.fim, self.tokenizer.encode_plain, whole, prefix, suffix, files, budget)
        except ValueError as exc:
            raise InvalidRequestError(f"{exc}; raise the budget", param="budget") from None

    @property
    def constraints(self) -> ConstraintCompiler:
        """The grammar compiler for this model's tokenizer (structured output; built on first use)."""
        with self._constraints_lock:
            if self._constraints is None:
                # The mask thread needs a core the decode step leaves free (see ConstraintCompiler).
                spare_core = self.runtime.device.type != "cpu" or usable_cpus() >= torch.get_num_threads() + 1
                self._constraints = ConstraintCompiler(self.tokenizer, self.config.vocab_size, sorted(self.eos_ids),
                                                       overlap=spare_core)
            return self._constraints

    @classmethod
    def load(
        cls,
        model: str | Path | None = None,
        device: str | torch.device = "cpu",
        dtype: str | torch.dtype = "auto",
        backend: str = "auto",
        revision: str | None = None,
        quantize: str | None = None,
        prefix_cache_gb: float | None = DEFAULT_PREFIX_CACHE_GB,
        speculative: str = "auto",
        tp: int = 1,
        context_length: int | None = None,
        chat_template: str | Path | None = None,
        tool_call_parser: str | None = None,
    ) -> Engine:
        """Load a model folder, a Hugging Face Hub id, or (with `model=None`) Solo's bundled model.

        Args:
            model: folder path, hub id ("org/name"), or None for the bundled default model.
            device: "cpu" or "cuda[:N]".
            dtype: "auto" (the checkpoint's dtype), "float32", "bfloat16" or "float16".
            backend: "auto" picks the fastest runtime for the device; "eager" forces the reference.
            revision: hub branch, tag or commit.
            quantize: None, or "int8" / "int4" weight-only quantization (CPU only; `solo.runtime.quant`).
            prefix_cache_gb: bound of the prefix cache's snapshot store in GB; None turns prefix caching off.
            speculative: "auto" (n-gram drafts on the native CPU runtime, off elsewhere), "off", "ngram", "suffix".
            tp: tensor-parallel ranks (`solo.distributed`): > 1 spawns tp - 1 follower processes (or joins a
                torchrun job as rank 0) and runs the eager model sharded over them; that runtime has neither
                prefix caching (prefix_cache_gb is not used) nor speculative verify ("ngram" / "suffix" refused).
            context_length: longest sequence (prompt + generated) to accept, in tokens; None for the model's
                (`ModelConfig.context_length`). Lower saves KV-cache memory; a LongRoPE model (Phi-3) accepts up
                to its long context and then takes its long factors at every position (see
                `ModelConfig.with_context_length`).
            chat_template: a chat template to use instead of the model's: a file's path or the template text
                (vLLM's `--chat-template`).
            tool_call_parser: the tool-call syntax to parse (`solo.engine.tool_calls.TOOL_FORMATS`) instead of
                the one detected from the template (vLLM's `--tool-call-parser`).

        Raises:
            ModelNotFoundError, CheckpointError, UnsupportedArchitectureError: see their docs.
            SoloError: an unknown dtype, device, backend, quantization or speculative mode; `quantize` off
                the CPU; a backend that cannot run this model; int4 on sizes that are not multiples of 32; a
                context_length the model cannot take.
        """
        if speculative not in SPECULATIVE_MODES:  # before the slow part
            raise SoloError(f"unknown speculative mode {speculative!r}; choose one of {', '.join(SPECULATIVE_MODES)}")
        if tool_call_parser is not None and tool_call_parser not in TOOL_FORMATS:
            raise SoloError(f"unknown tool-call parser {tool_call_parser!r}; choose one of {', '.join(TOOL_FORMATS)}")
        template_text = None if chat_template is None else read_chat_template(chat_template)
        # Python callers get a named error for a wrong type, not a TypeError from a comparison deep inside.
        if not isinstance(tp, int) or isinstance(tp, bool):
            raise SoloError(f"tp must be an integer (ranks), got {tp!r}")
        if prefix_cache_gb is not None and (not isinstance(prefix_cache_gb, int | float)
                                            or isinstance(prefix_cache_gb, bool)):
            raise SoloError(f"prefix_cache_gb must be a number of GB or None (off), got {prefix_cache_gb!r}")
        if isinstance(model, str) and not model.strip():
            raise SoloError('model is an empty string; give a folder, a hub id, a .gguf file, or None for the '
                            "bundled model")
        dev = resolve_device(device)
        folder = resolve_model_dir(model, revision)
        config = ModelConfig.from_file(folder)
        if context_length is not None:
            config = config.with_context_length(context_length)
        torch_dtype = load_dtype(dtype, config, folder, dev, backend, tp)
        tokenizer = Tokenizer.from_folder(folder)
        if chat_template is not None or tool_call_parser is not None:
            try:
                tokenizer.use_chat_template(template_text, tool_call_parser,
                                            origin=chat_template_origin(chat_template or ""))
            except InvalidRequestError as exc:  # (a request's error type; here the caller's)
                raise SoloError(str(exc)) from None
        if tokenizer.chat_template_error is not None:
            warnings.warn(f"{tokenizer.chat_template_error}; chat messages are refused unless a working template "
                          "is given (--chat-template); plain prompts run", SoloWarning, stacklevel=2)
        defaults = GenerationDefaults.from_folder(folder, fallback_eos_ids=config.eos_token_ids)
        if tp != 1:
            from solo.distributed.launch import start_ranks

            check_load_flags(dev, backend, tp, quantize, speculative)
            runtime = start_ranks(folder, config, torch_dtype, dev, tp)
            return cls(runtime.model, tokenizer, defaults, runtime, folder, str(model) if model else folder.name,
                       context_name=_context_name(config, context_length))
        weights = load_weights(folder, config, torch_dtype, dev)
        if quantize is not None:
            if dev.type != "cpu":
                raise SoloError("--quantize is implemented for the CPU runtime only; drop it or use --device cpu")
            if config.lanes is not None:
                raise SoloError("--quantize is not implemented for lane models (Laneformer); drop it")
            from solo.runtime.quant import quantize_model

            weights = quantize_model(weights, quantize)
        runtime = create_runtime(weights, backend, dev)
        name = str(model) if model is not None else folder.name
        return cls(weights, tokenizer, defaults, runtime, folder, name, prefix_cache_gb=prefix_cache_gb,
                   speculative=speculative, context_name=_context_name(config, context_length))

    # ----------------------------------------------------------------------------------------- prompts

    def encode_prompt(self, prompt: Prompt, chat_template_kwargs: Mapping[str, Any] | None = None) -> list[int]:
        """Token ids of a prompt.

        Text gets the tokenizer's special tokens (e.g. BOS; "" is BOS alone), messages are rendered with the chat
        template (and `chat_template_kwargs`, checked as `make_request` checks them), ids pass through.

        Raises:
            InvalidRequestError: an empty prompt (text one where the tokenizer adds no BOS), messages without a
                chat template, ids out of range.
        """
        if not isinstance(prompt, str | list | tuple) and getattr(prompt, "ndim", None) == 1:
            prompt = prompt.tolist()  # a 1-D NumPy array or torch tensor of token ids
        if isinstance(prompt, list | tuple):
            prompt = python_ints(prompt)
        if isinstance(prompt, str):  # ("" is the tokenizer's BOS alone, where it adds one, as transformers takes it)
            ids = self.tokenizer.encode(prompt)
            if not ids and not prompt:
                raise InvalidRequestError("the prompt is empty and this model's tokenizer adds no BOS token to start "
                                          "from; give some text", param="prompt")
        elif not isinstance(prompt, list | tuple) or not prompt or not (
            all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
            or all(isinstance(m, Mapping) for m in prompt)
        ):
            several = isinstance(prompt, list | tuple) and bool(prompt) and all(
                isinstance(p, str) or (isinstance(p, list | tuple) and p) for p in prompt
            )  # a batch of prompts, as vLLM's LLM.generate takes
            raise InvalidRequestError(
                "the prompt must be text (str), a non-empty list of chat messages ({'role': ..., 'content': ...}) "
                f"or a non-empty list of token ids (int), got {_describe(prompt)}"
                + ("; for several prompts, call complete() or generate() once per prompt (the engine runs one "
                   "generation at a time; `solo serve` batches concurrent requests)" if several else ""),
                param="prompt",
            )
        elif all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            ids = list(prompt)  # type: ignore[arg-type]
            bad = [t for t in ids if not 0 <= t < self.config.vocab_size]
            if bad:
                raise InvalidRequestError(
                    f"token id {bad[0]} is outside the vocabulary [0, {self.config.vocab_size})", param="prompt"
                )
        else:
            ids = self.tokenizer.encode_chat(arguments_as_objects(template_messages(prompt)),  # type: ignore[arg-type]
                                             **self._template_kwargs(chat_template_kwargs))
        if not ids:
            raise InvalidRequestError("the prompt encodes to no tokens; give some text", param="prompt")
        if (largest := max(ids)) >= self.config.vocab_size:  # only a tokenizer's ids can get here
            raise CheckpointError(
                f"the tokenizer gave token id {largest}, outside the model's vocabulary [0, "
                f"{self.config.vocab_size}): the tokenizer does not belong to this model (use the model's own "
                "tokenizer files)")
        return ids

    def _template_kwargs(self, kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
        # chat_template_kwargs checked against the template (see `check_template_kwargs`).
        template = self.tokenizer.chat_template
        source = template.source if template is not None else None
        return check_template_kwargs(kwargs, source, thinks=detect_reasoning(source))

    def prepare(self, prompt: Prompt, max_tokens: int | None) -> PreparedPrompt:
        """Encode a prompt and check it fits the context with `max_tokens` new tokens.

        Returns:
            The ids and the token budget (`max_tokens`; when None, what is left of the context, at most the
            generation config's `max_new_tokens` where it sets one, as transformers and vLLM take it).

        Raises:
            InvalidRequestError: see `encode_prompt`.
            ContextLengthError: the prompt alone, or the prompt plus `max_tokens`, exceeds the context;
                the message gives the numbers.
        """
        ids = self.encode_prompt(prompt)
        budget = context_budget(len(ids), max_tokens, self.config.context_length, self.context_name)
        if max_tokens is None and self.defaults.max_new_tokens is not None:
            budget = min(budget, self.defaults.max_new_tokens)
        return PreparedPrompt(ids, budget)

    def make_request(self, prompt: Prompt, params: SamplingParams | Mapping[str, Any] | None = None,
                     fallback_temperature: float = 0.0, start_time: float | None = None,
                     tools: Sequence[Mapping[str, Any]] | None = None, tool_choice: Any = None,  # noqa: ANN401
                     parallel_tool_calls: bool = True,
                     chat_template_kwargs: Mapping[str, Any] | None = None,
                     continue_final_message: bool = False, suffix: str | None = None,
                     rendered_chat: bool = False) -> Request:
        """Encode, validate and resolve a request without running it (the server's scheduler runs it).

        Args:
            prompt: text, messages or ids.
            params: sampling parameters (None: all defaults); a dict of `SamplingParams` fields works too.
            fallback_temperature: temperature when neither request nor model sets one.
            start_time: arrival time (`time.perf_counter()`), for TTFT.
            tools: OpenAI tools (messages only), rendered through the chat template (`solo.engine.tool_calls`).
            tool_choice: "auto" (default with tools), "none", "required" or {"type": "function", "function":
                {"name": ...}}; the last two constrain the output to tool calls.
            parallel_tool_calls: allow several calls in one reply (a template that takes one call per turn, as
                Llama 3.x's, gets one whatever this says).
            chat_template_kwargs: extra variables for the chat template (messages only), as vLLM's field:
                {"enable_thinking": False} turns a Qwen3-style model's thinking off.
            continue_final_message: the model continues the last message (a prefill, usually the assistant's
                start of a reply) instead of starting a new one, as vLLM's `LLM.chat(continue_final_message=True)`;
                a prefill that opens a `<think>` block is continued as reasoning.
            suffix: the text after the gap: the prompt (text) is the text before it and the output fills it in
                (fill-in-the-middle, `infill_prompt`; OpenAI's completions `suffix`), ending at the model's EOS
                or its FIM end tokens (as does a text or id prompt holding the FIM middle marker, laid out by
                the caller); None or empty: no suffix.
            rendered_chat: the prompt's ids are a conversation the caller rendered with the chat template (the
                server's chat route): a FIM marker in it is a message's text, not a FIM layout.

        Returns:
            The request, not yet prefilled; `tool_call_format` is set when its output holds tool calls.

        Raises:
            InvalidRequestError, ContextLengthError: see `prepare` and `SamplingParams.validate`; also an
                unknown key in a `params` dict, or `params` of another type; an invalid or unsupported
                response_format; bad tools (see `check_tools`); chat_template_kwargs without messages, naming
                a variable Solo sets itself or one the template never reads (enable_thinking excepted where
                the model does not think), or an enable_thinking that is not a boolean; continue_final_message
                without messages, beside an output grammar (or forced / strict tool calls), or continuing a
                message that holds tool calls; a suffix beside a prompt that is not text, or on a model without
                FIM tokens; min_tokens above what the request may generate when max_tokens is not given.
        """
        if self._closed:
            raise SoloError(_CLOSED)
        after_fork.warn_if_forked()
        params = _as_sampling_params(params)
        params.validate()
        if not isinstance(parallel_tool_calls, bool):
            raise InvalidRequestError(f"parallel_tool_calls must be true or false, got {parallel_tool_calls!r:.40}",
                                      param="parallel_tool_calls")
        tool_format, forced = None, False
        chat = isinstance(prompt, list | tuple) and bool(prompt) and all(isinstance(m, Mapping) for m in prompt)
        template = self.tokenizer.chat_template
        extra = self._template_kwargs(chat_template_kwargs)
        if extra and not chat:
            raise InvalidRequestError("chat_template_kwargs need chat messages as the prompt",
                                      param="chat_template_kwargs")
        if not isinstance(continue_final_message, bool) or (continue_final_message and not chat):
            raise InvalidRequestError("continue_final_message must be true or false, and true needs chat messages as "
                                      "the prompt (it continues the last one)", param="continue_final_message")
        messages = template_messages(prompt) if chat else None  # (text parts joined, as the server joins them)
        if suffix is not None and not isinstance(suffix, str):
            raise InvalidRequestError(f"suffix must be text, got {suffix!r:.40}", param="suffix")
        suffix = suffix or None  # (an empty suffix is none, as OpenAI's)
        if suffix is not None:
            if not isinstance(prompt, str):
                raise InvalidRequestError("suffix fills in the gap after a text prompt; send the prompt as text (not "
                                          "messages or token ids)", param="suffix")
            prompt = self.infill_ids(prompt, suffix)
        render = {"add_generation_prompt": False, "continue_final_message": True} if continue_final_message else {}
        parallel = parallel_tool_calls
        if tools or tool_choice not in (None, "none", "auto"):
            if not chat:
                raise InvalidRequestError("tools need chat messages as the prompt", param="tools")
            tool_format, tools, choice = check_tools(tools, tool_choice, template.source if template else None,
                                                     template.tool_format if template else None)
            parallel = allows_parallel_calls(template, parallel_tool_calls)
            spec, forced = output_constraint(tool_format, tools, choice, parallel, params.response_format)
            if spec is not params.response_format:  # a forced call's grammar, or strict functions' (auto)
                params = params.copy(response_format=spec)
            if choice == "none":
                tool_format = None
            prompt = self.tokenizer.encode_chat(arguments_as_objects(messages), tools=list(tools) or None, **extra,
                                                **render)
        elif extra or render:  # (the variables are checked above; `prepare` checks the ids)
            prompt = self.tokenizer.encode_chat(arguments_as_objects(messages), **extra, **render)
        if continue_final_message:
            check_continued(messages[-1], params.response_format)
            check_prefill_opens_no_call(tool_format, messages[-1].get("content"))
        bad_ids = [t for t in params.stop_token_ids if t >= self.config.vocab_size]
        if bad_ids:
            raise InvalidRequestError(
                f"stop_token_ids holds {bad_ids[0]}, outside the vocabulary [0, {self.config.vocab_size})",
                param="stop_token_ids",
            )
        prepared = self.prepare(prompt, params.max_tokens)
        if params.max_tokens is None and params.min_tokens > prepared.max_new_tokens:  # (as the server says it)
            room = self.config.context_length - len(prepared.token_ids)
            raise InvalidRequestError(
                f"min_tokens ({params.min_tokens}) exceeds the {prepared.max_new_tokens} tokens this request may "
                + (f"generate in what the prompt leaves of {self.context_name}; lower min_tokens or shorten the "
                   "prompt" if params.min_tokens > room else "generate without max_tokens (the generation config's "
                   "max_new_tokens); send max_tokens >= min_tokens"), param="min_tokens")
        # ignore_eos drops the model's EOS ids only: the user's stop_token_ids still stop, as in vLLM. A stop
        # string that is a special token never appears in the (special-token-free) text: match its id.
        special = self.tokenizer.special_token_ids()
        # A FIM prompt's middle ends at the FIM end tokens, whether Solo laid it out (suffix) or the client did
        # (a completion prompt holding the middle marker, as Tabby's and Twinny's templates write it).
        infill = self.fim is not None and not chat and not rendered_chat and (
            suffix is not None or self.fim.middle_id in prepared.token_ids)
        fim_ends = set(self.fim.end_ids) if infill else set()
        eos = ((set() if params.ignore_eos else set(self.eos_ids) | fim_ends) | set(params.stop_token_ids)
               | {special[s] for s in params.stop if s in special})
        constraint = None
        if params.response_format is not None:
            # A grammar decides which tokens may come and where the output ends; bans on top of it could leave
            # none (or force one the ban forbids), and past its end only EOS is allowed (ignore_eos could not hold).
            for name, value in (("min_tokens", params.min_tokens), ("allowed_token_ids", params.allowed_token_ids),
                                ("bad_words", params.bad_words), ("ignore_eos", params.ignore_eos)):
                if value:
                    source = getattr(params.response_format, "source", "response_format")
                    raise InvalidRequestError(f"{name} cannot be combined with {source}: the output's grammar decides "
                                              "which tokens may come and where the output ends", param=name)
            # Where the grammar may end: the model's EOS and special stop tokens. A stop id that is ordinary text
            # (a quote) stays a token the grammar may write, and stops the output where it comes, as in vLLM (made
            # an end token, it was banned where the grammar needed it: no token left, a 500).
            specials = set(special.values())
            text_stops = {t for t in params.stop_token_ids if t not in specials and t not in self.eos_ids}
            constraint = self.constraints.compile(params.response_format).matcher(
                sorted(eos - text_stops), params.response_format.source)
        processors = LogitsProcessors(
            self.config.vocab_size, stop_ids=eos, min_tokens=params.min_tokens, logit_bias=params.logit_bias,
            allowed_token_ids=params.allowed_token_ids,
            bad_word_ids=bad_word_token_ids(params.bad_words, self.tokenizer) if params.bad_words else (),
            device=self.runtime.device)
        request = Request(
            prompt_ids=prepared.token_ids,
            sampling=params.resolve(self.defaults, fallback_temperature),
            max_new_tokens=prepared.max_new_tokens,
            eos_ids=eos,
            stop=params.stop,
            tokenizer=self.tokenizer,
            vocab_size=self.config.vocab_size,
            logprobs=params.logprobs,
            device=self.runtime.device,
            start_time=start_time,
            constraint=constraint,
            include_stop_str=params.include_stop_str_in_output,
            logits_processors=processors,
            skip_special_tokens=params.skip_special_tokens,
        )
        request.tool_call_format, request.tool_call_forced = tool_format, forced
        request.parallel_tool_calls = parallel
        request.tool_parameters = tool_parameters(tools) if tool_format is not None else None
        # A thinking model's block, split as the server splits it (`Engine.complete`'s reasoning_content).
        constrained = getattr(params.response_format, "source", None) if params.response_format is not None else None
        if chat and splits_reasoning(detect_reasoning(template.source if template else None), constrained, forced):
            tail = self.tokenizer.decode(prepared.token_ids[-16:], skip_special_tokens=False)
            request.reasoning_split = True
            request.in_reasoning = prompt_opens_reasoning(tail) or (
                continue_final_message and continues_reasoning(str(messages[-1].get("content") or "")))
        model_eos = set() if params.ignore_eos else set(self.eos_ids)
        request.stop_token_reasons = {**{t: t for t in params.stop_token_ids if t not in model_eos},
                                      **{special[s]: s for s in params.stop if s in special}}
        return request

    # -------------------------------------------------------------------------------------- generation

    def generate(self, prompt: Prompt, params: SamplingParams | Mapping[str, Any] | None = None, *,
                 tools: Sequence[Mapping[str, Any]] | None = None, tool_choice: Any = None,  # noqa: ANN401
                 parallel_tool_calls: bool = True, chat_template_kwargs: Mapping[str, Any] | None = None,
                 continue_final_message: bool = False, suffix: str | None = None) -> Iterator[GenerationEvent]:
        """Stream a generation.

        The engine runs one generation at a time: from its first event until its last (the one with
        `finish_reason`), the stream holds the engine (another thread's call waits). Read it to that event, or
        `close()` it to stop early.

        Args:
            prompt: text, chat messages or token ids.
            params: sampling parameters, or a dict of `SamplingParams` fields.
            tools, tool_choice, parallel_tool_calls, chat_template_kwargs, continue_final_message, suffix: see
                `make_request`; the events carry the raw text, `complete` parses the calls.

        Yields:
            `GenerationEvent`s; the last has `finish_reason` and `stats`.

        Raises:
            InvalidRequestError, ContextLengthError: before the first event, for bad input.
        """
        request = self.make_request(prompt, params, tools=tools, tool_choice=tool_choice,
                                    parallel_tool_calls=parallel_tool_calls, chat_template_kwargs=chat_template_kwargs,
                                    continue_final_message=continue_final_message, suffix=suffix)
        return self._from_first_read(request)

    def _from_first_read(self, request: Request) -> Iterator[GenerationEvent]:
        # TTFT counts from the first read of the stream (one made, then read later, counted its idle time), a
        # wait for another thread's generation included.
        request.restart_clock()
        yield from self.run(request)

    def run(self, request: Request) -> Iterator[GenerationEvent]:
        """Run a prepared request alone: prefill (of the uncached tail), then decode steps.

        With the prefix cache on, the prompt's longest prefix already in the KV cache is reused; with
        speculation on, a step verifies a drafted run of tokens at once (`solo.engine.speculative`); on
        the GPU, blocks of tokens are decoded per host sync. Holds the engine's lock until the generation
        ends: the last event comes after its release (a reader that stops at it leaves the engine free), or
        the generator is closed.

        Yields:
            `GenerationEvent`s, one per token; the last has `finish_reason` and `stats`.

        Raises:
            SoloError: the engine was closed or a stream from it is still open in this thread (this thread read
                it last and no other takes it over within a second; at the first event); the engine was closed
                while this ran (at its next step); (GPU block decoding) the device stopped before the request
                finished; the request ran before (a `Request` holds one generation's state).
            InvalidRequestError: the request's prompt holds token ids outside this engine's vocabulary (a
                request made by another engine's `make_request`).
        """
        if self._closed:
            raise SoloError(_CLOSED)
        if request.output_ids or request.finished:
            raise SoloError("this request has run already (a Request holds one generation's state, which it used "
                            "up); make a new one with make_request for each run")
        if request.prompt_ids and (largest := max(request.prompt_ids)) >= self.config.vocab_size:
            raise InvalidRequestError(f"the request's prompt holds token id {largest}, outside this engine's "
                                      f"vocabulary [0, {self.config.vocab_size}); make the request with this "
                                      "engine's make_request", param="prompt")
        if self._forked_mid_generation:
            raise SoloError("this process was forked while another thread was generating with this engine, so the "
                            "engine's copy here holds that generation half done; load an engine in this process, or "
                            "start processes with multiprocessing's \"spawn\" method")
        final = None  # the last event: yielded once the engine is free (a reader may stop at it, never calling next)
        with self._held("a stream from this engine is still open in this thread (the engine runs one generation "
                        "at a time); read it to the end or close() it before starting another"):
            if self._closed:  # (closed while this waited for another generation to finish)
                raise SoloError(_CLOSED)
            self._owner = threading.get_ident()
            cache = self.prefix_cache
            clean = False  # whether row 0 holds exactly the request's fed tokens when this ends
            try:
                runtime = self.runtime
                needed = len(request.prompt_ids) + request.max_new_tokens
                if cache is not None:
                    # Rounded up so the next, longer turn of a conversation rarely reallocates the cache.
                    cache.reserve(1, min(-(-needed // 1024) * 1024, max(needed, self.config.context_length)))
                    cached = cache.load(0, request.prompt_ids)
                else:
                    runtime.reserve(1, needed)
                    cached = 0
                request.stats.cached_tokens = cached
                logits = runtime.prefill(0, torch.tensor(request.prompt_ids[cached:], dtype=torch.long), cached)
                clean = True
                in_blocks = (self.speculative_config is None and self._runtime_capabilities.block_decoding
                             and can_run_in_blocks(runtime, request))
                if in_blocks:
                    # GPU: K tokens per graph replay, sampled and stop-checked on the device (an explicit
                    # --speculative mode runs the per-token loop with verify steps instead).
                    clean = False  # the device may have run past the last reported token: fine, but unknown
                    for event in run_in_blocks(runtime, request, logits, row=0):
                        if event.finish_reason is not None:
                            final = event
                            break
                        yield event
                        self._owner = threading.get_ident()
                rows = torch.zeros(1, dtype=torch.long)
                if not in_blocks:
                    token, info = request.choose(logits)
                    event = request.append(token, info)
                    if event.finish_reason is not None:
                        final = event
                    else:
                        yield event
                        self._owner = threading.get_ident()  # (whoever reads the stream holds it: it may change hands)
                proposer = None if self.speculative_config is None or in_blocks else DraftProposer(
                    self.speculative_config, request, self.session_history)
                while not in_blocks and not request.finished:
                    if self._closed:  # (closed from another thread: no step after it, whatever the runtime)
                        raise SoloError(_CLOSED)
                    clean = False
                    events = None if proposer is None else speculative_step(runtime, 0, request, proposer, token)
                    if events is None:
                        position = torch.tensor([request.next_position - 1], dtype=torch.long)
                        logits = runtime.decode(rows, torch.tensor([token], dtype=torch.long), position)[0]
                        token, info = request.choose(logits)
                        events = [request.append(token, info)]
                    else:
                        token = events[-1].token_ids[-1]
                    clean = True
                    for event in events:
                        if event.finish_reason is not None:
                            final = event
                            break
                        yield event
                        self._owner = threading.get_ident()
            finally:
                if cache is not None:
                    if clean:
                        cache.finish(0, request.prompt_ids + request.output_ids[:-1])
                    else:
                        cache.forget(0)
                if self.session_history is not None:
                    self.session_history.add(request.prompt_ids + request.output_ids)
                self._owner = None
        if final is not None:
            yield final

    def complete(self, prompt: Prompt, params: SamplingParams | Mapping[str, Any] | None = None, *,
                 tools: Sequence[Mapping[str, Any]] | None = None, tool_choice: Any = None,  # noqa: ANN401
                 parallel_tool_calls: bool = True, chat_template_kwargs: Mapping[str, Any] | None = None,
                 continue_final_message: bool = False, suffix: str | None = None) -> GenerationResult:
        """Generate to the end and return the whole result (see `generate`).

        With chat messages, a thinking model's `<think>` block is split off as the server splits it
        (`reasoning_content`; `text` keeps the block). With `tools` (and messages), tool calls after the block
        are parsed into `tool_calls` (finish_reason "tool_calls"), and `text` keeps the rest; a call written
        inside the block is reasoning, never a call. Under a forced `tool_choice` ("required" or a named
        function) a call that max_tokens or a stop string cut short stays in `text` (finish_reason "length" or
        "stop"), not in `content`, as the server's message content leaves it out.

        Raises:
            InvalidRequestError, ContextLengthError: for bad input, before anything runs.
        """
        request = self.make_request(prompt, params, tools=tools, tool_choice=tool_choice,
                                    parallel_tool_calls=parallel_tool_calls, chat_template_kwargs=chat_template_kwargs,
                                    continue_final_message=continue_final_message, suffix=suffix)
        reader = OutputReader.for_reply(request.tool_call_format, self.tokenizer.special_token_ids(),
                                        request.tool_call_forced, request.tool_parameters, request.reasoning_split,
                                        request.in_reasoning)
        parser, thinking = reader.tools, reader.reasoning
        texts, contents, ids, logprobs = [], [], [], []
        event = None
        for event in self.run(request):
            texts.append(event.text)
            contents.append(reader.feed(event.text, event.token_ids)[1])
            ids.extend(event.token_ids)
            if event.logprobs:
                logprobs.extend(event.logprobs)
        assert event is not None and event.finish_reason is not None and event.stats is not None
        _, rest, calls = reader.finish()
        text, finish_reason, content = "".join(texts), event.finish_reason, "".join(contents) + rest
        if parser is not None:  # the block as written, then the content less its calls (and a forced call cut short)
            text = text[:len(text) - len(reader.raw_content)] + content + parser.cut
            calls = calls if request.parallel_tool_calls else calls[:1]  # OpenAI: one call without parallel calls
            if calls and finish_reason == "stop":
                finish_reason = "tool_calls"
        return GenerationResult(
            text=text, token_ids=ids, finish_reason=finish_reason, stats=event.stats,
            prompt_token_ids=request.prompt_ids, logprobs=logprobs if request.logprobs is not None else None,
            tool_calls=calls or None, stop_reason=event.stop_reason,
            # (an empty block is none, as the server sends it)
            reasoning_content=(thinking.reasoning or None) if thinking is not None else None,
            content=content,
        )


def _as_sampling_params(params: SamplingParams | Mapping[str, Any] | None) -> SamplingParams:
    if params is None:
        return SamplingParams()
    if isinstance(params, SamplingParams):  # a copy built anew: fields set after construction (stop = "x",
        return replace(params)  # NumPy ids) are taken as the constructor takes them
    if isinstance(params, Mapping):
        unknown = sorted(set(params) - set(SamplingParams.field_names()))
        if unknown:
            raise InvalidRequestError(
                f"unknown sampling parameter(s) {', '.join(map(repr, unknown))}; "
                f"known: {', '.join(SamplingParams.field_names())}"
            )
        return SamplingParams(**params)
    raise InvalidRequestError(f"params must be a SamplingParams or a dict of its fields, got {type(params).__name__}")


def _describe(value: object) -> str:
    if isinstance(value, list | tuple) and value:
        return f"a {type(value).__name__} of {type(value[0]).__name__}"
    return f"an empty {type(value).__name__}" if isinstance(value, list | tuple) else type(value).__name__
