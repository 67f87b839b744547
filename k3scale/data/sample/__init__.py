"""A committed public-domain sample (about 127 KB) and a tiny dataset built from it for tests.

`SOURCE.json` says where every file came from: excerpts of 12 State of the Union addresses
(`sotu_*.txt`, the in-distribution text) and of 6 Moby-Dick chapters (`moby_dick_*.txt`, the
out-of-distribution text), both public domain, from the npm packages english_mix uses.
"""

from __future__ import annotations

from pathlib import Path

from k3scale.data.corpus import Document, make_document
from k3scale.data.prepare import PrepareResult, prepare_documents

SAMPLE_DIR = Path(__file__).parent
SAMPLE_NAME = "sample"


def sample_documents(prefix: str) -> list[Document]:
    """Documents of the sample files whose names start with `prefix` (`sotu_`, `moby_dick_`)."""
    files = sorted(SAMPLE_DIR.glob(f"{prefix}*.txt"))
    docs = (make_document(f"sample/{f.stem}", f.read_text(encoding="utf-8")) for f in files)
    return [doc for doc in docs if doc is not None]


def prepare_sample(
    out_dir: Path, vocab_size: int = 512, seed: int = 0, force: bool = False
) -> PrepareResult:
    """Prepare the sample as dataset `sample` under `out_dir` in about a second.

    Splits: val_ood = the Moby-Dick excerpts; val_id = a seeded 2% (one) of the addresses;
    train = the other addresses. Progress lines are not printed.
    """
    return prepare_documents(
        sample_documents("sotu_"),
        sample_documents("moby_dick_"),
        Path(out_dir),
        name=SAMPLE_NAME,
        sources=[{"part": "sample", "path": "k3scale/data/sample"}],
        vocab_size=vocab_size,
        seed=seed,
        force=force,
        log=lambda _: None,
    )
