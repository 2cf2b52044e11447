"""A tiny byte model whose every next byte is fixed by the byte before it (a scripted bigram: attention and
feed-forward outputs are zero, so the hidden state is the last byte's embedding, and the output layer maps each
scripted byte to its successor). After the transcript template's "Assistant:" it writes " Hi!\\nUser:", so a
chat reply ends at the template's stop ("\\nUser:") as "Hi!": a `completed` response, made for real."""

from __future__ import annotations

from pathlib import Path

import torch
import txl
from txl.tokenizers import ByteTokenizer, save_tokenizer

from tests.helpers.tiny_models import BYTE_SIZES, BYTE_VOCABULARY, tiny_model

SCRIPT = " Hi!\nUser:"  # each byte is followed by the next, the last by the first
LOGIT = 40.0  # the successor's logit, the others' 0: sampling at any temperature up to 2 follows the script


def make_scripted_model_dir(path: Path, *, seed: int = 0) -> Path:
    model = tiny_model(seed, **{**BYTE_VOCABULARY, **BYTE_SIZES}, tie_word_embeddings=False)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "o_net" in name or "CoreNet.3" in name:
                param.zero_()  # attention and feed-forward add nothing: h = LayerNorm(embedding)
            elif "layer_norm.weight" in name:
                param.fill_(1.0)
            elif "layer_norm.bias" in name:
                param.zero_()
        embedding = model.transformer.word_emb.emb_layers[0].weight  # [256, d]
        script = list(SCRIPT.encode())
        hidden = torch.nn.functional.layer_norm(embedding[script], (embedding.shape[1],))  # [k, d]
        targets = torch.zeros(256, len(script))  # [256, k]
        for i in range(len(script)):
            targets[script[(i + 1) % len(script)], i] = LOGIT
        out = model.crit.out_layers[0]
        out.weight.copy_(targets @ torch.linalg.pinv(hidden.T))  # [256, d]: out.weight @ h_i = targets[:, i]
        out.bias.zero_()
    txl.save_pretrained(model, path)
    save_tokenizer(ByteTokenizer(), path)
    return path
