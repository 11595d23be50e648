"""Build a tiny random-weight Llama chat model on disk, offline, for testing against a real engine.

``python scripts/make_tiny_llama.py OUT_DIR`` (a new or empty folder: nothing is overwritten; needs
``torch``, ``transformers`` and ``tokenizers``: ``pip install torch==2.13.0 'transformers[serving]'``).
Writes a ~110k-parameter ``LlamaForCausalLM`` (hidden 64, 2 layers, ``initializer_range`` 0.5 so that
greedy output varies with the prompt) and a byte-level BPE tokenizer trained here on a few KB of text,
with a ChatML-style chat template, both saved with ``save_pretrained``.
Nothing is downloaded. It is a model nobody should use for anything but
exercising an inference server: its output is noise, by construction.

A Llama model type is deliberate: ``transformers serve`` applies a response parser to Qwen2 models that
strips whitespace.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "def solve(n):\n    return sum(range(n))\n",
    "The quick brown fox jumps over the lazy dog. " * 4,
    '{"type": "final", "answer": "42"}',
    '{"type": "tool", "name": "add", "arguments": {"a": 2, "b": 3}}',
    "import sys\nfor line in sys.stdin:\n    print(int(line) * 2)\n",
    "Agentic rollouts alternate between model requests and CPU work on tools. " * 8,
    "0123456789 +-*/=()[]{}<>:;,.!?'\"\n\t",
]


def build(out: Path) -> None:
    try:
        import torch
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
        from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    except ImportError as exc:
        sys.exit(
            f"error: make_tiny_llama.py needs torch, transformers and tokenizers ({exc}): "
            "pip install torch==2.13.0 'transformers[serving]'"
        )

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS * 20, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>", bos_token=None
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    config = LlamaConfig(
        vocab_size=tokenizer.vocab_size + len(specials),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        initializer_range=0.5,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    model.generation_config.do_sample = False
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    print(f"{out}: LlamaForCausalLM with {params} parameters, vocabulary {config.vocab_size}")


if __name__ == "__main__":
    if sys.argv[1:] in (["-h"], ["--help"]):
        print("usage: python scripts/make_tiny_llama.py OUT_DIR\n\n" + (__doc__ or ""))
        sys.exit(0)
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        print("usage: python scripts/make_tiny_llama.py OUT_DIR", file=sys.stderr)
        sys.exit(2)
    out = Path(sys.argv[1])
    if os.path.lexists(out) and not (out.is_dir() and not any(out.iterdir())):
        print(f"error: {out} already exists; choose a new folder (nothing is overwritten)", file=sys.stderr)
        sys.exit(2)
    build(out)
