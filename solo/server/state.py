"""The server's state: settings, the model loaded in the background, its scheduler, readiness.

uvicorn starts listening at once and the model loads on a worker thread, so `GET /health` can answer 503
while loading and 200 when ready (the way orchestrators probe readiness). A model that fails to load ends
the server through `on_fatal`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from solo.cpus import cgroup_cpu_limit, cpus_text, threads_within_cpu_limit
from solo.engine.engine import Engine, context_budget
from solo.engine.prefix_cache import DEFAULT_PREFIX_CACHE_GB
from solo.engine.reasoning import REASONING_PARSERS, detect_reasoning
from solo.engine.request import Request
from solo.errors import ContextLengthError, InvalidRequestError, SoloError
from solo.runtime.cpu import check_cpu_env
from solo.server import kv_memory
from solo.server.async_engine import AsyncEngine
from solo.server.errors import model_loading, model_not_found, shutting_down
from solo.server.heap import freeze_startup_heap, unfreeze_heap
from solo.server.logprobs import TokenPieces
from solo.server.metrics import ServerMetrics
from solo.server.scheduler import (
    DEFAULT_PREFILL_CHUNK,
    DecodeBatching,
    Generation,
    Scheduler,
    pause_steps_from_env,
    span_prefill_from_env,
)
from solo.tokenizer import Tokenizer

logger = logging.getLogger("solo.server")

LOOPBACK_HOSTS = ("localhost", "127.0.0.1", "[::1]")
"""Host names a server bound to a loopback address answers by default (`ServerSettings.allowed_hosts`)."""

EXACT_CHECK_BYTES_PER_TOKEN = 16
"""A prompt of at most this many UTF-8 bytes per context token is tokenized before its max_tokens is checked
(milliseconds: 512 KiB at a 32k context), so the error gives its token count; beyond, a bound refuses it first."""

COUNT_MAX_BYTES_PER_CONTEXT_TOKEN = 32
"""Routes that only count tokens (/tokenize, the Messages and Responses APIs' counts) take a text of at most this
many UTF-8 bytes per context token (at least `COUNT_MIN_MAX_BYTES`): tokenizing ~15 MB took ~20 s and left the
server ~2 GB larger, and no generation route can take a text many times its context anyway."""
COUNT_MIN_MAX_BYTES = 1 << 20


def listed_name(served: str) -> str:
    """The served name as Ollama lists models: with a tag (":latest" unless it has one); every route accepts it.

    Ollama's clients (and Ollama's own /v1 routes) send "name:latest" for a model listed by /api/tags.
    """
    return served if ":" in served.rsplit("/", 1)[-1] else f"{served}:latest"


def host_name(host: str) -> str:
    """A host name or address as the Host check compares it.

    Lower case, no trailing dot, an IPv6 address in brackets and compressed ("[0:0:0:0:0:0:0:1]" -> "[::1]").
    """
    name = host.strip().lower().rstrip(".")
    if name.startswith("[") and name.endswith("]") or name.count(":") > 1:
        try:
            return f"[{ipaddress.IPv6Address(name.strip('[]')).compressed}]"
        except ValueError:
            return name
    return name


def _is_loopback(host: str) -> bool:
    # An address, or a name this machine resolves (from /etc/hosts for the usual loopback names) to
    # loopback addresses only; an IPv4-mapped IPv6 address counts as its IPv4 one.
    def loopback(address: str) -> bool:
        ip = ipaddress.ip_address(address.split("%")[0])
        mapped = getattr(ip, "ipv4_mapped", None)
        return (mapped or ip).is_loopback

    name = host.strip("[]")
    try:
        return loopback(name)
    except ValueError:
        pass
    try:
        return all(loopback(info[4][0]) for info in socket.getaddrinfo(name, None))
    except (OSError, ValueError):
        return False


def allowed_hosts_for(bind_host: str, extra: Sequence[str] | None = None) -> list[str] | None:
    """The `Host` names `solo serve --host bind_host [--allowed-hosts extra]` answers.

    Bound to a loopback address: the loopback names, the bind address itself and `extra`. Else None (any:
    a server exposed on the network is reached by whatever name or address its clients use) unless
    `extra` names some, which then add to the loopback names. "*" in `extra`: any.
    """
    extra = list(extra or [])
    if "*" in extra:
        return None
    if not _is_loopback(bind_host):
        return [host_name(h) for h in [*LOOPBACK_HOSTS, *extra]] if extra else None
    return list(dict.fromkeys(host_name(h) for h in [*LOOPBACK_HOSTS, bind_host, *extra]))


def _say_how_system_messages_fare(engine: Engine) -> None:
    # A template that leaves system messages out would drop every request's without a word: said once, at start
    # (requests keep being served as other engines serve them; one that refuses them answers each with a 400).
    from solo.chat_template import system_prompt_ids

    try:
        system_prompt_ids(engine, "Be brief.", None)
    except InvalidRequestError as exc:
        logger.warning("requests with a system message are refused with a 400: %s", exc)
    except SoloError:
        logger.warning("this model's chat template leaves system messages out of the prompt: requests' system "
                       "messages do not reach the model (as on other engines serving it)")


def _cpu_threads_text(device: Any) -> str:
    # The serving line's ", 2 threads" on the CPU, and the decode steps' count where a container's CPU quota caps it.
    if getattr(device, "type", None) != "cpu":
        return ""
    import torch

    threads = torch.get_num_threads()
    decode = threads_within_cpu_limit(threads)  # (the CPU runtime's cap: ThreadGovernor's decode_threads)
    return (f", {threads} thread{'' if threads == 1 else 's'}"
            + (f" ({decode} for decode steps: CPU quota {cpus_text(cgroup_cpu_limit())})" if decode < threads else ""))


def longest_token_bytes(tokenizer: Tokenizer) -> int:
    """The most bytes of input text one token of `tokenizer` can stand for (at least 1).

    Measured on each vocabulary entry as the tokenizer spells it, added tokens included. That spelling is
    never shorter than the text the token covers: byte-level BPE writes each byte as a 1- or 2-byte
    character, SentencePiece writes a space as U+2581 (3 bytes) and a byte as <0xHH>, WordPiece adds "##".
    (A normalizer that shortens text, such as NFC, could in principle beat it, but L is the longest token
    while real text averages a few bytes per token, so the bound stays far below any real count.)
    """
    vocab = tokenizer.backend.get_vocab(with_added_tokens=True)
    return max((len(piece.encode("utf-8", "surrogatepass")) for piece in vocab), default=1) or 1


@dataclass
class ServerSettings:
    """What `solo serve` was asked to serve, and how.

    Attributes:
        model: model folder, hub id, or None for the bundled model.
        device, dtype, backend, revision, quantize: as for `Engine.load`.
        served_model_name: the name clients put in `model` (default: the engine's name).
        api_key: when set, every route but /health needs `Authorization: Bearer <api_key>`.
        allowed_origins: browser origins (CORS) that may call the API, e.g. "http://localhost:3000", or "*"
            for any; None: origins on localhost, 127.0.0.1 or [::1] (any port; the browser's own machine), as
            Ollama's default.
        allowed_hosts: host names the `Host` header may carry (any port), or ["*"] / None for any. `solo
            serve` bound to a loopback address answers the loopback names (`allowed_hosts_for`): a web page
            whose name an attacker re-points at 127.0.0.1 (DNS rebinding) is then same-origin to the browser,
            so CORS cannot stop it, but its requests carry the attacker's name as Host (Ollama checks the
            same).
        max_batch: KV-cache slots (requests decoded together); None: chosen from free memory at start-up
            (`kv_memory.auto_slots`: 8 to 32), after which it holds the number chosen.
        max_queue: requests that may wait for a slot; beyond it, 503 with Retry-After.
        max_model_len: tokens per slot (prompt + completion), the engine's context_length; None for the
            model's context length.
        decode_batching: "auto", "isolated" or "fused" (see solo.server.scheduler).
        prefill_chunk: prompt tokens prefilled per scheduler iteration (chunked prefill); 0: whole prompts.
        max_queue_wait_s: refuse (503) a request whose predicted wait for a slot exceeds this; None: no bound
            but max_queue (see solo.server.scheduler, "Overload").
        shutdown_grace_s: on SIGTERM, seconds in-flight requests may run before they are ended.
        prefix_cache_gb: bound of the prefix cache's snapshot store in GB; "auto" (the default): as large as
            the KV cache, at most `DEFAULT_PREFIX_CACHE_GB`, within the memory left after it; None turns
            prefix caching off. The store is preallocated at start-up (`PrefixCache.allocate_store`).
        speculative: "auto", "off", "ngram" or "suffix" (see solo.engine.speculative).
        tp: tensor-parallel ranks (`solo.distributed`; rank 0 serves, the others follow).
        reasoning_parser: "auto" (split `<think>` blocks into `reasoning_content` when the chat template writes
            them), "none", or vLLM's "qwen3" / "deepseek_r1" (see solo.engine.reasoning).
        chat_template, tool_call_parser: as for `Engine.load` (vLLM's --chat-template, --tool-call-parser).
        max_body_mb: the largest request body taken, MiB (a larger one gets 413 before it is read whole).
    """

    model: str | None = None
    device: str = "cpu"
    dtype: str = "auto"
    backend: str = "auto"
    revision: str | None = None
    quantize: str | None = None
    chat_template: str | None = None
    tool_call_parser: str | None = None
    served_model_name: str | None = None
    api_key: str | None = None
    allowed_origins: list[str] | None = None
    allowed_hosts: list[str] | None = None
    max_batch: int | None = None
    max_queue: int = 64
    max_model_len: int | None = None
    decode_batching: DecodeBatching = "auto"
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK
    max_queue_wait_s: float | None = None
    shutdown_grace_s: float = 30.0
    prefix_cache_gb: float | str | None = "auto"
    speculative: str = "auto"
    tp: int = 1
    reasoning_parser: str = "auto"
    max_body_mb: float = 16.0

    def validate(self) -> None:
        """Check the numbers.

        Raises:
            SoloError: a value out of range, naming the flag; a --chat-template that cannot be read or does not
                compile, an unknown --tool-call-parser (before the server listens: the model loads after); an
                environment knob the load would refuse (`EnvSettingError`).
        """
        if self.chat_template is not None:
            from solo.chat_template import ChatTemplate, chat_template_origin, read_chat_template

            try:
                source = read_chat_template(self.chat_template)
                ChatTemplate(source, {}, origin=chat_template_origin(self.chat_template))
            except InvalidRequestError as exc:
                raise SoloError(str(exc)) from None
        if self.tool_call_parser is not None:
            from solo.engine.tool_calls import TOOL_FORMATS

            if self.tool_call_parser not in TOOL_FORMATS:
                raise SoloError(f"unknown --tool-call-parser {self.tool_call_parser!r}; choose one of "
                                f"{', '.join(TOOL_FORMATS)}")
        if self.max_batch is not None and self.max_batch < 1:
            raise SoloError(f"--max-batch must be >= 1, got {self.max_batch}")
        if self.prefill_chunk < 0:
            raise SoloError(f"--prefill-chunk must be >= 0 (0: prefill whole prompts), got {self.prefill_chunk}")
        if self.max_queue < 0:
            raise SoloError(f"--max-queue must be >= 0, got {self.max_queue}")
        if self.max_queue_wait_s is not None and not self.max_queue_wait_s >= 0:
            raise SoloError(f"--max-queue-wait must be >= 0 seconds, got {self.max_queue_wait_s}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise SoloError(f"--max-model-len must be >= 2, got {self.max_model_len}")
        if not 0 < self.max_body_mb < 2**40:
            raise SoloError(f"--max-body-mb must be a number of MiB > 0, got {self.max_body_mb}")
        if self.shutdown_grace_s < 0:
            raise SoloError(f"--shutdown-grace must be >= 0, got {self.shutdown_grace_s}")
        if self.reasoning_parser not in REASONING_PARSERS:
            raise SoloError(f"--reasoning-parser must be one of {', '.join(REASONING_PARSERS)}, got "
                            f"{self.reasoning_parser!r}")
        if self.api_key is not None and not self.api_key:
            raise SoloError("--api-key is empty; give a key or leave the flag out")
        if self.api_key is not None and (self.api_key != self.api_key.strip() or not self.api_key.isprintable()):
            raise SoloError("--api-key has blanks at its ends or unprintable characters (a newline from a file?): HTTP "
                            "header values lose them, so no client could send it; strip the key")
        for host in self.allowed_hosts or []:
            if host != "*" and not re.fullmatch(r"\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+", host):
                raise SoloError(f"--allowed-hosts takes host names without scheme or port, like myhost.lan, "
                                f"192.168.1.5 or [::1], or * for any; got {host!r}")
        if self.served_model_name is not None and not self.served_model_name.strip():
            raise SoloError("--served-model-name is empty; give a name or leave the flag out (the model's own name "
                            "is served)")
        for origin in self.allowed_origins or []:
            parts = urlsplit(origin)
            if origin != "*" and (parts.scheme not in ("http", "https") or not parts.netloc or parts.path
                                  or parts.query or parts.fragment or origin != origin.lower()):
                raise SoloError(f"--allowed-origins takes origins like http://localhost:3000 (scheme, host, optional "
                                f"port; lower case, no path or trailing slash: as browsers send them) or *; got "
                                f"{origin!r}")
        gb = self.prefix_cache_gb
        if gb is not None and gb != "auto" and (isinstance(gb, str) or not gb >= 0):
            raise SoloError(f"--prefix-cache-gb must be >= 0 (or left out: auto), got {gb!r}")
        free = (kv_memory.available_memory_bytes("cpu") if isinstance(gb, int | float)
                and str(self.device).startswith("cpu") else None)
        if free is not None and gb * 1e9 > free:
            # (the exact check, after the KV cache is allocated, is _prefix_store_bytes: this one needs no model)
            raise SoloError(f"--prefix-cache-gb {gb:g} asks for {kv_memory.gib(gb * 1e9)}, more than the "
                            f"{kv_memory.gib(free)} this machine has free before the model loads; lower "
                            "--prefix-cache-gb (or leave it out: auto)")
        # The environment's knobs, read while the model loads, after the server says it listens.
        span_prefill_from_env()
        pause_steps_from_env()
        if self.device != "cuda" and not str(self.device).startswith("cuda:"):
            check_cpu_env()


class ServerState:
    """Everything the routes need, shared through `app.state.solo`.

    Args:
        settings: the server settings.
        load_engine: builds the engine (runs on a worker thread); default: `Engine.load` with the settings.
        on_fatal: called on the event loop when the model cannot be loaded (the CLI exits with it).
    """

    def __init__(self, settings: ServerSettings, load_engine: Callable[[], Engine] | None = None,
                 on_fatal: Callable[[BaseException], None] | None = None) -> None:
        self.settings = settings
        self.metrics = ServerMetrics()
        self.created = int(time.time())
        self._load_engine = load_engine or self._default_loader
        self._on_fatal = on_fatal
        self.engine: Engine | None = None
        self.reasoning = False  # chat replies split into reasoning_content and content (solo.engine.reasoning)
        self.client: AsyncEngine | None = None  # the engine client the routes submit to
        self.scheduler: Scheduler | None = None
        self.pieces: TokenPieces | None = None
        self.served_name = settings.served_model_name or ""
        self.max_model_len = 0
        self._loader: threading.Thread | None = None
        self.memory_limited = False  # max_model_len was lowered to what the KV cache can hold in memory
        self.longest_token = 1  # bytes of text one token covers at most (see longest_token_bytes)
        self.error: BaseException | None = None
        self.draining = False
        self.requests_ended = asyncio.Event()  # set when the shutdown ends every request (abort_all)
        self._frozen_heap = False  # freeze_startup_heap ran (undone by close)

    def _default_loader(self) -> Engine:
        s = self.settings
        gb = DEFAULT_PREFIX_CACHE_GB if s.prefix_cache_gb == "auto" else s.prefix_cache_gb  # sized in _start
        return Engine.load(s.model, device=s.device, dtype=s.dtype, backend=s.backend, revision=s.revision,
                           quantize=s.quantize, prefix_cache_gb=gb, speculative=s.speculative, tp=s.tp,
                           context_length=s.max_model_len, chat_template=s.chat_template,
                           tool_call_parser=s.tool_call_parser)

    @property
    def status(self) -> str:
        """Health as /health reports it: "ok", "loading", "shutting_down" or "failed"."""
        if self.error is not None or (self.client is not None and self.client.errored):
            return "failed"
        if self.engine is not None and self.engine.errored:  # e.g. a tensor-parallel rank died
            return "failed"
        if self.draining:
            return "shutting_down"
        return "ok" if self.scheduler is not None else "loading"

    # ----------------------------------------------------------------------------------- lifecycle

    @property
    def loading(self) -> bool:
        """The model's load (or the scheduler's start) is still running on its thread."""
        return self._loader is not None and self._loader.is_alive()

    async def _off_loop(self, fn: Callable[..., Any], *args: Any) -> Any:  # noqa: ANN401
        # fn(*args) on a daemon thread of its own, not the loop's executor: asyncio.run's exit waits for the
        # executor's threads, so a Ctrl-C during a multi-GB load waited for the whole load (`serve` exits instead).
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Any] = loop.create_future()

        def settle(result: Any, error: BaseException | None) -> None:  # noqa: ANN401
            if done.done():  # (cancelled: the server stopped) what was built is let go: a scheduler, an engine
                closer = getattr(result, "stop", None) or getattr(result, "close", None)
                if callable(closer):
                    threading.Thread(target=closer, name="solo-unload", daemon=True).start()
                return
            if error is not None:
                done.set_exception(error)
            else:
                done.set_result(result)

        def run() -> None:
            try:
                result, error = fn(*args), None
            except BaseException as exc:  # noqa: BLE001 (handed to the awaiting coroutine)
                result, error = None, exc
            try:
                loop.call_soon_threadsafe(settle, result, error)
            except RuntimeError:  # the loop closed meanwhile: the server is gone
                pass

        self._loader = threading.Thread(target=run, name="solo-load", daemon=True)
        self._loader.start()
        return await done

    async def load(self) -> None:
        """Load the model and start the scheduler off the event loop; on failure call `on_fatal`."""
        try:
            engine = await self._off_loop(self._load_engine)
            self.longest_token = await self._off_loop(longest_token_bytes, engine.tokenizer)
            client = await self._off_loop(self._start, engine)
        except Exception as exc:  # a bad path, a broken checkpoint, out of memory: the server cannot serve
            self.error = exc
            if isinstance(exc, SoloError | OSError):  # the user's to fix: the message says how
                if self._on_fatal is None:  # else its owner reports it (the CLI: one "solo: error:" line)
                    logger.error("cannot load the model: %s", exc)
            else:
                logger.exception("cannot load the model")
            if self._on_fatal is not None:
                self._on_fatal(exc)
            return
        self.engine, self.pieces = engine, TokenPieces(engine.tokenizer)
        template = engine.tokenizer.chat_template
        self.reasoning = detect_reasoning(template.source if template is not None else None,
                                          self.settings.reasoning_parser)
        self.served_name = self.settings.served_model_name or engine.name
        if template is not None:
            await self._off_loop(_say_how_system_messages_fare, engine)
        logger.debug("startup heap frozen: %d objects", freeze_startup_heap())
        self._frozen_heap = True
        self.client, self.scheduler = client, client.scheduler
        logger.info("serving %s (%s runtime%s, %d slots of %d tokens, %s decode, prefill chunk %s, prefix cache %s, "
                    "speculative %s)", self.served_name, engine.backend_name, _cpu_threads_text(engine.device),
                    self.settings.max_batch, self.max_model_len, client.decode_batching,
                    self.settings.prefill_chunk or "off", "on" if engine.prefix_cache is not None else "off",
                    engine.speculative)

    def _start(self, engine: Engine) -> AsyncEngine:
        context = engine.config.context_length
        limit = self.settings.max_model_len or context
        if limit > context:
            raise SoloError(f"--max-model-len {limit} exceeds the model's context length of {context}; lower it")
        per_token = kv_memory.kv_bytes_per_token(engine.config, engine.kv_cache_element_bytes,
                                                 engine.kv_heads_in_memory)
        if self.settings.max_batch is None:  # --max-batch auto: from free memory, before the cache is sized
            free = kv_memory.available_memory_bytes(engine.device)
            self.settings.max_batch = kv_memory.auto_slots(limit, per_token, free)
        self.max_model_len = self._fit_kv_cache(engine, limit, per_token)
        limit = self.max_model_len
        if engine.config.rope.prefills_whole and self.settings.prefill_chunk:  # (a chunk: its end's length)
            logger.info("dynamic NTK RoPE: prompts are prefilled whole, as transformers does (--prefill-chunk %d is "
                        "not used)", self.settings.prefill_chunk)
            self.settings.prefill_chunk = 0
        self.metrics.slots.set(self.settings.max_batch)
        client = AsyncEngine(engine, self.settings.max_batch, self.settings.max_queue, limit,
                             self.settings.decode_batching, self.metrics, prefill_chunk=self.settings.prefill_chunk,
                             max_queue_wait_s=self.settings.max_queue_wait_s)
        # The largest step's workspace, set aside by _fit_kv_cache, is allocated before the store is sized.
        engine.reserve_step_memory(self._step_entries(engine))
        cache = engine.prefix_cache
        if cache is not None:  # after the KV cache: the store takes what is left of the memory budget
            cache.allocate_store(self._prefix_store_bytes(engine, client.scheduler.kv_capacity_bytes))
            self.metrics.watch_prefix_cache(lambda: cache.stats.stored_bytes, cache.capacity_bytes)
        client.start()  # warms the runtime up first: one-time costs stay off the first user's TTFT
        return client

    def _prefix_store_bytes(self, engine: Engine, kv_bytes: int) -> int:
        # The prefix cache's store is preallocated like the KV cache, so its size is decided here, from the
        # memory free now (the KV cache already allocated): "auto" takes as much as the KV cache (at most the
        # engine's default bound) within KV_MEMORY_FRACTION of it, less HEADROOM_BYTES; an explicit size that
        # cannot fit is refused.
        wanted = self.settings.prefix_cache_gb
        free = kv_memory.available_memory_bytes(engine.device)
        budget = None if free is None else int(max(0, free - kv_memory.HEADROOM_BYTES) * kv_memory.KV_MEMORY_FRACTION)
        if wanted == "auto":
            size = min(int(DEFAULT_PREFIX_CACHE_GB * 1e9), kv_bytes)
            return size if budget is None else max(0, min(size, budget))
        size = int(float(wanted) * 1e9)
        if budget is not None and size > budget:
            raise SoloError(f"the prefix cache of --prefix-cache-gb {float(wanted):g} needs {kv_memory.gib(size)} but "
                            f"{kv_memory.KV_MEMORY_FRACTION:.0%} of the {kv_memory.gib(free)} free after the KV cache, "
                            f"less {kv_memory.gib(kv_memory.HEADROOM_BYTES)} for the server's own growth, is "
                            f"{kv_memory.gib(budget)}; lower --prefix-cache-gb (or leave it out: auto)")
        return size

    def _step_entries(self, engine: Engine) -> int:
        # The most sequence-tokens one decode step feeds: every slot's token and longest draft, plus a prompt piece.
        draft = engine.speculative_config.max_draft if engine.speculative_config is not None else 0
        return self.settings.max_batch * (1 + draft) + (self.settings.prefill_chunk or 0)

    def _fit_kv_cache(self, engine: Engine, limit: int, per_token: int) -> int:
        # Checked before the static cache is allocated, so a cache too big for this machine is refused with
        # the numbers instead of failing in the allocator or waking the OOM killer once its pages are written.
        # per_token: KV-cache bytes per token of one sequence (kv_memory.kv_bytes_per_token).
        rows = self.settings.max_batch
        free = kv_memory.available_memory_bytes(engine.device)
        # The decode step's workspace grows with the largest call to come: set aside now, or the cache takes
        # that memory and such calls fail later, each request refused while /health says 200.
        step = engine.step_memory_bytes(rows, limit, self._step_entries(engine))
        if free is not None:
            free = max(0, free - step - kv_memory.HEADROOM_BYTES)
        fits = kv_memory.fit_slot_tokens(rows, limit, per_token, free)
        if fits == limit:
            return limit
        need = kv_memory.gib(rows * limit * per_token)
        budget = (f"{kv_memory.KV_MEMORY_FRACTION:.0%} of the {kv_memory.gib(free or 0)} free beside the decode "
                  f"step's workspace ({kv_memory.gib(step)}) and {kv_memory.gib(kv_memory.HEADROOM_BYTES)} for the "
                  "server's own growth")
        if fits < kv_memory.MIN_SLOT_TOKENS or self.settings.max_model_len is not None:
            most_rows = int((free or 0) * kv_memory.KV_MEMORY_FRACTION) // (limit * per_token)
            advice = f"lower --max-model-len to at most {fits}" if fits >= kv_memory.MIN_SLOT_TOKENS else \
                "free memory or use a smaller model"
            if most_rows >= 1:
                advice += f" or --max-batch to at most {most_rows}"
            elif rows > 1:  # (nothing left beside the step's workspace, which grows with the slots: fewer help)
                advice += f" or lower --max-batch (the decode step's workspace, {kv_memory.gib(step)}, grows with it)"
            raise SoloError(f"the KV cache of --max-batch {rows} slots x {limit} tokens needs {need} but may use "
                            f"{budget}; {advice}")
        logger.warning("the KV cache of %d slots x %d tokens (the model's context) needs %s but may use %s; "
                       "serving %d tokens per slot (set --max-model-len and --max-batch to choose)",
                       rows, limit, need, budget, fits)
        self.memory_limited = True
        return fits

    def begin_drain(self) -> None:
        """Shutdown has begun: refuse new generation requests (503) and report /health 503."""
        self.draining = True

    def abort_all(self) -> None:
        """End every in-flight request now (the shutdown grace period is over); on the event loop.

        A request still sending its body is answered 503 too (`requests_ended`).
        """
        self.requests_ended.set()
        if self.client is not None:
            self.client.abort_all()

    async def close(self) -> None:
        """Stop the scheduler thread (after uvicorn has finished the in-flight responses)."""
        self.draining = True
        if self.client is not None:
            await asyncio.to_thread(self.client.stop)
        if self._frozen_heap:
            unfreeze_heap()  # a process that goes on (tests, an embedding app) may collect the server's objects
            self._frozen_heap = False

    # ------------------------------------------------------------------------------- request helpers

    def serves(self, model: str) -> bool:
        """Whether `model` names the served model: its name, or the name Ollama lists it by (`listed_name`)."""
        return model in (self.served_name, listed_name(self.served_name))

    def require_ready(self, model: str | None = None) -> tuple[Engine, Scheduler]:
        """The engine and scheduler, after checking readiness and the requested model name.

        Raises:
            APIError: 503 while loading or shutting down, 404 for a model this server does not serve.
        """
        if self.draining:
            raise shutting_down()
        if self.engine is None or self.scheduler is None:
            raise model_loading()
        if model is not None and not self.serves(model):
            raise model_not_found(model, self.served_name)
        return self.engine, self.scheduler

    def _context_name(self) -> str:
        assert self.engine is not None
        if self.memory_limited:
            return "the KV-cache slot this server's memory holds"
        if self.settings.max_model_len is None:
            return self.engine.context_name
        return "this server's --max-model-len"

    def check_prompt_size(self, prompt_bytes: int, max_tokens: int | None, param: str = "max_tokens",
                          prompt_param: str = "prompt") -> None:
        """Reject, before tokenizing it, a prompt that cannot fit whatever its tokens turn out to be.

        A prompt of B UTF-8 bytes has at least ceil(B / L) tokens, L being `longest_token`; tokenizing a
        prompt of many megabytes takes seconds, and rejecting it first is free. A prompt of at most
        `EXACT_CHECK_BYTES_PER_TOKEN` bytes per context token is cheap to tokenize, so with max_tokens it is left
        to the exact check after tokenizing (`completion_budget`), whose error counts its tokens.

        Args:
            prompt_bytes: UTF-8 bytes of the text to tokenize.
            max_tokens: what the request asked for, or None.
            param: the request field that set max_tokens (for the error).
            prompt_param: the request field that holds the prompt ("prompt" or "messages").

        Raises:
            ContextLengthError: the lower bound alone, or with max_tokens, exceeds the context.
        """
        at_least = -(-prompt_bytes // self.longest_token)
        limit, what = self.max_model_len, self._context_name()
        if at_least >= limit:
            raise ContextLengthError(
                f"this request needs more than {limit} tokens (its prompt of {prompt_bytes} bytes is at least "
                f"{at_least} tokens) but {what} is {limit}; shorten the prompt", param=prompt_param,
                prompt_tokens=at_least, max_tokens=max_tokens, limit=limit)
        if (max_tokens is not None and at_least + max_tokens > limit
                and prompt_bytes > EXACT_CHECK_BYTES_PER_TOKEN * limit):
            raise ContextLengthError(
                f"this request needs at least {at_least + max_tokens} tokens (prompt at least {at_least} + {param} "
                f"{max_tokens}) but {what} is {limit}; lower {param} (to at most {limit - at_least}, or "
                f"fewer: the prompt may have more than {at_least} tokens) or shorten the prompt", param=param,
                prompt_tokens=at_least, max_tokens=max_tokens, limit=limit)

    def check_count_size(self, text_bytes: int, param: str) -> None:
        """Refuse a text too large for a token-counting route (`COUNT_MAX_BYTES_PER_CONTEXT_TOKEN`).

        Args:
            text_bytes: UTF-8 bytes of the text to tokenize (a chat request's: its rendered prompt).
            param: the request field that holds it.

        Raises:
            InvalidRequestError: the text is over the limit; the message gives both sizes.
        """
        limit = max(COUNT_MIN_MAX_BYTES, COUNT_MAX_BYTES_PER_CONTEXT_TOKEN * self.max_model_len)
        if text_bytes > limit:
            raise InvalidRequestError(
                f"the text to count is {text_bytes} bytes; this server counts the tokens of at most {limit} bytes "
                f"({COUNT_MAX_BYTES_PER_CONTEXT_TOKEN} per token of its {self.max_model_len}-token context), "
                "far more than any request it can run; count it in parts", param=param)

    def completion_budget(self, prompt_len: int, max_tokens: int | None, default_cap: int | None,
                          param: str = "max_tokens", prompt_param: str = "prompt") -> int:
        """The number of tokens to generate for a prompt, checked against this server's context.

        Args:
            prompt_len: prompt tokens.
            max_tokens: what the request asked for, or None.
            default_cap: without max_tokens, generate at most this many (None: fill the context).
            param: the request field that set max_tokens (for the error).
            prompt_param: the request field that holds the prompt ("prompt" or "messages").

        Raises:
            ContextLengthError: the prompt alone, or with max_tokens, does not fit; the message gives the
                numbers. Never truncated silently.
        """
        budget = context_budget(prompt_len, max_tokens, self.max_model_len, self._context_name(), param, prompt_param)
        return budget if max_tokens is not None or default_cap is None else min(default_cap, budget)

    def submit(self, requests: Sequence[Request], priority: int = 0) -> Generation:
        """Queue prepared requests (the choices of one API request) on the scheduler.

        Args:
            requests: one `Request` per choice.
            priority: lower leaves the queue first (see `Scheduler.submit`).

        Raises:
            QueueFullError, SchedulerStoppedError: see `Scheduler.submit` (503).
        """
        assert self.client is not None
        return self.client.generate(requests, priority)
