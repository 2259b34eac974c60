"""GPU: kdtree.sample_tokens: greedy equals torch.argmax; temperature sampling is reproducible, keyed by
(seed, row offset), and distributed as softmax(logits / T)."""

import pytest
import torch

import kdtree

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype,vocab,stride", [(torch.float32, 32000, 32000), (torch.bfloat16, 151936, 152064),
                                                (torch.float32, 7, 16), (torch.bfloat16, 1000, 1000)],
                         ids=["f32,V=32000", "bf16,V=151936,stride=152064", "f32,V=7,stride=16", "bf16,V=1000"])
def test_greedy_is_argmax_lowest_index_first(dtype, vocab, stride):
    gen = torch.Generator(device="cuda").manual_seed(vocab)
    wide = torch.randn(37, stride, device="cuda", generator=gen).to(dtype)
    logits = wide[:, :vocab]
    logits[3] = 0  # all ties: index 0
    logits[5, vocab // 2:] = logits[5].max() + 1  # ties from the middle on: the lowest of them
    got = kdtree.sample_tokens(logits)
    assert got.dtype == torch.int32 and got.shape == (37,)
    assert torch.equal(got.long(), logits.float().argmax(dim=-1))
    assert int(got[3]) == 0 and int(got[5]) == vocab // 2
    assert torch.equal(kdtree.sample_tokens(logits, temperature=-1.0), got)


def test_sampling_is_reproducible_and_keyed_by_seed_and_row_offset():
    logits = torch.randn(64, 5000, device="cuda")
    a = kdtree.sample_tokens(logits, temperature=1.0, seed=1234)
    assert torch.equal(a, kdtree.sample_tokens(logits, temperature=1.0, seed=1234))
    rows = torch.arange(64, dtype=torch.int64, device="cuda")
    assert torch.equal(a, kdtree.sample_tokens(logits, temperature=1.0, seed=1234, row_offsets=rows))
    b = kdtree.sample_tokens(logits, temperature=1.0, seed=1235)
    assert (a != b).float().mean() > 0.5
    # Row offsets, not row positions, key the draws: reversing rows and offsets reverses the tokens.
    rev = kdtree.sample_tokens(logits.flip(0).contiguous(), temperature=1.0, seed=1234, row_offsets=rows.flip(0))
    assert torch.equal(rev.flip(0), a)
    top = kdtree.sample_tokens(logits, temperature=1.0, seed=2**64 - 1)
    assert ((top >= 0) & (top < 5000)).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_sampling_follows_softmax_of_logits_over_temperature(dtype):
    temperature, rows = 0.7, 40000
    base = torch.tensor([1.0, 0.5, 0.0, -0.5, 2.0, -3.0], device="cuda").to(dtype)
    logits = base.expand(rows, -1).contiguous()
    tokens = kdtree.sample_tokens(logits, temperature=temperature, seed=99)
    counts = torch.bincount(tokens.long(), minlength=6).double()
    p = torch.softmax(base.double() / temperature, dim=0)
    expected = p * rows
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 25.74, (counts.tolist(), expected.tolist())  # upper 1e-4 quantile, 5 degrees of freedom
