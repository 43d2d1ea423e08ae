"""The software stacks a node can carry, as exact pins. One place; install.sh.j2 renders them.

`stock` (default): stock CPU PyTorch (gloo for all-reduce) and Intel MPI from PyPI.
`intel`: the 2021 recipe's stack. Intel Extension for PyTorch is archived upstream and
oneCCL bindings for PyTorch (oneccl_bind_pt) are deprecated; 2.7.0 is the last release of
the pair that matches one torch (IPEX 2.8.0 has no oneccl_bind_pt to go with it), and
oneccl_bind_pt is only on Intel's own wheel index.
`ipex`: the intel stack's parts that PyPI carries (IPEX 2.7.0 and its torch), all-reduce over gloo:
ipex.optimize without oneCCL, for where Intel's index is out of reach (`make test-intel` runs it).
PyPI's Linux torch 2.7.0 is the CUDA build (about 5 GB with its nvidia-* wheels; AWS and your
own servers get the CPU build from PyTorch's index instead).
"""

import functools

# impi-rt 2021.19.0 needs a libfabric that PyPI lacks; 2021.18.1 bundles its own.
_COMMON = {"transformers": "5.24.0", "tokenizers": "0.23.3", "datasets": "5.2.0", "numpy": "2.4.6",
           "tensorboard": "2.21.0", "impi-rt": "2021.18.1"}
# IPEX 2.7.0 does not import with transformers 5 (it needs transformers.modeling_attn_mask_utils, gone in 5.0:
# NameError MoeModelOutputWithPast). 4.57.6 is the last 4.x and the first line to take train.py's `dtype=`
# (4.56+); it needs tokenizers < 0.23 and huggingface-hub < 1.0, which datasets 5.2.0 refuses and 5.0.1 takes.
_IPEX_27 = {**_COMMON, "transformers": "4.57.6", "tokenizers": "0.22.2", "datasets": "5.0.1"}

STACKS: dict[str, dict[str, str]] = {
    "stock": {"torch": "2.13.0", **_COMMON},
    "intel": {"torch": "2.7.0", "intel-extension-for-pytorch": "2.7.0", "oneccl-bind-pt": "2.7.0", **_IPEX_27},
    "ipex": {"torch": "2.7.0", "intel-extension-for-pytorch": "2.7.0", **_IPEX_27},
}

TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
# uv installs the stack where it can be fetched (templates/installer.sh; `make setup` reads this line):
# the same pins from the same indexes as pip, several times faster (docs/install.json).
UV_VERSION = "0.13.9"
INTEL_INDEX = "https://pytorch-extension.intel.com/release-whl/stable/cpu/us/"


@functools.cache
def missing_from_this_python(stack: str) -> tuple[str, ...]:
    """Pins of `stack` that this Python does not carry at exactly that version (local reuse check).
    Cached: this process does not install packages, and every node of a bootstrap asks."""
    from importlib import metadata  # a twentieth of a second to import: only a local bootstrap asks
    missing = []
    for package, version in STACKS[stack].items():
        try:
            installed = metadata.version(package)
        except metadata.PackageNotFoundError:
            missing.append(f"{package}=={version}")
            continue
        if installed.split("+")[0] != version:
            missing.append(f"{package}=={version} (have {installed})")
    return tuple(missing)
