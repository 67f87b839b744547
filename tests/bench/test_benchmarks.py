"""`k3scale bench NAME --quick --json` runs and prints the documented JSON (numbers are not
checked against targets: benchmarks report measurements, tests do not time anything)."""

from __future__ import annotations

import json
import math

import pytest

from k3scale.cli import main


def bench_json(name: str, capsys) -> dict:
    assert main(["bench", name, "--quick", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def positive(x) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x > 0


def test_kda_prints_speedups_and_layer_ratios(capsys):
    result = bench_json("kda", capsys)
    assert set(result["chunk_vs_recurrent_speedup"]) == {"64", "256"}
    assert all(positive(x) for x in result["chunk_vs_recurrent_speedup"].values())
    assert set(result["kda_over_mla_time"]) == {"64", "256"}


def test_moe_prints_both_families_and_the_qb_cost(capsys):
    result = bench_json("moe", capsys)
    for family in ("k2", "k3"):
        assert result[family]["preset"] == f"{family}-t3"
        assert positive(result[family]["moe_over_dense_throughput"])
        assert set(result["by_size"][family]) == {"t3"}
    assert positive(result["qb_update_over_step"])


@pytest.mark.slow
def test_train_prints_peaks_and_mfu_per_model(capsys):
    result = bench_json("train", capsys)
    assert positive(result["matmul_peak_flops"]["fp32"])
    assert positive(result["matmul_peak_flops"]["bf16"])
    names = [run["name"] for run in result["runs"]]
    assert {name.split("-")[0] for name in names} == {"k2", "k3", "dense"}
    assert all(positive(run["tokens_per_s"]) and positive(run["mfu"]) for run in result["runs"])
    for run in result["runs"]:
        assert positive(run["mfu_fwd_bwd"]) and 0 < run["optimizer_share"] < 1
        assert run["mfu"] < run["hfu"] and 0 < run["mfu_bound_newton_schulz"] < 1
        assert positive(run["mfu_bound_gemms_alone"])


@pytest.mark.slow
def test_fit_prints_fit_and_bootstrap_times(capsys):
    result = bench_json("fit", capsys)
    assert positive(result["fit_s"])
    assert set(result["fit_plus_100_bootstrap_s"]) == {"1", "2"}
