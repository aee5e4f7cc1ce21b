"""Solo's bundled default model: where it lives inside the package.

The folder is a regular Hugging Face model folder (``config.json``, ``model.safetensors`` in
bfloat16, ``tokenizer.json``, ...) produced by ``python -m solo.train`` (see
``scripts/train_default_model.sh``) and shipped as package data under ``solo/assets/``.
"""

from __future__ import annotations

from pathlib import Path

from solo.errors import ModelNotFoundError

#: Name of the bundled default model (also its folder name under ``solo/assets``).
DEFAULT_MODEL_NAME = "solo-code-16m"

#: Files a usable model folder must contain.
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def assets_dir() -> Path:
    """Return the folder that holds bundled models (``solo/assets``); it may not exist."""
    return Path(__file__).resolve().parent.parent / "assets"


def default_model_path() -> Path:
    """Return the folder of the bundled default model.

    Returns:
        Absolute path of ``solo/assets/<DEFAULT_MODEL_NAME>``.

    Raises:
        ModelNotFoundError: if the folder or one of :data:`REQUIRED_FILES` is missing (e.g. the
            model has not been trained yet in a source checkout); the message says how to build it.
    """
    path = assets_dir() / DEFAULT_MODEL_NAME
    missing = [name for name in REQUIRED_FILES if not (path / name).is_file()]
    if missing:
        raise ModelNotFoundError(
            f"Solo's default model {DEFAULT_MODEL_NAME!r} is not installed at {path} "
            f"(missing: {', '.join(missing)}). Build it with scripts/train_default_model.sh, "
            "or name a model explicitly."
        )
    return path
