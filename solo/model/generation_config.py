"""Default sampling values and stop tokens from a checkpoint's `generation_config.json`."""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from solo.errors import CheckpointError, SoloWarning
from solo.model.json_file import read_json_object

_UNAPPLIED = {
    "no_repeat_ngram_size": lambda v: isinstance(v, int) and v > 0,
    "suppress_tokens": lambda v: bool(v),
    "begin_suppress_tokens": lambda v: bool(v),
    "bad_words_ids": lambda v: bool(v),
    "sequence_bias": lambda v: bool(v),
    "forced_bos_token_id": lambda v: v is not None,
    "forced_eos_token_id": lambda v: v is not None,
    "num_beams": lambda v: isinstance(v, int) and v > 1,
    "penalty_alpha": lambda v: isinstance(v, int | float) and v > 0,
    "typical_p": lambda v: isinstance(v, int | float) and v < 1,
    "epsilon_cutoff": lambda v: isinstance(v, int | float) and v > 0,
    "eta_cutoff": lambda v: isinstance(v, int | float) and v > 0,
    "min_length": lambda v: isinstance(v, int) and v > 0,
    "min_new_tokens": lambda v: isinstance(v, int) and v > 0,
    "exponential_decay_length_penalty": lambda v: v is not None,
    "guidance_scale": lambda v: isinstance(v, int | float) and v != 1,
}
"""generation_config.json keys that change what transformers' generate writes and that Solo does not apply, each
with the test of a value that acts (transformers' defaults do nothing). Loading a file that sets one warns."""


def unapplied_keys(raw: dict[str, Any]) -> list[str]:
    """The keys of a parsed generation_config.json that would change transformers' output but Solo ignores.

    `max_length` is not among them: Solo bounds a generation by the context and max_tokens, as vLLM does.
    """
    return [key for key, acts in _UNAPPLIED.items() if key in raw and acts(raw[key])]


@dataclass(frozen=True)
class GenerationDefaults:
    """What the checkpoint's authors chose for generation, as `transformers`' GenerationConfig reads it.

    Sampling fields are None when generation_config.json does not set them, so a caller can fall back
    to its own default (greedy for the Python API and CLI, as transformers does; OpenAI's for the server).

    Attributes:
        eos_token_ids: every token id that ends generation (`eos_token_id` may be an int or a list).
        bos_token_id: BOS id, or None.
        do_sample: the file's `do_sample`, or None when absent.
        temperature, top_p, top_k, min_p, repetition_penalty: sampling values, or None when absent.
        max_new_tokens: the file's `max_new_tokens`, or None.
    """

    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    do_sample: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    max_new_tokens: int | None = None

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> GenerationDefaults:
        """Build defaults from the parsed contents of `generation_config.json` (ranges are not checked here).

        Raises:
            TypeError, ValueError: a sampling value or an EOS id is not a number (`from_folder` turns these
                into a CheckpointError).
        """
        eos = raw.get("eos_token_id")
        eos_ids = () if eos is None else ((eos,) if isinstance(eos, int) else tuple(int(e) for e in eos))

        def number(key: str, kind: type) -> Any:
            value = raw.get(key)
            return None if value is None else kind(value)

        return cls(
            eos_token_ids=eos_ids,
            bos_token_id=raw.get("bos_token_id"),
            do_sample=raw.get("do_sample"),
            temperature=number("temperature", float),
            top_p=number("top_p", float),
            top_k=number("top_k", int),
            min_p=number("min_p", float),
            repetition_penalty=number("repetition_penalty", float),
            max_new_tokens=number("max_new_tokens", int),
        )

    @classmethod
    def from_folder(cls, folder: str | Path, fallback_eos_ids: tuple[int, ...] = ()) -> GenerationDefaults:
        """Read `folder/generation_config.json`; without one, only `fallback_eos_ids` (from config.json).

        Raises:
            CheckpointError: the file exists but is not valid JSON, or holds an out-of-range sampling value.
        """
        path = Path(folder) / "generation_config.json"
        if not path.is_file():
            return cls(eos_token_ids=fallback_eos_ids)
        raw = read_json_object(path)
        try:
            defaults = cls.from_dict(raw)
            defaults.check()
        except (TypeError, ValueError) as exc:
            raise CheckpointError(
                f"{path}: {exc}; fix the file (or remove the key)"
            ) from None
        if not defaults.eos_token_ids and fallback_eos_ids:
            defaults = cls(**{**defaults.__dict__, "eos_token_ids": fallback_eos_ids})
        if unapplied := unapplied_keys(raw):
            warnings.warn(f"{path} sets {', '.join(f'{k}={raw[k]!r:.40}' for k in unapplied)}, which Solo does not "
                          "apply, so its outputs can differ from transformers' generate on this checkpoint; its "
                          "other defaults apply (per request: bad_words, logit_bias, min_tokens do similar jobs)",
                          SoloWarning, stacklevel=2)
        return defaults

    def check(self) -> None:
        """Check each sampling value against the range `SamplingParams` accepts.

        Raises:
            ValueError: a value is out of range (the message names the key and the value).
        """
        rules = [
            ("temperature", self.temperature, lambda v: v >= 0, ">= 0"),
            ("top_p", self.top_p, lambda v: 0 < v <= 1, "in (0, 1]"),
            ("top_k", self.top_k, lambda v: v >= -1, ">= -1"),
            ("min_p", self.min_p, lambda v: 0 <= v <= 1, "in [0, 1]"),
            ("repetition_penalty", self.repetition_penalty, lambda v: v > 0, "> 0"),
            ("max_new_tokens", self.max_new_tokens, lambda v: v >= 1, ">= 1"),
        ]
        for key, value, ok, rule in rules:
            if value is not None and (value != value or not ok(value)):  # value != value: NaN
                raise ValueError(f"{key} must be {rule}, got {value!r}")

    def default_temperature(self) -> float | None:
        """Temperature implied by the file: 0 (greedy) when do_sample is false, else the file's value.

        Returns None when the file says nothing, so the caller's own default applies.
        """
        if self.do_sample is False:
            return 0.0
        if self.do_sample is True:
            return 1.0 if self.temperature is None else self.temperature
        return self.temperature
