"""The three ways to prepare a dataset: `english_mix`, your own text, nanoGPT `.bin` shards.

Split rules (also in `k3scale/data/README.md`):
- english_mix: val_ood = all of Moby-Dick (literary prose, never trained on); val_id = a seeded
  2% of dictionary entries and 2% of State of the Union addresses; train = the rest.
- text: one document per .txt file of a folder (per blank-line paragraph of a single file);
  val_ood = the `--ood` text, or else a seeded 10% of the documents; val_id = a seeded 2% of
  the remaining documents; train = the rest.
- bin: train.bin -> train, val.bin -> val_id, ood.bin -> val_ood (if absent, val.bin's second
  half is val_ood and its first half val_id).
"""

from __future__ import annotations

import hashlib
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from k3scale.data.build import (
    Log,
    StepTimer,
    build_from_documents,
    existing_if_current,
    finish,
    import_token_arrays,
    staging_dir,
)
from k3scale.data.corpus import (
    OOD_FRACTION,
    Document,
    SplitDocuments,
    held_out_ids,
    join_documents,
    read_text_documents,
    split_in_distribution,
)
from k3scale.data.dataset import FORMAT_VERSION, PreparedDataset
from k3scale.data.gcide import read_gcide
from k3scale.data.sources import (
    ENGLISH_MIX_ARTIFACTS,
    GCIDE,
    MOBY_DICK,
    SOTU,
    extract_gcide_dictd,
    fetch_artifact,
    read_moby_dick,
    read_sotu,
)
from k3scale.data.tokenizer import token_dtype
from k3scale.errors import K3ScaleError

DEFAULT_VOCAB_SIZE = 8192


@dataclass(frozen=True)
class PrepareResult:
    """What `prepare_*` did."""

    dataset: PreparedDataset
    skipped: bool
    """True when an up-to-date dataset was already there and nothing was written."""
    seconds: float
    """Wall time of this call."""


def prepare_english_mix(
    out: Path,
    *,
    name: str = "english_mix",
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    seed: int = 0,
    force: bool = False,
    log: Log = print,
) -> PrepareResult:
    """Build `english_mix` from the three pinned registry artifacts (downloads cached in `out/downloads`)."""
    timer = StepTimer(log)
    recipe = {
        "kind": "english_mix",
        "format_version": FORMAT_VERSION,
        "artifacts": {a.part: a.sha256 for a in ENGLISH_MIX_ARTIFACTS},
        "vocab_size": vocab_size,
        "seed": seed,
    }
    target = Path(out) / name
    if (current := existing_if_current(target, recipe, force, timer)) is not None:
        return PrepareResult(current, True, time.perf_counter() - timer.start)
    downloads = {}
    for artifact in ENGLISH_MIX_ARTIFACTS:
        downloads[artifact.part] = timer.run(
            "download", lambda a=artifact: fetch_artifact(a, Path(out) / "downloads", timer.say)
        )
    timer.say("clean: reading the dictionary, addresses and Moby-Dick")
    with tempfile.TemporaryDirectory(prefix=".extract-", dir=out) as tmp:
        dictd = extract_gcide_dictd(downloads["gcide"], Path(tmp))
        parts = timer.run(
            "clean",
            lambda: {
                "gcide": read_gcide(dictd),
                "sotu": read_sotu(downloads["sotu"]),
                "moby_dick": read_moby_dick(downloads["moby_dick"]),
            },
        )
    gcide_train, gcide_val = split_in_distribution(parts["gcide"], seed, "gcide")
    sotu_train, sotu_val = split_in_distribution(parts["sotu"], seed, "sotu")
    splits = SplitDocuments(
        train=(*gcide_train, *sotu_train),
        val_id=(*gcide_val, *sotu_val),
        val_ood=tuple(parts["moby_dick"]),
    )
    sources = [_source_entry(a, parts[a.part]) for a in (GCIDE, SOTU, MOBY_DICK)]
    header = {
        "name": name,
        "kind": "english_mix",
        "recipe": recipe,
        "vocab_size": vocab_size,
        "sources": sources,
        "split_rule": "val_ood: all of Moby-Dick; val_id: seeded 2% of dictionary entries and of addresses",
    }
    return _build(splits, header, target, vocab_size, timer)


def prepare_text(
    text: Path,
    out: Path,
    *,
    name: str,
    ood: Path | None = None,
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    seed: int = 0,
    force: bool = False,
    log: Log = print,
) -> PrepareResult:
    """Build a dataset from your own UTF-8 text (a .txt file or a folder of them)."""
    documents = read_text_documents(Path(text), "text")
    ood_documents = read_text_documents(Path(ood), "ood") if ood is not None else None
    sources = [{"part": "text", "path": str(text)}]
    if ood is not None:
        sources.append({"part": "ood", "path": str(ood)})
    return prepare_documents(
        documents,
        ood_documents,
        out,
        name=name,
        sources=sources,
        vocab_size=vocab_size,
        seed=seed,
        force=force,
        log=log,
    )


def prepare_documents(
    documents: list[Document],
    ood_documents: list[Document] | None,
    out: Path,
    *,
    name: str,
    sources: list[dict],
    vocab_size: int = DEFAULT_VOCAB_SIZE,
    seed: int = 0,
    force: bool = False,
    log: Log = print,
) -> PrepareResult:
    """Build a dataset from in-distribution documents and optional OOD documents.

    Without OOD documents a seeded `OOD_FRACTION` of the documents is held out as val_ood.
    """
    timer = StepTimer(log)
    recipe = {
        "kind": "text",
        "format_version": FORMAT_VERSION,
        "text_sha256": _documents_hash(documents),
        "ood_sha256": _documents_hash(ood_documents) if ood_documents else None,
        "vocab_size": vocab_size,
        "seed": seed,
    }
    target = Path(out) / name
    if (current := existing_if_current(target, recipe, force, timer)) is not None:
        return PrepareResult(current, True, time.perf_counter() - timer.start)
    rule = "val_ood: the separate OOD text"
    if ood_documents is None:
        if len(documents) < 3:
            raise K3ScaleError(
                f"split {name}: need at least 3 documents (files, or paragraphs of one file) to "
                f"hold out OOD and ID validation text, got {len(documents)}; pass --ood PATH"
            )
        held = held_out_ids(documents, OOD_FRACTION, seed, "ood")
        ood_documents = [doc for doc in documents if doc.doc_id in held]
        documents = [doc for doc in documents if doc.doc_id not in held]
        rule = "val_ood: seeded 10% of documents"
    train, val_id = split_in_distribution(documents, seed, "text")
    splits = SplitDocuments(train=tuple(train), val_id=tuple(val_id), val_ood=tuple(ood_documents))
    header = {
        "name": name,
        "kind": "text",
        "recipe": recipe,
        "vocab_size": vocab_size,
        "sources": sources,
        "split_rule": rule + "; val_id: seeded 2% of the other documents",
    }
    return _build(splits, header, target, vocab_size, timer)


def import_bin(
    bin_dir: Path,
    out: Path,
    *,
    name: str,
    vocab_size: int | None = None,
    force: bool = False,
    log: Log = print,
) -> PrepareResult:
    """Import nanoGPT-style shards: `train.bin`, `val.bin` (optional `ood.bin`), uint16 ids."""
    timer = StepTimer(log)
    arrays = _read_bin_shards(Path(bin_dir))
    largest = max(int(a.max()) for a in arrays.values())
    vocab = vocab_size if vocab_size is not None else largest + 1
    if largest >= vocab:
        raise K3ScaleError(
            f"import {bin_dir}: token id {largest} >= --vocab-size {vocab}; raise --vocab-size"
        )
    recipe = {
        "kind": "bin",
        "format_version": FORMAT_VERSION,
        "shards_sha256": {
            k: hashlib.sha256(v.tobytes()).hexdigest() for k, v in sorted(arrays.items())
        },
        "vocab_size": vocab,
    }
    target = Path(out) / name
    if (current := existing_if_current(target, recipe, force, timer)) is not None:
        return PrepareResult(current, True, time.perf_counter() - timer.start)
    if "ood" in arrays:
        splits = {"train": arrays["train"], "val_id": arrays["val"], "val_ood": arrays["ood"]}
        rule = "train.bin, val.bin, ood.bin"
    else:
        half = arrays["val"].size // 2
        splits = {
            "train": arrays["train"],
            "val_id": arrays["val"][:half],
            "val_ood": arrays["val"][half:],
        }
        rule = (
            "train.bin; val_id: first half of val.bin; val_ood: second half (no separate OOD text)"
        )
    header = {
        "name": name,
        "kind": "bin",
        "recipe": recipe,
        "vocab_size": vocab,
        "sources": [{"part": "bin", "path": str(bin_dir)}],
        "split_rule": rule,
    }
    with staging_dir(target) as stage:
        split_info = import_token_arrays(splits, stage)
        dataset = finish(
            stage=stage,
            target=target,
            header=header,
            split_info=split_info,
            tokenizer_sha256=None,
            dtype=np.dtype(np.uint16),
            build_stats={"seconds": {"total": time.perf_counter() - timer.start}},
        )
    return PrepareResult(dataset, False, time.perf_counter() - timer.start)


def _build(
    splits: SplitDocuments, header: dict, target: Path, vocab_size: int, timer: StepTimer
) -> PrepareResult:
    with staging_dir(target) as stage:
        split_info, tokenizer_sha = build_from_documents(
            splits, stage=stage, vocab_size=vocab_size, timer=timer
        )
        timer.durations["total"] = time.perf_counter() - timer.start
        dataset = finish(
            stage=stage,
            target=target,
            header={**header, "eos_id": 0},
            split_info=split_info,
            tokenizer_sha256=tokenizer_sha,
            dtype=token_dtype(vocab_size),
            build_stats={"seconds": timer.durations},
        )
    return PrepareResult(dataset, False, time.perf_counter() - timer.start)


def _source_entry(artifact, documents: list[Document]) -> dict:
    clean = join_documents(documents).encode("utf-8")
    return {
        "part": artifact.part,
        "registry": artifact.registry,
        "package": artifact.spec,
        "artifact": artifact.filename,
        "artifact_sha256": artifact.sha256,
        "licence": artifact.licence,
        "num_documents": len(documents),
        "clean_bytes": len(clean),
        "clean_sha256": hashlib.sha256(clean).hexdigest(),
    }


def _documents_hash(documents: list[Document]) -> str:
    digest = hashlib.sha256()
    for doc in documents:
        digest.update(f"{doc.doc_id}\0{doc.text}\0".encode())
    return digest.hexdigest()


def _read_bin_shards(bin_dir: Path) -> dict[str, np.ndarray]:
    arrays = {}
    for part in ("train", "val", "ood"):
        path = bin_dir / f"{part}.bin"
        if not path.is_file():
            if part == "ood":
                continue
            raise K3ScaleError(
                f"import {bin_dir}: {path.name} missing (expected train.bin and val.bin, uint16)"
            )
        if path.stat().st_size % 2 or path.stat().st_size == 0:
            raise K3ScaleError(
                f"import {path}: {path.stat().st_size} bytes is not a non-empty uint16 array"
            )
        arrays[part] = np.fromfile(path, dtype="<u2")
    return arrays
