"""Provenance tags name the code, versions, device and host."""

from __future__ import annotations

import re
import socket

import torch

from k3scale.track import schema
from k3scale.track.provenance import git_state, provenance


def test_provenance_tags():
    tags = provenance()
    assert tags[schema.TAG_VERSION_TORCH] == torch.__version__
    assert tags[schema.TAG_HOSTNAME] == socket.gethostname()
    assert re.fullmatch(r"\d+\.\d+\.\d+", tags[schema.TAG_VERSION_PYTHON])
    assert tags[schema.TAG_DEVICE]
    sha, dirty = git_state()
    assert (tags[schema.TAG_GIT_SHA], tags[schema.TAG_GIT_DIRTY]) == (sha, dirty)
    assert (re.fullmatch(r"[0-9a-f]{40}", sha) and dirty in ("true", "false")) or (
        (sha, dirty) == ("unknown", "unknown")
    )
    assert all(isinstance(value, str) for value in tags.values())
