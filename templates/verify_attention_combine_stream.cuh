// The stream-K combine (kdtree_verify_combine_stream): merges the pieces of the
// items that stream-K CTA boundaries cut, from their CutItem records. Only kernels
// that run stream-K plans include it (the qsplit kernel).
#ifndef KDTREE_VERIFY_ATTENTION_COMBINE_STREAM_CUH
#define KDTREE_VERIFY_ATTENTION_COMBINE_STREAM_CUH

#include "verify_attention_combine.cuh"

// Stream-K: a CTA merges COMBINE_ROWS rows of the row tile of the item that CTA
// boundary blockIdx.x / (BLOCK_M / COMBINE_ROWS) + 1 cuts, from that boundary's
// CutItem record (rows of whole items were written by the main kernel). A cut
// item has few pieces: small batches keep the registers low and the SMs full.
extern "C" __global__ void __launch_bounds__(COMBINE_THREADS) kdtree_verify_combine_stream(const kdtree_verify_params p) {
  constexpr int GROUPS = BLOCK_M / COMBINE_ROWS;
  kd_grid_dependency_wait();  // the CutItem records and partials are the main kernel's (every CTA waits)
  const CutItem cut = ((const CutItem*)p.cut_items)[blockIdx.x / GROUPS + 1];
  if (!cut.merge) return;
  const int r = (blockIdx.x % GROUPS) * COMBINE_ROWS + threadIdx.x / COMBINE_ROW_THREADS;
  const int gr = cut.m_tile * BLOCK_M + r;
  if (gr >= cut.rows_total) return;
  const long long row = out_row(p, cut.node_base, gr, cut.out_head0);
  // Piece 0 is CTA c0's last segment (or its first, when the item starts with it);
  // piece s > 0 is CTA c0 + s's first segment, slot 2 (c0 + s).
  const long long prow0 = stream_slot(cut.c0, cut.chunk, cut.u0) * BLOCK_M + r;
  const long long prow1 = 2ll * cut.c0 * BLOCK_M + r;
  merge_row<4>(p, row, cut.pieces, (threadIdx.x % COMBINE_ROW_THREADS) * 4,
               [&](int s) { return s == 0 ? prow0 : prow1 + s * (2ll * BLOCK_M); });
}

#endif  // KDTREE_VERIFY_ATTENTION_COMBINE_STREAM_CUH
