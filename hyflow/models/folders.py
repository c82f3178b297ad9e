"""The check that a path is a local Hugging Face model folder, without importing torch or transformers, so the
config checks at load (`hyflow.config.files`) and the loaders (`hyflow.models.loader`) share one rule."""

from __future__ import annotations

import os


def check_local_model_folder(path: str | os.PathLike, key: str = "actor_rollout_ref.model.path") -> str:
    """Return `path` as a string if it is a local Hugging Face model folder, else raise a `ValueError`."""
    path = os.path.expanduser(os.fspath(path))
    if not os.path.isdir(path):
        raise ValueError(
            f"{key}={path!r} is not a local folder. hyflow loads models only from local Hugging Face folders and "
            "downloads nothing; download the checkpoint first (e.g. `hf download NAME --local-dir DIR`) "
            f"and set {key}=DIR, or build a tiny one with hyflow.models.tiny.build_tiny_model(DIR)."
        )
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise ValueError(
            f"{key}={path!r} has no config.json, so it is not a Hugging Face model folder; point {key} at the folder "
            "that holds config.json and the weights (*.safetensors)."
        )
    return path


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def check_local_tokenizer_folder(path: str | os.PathLike, key: str) -> str:
    """Return `path` as a string if it is a local folder holding a saved tokenizer (one of TOKENIZER_FILES; a
    model folder usually has them too), else raise a `ValueError`."""
    path = os.path.expanduser(os.fspath(path))
    if not os.path.isdir(path) or not any(os.path.isfile(os.path.join(path, f)) for f in TOKENIZER_FILES):
        raise ValueError(
            f"{key}={path!r} is not a local folder with a saved tokenizer (none of {list(TOKENIZER_FILES)} there). "
            f"Fix: point {key} at a folder written by tokenizer.save_pretrained(DIR), or leave it unset to use the "
            "model folder's tokenizer."
        )
    return path
