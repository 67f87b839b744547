"""`k3scale data` through the real entry point (argparse, handlers, one-line errors)."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from k3scale.cli import main

STUDY = Path(__file__).resolve().parents[2] / "experiments" / "k2_vs_k3.py"
PREPARE_OPTIONS = [
    "--out",
    "--name",
    "--text",
    "--ood",
    "--bin",
    "--vocab-size",
    "--for",
    "--preset",
    "--seed",
    "--force",
]


def _help(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def test_prepare_help_lists_every_option_with_help_text(capsys):
    text = _help(capsys, "data", "prepare")
    for option in PREPARE_OPTIONS:
        assert re.search(rf"^  {option}\b.*\S", text, flags=re.MULTILINE), option
    assert "train.bin" in text and "uint16" in text


def test_info_and_verify_help(capsys):
    assert "--json" in _help(capsys, "data", "info")
    assert "--root" in _help(capsys, "data", "verify")


def test_prepare_text_info_and_verify(tmp_path: Path, capsys):
    folder = Path(__file__).parents[2] / "k3scale" / "data" / "sample"
    argv = [
        "data",
        "prepare",
        "--text",
        str(folder),
        "--out",
        str(tmp_path),
        "--name",
        "s",
        "--vocab-size",
        "300",
    ]
    assert main(argv) == 0
    built = capsys.readouterr().out
    assert "built" in built and "fingerprint" in built and "val_ood" in built
    assert main(argv) == 0
    assert "up to date, nothing written" in capsys.readouterr().out
    assert main(["data", "info", "s", "--root", str(tmp_path), "--json"]) == 0
    header = json.loads(capsys.readouterr().out)
    assert header["vocab_size"] == 300
    assert main(["data", "verify", str(tmp_path / "s")]) == 0
    assert header["fingerprint"] in capsys.readouterr().out


def test_errors_are_one_line_and_non_zero(tmp_path: Path, capsys):
    (tmp_path / "empty").mkdir()
    assert main(["data", "prepare", "--text", str(tmp_path / "empty"), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("k3scale data: error: read text: no non-empty")
    assert main(["data", "info", "missing", "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "k3scale data prepare --name missing" in err


def test_corrupted_shard_fails_verify(tmp_path: Path, capsys):
    (tmp_path / "bin").mkdir()
    np.arange(1000, dtype=np.uint16).tofile(tmp_path / "bin" / "train.bin")
    np.arange(100, dtype=np.uint16).tofile(tmp_path / "bin" / "val.bin")
    assert (
        main(
            [
                "data",
                "prepare",
                "--bin",
                str(tmp_path / "bin"),
                "--out",
                str(tmp_path),
                "--name",
                "b",
            ]
        )
        == 0
    )
    shard = tmp_path / "b" / "val_ood.bin"
    data = bytearray(shard.read_bytes())
    data[3] ^= 0x80
    shard.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["data", "verify", "b", "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "val_ood.bin is corrupted" in err


def test_ood_without_text_is_rejected(tmp_path: Path, capsys):
    assert main(["data", "prepare", "--ood", str(tmp_path), "--out", str(tmp_path)]) == 2
    assert "--ood needs --text" in capsys.readouterr().err


def test_prepare_for_a_study_takes_the_presets_build(tmp_path: Path, capsys):
    """--for names the build a study's preset trains on; the build itself is english_mix's
    (tests/data/test_prepare.py), so only the choice is checked here."""
    import argparse

    from k3scale.commands.data import _for_study

    args = argparse.Namespace(
        for_study=str(STUDY), preset="cpu_v3", name=None, vocab_size=None,
        text=None, bin=None,
    )  # fmt: skip
    _for_study(args)
    assert (args.name, args.vocab_size) == ("english_mix_v512", 512)
    alone = ["data", "prepare", "--for", str(STUDY), "--out", str(tmp_path)]
    assert main(alone) == 2
    assert "--for and --preset go together" in capsys.readouterr().err
    assert main([*alone, "--preset", "demo", "--vocab-size", "600"]) == 2
    assert "--for sets the dataset; drop --vocab-size" in capsys.readouterr().err
