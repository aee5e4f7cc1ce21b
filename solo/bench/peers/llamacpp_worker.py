"""The llama.cpp peer's worker process: loads one GGUF once and serves timed generations over a pipe.

`solo bench` starts this file as a script (`python -P llamacpp_worker.py`), not as a module of the
solo package, so the process holds llama.cpp alone, as a user's own llama.cpp program would: no
PyTorch, no second OpenMP runtime, and llama.cpp's default OpenMP settings (its threads spin-wait
between tokens as they do for its users). Only the standard library, numpy and llama-cpp-python are
imported here.

Protocol: one JSON object per line on stdin, one JSON reply per line on the original stdout (the
worker points its file descriptor 1 at stderr, so anything llama.cpp prints cannot corrupt replies).

    {"op": "load", "path": str, "n_ctx": int, "n_batch": int, "threads": int}
        -> {"n_vocab": int, "version": str, "system_info": str}
    {"op": "run", "prompt": [int], "gen_len": int, "tokens": bool, "reuse_prefix": bool}
        -> {"ttft_s": float, "decode_s": float, "decode_tokens": int, "cached_tokens": int,
            "tokens": [int] (if asked)}

With "reuse_prefix" the context keeps the previous run's KV cache and evaluates only the prompt's tokens
after the longest prefix it shares with what the context holds (at least the last prompt token), as
llama.cpp's server does with its prompt cache; otherwise every run starts from an empty context.

A generation in steps (`solo bench --lockstep`: engines take turns of a few tokens):

    {"op": "begin", "prompt": [int]} -> {"ttft_s": float}   (cold prefill and the first greedy token)
    {"op": "advance", "tokens": int} -> {"decode_s": float}  (that many more greedy tokens)
    {"op": "quit"} -> {}

A failed request replies {"error": "<one line>"} and the worker keeps serving.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any


class _Server:
    """llama.cpp state of the worker: the model and context of the last "load"."""

    def __init__(self) -> None:
        self.llm: Any = None
        self.n_vocab = 0
        self._token: int | None = None  # the last greedy token of the current generation

    def load(self, path: str, n_ctx: int, n_batch: int, threads: int) -> dict[str, Any]:
        """Load the GGUF at `path` for `threads` CPU threads; context and batch in tokens."""
        import llama_cpp

        self._llama_cpp = llama_cpp
        self.llm = llama_cpp.Llama(
            model_path=path, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch, n_threads=threads,
            n_threads_batch=threads, logits_all=False, verbose=False,
        )
        self.n_vocab = self.llm.n_vocab()
        system = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
        return {"n_vocab": self.n_vocab, "version": llama_cpp.__version__, "system_info": system}

    def _last_token(self) -> int:
        import numpy as np

        logits = self._llama_cpp.llama_get_logits_ith(self.llm.ctx, -1)
        return int(np.ctypeslib.as_array(logits, shape=(self.n_vocab,)).argmax())

    def run(self, prompt: list[int], gen_len: int, tokens: bool, reuse_prefix: bool = False) -> dict[str, Any]:
        """Greedy generation: the prompt in one `eval`, then one `eval` per token; times in seconds.

        With `reuse_prefix` the prompt's longest prefix already in the context (all but its last token at
        most) is kept and only the rest is evaluated (`eval` drops the context's positions past it).
        """
        if self.llm is None:
            raise RuntimeError("no model loaded")
        start = time.perf_counter()
        cached = 0
        if reuse_prefix and prompt:
            held = self.llm.input_ids[: self.llm.n_tokens].tolist()
            cached = min(self.llm.longest_token_prefix(held, prompt), len(prompt) - 1)
        self.llm.n_tokens = cached  # reset() for a cold start
        self.llm.eval(prompt[cached:])
        self._token = self._last_token()
        first = time.perf_counter()
        out = [self._token]
        self.advance(gen_len - 1, out)
        end = time.perf_counter()
        reply: dict[str, Any] = {"ttft_s": first - start, "decode_s": end - first, "decode_tokens": gen_len - 1,
                                 "cached_tokens": cached}
        if tokens:
            reply["tokens"] = out
        return reply

    def begin(self, prompt: list[int]) -> dict[str, Any]:
        """Cold prefill of `prompt` and the first greedy token; TTFT in seconds."""
        return {"ttft_s": self.run(prompt, 1, tokens=False)["ttft_s"]}

    def advance(self, tokens: int, out: list[int] | None = None) -> dict[str, Any]:
        """`tokens` more greedy tokens (one `eval` each) after `run` / `begin`; seconds taken."""
        if self.llm is None or self._token is None:
            raise RuntimeError("advance needs a model and a begun generation")
        token = self._token
        start = time.perf_counter()
        for _ in range(tokens):
            self.llm.eval([token])
            token = self._last_token()
            if out is not None:
                out.append(token)
        elapsed = time.perf_counter() - start
        self._token = token
        return {"decode_s": elapsed}


def serve(requests: Any, replies: Any) -> None:  # noqa: ANN401 - text streams
    """Answer JSON-line requests from `requests` on `replies` until "quit" or end of input."""
    server = _Server()
    for line in requests:
        if not line.strip():
            continue
        op = None
        try:
            request = json.loads(line)
            op = request.get("op")
            if op == "quit":
                reply: dict[str, Any] = {}
            elif op == "load":
                reply = server.load(request["path"], int(request["n_ctx"]), int(request["n_batch"]),
                                    int(request["threads"]))
            elif op == "run":
                reply = server.run([int(t) for t in request["prompt"]], int(request["gen_len"]),
                                   bool(request.get("tokens")), bool(request.get("reuse_prefix")))
            elif op == "begin":
                reply = server.begin([int(t) for t in request["prompt"]])
            elif op == "advance":
                reply = server.advance(int(request["tokens"]))
            else:
                reply = {"error": f"unknown op {op!r}"}
        except Exception as exc:  # noqa: BLE001 - every failure goes back to the bench as one line
            reply = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()
        if op == "quit":
            return


def main() -> int:
    """Serve on stdin / the original stdout, with fd 1 redirected to stderr."""
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # C-level prints of llama.cpp land on stderr, never in the reply stream
    sys.stdout = sys.stderr
    serve(sys.stdin, replies)
    return 0


if __name__ == "__main__":
    sys.exit(main())
