"""What a local checkpoint folder holds, read without loading a weight (torch-free).

``config.json``, the ``*.safetensors`` files (with the shards ``model.safetensors.index.json`` lists), the
tensors' names and shapes from the safetensors headers, and the tokenizer files. Each error names the
config.yaml key that set the folder, so that a wrong path or a partial download stops before minutes of loading.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from specfit.errors import SpecFitError

INDEX = "model.safetensors.index.json"
# a Hugging Face tokenizer folder holds one of these (fast tokenizer, BPE vocab + merges, sentencepiece, WordPiece)
TOKENIZER_FILES = (("tokenizer.json",), ("vocab.json", "merges.txt"), ("tokenizer.model",), ("vocab.txt",))


def read_config(path: str | os.PathLike, what: str, key: str) -> dict:
    """``config.json`` of a local checkpoint folder; ``key`` names the config.yaml entry that sets ``path``."""
    config_path = Path(path) / "config.json"
    if not config_path.is_file():
        raise SpecFitError(
            f"no {what} at {path}: expected a local checkpoint folder with config.json and *.safetensors "
            f"(set by `{key}` in config.yaml)"
        )
    try:
        return json.loads(config_path.read_text())
    except json.JSONDecodeError as err:
        raise SpecFitError(f"{config_path} is not valid JSON ({err}); check the folder set by `{key}`") from None


def weight_files(path: str | os.PathLike, what: str, key: str) -> list[Path]:
    """The ``*.safetensors`` files of a checkpoint; with an index, exactly the shards it lists, all present."""
    path = Path(path)
    index = path / INDEX
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (json.JSONDecodeError, KeyError, AttributeError) as err:
            raise SpecFitError(
                f"{index} is not a safetensors index ({err!r}); check the folder set by `{key}`"
            ) from None
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise SpecFitError(
                f"the {what} at {path} is incomplete: {INDEX} lists {len(shards)} shards and "
                f"{len(missing)} are missing ({', '.join(missing[:4])}{', ...' if len(missing) > 4 else ''}); "
                f"finish the download into the folder set by `{key}`"
            )
        return [path / s for s in shards]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise SpecFitError(f"no *.safetensors weights in the {what} folder {path} (set by `{key}` in config.yaml)")
    return files


def tensor_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor in ``files``, from the safetensors headers alone (no tensor is read)."""
    shapes = {}
    for file in files:
        with open(file, "rb") as f:
            try:
                (n,) = struct.unpack("<Q", f.read(8))
                header = json.loads(f.read(n))
            except (struct.error, json.JSONDecodeError, UnicodeDecodeError) as err:
                raise SpecFitError(f"{file} is not a safetensors file ({err})") from None
        shapes.update({k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"})
    return shapes


def check_tokenizer(path: str | os.PathLike, key: str) -> None:
    """A tokenizer folder must hold tokenizer files: without them transformers returns an empty tokenizer."""
    path = Path(path)
    if not any(all((path / f).is_file() for f in files) for files in TOKENIZER_FILES):
        wanted = ", or ".join(" with ".join(files) for files in TOKENIZER_FILES)
        raise SpecFitError(
            f"no tokenizer files in {path} (expected {wanted}, as in the model's hub folder); "
            f"copy them next to config.json in the folder set by `{key}`"
        )
