"""Build a prepared dataset folder from split documents (or token arrays), atomically.

Everything is written into a hidden staging folder next to the target; `COMPLETE` is written
last and the staging folder is then renamed into place, so an interrupted build never leaves a
folder that looks complete. A target whose recipe matches and whose files verify is left alone.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from k3scale.data.corpus import SPLITS, SplitDocuments, join_documents
from k3scale.data.dataset import (
    FORMAT_VERSION,
    HEADER,
    MARKER,
    TOKENIZER,
    PreparedDataset,
    compute_fingerprint,
    open_dataset,
    shard_name,
    write_shard,
)
from k3scale.data.sources import sha256_file
from k3scale.data.tokenizer import encode_documents, load_tokenizer, token_dtype, train_tokenizer
from k3scale.errors import K3ScaleError

Log = Callable[[str], None]


@dataclass
class StepTimer:
    """Progress lines with elapsed time, and per-step durations for the summary."""

    log: Log
    start: float = field(default_factory=time.perf_counter)
    durations: dict[str, float] = field(default_factory=dict)

    def say(self, message: str) -> None:
        self.log(f"[{time.perf_counter() - self.start:7.1f}s] {message}")

    def run(self, step: str, action: Callable[[], object]) -> object:
        began = time.perf_counter()
        result = action()
        self.durations[step] = self.durations.get(step, 0.0) + time.perf_counter() - began
        return result


def existing_if_current(
    target: Path, recipe: dict, force: bool, timer: StepTimer
) -> PreparedDataset | None:
    """The verified dataset at `target` when it was built from `recipe`, else None."""
    if force or not (target / MARKER).is_file() or not (target / HEADER).is_file():
        return None
    header = json.loads((target / HEADER).read_text(encoding="utf-8"))
    if header.get("recipe") != recipe:
        timer.say(f"{target} was built from a different recipe: rebuilding")
        return None
    try:
        return open_dataset(target)
    except K3ScaleError as exc:
        timer.say(f"{exc}: rebuilding")
        return None


@contextmanager
def staging_dir(target: Path) -> Iterator[Path]:
    """A fresh hidden folder next to `target`, removed if the build fails.

    Leftovers of interrupted builds are removed first.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    for leftover in target.parent.glob(f".{target.name}.partial-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    stage = target.parent / f".{target.name}.partial-{os.getpid()}"
    stage.mkdir()
    try:
        yield stage
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def build_from_documents(
    splits: SplitDocuments, *, stage: Path, vocab_size: int, timer: StepTimer
) -> tuple[dict, str]:
    """Write split texts, train the tokenizer on train, write shards.

    Returns:
        (splits header entries, tokenizer sha256).
    """
    (stage / "text").mkdir()
    split_info = {}
    for split in SPLITS:
        path = stage / "text" / f"{split}.txt"
        path.write_text(join_documents(splits.get(split)), encoding="utf-8")
        split_info[split] = {
            "num_documents": len(splits.get(split)),
            "text_bytes": path.stat().st_size,
            "text_sha256": sha256_file(path),
        }
    train_mb = split_info["train"]["text_bytes"] / 1e6
    timer.say(
        f"tokenizer: training byte-level BPE, vocab {vocab_size}, on {train_mb:.1f} MB of train text"
    )
    timer.run("tokenizer", lambda: train_tokenizer(splits.train, vocab_size, stage / TOKENIZER))
    tokenizer = load_tokenizer(stage / TOKENIZER)
    dtype = token_dtype(vocab_size)
    for split in SPLITS:
        docs = splits.get(split)
        timer.say(f"encode {split}: {len(docs)} documents")
        report = _quarter_reporter(timer, f"encode {split}")
        tokens = timer.run(
            "encode", lambda d=docs, r=report: encode_documents(tokenizer, d, dtype, r)
        )
        split_info[split] |= write_shard(tokens, stage / shard_name(split))
    return split_info, sha256_file(stage / TOKENIZER)


def import_token_arrays(arrays: dict[str, np.ndarray], stage: Path) -> dict:
    """Write already-tokenized splits as shards; returns the splits header entries."""
    return {split: write_shard(arrays[split], stage / shard_name(split)) for split in SPLITS}


def finish(
    *,
    stage: Path,
    target: Path,
    header: dict,
    split_info: dict,
    tokenizer_sha256: str | None,
    dtype: np.dtype,
    build_stats: dict,
) -> PreparedDataset:
    """Header, then build stats, then `COMPLETE`, then rename the staging folder into place."""
    fingerprint = compute_fingerprint(
        dtype.name, {s: split_info[s]["sha256"] for s in SPLITS}, tokenizer_sha256
    )
    tokenizer = {"file": TOKENIZER, "sha256": tokenizer_sha256} if tokenizer_sha256 else None
    header = {
        "format_version": FORMAT_VERSION,
        **header,
        "dtype": dtype.name,
        "tokenizer": tokenizer,
        "splits": split_info,
        "fingerprint": fingerprint,
    }
    (stage / HEADER).write_text(
        json.dumps(header, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
    # Timings differ between builds, so they live outside the (byte-identical) header.
    (stage / "build.json").write_text(json.dumps(build_stats, indent=2) + "\n")
    (stage / MARKER).write_text(fingerprint + "\n")
    _swap_into_place(stage, target)
    return open_dataset(target)


def _swap_into_place(stage: Path, target: Path) -> None:
    old = target.parent / f".{target.name}.old-{os.getpid()}"
    if target.exists():
        os.replace(target, old)
    os.replace(stage, target)
    shutil.rmtree(old, ignore_errors=True)


def _quarter_reporter(timer: StepTimer, what: str) -> Callable[[int, int], None]:
    """A progress callback that prints at 25%, 50% and 75% of long encodes."""
    printed = set()

    def report(done: int, total: int) -> None:
        quarter = 4 * done // max(total, 1)
        if 0 < quarter < 4 and quarter not in printed and total > 10_000:
            printed.add(quarter)
            timer.say(f"{what}: {25 * quarter}% of {total} documents")

    return report
