"""Building datasets from the committed sample: determinism, splits, skip, .bin import."""

import json
from pathlib import Path

import numpy as np
import pytest

from k3scale.data import import_bin, open_dataset, prepare_text
from k3scale.data.dataset import MARKER
from k3scale.data.sample import SAMPLE_DIR, prepare_sample, sample_documents
from k3scale.errors import K3ScaleError


def _file_bytes(folder: Path) -> dict[str, bytes]:
    # build.json holds timings; everything else must be byte-identical.
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != "build.json"
    }


def test_two_prepares_give_identical_bytes_and_fingerprint(tmp_path: Path, sample_dataset):
    again = prepare_sample(tmp_path).dataset
    assert again.fingerprint == sample_dataset.fingerprint
    assert _file_bytes(again.path) == _file_bytes(sample_dataset.path)


def test_seed_changes_the_held_out_choice(tmp_path: Path, sample_dataset):
    other = prepare_sample(tmp_path, seed=1).dataset
    assert other.fingerprint != sample_dataset.fingerprint


def test_splits_are_disjoint_documents(sample_dataset):
    texts = {
        split: set((sample_dataset.path / "text" / f"{split}.txt").read_text().split("\n\n")) - {""}
        for split in ("train", "val_id", "val_ood")
    }
    assert texts["train"] and texts["val_id"] and texts["val_ood"]
    assert not texts["train"] & texts["val_id"]
    assert not texts["train"] & texts["val_ood"]
    assert not texts["val_id"] & texts["val_ood"]
    moby = {doc.text for doc in sample_documents("moby_dick_")}
    assert texts["val_ood"] == moby


def test_header_counts_match_shards_and_tokenizer_decodes(sample_dataset):
    from k3scale.data.tokenizer import load_tokenizer

    header = sample_dataset.header
    assert header["dtype"] == "uint16" and header["vocab_size"] == 512
    tokenizer = load_tokenizer(sample_dataset.tokenizer_path)
    assert tokenizer.get_vocab_size() == 512
    for split in ("train", "val_id", "val_ood"):
        tokens = sample_dataset.split(split)
        assert tokens.size == header["splits"][split]["num_tokens"]
        assert int(tokens.max()) < 512
        assert int(tokens[-1]) == header["eos_id"]
    first_doc = (sample_dataset.path / "text" / "val_ood.txt").read_text().split("\n\n")[0]
    ood = np.asarray(sample_dataset.split("val_ood"))
    end = int(np.flatnonzero(ood == header["eos_id"])[0])
    assert tokenizer.decode(ood[:end].tolist()) == first_doc


def test_rerun_skips_and_writes_nothing(tmp_path: Path):
    first = prepare_sample(tmp_path)
    marker = first.dataset.path / MARKER
    before = marker.stat().st_mtime_ns
    second = prepare_sample(tmp_path)
    assert not first.skipped and second.skipped
    assert marker.stat().st_mtime_ns == before
    forced = prepare_sample(tmp_path, force=True)
    assert not forced.skipped and forced.dataset.fingerprint == first.dataset.fingerprint


def test_changed_recipe_rebuilds(tmp_path: Path):
    small = prepare_sample(tmp_path, vocab_size=300)
    bigger = prepare_sample(tmp_path, vocab_size=400)
    assert not bigger.skipped and bigger.dataset.vocab_size == 400
    assert small.dataset.fingerprint != bigger.dataset.fingerprint


def test_text_folder_holds_out_ood_files(tmp_path: Path):
    result = prepare_text(SAMPLE_DIR, tmp_path, name="folder", vocab_size=300, log=lambda _: None)
    header = result.dataset.header
    docs = {
        split: header["splits"][split]["num_documents"] for split in ("train", "val_id", "val_ood")
    }
    assert docs == {"train": 15, "val_id": 1, "val_ood": 2}  # 18 files: ceil(10%) OOD, ceil(2%) ID
    assert not list(tmp_path.glob(".folder.*"))


def test_empty_text_folder_fails_and_leaves_nothing(tmp_path: Path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(K3ScaleError, match="no non-empty"):
        prepare_text(tmp_path / "empty", tmp_path / "out", name="x", log=lambda _: None)
    assert not (tmp_path / "out").exists()


def test_failed_build_leaves_no_folder(tmp_path: Path):
    with pytest.raises(ValueError, match="vocab_size"):
        prepare_text(SAMPLE_DIR, tmp_path, name="bad", vocab_size=100, log=lambda _: None)
    assert list(tmp_path.iterdir()) == []


def test_bin_import_round_trips_tokens(tmp_path: Path):
    rng = np.random.default_rng(0)
    train = rng.integers(0, 50257, size=5000, dtype=np.uint16)
    val = rng.integers(0, 50257, size=1001, dtype=np.uint16)
    (tmp_path / "bin").mkdir()
    train.tofile(tmp_path / "bin" / "train.bin")
    val.tofile(tmp_path / "bin" / "val.bin")
    result = import_bin(tmp_path / "bin", tmp_path / "out", name="owt", log=lambda _: None)
    dataset = open_dataset("owt", root=tmp_path / "out")
    assert dataset.tokenizer_path is None
    assert dataset.vocab_size == int(max(train.max(), val.max())) + 1
    np.testing.assert_array_equal(dataset.split("train"), train)
    np.testing.assert_array_equal(dataset.split("val_id"), val[:500])
    np.testing.assert_array_equal(dataset.split("val_ood"), val[500:])
    assert result.dataset.fingerprint == dataset.fingerprint
    assert json.loads((dataset.path / "dataset.json").read_text())["kind"] == "bin"


def test_bin_import_rejects_bad_input(tmp_path: Path):
    (tmp_path / "bin").mkdir()
    np.arange(10, dtype=np.uint16).tofile(tmp_path / "bin" / "train.bin")
    with pytest.raises(K3ScaleError, match=r"val\.bin missing"):
        import_bin(tmp_path / "bin", tmp_path / "out", name="x", log=lambda _: None)
    (tmp_path / "bin" / "val.bin").write_bytes(b"\x01\x02\x03")
    with pytest.raises(K3ScaleError, match="not a non-empty uint16"):
        import_bin(tmp_path / "bin", tmp_path / "out", name="x", log=lambda _: None)
    np.arange(10, dtype=np.uint16).tofile(tmp_path / "bin" / "val.bin")
    with pytest.raises(K3ScaleError, match="raise --vocab-size"):
        import_bin(tmp_path / "bin", tmp_path / "out", name="x", vocab_size=5, log=lambda _: None)
