"""A tiny random Llama with a real (tiny) tokenizer and chat template, so that the whole
pipeline (gateway tokenization, engine, detokenization) runs on it in milliseconds per step.

The tokenizer is a byte-level BPE trained on a few sentences (every byte is in its alphabet,
so any text encodes); the model's vocabulary is exactly the tokenizer's, so every sampled id
decodes.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.fixtures.tiny_models import build_tiny_model

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paged attention stores the key value cache in fixed size blocks.",
    "Continuous batching adds and removes sequences at every step.",
    "Hello, world! How are you today? I am fine, thank you.",
    "Once upon a time there was a little server that answered every request.",
] * 20
MAX_MODEL_LEN = 256


def build_served_model(out_dir: Path, vocab_size: int = 384) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        model_max_length=MAX_MODEL_LEN,
    )
    fast.chat_template = CHAT_TEMPLATE
    build_tiny_model(
        out_dir,
        "llama",
        vocab_size=len(fast),
        max_position_embeddings=MAX_MODEL_LEN,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
    )
    fast.save_pretrained(out_dir)
    (out_dir / "generation_config.json").write_text(
        json.dumps({"eos_token_id": fast.eos_token_id, "bos_token_id": fast.bos_token_id})
    )
    return out_dir
