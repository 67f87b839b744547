"""Attention Residuals (architecture.md 4.4): the op against fla's reference, and the K3 Block
AttnRes bookkeeping of section 4.2."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch

from k3scale.models.attnres import AttnResSite, BlockAttnResState, attn_res, depth_weights

D = 16
EPS = 1e-5


def rel_rms(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """RMS of the difference over RMS of the reference."""
    return (
        ((actual - expected).pow(2).mean() / expected.pow(2).mean().clamp_min(1e-300)).sqrt().item()
    )


def load_fla_naive_attnres() -> ModuleType:
    """fla's `ops/attnres/naive.py` loaded by file path: the package import needs triton (sec. 13)."""
    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("fla-core is not installed (test-only dependency, extra 'kernels')")
    path = Path(spec.submodule_search_locations[0]) / "ops" / "attnres" / "naive.py"
    if not path.is_file():
        pytest.skip(f"fla-core has no {path}")
    file_spec = importlib.util.spec_from_file_location("fla_attnres_naive_reference", path)
    module = importlib.util.module_from_spec(file_spec)
    file_spec.loader.exec_module(module)
    return module


def random_sources(count: int, shape: tuple[int, ...] = (2, 7), seed: int = 0) -> list:
    gen = torch.Generator().manual_seed(seed)
    # Different scales per source so the unnormalised values and the RMS-normalised keys differ.
    return [(j + 1) * torch.randn(*shape, D, generator=gen) for j in range(count)]


def random_site(seed: int = 1) -> AttnResSite:
    site = AttnResSite(D, EPS)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        site.query.copy_(torch.randn(D, generator=gen))
        site.key_norm.copy_(torch.rand(D, generator=gen) + 0.5)
    return site


@pytest.mark.parametrize("num_sources", [1, 3, 9])
def test_attn_res_matches_fla_naive_attnres(num_sources: int) -> None:
    reference = load_fla_naive_attnres()
    site = random_site()
    sources = [s.requires_grad_() for s in random_sources(num_sources, shape=(3, 63))]
    cotangent = torch.randn(3, 63, D)
    actual = site(sources)
    actual_weights = depth_weights(sources, site.query, site.key_norm, EPS)
    (actual * cotangent).sum().backward()
    actual_grads = [s.grad for s in sources] + [site.query.grad, site.key_norm.grad]
    for tensor in [*sources, site.query, site.key_norm]:
        tensor.grad = None
    expected, expected_weights = reference.naive_attnres(
        site.query, sources, site.key_norm, rms_eps=EPS, scale=1.0, return_weights=True
    )
    (expected * cotangent).sum().backward()
    expected_grads = [s.grad for s in sources] + [site.query.grad, site.key_norm.grad]
    # Both compute in fp32 with differently ordered reductions (fla: F.rms_norm, einsum).
    assert rel_rms(actual, expected) < 1e-6
    assert rel_rms(actual_weights, expected_weights) < 1e-6
    for index, (got, want) in enumerate(zip(actual_grads, expected_grads, strict=True)):
        if num_sources == 1 and index >= num_sources:
            assert got.abs().max() == 0 and want.abs().max() == 0  # a 1-way softmax is constant
        else:
            assert rel_rms(got, want) < 1e-5, index


def test_weights_sum_to_one_and_zero_query_gives_the_mean() -> None:
    sources = [s.double() for s in random_sources(5)]
    site = random_site().double()
    weights = depth_weights(sources, site.query, site.key_norm, EPS)
    assert weights.shape == (5, 2, 7) and weights.dtype == torch.float64
    torch.testing.assert_close(weights.sum(0), torch.ones(2, 7, dtype=torch.float64))
    assert weights.std(dim=0).min() > 1e-3  # a random query does not give uniform weights
    zero_query = AttnResSite(D, EPS).double()
    mean = torch.stack(sources).mean(0)
    torch.testing.assert_close(zero_query(sources), mean, rtol=1e-14, atol=1e-14)


def test_attn_res_keeps_dtype_and_computes_in_fp32() -> None:
    sources = [s.bfloat16() for s in random_sources(4)]
    site = random_site()
    out = attn_res(sources, site.query, site.key_norm, EPS)
    assert out.dtype == torch.bfloat16
    expected = attn_res([s.float() for s in sources], site.query, site.key_norm, EPS)
    torch.testing.assert_close(out, expected.bfloat16(), rtol=0, atol=0)
    with pytest.raises(ValueError, match="sources"):
        attn_res([], site.query, site.key_norm, EPS)


def test_query_gets_a_gradient_when_sources_differ() -> None:
    site = AttnResSite(D, EPS).double()  # zero-initialised query, as at the start of training
    site([s.double() for s in random_sources(3)]).pow(2).sum().backward()
    assert site.query.grad.abs().max() > 1e-3
    same = AttnResSite(D, EPS).double()
    source = random_sources(1)[0].double()
    same([source, source.clone(), source.clone()]).pow(2).sum().backward()
    assert same.query.grad.abs().max() < 1e-12  # equal keys: the weights cannot move the output


def test_site_parameters_are_vectors_with_neutral_init() -> None:
    site = AttnResSite(D, EPS)
    params = dict(site.named_parameters())
    assert set(params) == {"query", "key_norm"}
    assert torch.equal(params["query"], torch.zeros(D))
    assert torch.equal(params["key_norm"], torch.ones(D))


def run_dataflow(
    num_layers: int, block_size: int, seed: int = 0
) -> tuple[BlockAttnResState, dict[str, list[torch.Tensor]]]:
    """Drive the state with random mixer/FFN outputs; return it and what was fed in and out."""
    gen = torch.Generator().manual_seed(seed)
    embedding = torch.randn(1, 2, D, generator=gen, dtype=torch.float64)
    state = BlockAttnResState(embedding, block_size)
    record: dict[str, list[torch.Tensor]] = {"layer_sums": [], "mixer_inputs": []}
    for i in range(num_layers):
        record["mixer_inputs"].append(state.mixer_input(i, random_site(seed=10 + i).double()))
        mixer_out = torch.randn(1, 2, D, generator=gen, dtype=torch.float64)
        state.add_mixer_output(i, mixer_out)
        state.ffn_input(i, random_site(seed=1000 + i).double())
        ffn_out = torch.randn(1, 2, D, generator=gen, dtype=torch.float64)
        state.add_ffn_output(ffn_out)
        record["layer_sums"].append(mixer_out + ffn_out)
    state.output(AttnResSite(D, EPS).double())
    record["embedding"] = [embedding]
    return state, record


@pytest.mark.parametrize(("num_layers", "block_size"), [(93, 12), (7, 3), (5, 1), (6, 6), (1, 4)])
def test_source_counts_per_site(num_layers: int, block_size: int) -> None:
    state, _ = run_dataflow(num_layers, block_size)
    size = block_size
    mixer = [1] + [2 + (i - 1) // size for i in range(1, num_layers)]
    ffn = [2 + i // size for i in range(num_layers)]
    assert state.source_counts == {
        "mixer": mixer,
        "ffn": ffn,
        "output": [2 + (num_layers - 1) // size],
    }


def test_k3_output_site_sees_nine_sources() -> None:
    state, _ = run_dataflow(93, 12)
    assert state.source_counts["output"] == [9]


def test_block_contents_follow_the_k3_dataflow() -> None:
    state, record = run_dataflow(5, 2)
    sums, embedding = record["layer_sums"], record["embedding"][0]
    # Boundaries at layers 0, 2, 4: blocks are [embedding, L0+L1, L2+L3], partial L4.
    expected_blocks = [embedding, sums[0] + sums[1], sums[2] + sums[3]]
    assert len(state.blocks) == 3
    for got, want in zip(state.blocks, expected_blocks, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-15, atol=1e-15)
    torch.testing.assert_close(state.partial, sums[4], rtol=1e-15, atol=1e-15)
    assert torch.equal(record["mixer_inputs"][0], embedding)  # layer 0 mixer: raw embedding
    # Layer 2 (a boundary) reads the block it is about to close as the partial sum.
    site_2 = random_site(seed=12).double()
    expected_input_2 = site_2([embedding, sums[0] + sums[1]])
    torch.testing.assert_close(record["mixer_inputs"][2], expected_input_2, rtol=1e-14, atol=1e-14)


def test_block_size_of_all_layers_is_one_block() -> None:
    state, record = run_dataflow(6, 6)
    assert len(state.blocks) == 1 and torch.equal(state.blocks[0], record["embedding"][0])
    torch.testing.assert_close(state.partial, sum(record["layer_sums"]), rtol=1e-14, atol=1e-14)


def test_calls_out_of_order_are_rejected() -> None:
    state = BlockAttnResState(torch.zeros(1, 2, D), block_size=2)
    site = AttnResSite(D, EPS)
    with pytest.raises(ValueError, match="mixer_input"):
        state.ffn_input(0, site)
    state.mixer_input(0, site)
    with pytest.raises(ValueError, match="layer_idx"):
        state.add_mixer_output(1, torch.zeros(1, 2, D))
    state.add_mixer_output(0, torch.zeros(1, 2, D))
    with pytest.raises(ValueError, match="middle of a layer"):
        state.output(site)
    with pytest.raises(ValueError, match="block_size"):
        BlockAttnResState(torch.zeros(1, 2, D), block_size=0)
