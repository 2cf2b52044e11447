"""Loading and saving model directories in HF's format: `config.json` + `model.safetensors` (or `pytorch_model.bin`).

Loading is strict: every missing, unexpected or mis-shaped tensor is named in one error. `pytorch_model.bin` is
read with `torch.load(weights_only=True)`, which refuses arbitrary pickled objects; nothing here unpickles anything
else. Saving always writes safetensors, with tied weights stored once (under their first name, as HF does).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from .config import TxlConfig, UnsupportedConfigError
from .model import TransfoXLLMHeadModel

CONFIG_NAME = "config.json"
SAFETENSORS_NAME = "model.safetensors"
PYTORCH_NAME = "pytorch_model.bin"
# Buffers HF stores that are derived from the config: accepted when present, recomputed, never required.
_DERIVED = {"transformer.pos_emb.inv_freq"}

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class CheckpointError(Exception):
    """A model directory cannot be loaded; the message says what is wrong and where."""


class MissingFileError(CheckpointError, FileNotFoundError):
    pass


class CorruptCheckpointError(CheckpointError):
    """The weights file is truncated or not in the format its name says."""


class StateDictMismatchError(CheckpointError):
    """Tensors missing, unexpected or of the wrong shape. Each list names them all."""

    def __init__(
        self, missing: list[str], unexpected: list[str], mismatched: list[tuple[str, tuple, tuple]]
    ) -> None:
        self.missing, self.unexpected, self.mismatched = missing, unexpected, mismatched
        parts = []
        if missing:
            parts.append(f"missing tensors: {', '.join(missing)}")
        if unexpected:
            parts.append(f"unexpected tensors: {', '.join(unexpected)}")
        if mismatched:
            shapes = ", ".join(f"{n} (file {list(got)}, model {list(want)})" for n, got, want in mismatched)
            parts.append(f"shape mismatch: {shapes}")
        super().__init__("checkpoint does not match its config: " + "; ".join(parts))


class UnsupportedCheckpointError(CheckpointError, UnsupportedConfigError):
    pass


def resolve_dtype(dtype: torch.dtype | str) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in _DTYPES.values():
            raise ValueError(f"unsupported dtype {dtype}; choose one of {sorted(_DTYPES)}")
        return dtype
    try:
        return _DTYPES[dtype]
    except KeyError:
        raise ValueError(f"unsupported dtype {dtype!r}; choose one of {sorted(_DTYPES)}") from None


def read_config(model_dir: str | Path) -> TxlConfig:
    path = Path(model_dir) / CONFIG_NAME
    if not path.is_file():
        raise MissingFileError(f"{path} not found: a model directory needs {CONFIG_NAME}")
    try:
        return TxlConfig.from_json_file(path)
    except UnsupportedConfigError as exc:
        raise UnsupportedCheckpointError(f"{path}: {exc}") from exc


def read_state_dict(model_dir: str | Path) -> dict[str, Tensor]:
    """The tensors of a model directory, from safetensors if present, else from a weights-only torch file."""
    model_dir = Path(model_dir)
    safetensors_path, torch_path = model_dir / SAFETENSORS_NAME, model_dir / PYTORCH_NAME
    if safetensors_path.is_file():
        try:
            return load_file(str(safetensors_path))
        except (SafetensorError, OSError, ValueError) as exc:
            raise CorruptCheckpointError(
                f"{safetensors_path} is not a readable safetensors file: {exc}"
            ) from exc
    if torch_path.is_file():
        try:
            state = torch.load(str(torch_path), map_location="cpu", weights_only=True)
        except Exception as exc:  # truncated zip, foreign pickle, ...: all mean "cannot use this file"
            raise CorruptCheckpointError(
                f"{torch_path} is not a readable weights-only PyTorch file: {exc}"
            ) from exc
        if not isinstance(state, dict) or not all(isinstance(v, Tensor) for v in state.values()):
            raise CorruptCheckpointError(f"{torch_path} does not hold a flat dict of tensors")
        return state
    raise MissingFileError(f"no weights in {model_dir}: expected {SAFETENSORS_NAME} or {PYTORCH_NAME}")


def build_model(
    config: TxlConfig, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> TransfoXLLMHeadModel:
    """A model with uninitialised weights on `device` (built on the meta device: no time spent on random init)."""
    with torch.device("meta"):
        model = TransfoXLLMHeadModel(config)
    model = model.to_empty(device=device).to(dtype)
    model.tie_weights()  # to_empty can replace shared parameters by separate ones
    model.transformer.pos_emb.reset_buffers()
    return model.eval()


def load_state_dict_strict(model: TransfoXLLMHeadModel, state: dict[str, Tensor]) -> None:
    """Copies `state` into `model`, converting dtype; raises StateDictMismatchError naming every problem.

    Nothing is copied unless everything matches.
    """
    targets = model.state_dict()
    aliases = model.tied_names()
    names_of: dict[str, list[str]] = {name: [name] for name in targets if name not in aliases}
    for alias, owner in aliases.items():
        # A tied tensor may be stored under any of its names (HF's .bin keeps all, safetensors keeps one).
        names_of[owner].append(alias)
    sources: dict[str, Tensor] = {}
    missing, mismatched = [], []
    for name, names in names_of.items():
        if name in _DERIVED:
            continue
        source = next((state[n] for n in names if n in state), None)
        if source is None:
            missing.append(name)
            continue
        for n in names:
            if n in state and tuple(state[n].shape) != tuple(targets[n].shape):
                mismatched.append((n, tuple(state[n].shape), tuple(targets[n].shape)))
        sources[name] = source
    unexpected = sorted(set(state) - set(targets))
    if missing or unexpected or mismatched:
        raise StateDictMismatchError(sorted(missing), unexpected, mismatched)
    not_float = sorted(name for name, t in sources.items() if not t.is_floating_point())
    if not_float:
        raise CorruptCheckpointError(f"tensors that should hold floats do not: {', '.join(not_float)}")
    with torch.no_grad():
        for name, source in sources.items():
            targets[name].copy_(source)


def load_pretrained(
    model_dir: str | Path,
    *,
    dtype: torch.dtype | str = torch.float32,
    device: str | torch.device = "cpu",
) -> TransfoXLLMHeadModel:
    """Loads a model directory (HF format) for inference: eval mode, the given dtype and device."""
    config = read_config(model_dir)
    state = read_state_dict(model_dir)
    model = build_model(config, dtype=resolve_dtype(dtype), device=device)
    load_state_dict_strict(model, state)
    return model


def save_pretrained(
    model: TransfoXLLMHeadModel, model_dir: str | Path, *, extra_config: dict | None = None
) -> None:
    """Writes `config.json` and `model.safetensors` (float tensors as they are; tied weights once)."""
    model_dir = Path(model_dir)
    model_dir.mkdir(parents=True, exist_ok=True)
    aliases = model.tied_names()
    tensors = {
        name: t.detach().contiguous().cpu() for name, t in model.state_dict().items() if name not in aliases
    }
    save_file(tensors, str(model_dir / SAFETENSORS_NAME), metadata={"format": "pt"})
    config = model.config.to_dict()
    config["torch_dtype"] = str(model.dtype).removeprefix("torch.")
    config.update(extra_config or {})
    (model_dir / CONFIG_NAME).write_text(
        json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
