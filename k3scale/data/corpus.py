"""Documents, text normalisation and the split rules shared by every corpus.

A document is the unit that goes to exactly one split (a dictionary entry, one address, one
chapter, one text file). Normalised documents contain no blank lines, so a split's text file
holds its documents separated by one blank line and can be read back by `read_text_documents`.
"""

from __future__ import annotations

import hashlib
import math
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from k3scale.errors import K3ScaleError

SPLITS = ("train", "val_id", "val_ood")

# Small enough to keep training data, large enough for a stable eval at the default
# data.eval_tokens (65,536): 2% of english_mix is about 0.8 MB of text.
VAL_ID_FRACTION = 0.02
# Used only when a text folder has no separate --ood text: one file in ten is held out as OOD.
OOD_FRACTION = 0.10

_BLANK_LINES = re.compile(r"\n[ \t]*\n")
_SPACES = re.compile(r"[ \t\f\v]+")


@dataclass(frozen=True, kw_only=True)
class Document:
    """One unit of text that goes to exactly one split."""

    doc_id: str
    """Stable identity, e.g. `sotu/1790_george_washington_n` (drives the seeded split choice)."""
    text: str
    """Normalised text: no blank lines, no trailing spaces."""


@dataclass(frozen=True, kw_only=True)
class SplitDocuments:
    """The documents of each split, in a fixed order."""

    train: tuple[Document, ...]
    val_id: tuple[Document, ...]
    val_ood: tuple[Document, ...]

    def get(self, split: str) -> tuple[Document, ...]:
        return getattr(self, split)


def normalize_document(text: str) -> str:
    """Unwrap a text into one line per paragraph.

    Paragraphs are separated by blank lines; a paragraph's wrapped lines are joined with one
    space and runs of spaces collapse. Unicode is NFC-normalised so equal text has equal bytes.
    """
    text = unicodedata.normalize("NFC", text.replace("\r\n", "\n").replace("\r", "\n"))
    paragraphs = []
    for block in _BLANK_LINES.split(text):
        line = _SPACES.sub(" ", " ".join(part.strip() for part in block.split("\n"))).strip()
        if line:
            paragraphs.append(line)
    return "\n".join(paragraphs)


def make_document(doc_id: str, raw_text: str) -> Document | None:
    """A normalised document, or None when nothing but whitespace is left."""
    text = normalize_document(raw_text)
    return Document(doc_id=doc_id, text=text) if text else None


def join_documents(documents: Iterable[Document]) -> str:
    """The on-disk text form of a split: documents separated by one blank line."""
    return "".join(doc.text + "\n\n" for doc in documents)


def held_out_ids(documents: Sequence[Document], fraction: float, seed: int, salt: str) -> set[str]:
    """A seeded choice of `ceil(fraction * n)` documents (at least one).

    Documents are ranked by sha256 of (seed, salt, doc_id): the choice does not depend on the
    order documents were read in, nor on any random-number library version.
    """
    count = max(1, math.ceil(fraction * len(documents)))

    def rank(doc: Document) -> str:
        return hashlib.sha256(f"{seed}:{salt}:{doc.doc_id}".encode()).hexdigest()

    return {doc.doc_id for doc in sorted(documents, key=rank)[:count]}


def split_in_distribution(
    documents: Sequence[Document], seed: int, salt: str
) -> tuple[list[Document], list[Document]]:
    """(train, val_id): a seeded `VAL_ID_FRACTION` of documents held out, order kept."""
    if len(documents) < 2:
        raise K3ScaleError(
            f"split {salt}: need at least 2 documents for train and val_id, got {len(documents)} "
            "(add more text, or split a single file into paragraphs separated by blank lines)"
        )
    held = held_out_ids(documents, VAL_ID_FRACTION, seed, salt)
    train = [doc for doc in documents if doc.doc_id not in held]
    val = [doc for doc in documents if doc.doc_id in held]
    return train, val


def read_text_documents(path: Path, prefix: str) -> list[Document]:
    """Documents from a .txt file (one per blank-line-separated paragraph) or a folder.

    A folder gives one document per `*.txt` file (searched recursively, sorted by relative
    path); a single file gives one document per paragraph.
    """
    path = Path(path)
    if not path.exists():
        raise K3ScaleError(f"read text: {path} does not exist (pass a .txt file or a folder)")
    if path.is_file():
        raw = _read_utf8(path)
        docs = (
            make_document(f"{prefix}/{i}", block) for i, block in enumerate(_BLANK_LINES.split(raw))
        )
        documents = [doc for doc in docs if doc is not None]
    else:
        files = sorted(path.rglob("*.txt"), key=lambda p: p.relative_to(path).as_posix())
        docs = (
            make_document(f"{prefix}/{f.relative_to(path).as_posix()}", _read_utf8(f))
            for f in files
        )
        documents = [doc for doc in docs if doc is not None]
    if not documents:
        raise K3ScaleError(
            f"read text: no non-empty .txt text under {path} (put UTF-8 .txt files there)"
        )
    return documents


def _read_utf8(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise K3ScaleError(f"read text: {path} is not UTF-8 ({exc.reason}); convert it") from None
