"""Tiny llama-architecture GGUF models for a real llama-server on CPU (REFERENCE.md, llama.cpp):
a target and drafts that share one embedding and output head, each layer's residual output
(attn_output, ffn_down) scaled near zero, so every depth computes nearly the same function
and a draft's acceptance is set by how much its one layer is allowed to move it.

    python tests/engines/tinymodels.py DIR    # target.gguf, draft-exact.gguf, draft-loose.gguf
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

VOCAB = 512
WIDTH = 512
TARGET_LAYERS = 16
FFN = 1024
HEADS = 8
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _vocabulary() -> tuple[list[str], list[float], list[int]]:
    """3 specials, 256 byte tokens, `▁` (without it every text prompt fails with HTTP 400),
    then letters and pieces up to VOCAB."""
    import gguf

    tokens = ["<unk>", "<s>", "</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    pieces = ["▁", *LETTERS, *(f"▁{c}" for c in LETTERS)]
    pieces += [a + b for a in LETTERS for b in LETTERS][: VOCAB - len(tokens) - len(pieces)]
    tokens += pieces
    types += [gguf.TokenType.NORMAL] * len(pieces)
    scores = [0.0] * 259 + [-float(i) for i in range(len(pieces))]
    return tokens, scores, [int(t) for t in types]


def write_model(
    path: Path, layers: int, residual_scale: float, head_shuffle: float = 0.0, seed: int = 7
) -> Path:
    """One model: `layers` blocks whose residual outputs are scaled by `residual_scale` /
    sqrt(WIDTH); the embedding and head are the same for every model (seed 7), but for a
    `head_shuffle` share of the head's rows, swapped among themselves: with the residual
    near zero a model repeats its context's last token, and a draft whose head row for
    that token is swapped proposes another one, rejected every time."""
    import gguf

    shared = np.random.default_rng(seed)
    embed = shared.standard_normal((VOCAB, WIDTH)).astype(np.float32)
    embed[:3] *= 0.01  # the specials (EOS among them) never win the argmax
    blocks = np.random.default_rng(seed + layers + int(residual_scale * 1000))
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name(path.stem)
    writer.add_context_length(2048)
    writer.add_embedding_length(WIDTH)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(WIDTH // HEADS)
    writer.add_vocab_size(VOCAB)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    tokens, scores, types = _vocabulary()
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_tensor("token_embd.weight", embed)
    writer.add_tensor("output_norm.weight", np.ones(WIDTH, np.float32))
    head = embed.copy()
    if head_shuffle:
        rows = np.random.default_rng(seed + 1).permutation(np.arange(3, VOCAB))
        chosen = rows[: int(head_shuffle * len(rows))]
        head[chosen] = head[np.roll(chosen, 1)]
    writer.add_tensor("output.weight", head)
    scale = residual_scale / np.sqrt(WIDTH)

    def weight(rows: int, cols: int, factor: float = 1.0) -> np.ndarray:
        return (blocks.standard_normal((rows, cols)) * factor / np.sqrt(cols)).astype(np.float32)

    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(WIDTH, np.float32))
        for name in ("attn_q", "attn_k", "attn_v"):
            writer.add_tensor(f"blk.{i}.{name}.weight", weight(WIDTH, WIDTH))
        writer.add_tensor(f"blk.{i}.attn_output.weight", weight(WIDTH, WIDTH, scale))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(WIDTH, np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(FFN, WIDTH))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(FFN, WIDTH))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(WIDTH, FFN, scale))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_all(directory: Path) -> dict[str, Path]:
    """The target and two drafts: one that proposes what the target would choose, one whose
    head swaps half of its rows (its proposals for those tokens always rejected)."""
    directory.mkdir(parents=True, exist_ok=True)
    made = {}
    for name, layers, shuffle in (("target", TARGET_LAYERS, 0.0), ("draft-exact", 1, 0.0),
                                  ("draft-loose", 1, 0.5)):  # fmt: skip
        path = directory / f"{name}.gguf"
        if not path.exists():
            write_model(path.with_suffix(".part"), layers, 0.001, shuffle).rename(path)
        made[name] = path
    return made


if __name__ == "__main__":
    for name, path in write_all(Path(sys.argv[1])).items():
        print(name, path, f"{path.stat().st_size / 1e6:.0f} MB")
