"""A checkpoint's JSON files, read as objects with typed fields.

config.json, generation_config.json and tokenizer_config.json: each error names the file or the field and the fix.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from solo.errors import CheckpointError

REQUIRED: Any = object()  # `int_field`'s default for a field that must be present


def read_json_object(path: Path) -> dict[str, Any]:
    """The JSON object in `path`.

    Raises:
        OSError: the file cannot be read.
        CheckpointError: it is not UTF-8, not JSON, nested past Python's recursion limit, or not an object.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as exc:  # (not JSON, not UTF-8, nested too deep)
        raise CheckpointError(f"{path} is not valid JSON ({exc}); re-download it") from None
    if not isinstance(data, dict):
        kind = "null" if data is None else type(data).__name__
        raise CheckpointError(f"{path} holds a JSON {kind}, not an object; re-download it")
    return data


def int_field(raw: dict[str, Any], key: str, default: Any = REQUIRED) -> int:  # noqa: ANN401
    """config.json's integer field `key`: a JSON integer, or a number with no fraction (2048.0).

    Null or absent is `default`.

    Raises:
        CheckpointError: absent with no default, or not an integer (true, 1.5, "2048").
    """
    value = raw.get(key)
    if value is None:
        if default is REQUIRED:
            raise CheckpointError(f"config.json lacks the field {key!r}; re-download the model's config.json")
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or (
            isinstance(value, float) and not value.is_integer()):
        raise CheckpointError(f"config.json gives {key} = {value!r}; it must be an integer. Fix or re-download it")
    return int(value)


def float_field(raw: dict[str, Any], key: str, default: float) -> float:
    """config.json's number field `key` (null or absent: `default`).

    Raises:
        CheckpointError: not a number (true, "1e-6").
    """
    value = raw.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CheckpointError(f"config.json gives {key} = {value!r}; it must be a number. Fix or re-download it")
    return float(value)
