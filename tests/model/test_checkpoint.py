"""Loading model directories: strict, typed errors; dtypes; saving round-trips."""

from __future__ import annotations

import json

import pytest
import torch
import txl
from safetensors.torch import load_file, save_file

from tests.helpers.tiny_models import saved_tiny_model, tiny_model


@pytest.fixture
def model_dir(tmp_path):
    return saved_tiny_model(tmp_path / "model", seed=3)


def test_save_then_load_is_the_same_function(model_dir):
    original = tiny_model(seed=3)
    loaded = txl.load_pretrained(model_dir)
    tokens = torch.randint(0, 64, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        expected = original.log_probs(original(tokens, original.empty_memory())[0])
        got = loaded.log_probs(loaded(tokens, loaded.empty_memory())[0])
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    # Tied weights stay tied after loading, and are stored once.
    assert loaded.crit.out_layers[0].weight is loaded.transformer.word_emb.emb_layers[0].weight
    assert "crit.out_layers.0.weight" not in load_file(str(model_dir / "model.safetensors"))


def test_missing_directory_files_are_named(tmp_path, model_dir):
    with pytest.raises(txl.MissingFileError, match=r"config\.json"):
        txl.load_pretrained(tmp_path / "nowhere")
    (model_dir / "model.safetensors").unlink()
    with pytest.raises(txl.MissingFileError, match=r"model\.safetensors or pytorch_model\.bin"):
        txl.load_pretrained(model_dir)


def test_every_wrong_shape_missing_and_unexpected_tensor_is_named(model_dir):
    path = model_dir / "model.safetensors"
    state = load_file(str(path))
    state["transformer.layers.0.dec_attn.qkv_net.weight"] = torch.zeros(5, 5)
    state["transformer.layers.1.pos_ff.CoreNet.0.bias"] = torch.zeros(3)
    del state["transformer.layers.1.dec_attn.r_net.weight"]
    state["transformer.layers.9.extra"] = torch.zeros(1)
    save_file(state, str(path))
    with pytest.raises(txl.StateDictMismatchError) as info:
        txl.load_pretrained(model_dir)
    error = info.value
    assert error.missing == ["transformer.layers.1.dec_attn.r_net.weight"]
    assert error.unexpected == ["transformer.layers.9.extra"]
    assert {name for name, _, _ in error.mismatched} == {
        "transformer.layers.0.dec_attn.qkv_net.weight",
        "transformer.layers.1.pos_ff.CoreNet.0.bias",
    }
    message = str(error)
    assert "[5, 5]" in message and "r_net.weight" in message and "layers.9.extra" in message


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"attn_type": 1}, "attn_type=1"),
        ({"sample_softmax": 1000}, "sample_softmax"),
        ({"cutoffs": [40, 16]}, "strictly increasing"),
        ({"model_type": "gpt2"}, "not a Transformer-XL"),
        ({"d_model": -3}, "d_model must be positive"),
    ],
)
def test_unsupported_config_is_refused_clearly(model_dir, change, match):
    config_path = model_dir / "config.json"
    config = json.loads(config_path.read_text())
    config.update(change)
    config_path.write_text(json.dumps(config))
    with pytest.raises(txl.UnsupportedConfigError, match=match):
        txl.load_pretrained(model_dir)


def test_malformed_config_json_is_refused(model_dir):
    (model_dir / "config.json").write_text("{not json")
    with pytest.raises(txl.UnsupportedConfigError, match="not valid JSON"):
        txl.load_pretrained(model_dir)


def test_truncated_safetensors_is_a_corrupt_checkpoint(model_dir):
    path = model_dir / "model.safetensors"
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(txl.CorruptCheckpointError, match="safetensors"):
        txl.load_pretrained(model_dir)


def test_truncated_or_malicious_pytorch_bin_is_refused(model_dir, tmp_path):
    state = load_file(str(model_dir / "model.safetensors"))
    (model_dir / "model.safetensors").unlink()
    bin_path = model_dir / "pytorch_model.bin"
    torch.save(state, bin_path)
    assert isinstance(txl.load_pretrained(model_dir), txl.TransfoXLLMHeadModel)
    bin_path.write_bytes(bin_path.read_bytes()[:1000])
    with pytest.raises(txl.CorruptCheckpointError):
        txl.load_pretrained(model_dir)

    marker = tmp_path / "pwned"

    class Exploit:
        def __reduce__(self):
            import os

            return (os.system, (f"touch {marker}",))

    torch.save({"x": Exploit()}, bin_path)
    with pytest.raises(txl.CorruptCheckpointError, match="weights-only"):
        txl.load_pretrained(model_dir)
    assert not marker.exists()


def test_legacy_config_names_are_read():
    config = txl.TxlConfig.from_dict(
        {
            "n_token": 100,
            "tie_weight": False,
            "tgt_len": 64,
            "cutoffs": [10, 50],
            "proj_share_all_but_first": False,
            "d_model": 16,
            "n_head": 2,
            "d_head": 8,
            "d_inner": 32,
            "n_layer": 1,
            "div_val": 2,
            "ext_len": 0,
        }
    )
    assert (config.vocab_size, config.tie_word_embeddings, config.segment_len) == (100, False, 64)
    assert config.tie_projs == [False, False, False] and config.d_embed == 16


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_loads_and_stays_finite(model_dir, dtype):
    reference = txl.load_pretrained(model_dir)
    half = txl.load_pretrained(model_dir, dtype=dtype)
    assert half.dtype == dtype
    tokens = torch.randint(0, 64, (1, 16), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        expected = reference.log_probs(reference(tokens, reference.empty_memory())[0])
        hidden, memory = half(tokens, half.empty_memory())
        got = half.log_probs(hidden)
    assert got.dtype == torch.float32 and torch.isfinite(got).all()
    assert memory.keys(0).dtype == dtype
    assert (got.exp() - expected.exp()).abs().max() < 0.05


def test_float16_log_softmax_does_not_overflow_with_large_logits(tmp_path):
    # Logits beyond float16's range of exp(): the head still gives finite, normalised log-probabilities.
    model = tiny_model(seed=5, weight_scale=0.3)
    with torch.no_grad():
        model.crit.cluster_bias.fill_(30.0)
        model.crit.out_layers[0].bias[:3] = 40.0
    txl.save_pretrained(model, tmp_path / "m")
    half = txl.load_pretrained(tmp_path / "m", dtype="float16")
    with torch.inference_mode():
        hidden, _ = half(torch.tensor([[1, 2, 3]]), half.empty_memory())
        log_probs = half.log_probs(hidden)
    assert torch.isfinite(log_probs).all()
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(1, 3), atol=1e-3, rtol=0)


def test_unknown_dtype_is_refused(model_dir):
    with pytest.raises(ValueError, match="unsupported dtype"):
        txl.load_pretrained(model_dir, dtype="int8")
