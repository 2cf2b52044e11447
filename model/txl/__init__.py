"""txl: a Transformer-XL library for exact, cached, incremental inference (and training).

from txl import load_pretrained
model = load_pretrained("path/to/model_dir")           # HF format: config.json + model.safetensors
memory = model.empty_memory()                            # holds nothing yet
hidden, memory = model(tokens, memory)                   # tokens [B, T]; memory in, new memory out
log_probs = model.log_probs(hidden[:, -1])               # [B, vocab], float32
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
from .memory import HiddenMemory, Memory, peak_positions
from .model import TransfoXLLMHeadModel, TransfoXLModel
from .paged.layout import MemoryLayout
from .paged.pool import BlockPool, PoolExhausted
from .window import WindowRule

__version__ = "0.1.0"

__all__ = [
    "BlockPool",
    "CheckpointError",
    "CorruptCheckpointError",
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
    "load_pretrained",
    "peak_positions",
    "read_config",
    "save_pretrained",
]
