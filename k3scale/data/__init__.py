"""Corpus build, tokenizer, token shards, splits and loaders (numpy only; no torch).

`open_dataset` opens and verifies a prepared dataset; `TrainWindows` and `eval_windows` read
windows from it; `prepare_english_mix`, `prepare_text` and `import_bin` build one. Layout and
split rules: `k3scale/data/README.md`.
"""

from k3scale.data.dataset import PreparedDataset, open_dataset
from k3scale.data.loader import TrainWindows, eval_windows
from k3scale.data.prepare import PrepareResult, import_bin, prepare_english_mix, prepare_text

__all__ = [
    "PrepareResult",
    "PreparedDataset",
    "TrainWindows",
    "eval_windows",
    "import_bin",
    "open_dataset",
    "prepare_english_mix",
    "prepare_text",
]
