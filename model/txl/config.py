"""Transformer-XL hyper-parameters, read from and written to HuggingFace's `config.json` format.

Names follow HF transformers 4.35.2 `TransfoXLConfig` (which follow the paper's code): a checkpoint directory a user
downloaded for `transfo-xl-wt103` loads without renaming anything. Older files use legacy names (`n_token`,
`tie_weight`, `proj_share_all_but_first`); they are accepted and normalised here, once.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class UnsupportedConfigError(ValueError):
    """The config asks for something this implementation deliberately does not support."""


# Keys HF writes that carry no architecture information; accepted and dropped.
_IGNORED_KEYS = {
    "architectures",
    "model_type",
    "torch_dtype",
    "transformers_version",
    "eos_token_id",
    "bos_token_id",
    "pad_token_id",
    "adaptive",  # HF builds the adaptive softmax whatever this says; `cutoffs=[]` is the plain softmax
    "ext_len",
    "eval_tgt_len",
    "init",
    "init_range",
    "init_std",
    "proj_init_std",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "trainer_compatible",
    "_name_or_path",
    "torchscript",
    "use_cache",
    "id2label",
    "label2id",
    "task_specific_params",
    "problem_type",
}

_LEGACY_NAMES = {"n_token": "vocab_size", "tie_weight": "tie_word_embeddings"}


@dataclass
class TxlConfig:
    """Architecture of a Transformer-XL language model (attention type 0: relative, partially learnable)."""

    vocab_size: int = 267735
    cutoffs: list[int] = field(default_factory=lambda: [20000, 40000, 200000])
    d_model: int = 1024
    d_embed: int = 1024
    n_head: int = 16
    d_head: int = 64
    d_inner: int = 4096
    div_val: int = 4
    pre_lnorm: bool = False
    n_layer: int = 18
    # How many past positions the memory keeps; a session may ask for less (or more, up to the server's limit).
    mem_len: int = 1600
    # Distances beyond clamp_len share one positional encoding; <= 0 disables clamping.
    clamp_len: int = 1000
    # Every query attends to exactly `mem_len` keys (HF semantics), as the paper's evaluation did.
    same_length: bool = True
    # Per cluster: share the output projection with the input embedding's. Default from proj_share_all_but_first.
    tie_projs: list[bool] | None = None
    tie_word_embeddings: bool = True
    # False: one pair of (u, v) biases shared by all layers, stored at `transformer.r_w_bias`.
    untie_r: bool = True
    dropout: float = 0.1
    dropatt: float = 0.0
    layer_norm_epsilon: float = 1e-5
    # Segment length the model was trained with; the server ingests text in segments of this many tokens.
    tgt_len: int | None = None
    eos_token_id: int | None = None

    def __post_init__(self) -> None:
        self.cutoffs = [int(c) for c in self.cutoffs]
        if self.tie_projs is None:
            self.tie_projs = [False] + [True] * len(self.cutoffs)
        self.tie_projs = [bool(t) for t in self.tie_projs]
        self.validate()

    # ------------------------------------------------------------------ derived

    @property
    def n_clusters(self) -> int:
        return len(self.cutoffs)

    @property
    def cutoff_ends(self) -> list[int]:
        """Cluster boundaries [0, c1, ..., vocab_size]."""
        return [0, *self.cutoffs, self.vocab_size]

    def cluster_dim(self, i: int) -> int:
        """Embedding width of cluster i: d_embed // div_val**i (a single cluster when div_val == 1)."""
        return self.d_embed if self.div_val == 1 else self.d_embed // (self.div_val**i)

    @property
    def segment_len(self) -> int:
        return self.tgt_len if self.tgt_len else 128

    def validate(self) -> None:
        problems = []
        for name in ("vocab_size", "d_model", "d_embed", "n_head", "d_head", "d_inner", "n_layer", "div_val"):
            if int(getattr(self, name)) <= 0:
                problems.append(f"{name} must be positive, got {getattr(self, name)}")
        if self.mem_len < 0:
            problems.append(f"mem_len must be >= 0, got {self.mem_len}")
        if any(b <= a for a, b in zip(self.cutoffs, self.cutoffs[1:], strict=False)):
            problems.append(f"cutoffs must be strictly increasing, got {self.cutoffs}")
        if self.cutoffs and not (self.cutoffs[0] > 0 and self.cutoffs[-1] < self.vocab_size):
            problems.append(
                f"cutoffs {self.cutoffs} must lie strictly inside (0, vocab_size={self.vocab_size})"
            )
        if self.tie_projs is not None and len(self.tie_projs) != len(self.cutoffs) + 1:
            problems.append(
                f"tie_projs needs {len(self.cutoffs) + 1} entries (one per cluster), got {self.tie_projs}"
            )
        if self.div_val > 1 and self.cutoffs and self.d_embed // (self.div_val ** len(self.cutoffs)) < 1:
            problems.append(
                f"d_embed={self.d_embed} is too small for div_val={self.div_val} and {self.n_clusters} tails"
            )
        if self.tgt_len is not None and self.tgt_len <= 0:
            problems.append(f"tgt_len must be positive, got {self.tgt_len}")
        if problems:
            raise UnsupportedConfigError("invalid Transformer-XL config: " + "; ".join(problems))

    # ------------------------------------------------------------------ HF config.json

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> TxlConfig:
        """Reads an HF `config.json` dict, legacy names included; rejects variants this library does not run."""
        data = dict(raw)
        for old, new in _LEGACY_NAMES.items():
            if old in data:
                value = data.pop(old)
                data.setdefault(new, value)
        if data.get("model_type", "transfo-xl") not in ("transfo-xl", "transfo_xl"):
            raise UnsupportedConfigError(f"model_type {data['model_type']!r} is not a Transformer-XL")
        if int(data.get("attn_type", 0)) != 0:
            raise UnsupportedConfigError(
                f"attn_type={data['attn_type']} is not supported: only 0 (relative partial-learnable attention, "
                "the one every released Transformer-XL checkpoint uses)"
            )
        if int(data.get("sample_softmax", -1)) > 0:
            raise UnsupportedConfigError(
                f"sample_softmax={data['sample_softmax']} is not supported: only the full adaptive softmax (-1)"
            )
        data.pop("attn_type", None)
        data.pop("sample_softmax", None)
        share = data.pop("proj_share_all_but_first", None)
        if "tie_projs" not in data and share is not None:
            n = len(data.get("cutoffs", [20000, 40000, 200000]))  # the class default
            data["tie_projs"] = [False] + [bool(share)] * n
        if "d_embed" not in data and "d_model" in data:
            data["d_embed"] = data["d_model"]
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        unknown = sorted(k for k in data if k not in known and k not in _IGNORED_KEYS)
        if unknown and any(k.startswith(("attn_", "r_", "sample_")) for k in unknown):
            raise UnsupportedConfigError(f"unsupported Transformer-XL options: {unknown}")
        try:
            return cls(**kwargs)
        except TypeError as exc:
            raise UnsupportedConfigError(f"malformed config: {exc}") from exc

    @classmethod
    def from_json_file(cls, path: str | Path) -> TxlConfig:
        try:
            raw = json.loads(Path(path).read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise UnsupportedConfigError(f"{path} is not valid JSON: {exc}") from exc
        if not isinstance(raw, dict):
            raise UnsupportedConfigError(f"{path} must hold a JSON object")
        return cls.from_dict(raw)

    def to_dict(self) -> dict[str, Any]:
        """HF-compatible config dict (loads with `TransfoXLConfig.from_pretrained`)."""
        out: dict[str, Any] = dataclasses.asdict(self)
        out.update(
            architectures=["TransfoXLLMHeadModel"],
            model_type="transfo-xl",
            attn_type=0,
            sample_softmax=-1,
            adaptive=True,
        )
        if out["tgt_len"] is None:
            del out["tgt_len"]
        if out["eos_token_id"] is None:
            del out["eos_token_id"]
        return out

    # ------------------------------------------------------------------ presets

    @classmethod
    def wt103(cls) -> TxlConfig:
        """The paper's WikiText-103 large model (`transfo-xl-wt103`): 18 layers, 267,735 words."""
        return cls(tgt_len=128, eos_token_id=0)

    @classmethod
    def tiny(cls, **overrides: Any) -> TxlConfig:
        """A few-thousand-parameter model for tests."""
        base: dict[str, Any] = dict(
            vocab_size=64,
            cutoffs=[16, 40],
            d_model=16,
            d_embed=16,
            n_head=2,
            d_head=8,
            d_inner=32,
            div_val=2,
            n_layer=2,
            mem_len=16,
            clamp_len=1000,
            same_length=False,
            dropout=0.0,
            tgt_len=8,
        )
        base.update(overrides)
        return cls(**base)

    def param_count(self) -> int:
        """Parameters of the model this config builds (tied weights counted once)."""
        d, h, dh = self.d_model, self.n_head, self.d_head
        per_layer = 3 * d * h * dh + h * dh * d + d * h * dh + 2 * d  # qkv, o, r_net, attention LayerNorm
        per_layer += d * self.d_inner + self.d_inner + self.d_inner * d + d + 2 * d  # FF + its LayerNorm
        per_layer += 2 * h * dh if self.untie_r else 0
        total = self.n_layer * per_layer + (0 if self.untie_r else 2 * h * dh)
        ends = self.cutoff_ends
        n_emb = 1 if self.div_val == 1 else len(ends) - 1
        for i in range(n_emb):
            size = self.vocab_size if self.div_val == 1 else ends[i + 1] - ends[i]
            dim = self.cluster_dim(i)
            total += size * dim + (
                0 if (self.div_val == 1 and dim == d) else d * dim
            )  # embedding + projection
            total += size + (0 if self.tie_word_embeddings else size * dim)  # output bias (+ untied weight)
        for i in range(len(ends) - 1):
            dim = self.cluster_dim(0 if self.div_val == 1 else i)
            has_proj = self.div_val != 1 or dim != d
            assert self.tie_projs is not None
            if has_proj and not self.tie_projs[i]:
                total += d * dim
        total += self.n_clusters * (self.d_embed + 1)
        return total

    def memory_bytes_per_token(self, element_size: int = 4) -> int:
        """Bytes the key/value memory holds per remembered position (all layers)."""
        return self.n_layer * 2 * self.n_head * self.d_head * element_size

    def __repr__(self) -> str:  # compact: the dataclass default is one very long line
        params = self.param_count()
        return (
            f"TxlConfig(n_layer={self.n_layer}, d_model={self.d_model}, heads={self.n_head}x{self.d_head}, "
            f"d_inner={self.d_inner}, vocab={self.vocab_size}, cutoffs={self.cutoffs}, div_val={self.div_val}, "
            f"mem_len={self.mem_len}, params={params / 1e6:.2f}M)"
        )
