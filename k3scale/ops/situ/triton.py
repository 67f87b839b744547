"""SiTU-GLU as fused Triton kernels: one elementwise pass forward, one pass for both gradients.

Same math as `naive.situ_glu` (architecture.md section 6), fp32 inside, output in the input dtype:

    h     = SiTU_b1(g) * cap_b2(u),  SiTU_b(g) = b tanh(g / b) sigmoid(g),  cap_b(u) = b tanh(u / b)
    dh/dg = cap_b2(u) * [(1 - tanh^2(g / b1)) sigmoid(g) + SiTU_b1(g) (1 - sigmoid(g))]
    dh/du = SiTU_b1(g) * (1 - tanh^2(u / b2))

`gate` and `up` may be the two halves of one `[..., 2f]` tensor (`x[..., :f]`, `x[..., f:]`): the
kernels read rows with their own stride, so no copy is made as long as the last dim is contiguous.
Import this module only with Triton present; set `TRITON_INTERPRET=1` before importing it to run
on CPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Elements per program along a row; 1024 fp32 = 4 KiB per operand, a common elementwise tile.
BLOCK_COLS = 1024


@triton.jit
def _tanh(x):
    """tanh in fp32 without overflow; Taylor series near 0, where 1 - e^{-2|x|} cancels."""
    a = tl.abs(x)
    e = tl.exp(-2.0 * a)
    big = (1.0 - e) / (1.0 + e)
    # x - x^3/3 + 2x^5/15: truncation error < 2e-15 relative for |x| < 0.01.
    x2 = a * a
    small = a * (1.0 - x2 / 3.0 + 2.0 * x2 * x2 / 15.0)
    t = tl.where(a < 0.01, small, big)
    return tl.where(x < 0, -t, t)


@triton.jit
def _sigmoid(x):
    """sigmoid in fp32 from exp(-|x|) <= 1, so nothing overflows."""
    e = tl.exp(-tl.abs(x))
    return tl.where(x >= 0, 1.0, e) / (1.0 + e)


@triton.jit
def _situ_glu_fwd_kernel(
    gate_ptr, up_ptr, out_ptr, num_cols, gate_row_stride, up_row_stride, out_row_stride,
    beta, linear_beta, CAP_UP: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < num_cols
    g = tl.load(gate_ptr + row * gate_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + row * up_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    sig = _sigmoid(g)
    situ = beta * _tanh(g / beta) * sig
    if CAP_UP:
        u = linear_beta * _tanh(u / linear_beta)
    h = situ * u
    tl.store(out_ptr + row * out_row_stride + cols, h.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _situ_glu_bwd_kernel(
    gate_ptr, up_ptr, grad_out_ptr, grad_gate_ptr, grad_up_ptr, num_cols,
    gate_row_stride, up_row_stride, grad_out_row_stride, beta, linear_beta,
    CAP_UP: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < num_cols
    g = tl.load(gate_ptr + row * gate_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(up_ptr + row * up_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    dh = tl.load(grad_out_ptr + row * grad_out_row_stride + cols, mask=mask, other=0.0)
    dh = dh.to(tl.float32)
    sig = _sigmoid(g)
    t_g = _tanh(g / beta)
    situ = beta * t_g * sig
    d_situ = (1.0 - t_g * t_g) * sig + situ * (1.0 - sig)
    if CAP_UP:
        t_u = _tanh(u / linear_beta)
        capped = linear_beta * t_u
        d_capped = 1.0 - t_u * t_u
    else:
        capped = u
        d_capped = 1.0
    # Gradients are written densely `[rows, num_cols]`.
    out = row * num_cols + cols
    tl.store(grad_gate_ptr + out, (dh * capped * d_situ).to(grad_gate_ptr.dtype.element_ty), mask)
    tl.store(grad_up_ptr + out, (dh * situ * d_capped).to(grad_up_ptr.dtype.element_ty), mask)


def _as_rows(x: torch.Tensor, name: str) -> torch.Tensor:
    """`[..., f]` -> `[rows, f]` view (row-strided); copies only if the last dim is strided."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    rows = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    if rows.shape[-1] and rows.stride(-1) != 1:
        raise ValueError(f"{name}: last dim must be contiguous, got strides {x.stride()}")
    return rows


def _grid(rows: torch.Tensor) -> tuple[int, int]:
    return rows.shape[0], triton.cdiv(rows.shape[1], BLOCK_COLS)


class _SituGluFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate, up, beta, linear_beta):
        gate_rows, up_rows = _as_rows(gate, "gate"), _as_rows(up, "up")
        out = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
        if out.numel():
            cap_up = linear_beta is not None
            _situ_glu_fwd_kernel[_grid(gate_rows)](
                gate_rows, up_rows, out, gate_rows.shape[1], gate_rows.stride(0),
                up_rows.stride(0), gate_rows.shape[1], float(beta),
                float(linear_beta) if cap_up else 1.0, CAP_UP=cap_up, BLOCK=BLOCK_COLS,
            )  # fmt: skip
        ctx.save_for_backward(gate, up)
        ctx.beta, ctx.linear_beta = beta, linear_beta
        return out

    @staticmethod
    def backward(ctx, grad_out):
        gate, up = ctx.saved_tensors
        gate_rows, up_rows = _as_rows(gate, "gate"), _as_rows(up, "up")
        grad_rows = _as_rows(grad_out, "grad_out")
        grad_gate = torch.empty(gate.shape, dtype=gate.dtype, device=gate.device)
        grad_up = torch.empty(up.shape, dtype=up.dtype, device=up.device)
        if grad_gate.numel():
            cap_up = ctx.linear_beta is not None
            _situ_glu_bwd_kernel[_grid(gate_rows)](
                gate_rows, up_rows, grad_rows, grad_gate, grad_up, gate_rows.shape[1],
                gate_rows.stride(0), up_rows.stride(0), grad_rows.stride(0), float(ctx.beta),
                float(ctx.linear_beta) if cap_up else 1.0, CAP_UP=cap_up, BLOCK=BLOCK_COLS,
            )  # fmt: skip
        return grad_gate, grad_up, None, None


def situ_glu_triton(
    gate: torch.Tensor, up: torch.Tensor, beta: float = 4.0, linear_beta: float | None = 25.0
) -> torch.Tensor:
    """Fused `h = SiTU_beta(gate) * cap_linear_beta(up)`; same contract as `naive.situ_glu`.

    Args:
        gate: gate branch `[..., f]` (fp32 or bf16), last dim contiguous.
        up: up branch, same shape as `gate`.
        beta: gate cap b1 (K3: 4.0).
        linear_beta: up cap b2 (K3: 25.0); None leaves the up branch uncapped.

    Returns:
        `h [..., f]` in `gate.dtype`; differentiable in `gate` and `up` (one fused backward pass).
    """
    if gate.shape != up.shape:
        raise ValueError(f"up: expected shape {tuple(gate.shape)}, got {tuple(up.shape)}")
    return _SituGluFunction.apply(gate, up, beta, linear_beta)
