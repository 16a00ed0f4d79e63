"""Triton kernels: KV store and one paged attention kernel for prefill chunks and decodes together.

The attention kernel runs one program per (sequence, KV head, tile of query tokens). Its rows
are the query heads of one KV group times the tile's tokens, so GQA loads each K/V page
once per group, and a decode token (one query) still fills a whole matrix tile with its
group's heads. Keys are walked page by page with an online softmax; the causal mask is by
absolute position, so the same code serves a 1-token decode and a 4k-token prefill chunk.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from gpu_backend.metadata import AttentionMetadata
from sim.errors import InputError


@triton.jit
def _store_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_cs, stride_ch,  # cache strides per slot and per head (the cache is viewed [slots, H, D])
    NUM_KV_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    # slot -1 marks a padding token (CUDA-graph batches): nothing to store.
    if slot < 0:
        return
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < NUM_KV_HEADS) & (d < HEAD_DIM)
    k = tl.load(k_ptr + t * stride_kt + h * stride_kh + d, mask=mask)
    v = tl.load(v_ptr + t * stride_vt + h * stride_vh + d, mask=mask)
    tl.store(k_cache_ptr + slot * stride_cs + h * stride_ch + d, k, mask=mask)
    tl.store(v_cache_ptr + slot * stride_cs + h * stride_ch + d, v, mask=mask)


@triton.jit
def _paged_attention_kernel(
    out_ptr, q_ptr, k_cache_ptr, v_cache_ptr,
    block_tables_ptr, cu_seqlens_q_ptr, context_lens_ptr,
    scale_log2,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_cb, stride_cs, stride_ch,  # cache strides: block, slot in block, head (dim is contiguous)
    stride_bt,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    tile = tl.program_id(2)
    q_start = tl.load(cu_seqlens_q_ptr + seq)
    q_len = tl.load(cu_seqlens_q_ptr + seq + 1) - q_start
    if tile * BLOCK_Q >= q_len:
        return
    ctx = tl.load(context_lens_ptr + seq)

    rows = tl.arange(0, BLOCK_M)
    q_idx = tile * BLOCK_Q + rows // GROUP  # token within the chunk
    head = kv_head * GROUP + rows % GROUP
    # BLOCK_M may not be a multiple of GROUP (Qwen: 7): the leftover rows belong to no token.
    row_ok = (rows < BLOCK_Q * GROUP) & (q_idx < q_len)
    q_pos = ctx - q_len + q_idx
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM

    q_off = (q_start + q_idx).to(tl.int64)[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptr + q_off, mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)

    # Keys up to the tile's last query position; key 0 is visible to every row, so the
    # first page gives each row a finite running max and later masked pages cannot NaN.
    last_q = tl.minimum(tile * BLOCK_Q + BLOCK_Q, q_len)
    kv_len = ctx - q_len + last_q
    offs_n = tl.arange(0, PAGE)
    for page in range(tl.cdiv(kv_len, PAGE)):
        block = tl.load(block_tables_ptr + seq * stride_bt + page).to(tl.int64)
        k_pos = page * PAGE + offs_n
        kv_ok = (k_pos < kv_len)[:, None] & d_ok[None, :]
        kv_off = block * stride_cb + offs_n[:, None] * stride_cs + kv_head * stride_ch + d[None, :]
        k = tl.load(k_cache_ptr + kv_off, mask=kv_ok, other=0.0)
        v = tl.load(v_cache_ptr + kv_off, mask=kv_ok, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2
        s = tl.where(k_pos[None, :] <= q_pos[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new

    acc = acc / l_i[:, None]
    o_off = (q_start + q_idx).to(tl.int64)[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :]
    tl.store(out_ptr + o_off, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def _pow2_at_least_16(n: int) -> int:
    # tl.dot wants every matrix side >= 16 and tl.arange wants powers of two.
    return max(16, triton.next_power_of_2(n))


class TritonAttention:
    name = "triton"

    def store_kv(self, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
        num_tokens, num_kv_heads, head_dim = k.shape
        if num_tokens == 0:
            return
        # The kernel addresses a slot as block * block_size + offset with one stride.
        assert k_cache.stride(0) == k_cache.shape[1] * k_cache.stride(1), "cache blocks must be contiguous"
        assert v_cache.stride() == k_cache.stride() and k.stride(2) == 1 and v.stride(2) == 1
        _store_kv_kernel[(num_tokens,)](
            k, v, k_cache, v_cache, slot_mapping,
            k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            k_cache.stride(1), k_cache.stride(2),
            NUM_KV_HEADS=num_kv_heads, HEAD_DIM=head_dim,
            BLOCK_H=triton.next_power_of_2(num_kv_heads), BLOCK_D=triton.next_power_of_2(head_dim),
        )

    def attend(self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
               meta: AttentionMetadata, scale: float) -> torch.Tensor:
        num_heads, head_dim = q.shape[1], q.shape[2]
        num_kv_heads, page = k_cache.shape[2], k_cache.shape[1]
        group = num_heads // num_kv_heads
        if page < 16 or page & (page - 1):
            raise InputError(f"engine.block_size: the Triton attention kernel needs a power of two >= 16, "
                             f"got {page} (or use attention: torch)")
        assert v_cache.stride() == k_cache.stride() and q.stride(2) == 1 and k_cache.stride(3) == 1
        # Decode-only steps get one token per tile (rows = the group's heads); prefill tiles
        # take several tokens so a long chunk is not one program per token.
        block_m = _pow2_at_least_16(group) if meta.max_query_len == 1 else max(64, _pow2_at_least_16(group))
        block_q = block_m // group
        out = torch.empty_like(q)
        grid = (meta.num_seqs, num_kv_heads, triton.cdiv(meta.max_query_len, block_q))
        _paged_attention_kernel[grid](
            out, q, k_cache, v_cache,
            meta.block_tables, meta.cu_seqlens_q, meta.context_lens,
            scale * math.log2(math.e),
            q.stride(0), q.stride(1), out.stride(0), out.stride(1),
            k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            meta.block_tables.stride(0),
            GROUP=group, HEAD_DIM=head_dim, BLOCK_D=_pow2_at_least_16(head_dim),
            PAGE=page, BLOCK_M=block_m, BLOCK_Q=block_q,
            # fp32 caches mean a correctness run: exact products, not TF32; others keep the default.
            DOT_PRECISION="ieee" if q.dtype == torch.float32 else None,
        )
        return out
