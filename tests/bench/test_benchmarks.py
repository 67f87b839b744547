"""`k3scale bench NAME --quick --json` runs and prints the documented JSON (numbers are not
checked against targets: benchmarks report measurements, tests do not time anything)."""

from __future__ import annotations

import json
import math

import pytest

from k3scale.bench.compile import markdown as compile_markdown
from k3scale.bench.stack import markdown as stack_markdown
from k3scale.bench.sweep import markdown as sweep_markdown
from k3scale.bench.train import core_flops_share, step_breakdown
from k3scale.bench.train import markdown as train_markdown
from k3scale.cli import main
from k3scale.models import accounting
from k3scale.models.presets import get_preset


def bench_json(name: str, capsys) -> dict:
    assert main(["bench", name, "--quick", "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def positive(x) -> bool:
    return isinstance(x, int | float) and math.isfinite(x) and x > 0


def test_core_flops_share_is_the_attention_and_kda_cores_part():
    k2, k3 = get_preset("k2-s3"), get_preset("k3-s3")
    for cfg in (k2, k3):
        terms = accounting.flops_breakdown(cfg, 256)
        core = float((terms["mla_core"] + terms["kda_core"]) / sum(terms.values()))
        assert core_flops_share(cfg, 256) == pytest.approx(core) and 0 < core < 1
    assert accounting.flops_breakdown(k2, 256)["kda_core"] == 0  # K2: attention only
    assert core_flops_share(k2, 512) > core_flops_share(k2, 256)  # the cores grow with context


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
def test_train_prints_fast_and_reference_columns_per_model(capsys):
    result = bench_json("train", capsys)
    assert positive(result["matmul_peak_flops"]["fp32"])
    assert positive(result["matmul_peak_flops"]["bf16"])
    assert {(run["name"].split("-")[0], run["shape"]) for run in result["runs"]} == {
        (family, shape) for family in ("k2", "k3") for shape in ("demo", "study")
    }
    for run in result["runs"]:
        for key in ("tokens_per_s_reference", "tokens_per_s", "tokens_per_s_bf16", "mfu"):
            assert positive(run[key]), key
        assert run["speedup_vs_reference"] == pytest.approx(
            run["tokens_per_s"] / run["tokens_per_s_reference"]
        )
        if run["shape"] == "study":  # the compiled step, at the shapes studies train
            assert run["compiled_speedup"] == pytest.approx(
                run["tokens_per_s_compiled"] / run["tokens_per_s"]
            )
        else:
            assert run["compiled_speedup"] is run["tokens_per_s_compiled"] is None
        assert 0 < run["gemm_bound"] <= 1.5  # a rate over a peak measured apart: near 1 at most
        assert run["mfu_over_gemm_bound"] == pytest.approx(run["mfu"] / run["gemm_bound"])
        # Every piece timed alone takes less than the step; the pieces and the rest add up.
        assert 0 < run["kernel_bound"] < run["gemm_bound"]
        assert 0 < run["mfu_over_kernel_bound"] < 1
        assert run["mfu_over_kernel_bound"] == pytest.approx(run["mfu"] / run["kernel_bound"])
        parts = step_breakdown(run)
        assert sum(parts.values()) == pytest.approx(run["compute_s"]["step"])
        assert parts["between them"] > 0 and parts["GEMMs"] > 0
        assert (parts["attention"] > 0) == (run["attention_kernel_gflops"] is not None)
        assert (parts["KDA"] > 0) == run["name"].startswith("k3")
    assert set(result["summary"]) == {"k2-demo", "k2-study", "k3-demo", "k3-study"}
    table = train_markdown(result)  # what analysis/README.md embeds from a committed run
    # The columns, then where the step goes: the study rungs once in each, the demo rungs in none.
    assert table.count("| k2-s1 |") == table.count("| k3-s1 |") == 2 and "| k2-t3 |" not in table


@pytest.mark.slow
def test_compile_prints_breaks_compile_times_and_the_ratio(capsys):
    result = bench_json("compile", capsys)
    assert [(r["name"], r["path"]) for r in result["runs"]] == [("k2-s1", "fast")]
    for run in result["runs"]:
        assert run["graphs"] == run["graph_breaks"] + 1 >= 1
        assert run["forward_graphs"] >= run["backward_graphs"] >= 1
        assert sum(run["break_reasons"].values()) <= run["graph_breaks"]
        assert positive(run["first_step_cold_cache_s"]) and positive(run["first_step_warm_cache_s"])
        assert run["compiled_over_eager"] == pytest.approx(run["compiled_ms"] / run["eager_ms"])
    assert f"| k2-s1 | fast | {result['runs'][0]['graphs']} |" in compile_markdown(result)


@pytest.mark.slow
def test_stack_prints_each_way_and_its_ratio_to_separate_steps(capsys):
    result = bench_json("stack", capsys)
    (run,) = result["runs"]
    assert run["name"] == "k2-s1" and run["members"] == 2
    for way in ("stacked", "folded", "compiled_folded"):
        assert run[f"{way}_speedup"] == pytest.approx(run["separate_ms"] / run[f"{way}_ms"])
    assert run["compiled_speedup"] == pytest.approx(
        run["separate_ms"] / run["compiled_separate_ms"]
    )
    assert 0 < run["optimizer_share"] < 1
    assert stack_markdown(result).count("| k2-s1 |") == 1


@pytest.mark.slow
def test_fit_prints_fit_and_bootstrap_times(capsys):
    result = bench_json("fit", capsys)
    assert positive(result["fit_s"])
    assert set(result["fit_plus_100_bootstrap_s"]) == {"1", "2"}


@pytest.mark.slow
@pytest.mark.ray
def test_sweep_prints_the_fixed_overhead_per_trial(capsys):
    result = bench_json("sweep", capsys)
    assert result["trials"]["finished"] > 0 and result["trials"]["failed"] == 0
    assert 0 < result["fixed_overhead_s_per_trial"] <= result["fixed_overhead_s_max"]
    assert set(result["overhead_by_phase_s"]) == {
        "imports",
        "run_setup",
        "evaluation",
        "tracking",
        "checkpoints",
        "other",
    }
    assert 0 < result["utilization"] <= 1
    assert f"**{result['fixed_overhead_s_per_trial']:.2f} s**" in sweep_markdown(result)


@pytest.mark.slow
def test_bookkeeping_prints_per_run_costs_at_each_size(capsys):
    result = bench_json("bookkeeping", capsys)
    assert result["points_per_run"] == 600 and result["sizes"] == [20, 100]
    for n in ("20", "100"):
        row = result["backends"]["sqlite"][n]
        for key in ("log_ms_per_run", "log_ms_per_run_last", "export_s", "export_peak_mb"):
            assert positive(row[key]), key
        assert positive(row["optuna_ms_per_trial"]) and positive(row["optuna_ms_per_trial_last"])
