"""`Engine`: load a model once, then generate from prompts or chat messages.

Example:
>>> engine = Engine.load("path/or/org-name", device="cpu", dtype="auto")
>>> for event in engine.generate("def fibonacci(n):", SamplingParams(max_tokens=64)):
...     print(event.text, end="")
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from solo.engine.request import GenerationEvent, GenerationResult, Request
from solo.engine.sampling import SamplingParams
from solo.errors import ContextLengthError, InvalidRequestError, SoloError
from solo.model.config import ModelConfig
from solo.model.generation_config import GenerationDefaults
from solo.model.hub import resolve_dtype, resolve_model_dir
from solo.model.transformer import Transformer
from solo.model.weights import load_weights
from solo.runtime import create_runtime
from solo.runtime.base import DecodeRuntime
from solo.runtime.cuda.block_loop import can_run_in_blocks, run_in_blocks
from solo.tokenizer import Tokenizer

Prompt = str | Sequence[Mapping[str, Any]] | Sequence[int]
"""A prompt: text, chat messages ([{"role", "content"}, ...]) or token ids."""


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


@dataclass
class PreparedPrompt:
    """A prompt turned into token ids, with the generation budget it fits.

    Attributes:
        token_ids: the prompt ids.
        max_new_tokens: tokens that may be generated.
    """

    token_ids: list[int]
    max_new_tokens: int


class Engine:
    """A loaded model ready to generate.

    Build one with `Engine.load`. `generate` streams `GenerationEvent`s; `complete` returns a
    `GenerationResult`. Calls from several threads run one at a time.

    Args:
        model: the eager reference model (weights).
        tokenizer: the model's tokenizer.
        defaults: generation defaults from generation_config.json.
        runtime: the decode runtime.
        model_dir: the folder the model came from.
        name: a display name for the model.
    """

    def __init__(self, model: Transformer, tokenizer: Tokenizer, defaults: GenerationDefaults,
                 runtime: DecodeRuntime, model_dir: Path, name: str) -> None:
        self.model = model
        self.config: ModelConfig = model.config
        self.tokenizer = tokenizer
        self.defaults = defaults
        self.runtime = runtime
        self.model_dir = model_dir
        self.name = name
        self.eos_ids = set(defaults.eos_token_ids) or set(self.config.eos_token_ids)
        self._lock = threading.Lock()
        self._owner: int | None = None  # thread running a generation: a second one there would deadlock

    @classmethod
    def load(
        cls,
        model: str | Path | None = None,
        device: str | torch.device = "cpu",
        dtype: str | torch.dtype = "auto",
        backend: str = "auto",
        revision: str | None = None,
        quantize: str | None = None,
        tp: int = 1,
    ) -> Engine:
        """Load a model folder, a Hugging Face Hub id, or (with `model=None`) Solo's bundled model.

        Args:
            model: folder path, hub id ("org/name"), or None for the bundled default model.
            device: "cpu" or "cuda[:N]".
            dtype: "auto" (the checkpoint's dtype), "float32", "bfloat16" or "float16".
            backend: "auto" picks the fastest runtime for the device; "eager" forces the reference.
            revision: hub branch, tag or commit.
            quantize: None, or "int8" / "int4" weight-only quantization (CPU only; `solo.runtime.quant`).
            tp: tensor-parallel ranks (`solo.distributed`): > 1 spawns tp - 1 follower processes (or joins a
                torchrun job as rank 0) and runs the eager model sharded over them.

        Raises:
            ModelNotFoundError, CheckpointError, UnsupportedArchitectureError: see their docs.
            SoloError: an unknown dtype, device, backend or quantization mode; `quantize` off the CPU; a
                backend that cannot run this model; int4 on sizes that are not multiples of 32.
        """
        dev = resolve_device(device)
        folder = resolve_model_dir(model, revision)
        config = ModelConfig.from_file(folder)
        torch_dtype = resolve_dtype(dtype, config.torch_dtype)
        tokenizer = Tokenizer.from_folder(folder)
        defaults = GenerationDefaults.from_folder(folder, fallback_eos_ids=config.eos_token_ids)
        if tp != 1:
            from solo.distributed.launch import start_ranks

            if quantize is not None or backend not in ("auto", "eager"):
                raise SoloError("--tp runs the eager model on every rank; drop --quantize and --backend")
            runtime = start_ranks(folder, config, torch_dtype, dev, tp)
            return cls(runtime.model, tokenizer, defaults, runtime, folder, str(model) if model else folder.name)
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
        return cls(weights, tokenizer, defaults, runtime, folder, name)

    # ----------------------------------------------------------------------------------------- prompts

    def encode_prompt(self, prompt: Prompt) -> list[int]:
        """Token ids of a prompt.

        Text gets the tokenizer's special tokens (e.g. BOS), messages are rendered with the chat template,
        ids pass through.

        Raises:
            InvalidRequestError: an empty prompt, messages without a chat template, ids out of range.
        """
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidRequestError("the prompt is empty; give some text", param="prompt")
            ids = self.tokenizer.encode(prompt)
        elif not isinstance(prompt, list | tuple) or not prompt or not (
            all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
            or all(isinstance(m, Mapping) for m in prompt)
        ):
            raise InvalidRequestError(
                "the prompt must be text (str), a non-empty list of chat messages ({'role': ..., 'content': ...}) "
                f"or a non-empty list of token ids (int), got {_describe(prompt)}",
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
            ids = self.tokenizer.encode_chat(list(prompt))  # type: ignore[arg-type]
        if not ids:
            raise InvalidRequestError("the prompt encodes to no tokens; give some text", param="prompt")
        return ids

    def prepare(self, prompt: Prompt, max_tokens: int | None) -> PreparedPrompt:
        """Encode a prompt and check it fits the context with `max_tokens` new tokens.

        Returns:
            The ids and the token budget (`max_tokens`, or what is left of the context when None).

        Raises:
            InvalidRequestError: see `encode_prompt`.
            ContextLengthError: the prompt alone, or the prompt plus `max_tokens`, exceeds the context;
                the message gives the numbers.
        """
        ids = self.encode_prompt(prompt)
        context = self.config.context_length
        if len(ids) >= context:
            raise ContextLengthError(
                f"the prompt is {len(ids)} tokens but the model's context is {context} tokens (room is "
                f"needed for at least one new token); shorten the prompt", param="prompt"
            )
        room = context - len(ids)
        if max_tokens is None:
            return PreparedPrompt(ids, room)
        if max_tokens > room:
            raise ContextLengthError(
                f"the prompt ({len(ids)} tokens) plus max_tokens ({max_tokens}) is {len(ids) + max_tokens} "
                f"tokens, more than the model's context of {context}; lower max_tokens to at most {room} "
                "or shorten the prompt", param="max_tokens"
            )
        return PreparedPrompt(ids, max_tokens)

    def make_request(self, prompt: Prompt, params: SamplingParams | Mapping[str, Any] | None = None,
                     fallback_temperature: float = 0.0, start_time: float | None = None) -> Request:
        """Encode, validate and resolve a request without running it (the server's scheduler runs it).

        Args:
            prompt: text, messages or ids.
            params: sampling parameters (None: all defaults); a dict of `SamplingParams` fields works too.
            fallback_temperature: temperature when neither request nor model sets one.
            start_time: arrival time (`time.perf_counter()`), for TTFT.

        Returns:
            The request, not yet prefilled.

        Raises:
            InvalidRequestError, ContextLengthError: see `prepare` and `SamplingParams.validate`; also an
                unknown key in a `params` dict, or `params` of another type.
        """
        params = _as_sampling_params(params)
        params.validate()
        bad_ids = [t for t in params.stop_token_ids if t >= self.config.vocab_size]
        if bad_ids:
            raise InvalidRequestError(
                f"stop_token_ids holds {bad_ids[0]}, outside the vocabulary [0, {self.config.vocab_size})",
                param="stop_token_ids",
            )
        prepared = self.prepare(prompt, params.max_tokens)
        # ignore_eos drops the model's EOS ids only: the user's stop_token_ids still stop, as in vLLM. A stop
        # string that is a special token never appears in the (special-token-free) text: match its id.
        special = self.tokenizer.special_token_ids()
        eos = ((set() if params.ignore_eos else set(self.eos_ids)) | set(params.stop_token_ids)
               | {special[s] for s in params.stop if s in special})
        return Request(
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
        )

    # -------------------------------------------------------------------------------------- generation

    def generate(self, prompt: Prompt, params: SamplingParams | Mapping[str, Any] | None = None
                 ) -> Iterator[GenerationEvent]:
        """Stream a generation.

        The engine runs one generation at a time: from its first event until it ends, the stream holds
        the engine (another thread's call waits). Consume it to the end, or `close()` it to stop early.

        Args:
            prompt: text, chat messages or token ids.
            params: sampling parameters, or a dict of `SamplingParams` fields.

        Yields:
            `GenerationEvent`s; the last has `finish_reason` and `stats`.

        Raises:
            InvalidRequestError, ContextLengthError: before the first event, for bad input.
        """
        request = self.make_request(prompt, params)
        return self.run(request)

    def run(self, request: Request) -> Iterator[GenerationEvent]:
        """Run a prepared request alone (prefill, then one decode step per token, or blocks on the GPU).

        Holds the engine's lock until the generator finishes or is closed.

        Yields:
            `GenerationEvent`s, one per token; the last has `finish_reason` and `stats`.

        Raises:
            SoloError: (GPU block decoding) the device stopped before the request finished.
        """
        if self._owner == threading.get_ident():
            raise SoloError(
                "a stream from this engine is still open in this thread (the engine runs one generation at a "
                "time); read it to the end or close() it before starting another"
            )
        with self._lock:
            self._owner = threading.get_ident()
            try:
                runtime = self.runtime
                runtime.reserve(1, len(request.prompt_ids) + request.max_new_tokens)
                logits = runtime.prefill(0, torch.tensor(request.prompt_ids, dtype=torch.long))
                if can_run_in_blocks(runtime, request):
                    # GPU: K tokens per graph replay, sampled and stop-checked on the device.
                    yield from run_in_blocks(runtime, request, logits, row=0)
                    return
                rows = torch.zeros(1, dtype=torch.long)
                while True:
                    token, info = request.choose(logits)
                    event = request.append(token, info)
                    yield event
                    if request.finished:
                        return
                    position = torch.tensor([request.next_position - 1], dtype=torch.long)
                    logits = runtime.decode(rows, torch.tensor([token], dtype=torch.long), position)[0]
            finally:
                self._owner = None

    def complete(self, prompt: Prompt, params: SamplingParams | Mapping[str, Any] | None = None
                 ) -> GenerationResult:
        """Generate to the end and return the whole result (see `generate`).

        Raises:
            InvalidRequestError, ContextLengthError: for bad input, before anything runs.
        """
        request = self.make_request(prompt, params)
        texts, ids, logprobs = [], [], []
        event = None
        for event in self.run(request):
            texts.append(event.text)
            ids.extend(event.token_ids)
            if event.logprobs:
                logprobs.extend(event.logprobs)
        assert event is not None and event.finish_reason is not None and event.stats is not None
        return GenerationResult(
            text="".join(texts), token_ids=ids, finish_reason=event.finish_reason, stats=event.stats,
            prompt_token_ids=request.prompt_ids, logprobs=logprobs if request.logprobs is not None else None,
        )


def _as_sampling_params(params: SamplingParams | Mapping[str, Any] | None) -> SamplingParams:
    if params is None:
        return SamplingParams()
    if isinstance(params, SamplingParams):
        return params
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
