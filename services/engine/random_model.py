"""Model directories with random weights and a tokenizer trained here, for tests
and the GPU check: nothing is downloaded, yet the directory loads through the
same `from_pretrained` path as a real model.

    python -m services.engine.random_model DIR [--size tiny|gpt2-small]

The tokenizer is a byte-level BPE (GPT-2's scheme) trained on a small corpus
that includes multi-byte text, so characters like "é", "東" and "🙂" are split
across tokens exactly where incremental detokenisation can go wrong.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
)

EOS = "<|endoftext|>"
PASSAGE = (
    "the quick brown fox jumps over the lazy dog while a naïve café owner counts tokens "
    "one by one — streaming them as soon as each is ready. Ünïcödé, 東京, Ελληνικά, "
    "emoji 🙂🚀 and ‘quotes’ travel through the same stream."
)


@dataclass(frozen=True)
class Size:
    arch: str
    hidden: int
    layers: int
    heads: int
    vocab: int  # the BPE's target size (the model's vocabulary is the tokenizer's)
    context: int


SIZES = {
    # Fast on two CPU cores: the test suite's model.
    "tiny": Size("llama", hidden=32, layers=2, heads=2, vocab=512, context=4096),
    # GPT-2 small's body (12 layers × 768, ~85 M parameters) with a 16 k vocabulary.
    "gpt2-small": Size("gpt2", hidden=768, layers=12, heads=12, vocab=16_384, context=1024),
}


def corpus(words: int, seed: int = 0) -> Iterator[str]:
    """The passage, then pseudo-words from syllables: enough distinct strings for
    the BPE to reach a realistic vocabulary without any downloaded text."""
    rng = random.Random(seed)
    syllables = [c + v for c in "bcdfghklmnprstvwz" for v in ("a", "e", "i", "o", "u", "é", "ö")]
    for _ in range(20):
        yield PASSAGE
    line: list[str] = []
    for _ in range(words):
        line.append("".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))))
        if len(line) == 16:
            yield " ".join(line)
            line = []


def train_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOS], show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus(words=max(2_000, vocab_size * 8)), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token=EOS, bos_token=EOS)


def build(directory: Path, size: str = "tiny", seed: int = 0) -> Path:
    """Write a loadable model directory (config, safetensors weights, tokenizer)."""
    spec = SIZES[size]
    tokenizer = train_tokenizer(spec.vocab)
    torch.manual_seed(seed)
    eos = tokenizer.eos_token_id
    model: torch.nn.Module
    if spec.arch == "llama":
        model = LlamaForCausalLM(LlamaConfig(
            vocab_size=len(tokenizer), hidden_size=spec.hidden, intermediate_size=spec.hidden * 2,
            num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
            num_key_value_heads=spec.heads, max_position_embeddings=spec.context,
            bos_token_id=eos, eos_token_id=eos))
    else:
        model = GPT2LMHeadModel(GPT2Config(
            vocab_size=len(tokenizer), n_embd=spec.hidden, n_layer=spec.layers,
            n_head=spec.heads, n_positions=spec.context, bos_token_id=eos, eos_token_id=eos))
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--size", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(build(args.directory, args.size, args.seed))


if __name__ == "__main__":
    main()
