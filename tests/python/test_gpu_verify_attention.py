"""GPU: kdtree.verify_attention against a float64 torch reference (random trees, uneven lengths, scattered
pages), MLA and GQA, with and without LSE."""

import os
import zlib

import pytest
import torch

import kdtree
import torch_reference as R

pytestmark = pytest.mark.gpu

TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3}  # relative L2 error of out per request
LSE_TOL = 1e-2  # absolute, natural log

# (mla, heads, kv_heads, head_dim, page, width, dtype, batch, lse, mla_3d)
CASES = [
    (True, 16, 1, 576, 64, 64, torch.bfloat16, 4, True, False),
    (True, 128, 1, 576, 1, 16, torch.float16, 2, True, False),
    (True, 16, 1, 576, 16, 128, torch.bfloat16, 3, False, True),
    (True, 32, 1, 576, 32, 32, torch.float16, 5, True, False),
    (False, 32, 8, 128, 16, 32, torch.bfloat16, 4, True, False),
    (False, 8, 8, 64, 1, 16, torch.float16, 3, True, False),
    (False, 16, 2, 256, 64, 64, torch.bfloat16, 3, False, False),
    (False, 8, 1, 128, 128, 128, torch.float16, 2, True, False),
    (False, 64, 8, 128, 64, 16, torch.bfloat16, 6, True, False),
]


def _id(c):
    mla, heads, kv_heads, head_dim, page, width, dtype, batch, lse, mla_3d = c
    head = "mla576/512" if mla else f"gqa{head_dim},Hq={heads},Hkv={kv_heads}"
    return (f"{head},W={width},page={page},{'bf16' if dtype == torch.bfloat16 else 'f16'},B={batch}"
            f"{',lse' if lse else ''}{',3d-cache' if mla_3d else ''}")


def run(c, **kw):
    return kdtree.verify_attention(c["q"], c["k_cache"], c["page_table"], c["kv_lens"], c["node_indptr"],
                                   c["tree_mask"], max_tree_nodes=c["max_tree_nodes"], v_cache=c["v_cache"], **kw)


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_verify_attention_matches_reference(case, record_error):
    mla, heads, kv_heads, head_dim, page, width, dtype, batch, lse, mla_3d = case
    c = R.verify_case(mla=mla, heads=heads, kv_heads=kv_heads, head_dim=head_dim, page=page, width=width,
                      dtype=dtype, batch=batch, seed=zlib.crc32(_id(case).encode()), device="cuda", mla_3d=mla_3d)
    res = run(c, return_lse=lse)
    out, out_lse = res if lse else (res, None)
    ref_out, ref_lse = R.verify_reference(c)
    assert out.dtype == dtype and out.shape == ref_out.shape
    assert torch.isfinite(out).all()
    start = 0
    for b, n in enumerate(c["nodes"]):
        err = R.rel_l2(out[start:start + n], ref_out[start:start + n])
        record_error("verify_attention", _id(case) + f",request={b}", err)
        assert err < TOL[dtype], f"request {b} ({n} nodes, prefix {c['prefixes'][b]}): rel L2 {err:.2e}"
        start += n
    if lse:
        assert out_lse.dtype == torch.float32 and out_lse.shape == ref_lse.shape
        lse_err = float((out_lse.double() - ref_lse).abs().max())
        record_error("verify_attention (lse, abs)", _id(case), lse_err)
        assert lse_err < LSE_TOL


def test_verify_attention_sm_scale_and_max_kv_len():
    c = R.verify_case(mla=False, heads=8, kv_heads=2, head_dim=128, page=16, width=16, dtype=torch.float16,
                      batch=3, seed=7, device="cuda")
    exact = max(p + n for p, n in zip(c["prefixes"], c["nodes"]))
    out = run(c, sm_scale=0.05, max_kv_len=exact)
    ref, _ = R.verify_reference(c, sm_scale=0.05)
    assert R.rel_l2(out, ref) < TOL[torch.float16]


def test_verify_attention_operator_equals_function():
    c = R.verify_case(mla=True, heads=16, kv_heads=1, head_dim=576, page=64, width=16, dtype=torch.bfloat16,
                      batch=2, seed=3, device="cuda")
    f_out, f_lse = run(c, return_lse=True)
    o_out, o_lse = torch.ops.kdtree.verify_attention(c["q"], c["k_cache"], None, c["page_table"], c["kv_lens"],
                                                     c["node_indptr"], c["tree_mask"], 16, None, None, True)
    assert torch.equal(f_out, o_out) and torch.equal(f_lse, o_lse)


def test_verify_attention_rejects_a_tensor_on_another_device():
    c = R.verify_case(mla=True, heads=16, kv_heads=1, head_dim=576, page=16, width=16, dtype=torch.bfloat16,
                      batch=2, seed=4, device="cuda")
    with pytest.raises(ValueError, match=r"^kv_lens: expected a CUDA tensor, got one on cpu"):
        kdtree.verify_attention(c["q"], c["k_cache"], c["page_table"], c["kv_lens"].cpu(), c["node_indptr"],
                                c["tree_mask"], max_tree_nodes=16)


def test_verify_attention_misaligned_q_is_a_kdtree_error():
    # A view one element in is contiguous but not 16-byte aligned: the C library's check, raised as
    # kdtree.Error with its message (the interpreter keeps running).
    c = R.verify_case(mla=False, heads=8, kv_heads=8, head_dim=64, page=16, width=16, dtype=torch.float16,
                      batch=1, seed=5, device="cuda")
    flat = torch.empty(c["q"].numel() + 1, dtype=c["q"].dtype, device="cuda")
    q = flat[1:].view(c["q"].shape)
    with pytest.raises(kdtree.Error) as e:
        kdtree.verify_attention(q, c["k_cache"], c["page_table"], c["kv_lens"], c["node_indptr"], c["tree_mask"],
                                max_tree_nodes=16, v_cache=c["v_cache"])
    assert e.value.status == 1 and "q" in e.value.message


# e4m3 caches (torch.float8_e4m3fn with random scales), against the float64 reference over the dequantised
# cache. The dequantising path keeps Q and P 16-bit: the bf16/f16 tolerance. The e4m3 MMA path rounds both to
# e4m3 (kdtree.h): out within 0.1 relative, the LSE within q's rounding bound plus LSE_TOL.
E4M3_MMA_TOL = 0.1


def takes_e4m3_mma(mla):
    """Whether this GPU's kernel for an e4m3 cache is on the e4m3 MMA path (kdtree.h: sm_120/sm_121, and sm_90's
    MLA kernel), KDTREE_VERIFY_TILES's mma= and kernel= overrides included."""
    tiles = os.environ.get("KDTREE_VERIFY_TILES", "")
    if "mma=e4m3" in tiles:
        return True
    if "mma=16bit" in tiles:
        return False
    major, minor = torch.cuda.get_device_capability()
    sm = 10 * major + minor
    wgmma = "kernel=" not in tiles or "kernel=wgmma" in tiles
    return sm in (120, 121) or (sm == 90 and mla and wgmma)


E4M3_CASES = [CASES[i] for i in (0, 1, 2, 4, 5, 6)]  # MLA (2-d and 3-d caches) and every GQA head dim


@pytest.mark.parametrize("case", E4M3_CASES, ids=[_id(c) + ",kv=e4m3" for c in E4M3_CASES])
def test_verify_attention_e4m3_matches_reference(case, record_error):
    mla, heads, kv_heads, head_dim, page, width, dtype, batch, lse, mla_3d = case
    name = _id(case) + ",kv=e4m3"
    c = R.verify_case(mla=mla, heads=heads, kv_heads=kv_heads, head_dim=head_dim, page=page, width=width,
                      dtype=dtype, batch=batch, seed=zlib.crc32(name.encode()), device="cuda", mla_3d=mla_3d,
                      kv_dtype="e4m3")
    assert c["k_cache"].dtype == torch.float8_e4m3fn
    res = run(c, return_lse=lse, k_scale=c["k_scale"], v_scale=c["v_scale"])
    out, out_lse = res if lse else (res, None)
    ref_out, ref_lse, q_bound = R.verify_reference(c, q_rounding_bound=True)
    assert out.dtype == dtype and out.shape == ref_out.shape
    assert torch.isfinite(out).all()
    e4m3_mma = takes_e4m3_mma(mla)
    path = " (e4m3 MMA)" if e4m3_mma else ""
    tol = E4M3_MMA_TOL if e4m3_mma else TOL[dtype]
    start = 0
    for b, n in enumerate(c["nodes"]):
        err = R.rel_l2(out[start:start + n], ref_out[start:start + n])
        record_error("verify_attention kv=e4m3" + path, name + f",request={b}", err)
        assert err < tol, f"request {b} ({n} nodes, prefix {c['prefixes'][b]}): rel L2 {err:.2e}{path}"
        start += n
    if lse:
        lse_dev = (out_lse.double() - ref_lse).abs()
        allowed = LSE_TOL + (q_bound if e4m3_mma else 0.0)
        record_error("verify_attention kv=e4m3 (lse, abs)" + path, name, float(lse_dev.max()))
        assert bool((lse_dev < allowed).all()), f"LSE off by {float((lse_dev - allowed).max()):.2e} over its bound"


def test_verify_attention_e4m3_scales_as_tensors_and_the_operator():
    c = R.verify_case(mla=True, heads=16, kv_heads=1, head_dim=576, page=16, width=16, dtype=torch.bfloat16,
                      batch=2, seed=11, device="cuda", kv_dtype="e4m3")
    ks, vs = c["k_scale"], c["v_scale"]
    f_out = run(c, k_scale=ks, v_scale=vs)
    t_out = run(c, k_scale=torch.tensor(ks), v_scale=torch.tensor(vs, device="cuda"))  # CPU and CUDA 0-d
    o_out, _ = torch.ops.kdtree.verify_attention(c["q"], c["k_cache"], None, c["page_table"], c["kv_lens"],
                                                 c["node_indptr"], c["tree_mask"], 16, None, None, False, ks, vs)
    assert torch.equal(f_out, t_out) and torch.equal(f_out, o_out)
    # Scaling V by 2 doubles the output exactly (the kernel multiplies O by v_scale once).
    assert torch.equal(run(c, k_scale=ks, v_scale=2 * vs).float(), 2 * f_out.float())


def test_verify_attention_e4m3_cuda_scale_in_graph_capture_asks_for_a_float():
    c = R.verify_case(mla=True, heads=16, kv_heads=1, head_dim=576, page=16, width=16, dtype=torch.bfloat16,
                      batch=2, seed=12, device="cuda", kv_dtype="e4m3")
    scale = torch.tensor(c["k_scale"], device="cuda")
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        with pytest.raises(RuntimeError, match=r"^k_scale: a CUDA tensor cannot be read during CUDA-graph capture"):
            with torch.cuda.graph(g, stream=s):
                run(c, k_scale=scale, v_scale=c["v_scale"])
