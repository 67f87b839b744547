"""Training windows: deterministic, seekable, epoch-aware, inside their split; fixed eval windows."""

import numpy as np
import pytest

from k3scale.data import TrainWindows, eval_windows
from k3scale.data.loader import window_order
from k3scale.errors import K3ScaleError

SEQ_LEN = 64


def test_batches_are_deterministic(sample_dataset):
    a = TrainWindows(sample_dataset, seq_len=SEQ_LEN, seed=3).batch(0, 16)
    b = TrainWindows(sample_dataset, seq_len=SEQ_LEN, seed=3).batch(0, 16)
    c = TrainWindows(sample_dataset, seq_len=SEQ_LEN, seed=4).batch(0, 16)
    assert a.dtype == np.int64 and a.shape == (16, SEQ_LEN + 1)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)


def test_seeking_matches_an_uninterrupted_stream(sample_dataset):
    windows = TrainWindows(sample_dataset, seq_len=SEQ_LEN, seed=0)
    total = windows.windows_per_epoch * 2 + 7  # crosses two epoch boundaries
    stream = windows.batch(0, total)
    resumed = TrainWindows(sample_dataset, seq_len=SEQ_LEN, seed=0)
    pieces = [resumed.batch(start, min(37, total - start)) for start in range(0, total, 37)]
    np.testing.assert_array_equal(np.concatenate(pieces), stream)
    np.testing.assert_array_equal(resumed.batch(total - 5, 5), stream[-5:])


def test_each_epoch_visits_every_window_once_in_a_new_order(sample_dataset):
    windows = TrainWindows(sample_dataset, seq_len=SEQ_LEN, seed=0)
    per_epoch = windows.windows_per_epoch
    tokens = np.asarray(sample_dataset.split("train"))
    assert per_epoch == (tokens.size - 1) // SEQ_LEN
    expected = sorted(
        tokens[k * SEQ_LEN : k * SEQ_LEN + SEQ_LEN + 1].tobytes() for k in range(per_epoch)
    )
    epoch0 = windows.batch(0, per_epoch)
    epoch1 = windows.batch(per_epoch, per_epoch)
    for epoch in (epoch0, epoch1):
        assert sorted(row.astype(tokens.dtype).tobytes() for row in epoch) == expected
    assert not np.array_equal(epoch0, epoch1)
    assert [windows.epoch_of(i) for i in (0, per_epoch - 1, per_epoch, 3 * per_epoch)] == [
        0,
        0,
        1,
        3,
    ]
    assert windows.tokens_per_epoch == per_epoch * SEQ_LEN


def test_windows_never_leave_the_split(sample_dataset):
    val = np.asarray(sample_dataset.split("val_id"))
    windows = TrainWindows(sample_dataset, "val_id", seq_len=SEQ_LEN, seed=0)
    batch = windows.batch(0, windows.windows_per_epoch)
    for row in batch:
        matches = [
            s
            for s in range(0, val.size - SEQ_LEN, SEQ_LEN)
            if np.array_equal(val[s : s + SEQ_LEN + 1], row)
        ]
        assert matches, "every window is a contiguous slice of its own split"
    assert (windows.windows_per_epoch - 1) * SEQ_LEN + SEQ_LEN + 1 <= val.size


def test_window_order_is_a_permutation():
    order = window_order(1000, seed=0, epoch=0)
    assert sorted(order.tolist()) == list(range(1000))
    assert not np.array_equal(order, window_order(1000, seed=0, epoch=1))
    np.testing.assert_array_equal(order, window_order(1000, seed=0, epoch=0))


def test_split_too_small_for_a_window(sample_dataset):
    too_long = sample_dataset.num_tokens("val_id")
    with pytest.raises(K3ScaleError, match="cannot fill one window"):
        TrainWindows(sample_dataset, "val_id", seq_len=too_long, seed=0)


def test_eval_windows_are_fixed_and_spread_over_the_split(sample_dataset):
    first = eval_windows(sample_dataset, "val_ood", SEQ_LEN, 4096)
    TrainWindows(sample_dataset, seq_len=SEQ_LEN, seed=123).batch(
        0, 50
    )  # training does not disturb them
    second = eval_windows(sample_dataset, "val_ood", SEQ_LEN, 4096)
    assert first.shape == (4096 // SEQ_LEN, SEQ_LEN + 1) and first.dtype == np.int64
    np.testing.assert_array_equal(first, second)
    ood = np.asarray(sample_dataset.split("val_ood"))
    np.testing.assert_array_equal(first[0], ood[: SEQ_LEN + 1])
    available = (ood.size - 1) // SEQ_LEN
    last = (63 * available) // 64  # evenly spread over the whole split, not a prefix
    assert last > 63
    np.testing.assert_array_equal(first[-1], ood[last * SEQ_LEN : last * SEQ_LEN + SEQ_LEN + 1])


def test_eval_windows_cap_at_the_split_size(sample_dataset):
    available = (sample_dataset.num_tokens("val_id") - 1) // SEQ_LEN
    windows = eval_windows(sample_dataset, "val_id", SEQ_LEN, 10**9)
    assert windows.shape[0] == available
    assert len({row.tobytes() for row in windows}) == available


def test_epochs_seen_counts_passes(sample_dataset):
    windows = TrainWindows(sample_dataset, seq_len=SEQ_LEN, seed=0)
    assert windows.epochs_seen(0) == 0.0
    assert windows.epochs_seen(windows.windows_per_epoch * 3 // 2) == pytest.approx(1.5, abs=1e-3)
