"""Tokenizers of the families the embedded models lack, built offline with ``tokenizers``."""

from __future__ import annotations

import transformers as tf
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

_PIECES = ["▁When", "▁Ma", "ry", "▁and", "▁John", "▁went", "▁", *"abcdefghijklmnopqrstuvwxyz"]


def sentencepiece(layout: str) -> tf.PreTrainedTokenizerBase:
    """
    A LLaMA-style Unigram tokenizer with byte fallback, in either of LLaMA's two layouts.

    ``metaspace``: a Metaspace pre-tokenizer (``▁`` for spaces, prepended to the first word);
    ``normalizer``: the older LLaMA layout (a normaliser prepends ``▁`` and replaces spaces).
    As transformers' LLaMA converter writes them.
    """
    bytes_ = [(f"<0x{b:02X}>", 0.0) for b in range(256)]
    vocab = [("<unk>", 0.0), ("<s>", 0.0), ("</s>", 0.0), *bytes_]
    vocab += [(p, -1.0 if len(p) > 1 else -10.0) for p in _PIECES]
    tok = Tokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=True))
    if layout == "metaspace":
        tok.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first", split=False)
    else:
        tok.normalizer = normalizers.Sequence(
            [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
        )
    # both layouts decode alike, dropping the space prepended to the first word
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return tf.PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
