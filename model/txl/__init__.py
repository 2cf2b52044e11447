"""txl: a Transformer-XL library for exact, cached, incremental inference (and training).

import txl
from txl import load_pretrained
model = load_pretrained("path/to/model_dir")           # HF format: config.json + model.safetensors
memory = model.empty_memory()                            # holds nothing yet
hidden, memory = model(tokens, memory)                   # tokens [B, T]; memory in, new memory out
log_probs = model.log_probs(hidden[:, -1])               # [B, vocab], float32
path = txl.fastest(model.device)                         # the C or Triton kernels (default: torch's, the reference)
hidden, after = model(tokens, memory, path=path)
memory.release()                                         # done with it: its blocks go back to the pool now

The top level reads like the paper (Dai et al., 2019), small parts first: `config`; the layers `positional`
(relative positional embedding), `attention` (relative partial-learnable attention), `feedforward`, `adaptive`
(adaptive embedding and softmax); `model`; `memory` and its `window` rule (which keys each query sees, what a
memory keeps); `checkpoint` (HF checkpoints); `tokenizers`; `sampling` (with `nucleus`, top-p's threshold) and
`scoring`, what is done with the model's output.

How the model serves sits in two sub-packages below those parts (they import none of them but the `window` rule),
and training in one above them:
- `paged`: paged memory (the block pool, a sequence's rows of it) and the machinery of one step over it (step
  plans, decoding plans for many rows, host-to-device staging, the fused native decode step);
- `kernels`: the decode path (`DecodePath`: which kernel each part of a step takes, one value passed down to every
  call), the C kernels (`kernels/cpu`: their build, the linear layers' choice measured on the machine, the C
  allocator's settings) and the Triton kernels (`kernels/triton`);
- `training`: training and evaluating a byte-level model, and its corpus.
"""

from .checkpoint import (
    CheckpointError,
    CorruptCheckpointError,
    MissingFileError,
    StateDictMismatchError,
    UnsupportedCheckpointError,
    build_model,
    load_pretrained,
    read_config,
    save_pretrained,
)
from .config import TxlConfig, UnsupportedConfigError
from .kernels import REFERENCE, DecodePath, fastest
from .memory import HiddenMemory, Memory, peak_positions
from .model import TransfoXLLMHeadModel, TransfoXLModel
from .paged.layout import MemoryLayout
from .paged.pool import BlockPool, PoolExhausted
from .window import WindowRule

__version__ = "0.1.0"

__all__ = [
    "REFERENCE",
    "BlockPool",
    "CheckpointError",
    "CorruptCheckpointError",
    "DecodePath",
    "HiddenMemory",
    "Memory",
    "MemoryLayout",
    "MissingFileError",
    "PoolExhausted",
    "StateDictMismatchError",
    "TransfoXLLMHeadModel",
    "TransfoXLModel",
    "TxlConfig",
    "UnsupportedCheckpointError",
    "UnsupportedConfigError",
    "WindowRule",
    "__version__",
    "build_model",
    "fastest",
    "load_pretrained",
    "peak_positions",
    "read_config",
    "save_pretrained",
]
