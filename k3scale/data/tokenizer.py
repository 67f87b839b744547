"""Byte-level BPE tokenizer (the `tokenizers` package): train on the train split, encode splits.

Every document ends with the end-of-text token, so a window that spans two documents still
tells the model where one ended. Training is deterministic: the same documents in the same
order give the same `tokenizer.json` bytes (checked by the tests).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from k3scale.data.corpus import Document

END_OF_TEXT = "<|endoftext|>"
# Documents per encode_batch call: bounds memory on 40 MB splits.
_ENCODE_CHUNK = 2048


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 while every id fits (vocab <= 65,536), else uint32."""
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def train_tokenizer(documents: Sequence[Document], vocab_size: int, path: Path) -> None:
    """Train byte-level BPE with `vocab_size` entries (end-of-text is id 0) and save it.

    Raises:
        ValueError: vocab_size below the 256 byte symbols + end-of-text.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    # 256 byte-level symbols plus the end-of-text token.
    if vocab_size < 257:
        raise ValueError(
            f"vocab_size: must be at least 257 (256 bytes + end-of-text), got {vocab_size}"
        )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[END_OF_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_texts(documents), trainer=trainer, length=len(documents))
    tokenizer.save(str(path))


def load_tokenizer(path: Path):
    """The saved `tokenizers.Tokenizer`."""
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(path))


def encode_documents(
    tokenizer,
    documents: Sequence[Document],
    dtype: np.dtype,
    progress: Callable[[int, int], None] | None = None,
) -> np.ndarray:
    """All documents' token ids, each followed by end-of-text: 1-D array of `dtype`.

    Args:
        tokenizer: a `tokenizers.Tokenizer` with the end-of-text token.
        documents: in split order.
        dtype: storage dtype (uint16/uint32).
        progress: called with (documents done, total) after each chunk.
    """
    eos = tokenizer.token_to_id(END_OF_TEXT)
    pieces = []
    for start in range(0, len(documents), _ENCODE_CHUNK):
        chunk = documents[start : start + _ENCODE_CHUNK]
        for encoding in tokenizer.encode_batch(
            [doc.text for doc in chunk], add_special_tokens=False
        ):
            pieces.append(np.asarray(encoding.ids, dtype=dtype))
            pieces.append(np.asarray([eos], dtype=dtype))
        if progress is not None:
            progress(min(start + _ENCODE_CHUNK, len(documents)), len(documents))
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=dtype)


def _texts(documents: Sequence[Document]) -> Iterator[str]:
    for doc in documents:
        yield doc.text
