"""Errors Solo raises for problems the user can fix.

Every message is one line that names the problem and the fix. The CLI prints it without a traceback and the
server maps it to an OpenAI-shaped error with status 400 (or 404 for an unknown model).
"""

from __future__ import annotations

import copy
import os


class SoloError(Exception):
    """Base class for errors caused by user input (a path, a flag, a request field).

    The message is meant for the user: it names what is wrong and how to fix it.
    """


class ModelNotFoundError(SoloError):
    """The model path or hub id does not lead to a model folder."""


class CheckpointError(SoloError):
    """The model folder is partial or inconsistent: a missing file or shard, a missing or misshapen tensor."""


class UnsupportedArchitectureError(SoloError):
    """`config.json` names an architecture (or a feature of one) that Solo does not implement."""


class InvalidRequestError(SoloError):
    """A generation request has an invalid field (a sampling value, `max_tokens`, the messages).

    Attributes:
        param: name of the offending request field, or None when the problem is not one field.
    """

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param

    def renamed(self, message: str, param: str | None) -> InvalidRequestError:
        """A copy of the error with another message and param (an API's own names for the fields it names).

        Of the same class, its other attributes kept (a ContextLengthError's counts, from which the server's reply
        also says the overflow in OpenAI's words).
        """
        other = copy.copy(self)
        other.args, other.param = (message,), param
        return other


class ContextLengthError(InvalidRequestError):
    """The prompt, or the prompt plus `max_tokens`, does not fit the model's context length.

    Attributes:
        param: as InvalidRequestError's.
        prompt_tokens: the prompt's tokens (a lower bound where it was refused before tokenizing), or None.
        max_tokens: the tokens the request asked to generate, or None.
        limit: the context the two had to fit (tokens), or None.
    """

    def __init__(self, message: str, param: str | None = None, prompt_tokens: int | None = None,
                 max_tokens: int | None = None, limit: int | None = None) -> None:
        super().__init__(message, param)
        self.prompt_tokens, self.max_tokens, self.limit = prompt_tokens, max_tokens, limit


class KVCacheMemoryError(SoloError):
    """The KV cache of the rows and tokens asked for cannot be allocated: the machine is out of memory."""


class WeightsMemoryError(SoloError):
    """The model's weights do not fit in the memory this process may use (RAM, `ulimit -v`, a container's limit)."""


class EngineFailedError(SoloError):
    """The engine can no longer run requests: a tensor-parallel rank stopped answering.

    Not the request's fault: the server answers 500 (and shuts down), the `solo` command exits with status 1.
    """


class SoloWarning(UserWarning):
    """Something the user may want to fix that does not stop the work.

    The `solo` command prints it as "solo: warning: <message>"; the message names the problem and the fix,
    as an error's does.
    """


def undeletable(what: str, exc: OSError, cache_setting: str) -> SoloError:
    """The error for a cached folder `solo rm` could not delete (a read-only cache, or another user's).

    Args:
        what: what was being deleted ("tiny/llama from the Hugging Face cache").
        exc: the file system's error (its `filename` is named).
        cache_setting: the environment variable that moves that cache ("HF_HOME").
    """
    where = f" ({exc.filename})" if exc.filename else ""
    return SoloError(f"could not delete {what}: {exc.strerror or exc}{where}; the cache is read-only or another "
                     f"user's: delete it with the owner's rights, or point {cache_setting} at a cache of your own")


def shown_path(path: str | os.PathLike[str]) -> str:
    r"""A path as a message or listing shows it: one line, and something a shell takes back.

    Itself, or, where it holds a newline, another character a terminal cannot print, or bytes that are not
    UTF-8, quoted as `ls` and bash quote it ($'...'): "two\nlines.gguf" (a newline) shows as
    $'two\nlines.gguf', the bytes b"g\xff" as $'g\xff'.
    """
    text = os.fspath(path)
    if text.isprintable():
        return text
    named = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "'": "\\'", "\\": "\\\\"}
    out = []
    for ch in text:
        if ch in named:
            out.append(named[ch])
        elif ch.isprintable():
            out.append(ch)
        else:
            try:  # (a byte that is not UTF-8 reads as a lone surrogate: its byte back)
                out.append("".join(f"\\x{b:02x}" for b in os.fsencode(ch)))
            except UnicodeError:
                out.append(f"\\u{ord(ch):04x}")
    return "$'" + "".join(out) + "'"
