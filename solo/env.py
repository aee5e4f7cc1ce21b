"""Solo's environment variables (measurement switches and tuning knobs), read with errors that name them.

A value Solo cannot read is refused with `EnvSettingError` rather than taken as the default: `SOLO_X=off`
must never leave X on. Switches take 1 / 0 and the usual spellings (true/false, on/off, yes/no, any case);
an unset or empty variable is its default.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path

from solo.errors import SoloError

_ON = frozenset({"1", "true", "on", "yes"})
_OFF = frozenset({"0", "false", "off", "no"})


class EnvSettingError(SoloError):
    """An environment variable Solo reads holds a value it cannot use."""


def parse_switch(text: str) -> bool | None:
    """1/0, true/false, on/off, yes/no (any case, blanks around ignored) as True or False; None for anything else."""
    value = text.strip().lower()
    return True if value in _ON else False if value in _OFF else None


def env_switch(name: str, default: bool) -> bool:
    """The switch `name` (unset or empty: `default`).

    Raises:
        EnvSettingError: any value but 1/0, true/false, on/off, yes/no (case and surrounding blanks ignored).
    """
    raw = os.environ.get(name, "")
    if not raw.strip():
        return default
    if (value := parse_switch(raw)) is not None:
        return value
    raise EnvSettingError(f"{name}={raw!r} is not a switch: set it to 1 or 0 (true/false, on/off and yes/no work "
                          "too), or unset it")


def env_choice(name: str, choices: Iterable[str], default: str) -> str:
    """The value of `name`, one of `choices` (lower case; unset or empty: `default`).

    Raises:
        EnvSettingError: a value not among `choices` (case and surrounding blanks ignored).
    """
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if not value:
        return default
    options = tuple(choices)
    if value not in options:
        raise EnvSettingError(f"{name}={raw!r} is not one of {', '.join(options)}; set one of them, or unset it "
                              f"(default {default})")
    return value


def env_int(name: str, default: int, low: int, high: int, unit: str = "") -> int:
    """The integer value of `name` in [low, high] (unset or empty: `default`).

    Raises:
        EnvSettingError: not a decimal integer, or out of range.
    """
    raw = os.environ.get(name, "")
    text = raw.strip()
    if not text:
        return default
    what = f" {unit}" if unit else ""
    if not re.fullmatch(r"[+-]?[0-9]+", text) or not low <= int(text) <= high:
        raise EnvSettingError(f"{name}={raw!r} is not a whole number from {low} to {high}{what}; set one, or unset "
                              f"it (default {default})")
    return int(text)


def solo_cache_home() -> Path:
    """The folder Solo's caches live under: $XDG_CACHE_HOME/solo, else ~/.cache/solo (the XDG base directory rule).

    The kernels (`solo.runtime.cpu_build.cache_dir`), GGUF conversions (`solo.model.gguf.cache_root`, unless
    SOLO_CACHE_DIR) and Triton tuning (`solo.runtime.triton.tuning.cache_path`, unless SOLO_TUNING_CACHE).
    """
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "solo"
