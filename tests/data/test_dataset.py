"""Opening prepared datasets: corruption, truncation and incomplete folders are caught."""

import os
import shutil
from pathlib import Path

import pytest

from k3scale.data import open_dataset
from k3scale.data.dataset import MARKER
from k3scale.errors import K3ScaleError


@pytest.fixture
def copy(tmp_path: Path, sample_dataset) -> Path:
    target = tmp_path / "sample"
    shutil.copytree(sample_dataset.path, target)
    return target


def test_opens_by_name_and_by_path(copy: Path, sample_dataset):
    assert open_dataset("sample", root=copy.parent).fingerprint == sample_dataset.fingerprint
    assert open_dataset(copy).fingerprint == sample_dataset.fingerprint


@pytest.mark.parametrize("name", ["train.bin", "val_id.bin", "val_ood.bin", "tokenizer.json"])
def test_one_flipped_byte_is_detected(copy: Path, name: str):
    path = copy / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    stat = path.stat()
    path.write_bytes(bytes(data))
    # Same size and mtime as before: only the content hash can tell.
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(K3ScaleError, match=f"{name} is corrupted"):
        open_dataset(copy)


def test_truncated_shard_is_detected(copy: Path):
    path = copy / "train.bin"
    path.write_bytes(path.read_bytes()[:-2])
    with pytest.raises(K3ScaleError, match="truncated"):
        open_dataset(copy, verify=False)


def test_missing_marker_means_incomplete(copy: Path):
    (copy / MARKER).unlink()
    with pytest.raises(K3ScaleError, match="incomplete"):
        open_dataset(copy)


def test_missing_dataset_names_the_fix(tmp_path: Path):
    with pytest.raises(K3ScaleError, match="k3scale data prepare --name nope"):
        open_dataset("nope", root=tmp_path)


def test_unknown_split_names_the_field(sample_dataset):
    with pytest.raises(ValueError, match="split"):
        sample_dataset.split("validation")


def test_fingerprint_check(sample_dataset):
    sample_dataset.check_fingerprint(None)
    sample_dataset.check_fingerprint(sample_dataset.fingerprint)
    with pytest.raises(K3ScaleError, match=r"data\.fingerprint"):
        sample_dataset.check_fingerprint("0" * 64)
