"""A real llama.cpp server for the tests: llama-cpp-python's OpenAI-compatible
server (`python -m llama_cpp.server`, scripts/install_llama_server.sh) on a
tiny model these tests write themselves, so nothing comes from a model hub.

    write_tiny_gguf   a llama-architecture GGUF with random weights (a fixed
                      seed) and a small SentencePiece-style vocabulary of its
                      own: it loads in llama.cpp and generates random English
                      words, never the end-of-sequence token, so an answer is
                      as long as its `max_tokens` (or the context) allows
    llama_server      the server on a free port as a process of its own (the
                      lab's ServiceSpec/start/wait_ready/stop); yields the
                      OpenAI base URL
    require_llama_server  skips the test when the server is not installed

How the tiny model never ends on its own: every token embedding holds the same
constant in dimension 0, and no layer writes to that dimension (the rows of
attn_output and ffn_down for it are zero), so after the final RMSNorm it is
positive for every position. The output matrix has a large negative weight
there for every token that must not be sampled (the end of sequence, the other
control tokens, the byte tokens and the word prefixes the prompt tokenizer
needs) and zero for the words: those tokens' logits sit about a hundred below
the words' at any position, so only words (and "," ".") are ever sampled, at
any temperature, top-k or top-p. Each streamed `content` delta is then a word
(" table"), never empty. The server's request schema also has `min_tokens`
(the end of sequence masked until then); it has no `ignore_eos`.

Things about this server the tests rely on (llama-cpp-python 0.3.36):
  - one generation at a time: a lock around the model. With the default
    `--interrupt_requests True` a request that arrives (any route that takes
    the model: chat, completions, /v1/models too) ends the stream running with
    `data: [DONE]` (no finish_reason) and a connection closed mid-body (an
    incomplete chunked read), then runs; with `False` it gets its headers at
    once, then pings only, and its first token when the running one ends.
  - a client that leaves stops its generation (sse-starlette's disconnect
    listener cancels the publisher); a reader that stops reading stops it too,
    but only once the socket's buffers are full (megabytes on loopback).
  - `/v1/models` lists the model alias (`model_alias`, else the model's path);
    a request's `model` is not checked (an unknown one gets the loaded model),
    and the chunks carry the request's `model`, else the model's path.
  - no /metrics, no `stream_options.include_usage` (no usage chunk when
    streaming); a ": ping - <time>" comment every 15 s (sse-starlette's default).
  - a long answer slows down: each token detokenizes the whole answer so far
    (about 700 tokens/s at first, 90/s past 4,000, 20/s past 19,000 here).
  - a request that fails validation gets a 500 with OpenAI's error object; a
    body that is not JSON a plain 500; a streamed prompt longer than the
    context a 200 with an empty body.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest

from streamlab.lab import processes
from streamlab.lab.processes import ServiceSpec, free_ports

MODEL_ALIAS = "tiny-llama"
INSTALL_HINT = "llama-cpp-python is not installed: bash scripts/install_llama_server.sh"

# The words the model says (each one token, "▁" is SentencePiece's space); a
# prompt written from them (prompt_of_words) is one token a word.
_WORD_TEXT = """
the of and to in is was for on that with as by at from his her it an were are
which this be or has had not first one their its new after but who they have
two been other all time year more when she can also city people into during
world most state only over some school about many would then game may them
team such these three known later before work while house river part where
national being year town music water light word under through between long
each because small great old number sound stone paper table window garden
road bridge market village winter summer morning evening story letter song
voice field forest island mountain ocean cloud river fire wind rain snow
green blue red white black yellow bright quiet quick slow warm cold open
close begin end carry build watch listen write read speak follow answer
"""
WORDS: tuple[str, ...] = tuple(dict.fromkeys(_WORD_TEXT.split()))
PUNCTUATION = (",", ".")
# The printable ASCII characters: the prompt tokenizer's single-character pieces.
CHARACTERS = tuple(chr(c) for c in range(0x21, 0x7F))
SPACE = "\u2581"  # ▁

# Before the words sampled: a default generation prompt of this template.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)
BANNED_LOGIT_WEIGHT = -50.0  # dimension 0's output weight for what must not be sampled
CONSTANT = 4.0  # dimension 0 of every token's embedding


def llama_server_installed() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("llama_cpp", "gguf"))


def require_llama_server() -> None:
    """Skips the calling test (or fixture) when the server or gguf is missing."""
    if not llama_server_installed():
        pytest.skip(INSTALL_HINT)


def vocabulary() -> tuple[list[str], list[float], list[int], list[bool]]:
    """The tiny model's tokens, their scores and types, and which ones it may
    sample: <unk> <s> </s>, the 256 byte tokens (llama.cpp's SentencePiece
    tokenizer needs them), the printable characters and every "▁"-prefix of
    each word (so the tokenizer's merges can reach the word), then the words."""
    tokens: list[str] = ["<unk>", "<s>", "</s>"]
    types = [2, 3, 3]  # gguf.TokenType: UNKNOWN, CONTROL, CONTROL
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256  # BYTE
    pieces: list[str] = [SPACE, *CHARACTERS]
    words = [SPACE + w for w in WORDS]
    for word in words:
        pieces += [word[:end] for end in range(2, len(word))]
    seen = set(tokens)
    for piece in [*pieces, *words, *PUNCTUATION]:
        if piece not in seen:
            seen.add(piece)
            tokens.append(piece)
            types.append(1)  # NORMAL
    sampled = set(words) | set(PUNCTUATION)
    # SentencePiece merges the pair whose result scores highest: longer first.
    scores = [float(len(t)) if kind == 1 else 0.0 for t, kind in zip(tokens, types, strict=True)]
    return tokens, scores, types, [t in sampled for t in tokens]


def write_tiny_gguf(
    path: Path,
    *,
    n_ctx_train: int = 8192,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_ff: int = 128,
    seed: int = 1234,
) -> Path:
    """A llama model with random weights (seeded: the same file each time) that
    llama.cpp loads and that generates words until max_tokens. `n_embd`,
    `n_layer` and `n_ff` make it heavier: prefill time grows with them."""
    import gguf  # type: ignore[import-not-found, unused-ignore]
    import numpy as np

    if n_embd % n_head:
        raise ValueError(f"n_embd ({n_embd}) must be a multiple of n_head ({n_head})")
    tokens, scores, types, sampled = vocabulary()
    n_vocab = len(tokens)
    rng = np.random.default_rng(seed)

    def normal(*shape: int, std: float) -> np.ndarray:
        return rng.normal(0.0, std, size=shape).astype(np.float32)

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("streamlab-tiny")
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_vocab_size(n_vocab)
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head)
    writer.add_rope_dimension_count(n_embd // n_head)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("llama")  # SentencePiece, with byte fallback
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)

    embedding = normal(n_vocab, n_embd, std=1.0)
    embedding[:, 0] = CONSTANT
    writer.add_tensor("token_embd.weight", embedding)
    scale = 1.0 / np.sqrt(n_embd)
    for layer in range(n_layer):
        block = f"blk.{layer}"
        writer.add_tensor(f"{block}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        for name in ("attn_q", "attn_k", "attn_v"):
            writer.add_tensor(f"{block}.{name}.weight", normal(n_embd, n_embd, std=scale))
        attn_output = normal(n_embd, n_embd, std=scale)
        attn_output[0, :] = 0.0  # nothing writes to dimension 0
        writer.add_tensor(f"{block}.attn_output.weight", attn_output)
        writer.add_tensor(f"{block}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"{block}.ffn_gate.weight", normal(n_ff, n_embd, std=scale))
        writer.add_tensor(f"{block}.ffn_up.weight", normal(n_ff, n_embd, std=scale))
        ffn_down = normal(n_embd, n_ff, std=1.0 / np.sqrt(n_ff))
        ffn_down[0, :] = 0.0
        writer.add_tensor(f"{block}.ffn_down.weight", ffn_down)
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    # Logits of a few units' spread among the words: varied, not one word forever.
    output = normal(n_vocab, n_embd, std=2.5 / np.sqrt(n_embd))
    output[:, 0] = np.where(np.array(sampled), 0.0, BANNED_LOGIT_WEIGHT).astype(np.float32)
    writer.add_tensor("output.weight", output)

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def prompt_of_words(count: int, seed: int = 0) -> str:
    """`count` of the model's words: about one prompt token a word (text of
    other words costs a token a character or so)."""
    import random

    picker = random.Random(seed)
    return " ".join(picker.choice(WORDS) for _ in range(count))


@contextlib.contextmanager
def llama_server(
    model_path: Path,
    *,
    n_ctx: int = 8192,
    port: int | None = None,
    extra_args: Sequence[str] = (),
    model_alias: str = MODEL_ALIAS,
    log_dir: Path | None = None,
    ready_timeout_s: float = 60.0,
) -> Iterator[str]:
    """`python -m llama_cpp.server` on `model_path`, as a process of its own on
    127.0.0.1 (a free port unless `port`); yields its OpenAI base URL
    (http://127.0.0.1:P/v1) once /v1/models answers, and stops it after.
    `extra_args` go to its command line as they are (e.g. "--interrupt_requests",
    "False"); its output goes to llama-server.log in `log_dir` (a temporary
    folder unless given)."""
    require_llama_server()
    if port is None:
        (port,) = free_ports(1)
    base = f"http://127.0.0.1:{port}"
    spec = ServiceSpec(
        "llama-server",
        [sys.executable, "-m", "llama_cpp.server", "--model", str(model_path),
         "--model_alias", model_alias, "--host", "127.0.0.1", "--port", str(port),
         "--n_ctx", str(n_ctx), *extra_args],
        # uvicorn.run in llama_cpp.server reads HOST and PORT from the
        # environment before its settings: the ones asked for win.
        env={"HOST": "127.0.0.1", "PORT": str(port)},
        ready=lambda: httpx.get(base + "/v1/models", timeout=2.0).status_code == 200,
        ready_timeout_s=ready_timeout_s,
    )
    with contextlib.ExitStack() as stack:
        if log_dir is None:
            log_dir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="llama-")))
        stack.enter_context(processes.serving(spec, log_dir))
        yield base + "/v1"
