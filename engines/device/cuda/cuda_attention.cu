/* cuda_attention.cu — causal grouped-query attention over packed sequences
 * on the GPU: flash-style tiles in fp32, O(T) memory, no atomics.
 *
 * Tiling: a block owns BR = 8 * NW consecutive rows of the packed batch
 * (global positions, not per sequence) for one head; each of its NW warps
 * owns 8 rows, each lane 32 / CPL key columns of a BC = 32 * CPL tile and
 * DPL = ceil(D / 32) output columns. The sequence of every row is found by
 * a binary search in cu_seqlens (device memory: nothing is read back to the
 * host), and the key tiles run from the start of the first row's sequence
 * to the last row; a score (t, j) counts only when start(t) <= j <= t, so a
 * block that straddles two sequences masks the other one's keys: nothing
 * leaks across sequences, and no T x T matrix ever exists (scores live in
 * registers, one tile at a time).
 *
 * Forward, per row (online softmax over key tiles):
 *   s = scale q k^T;  m' = max(m, max s);  l = l e^(m - m') + sum e^(s - m')
 *   acc = acc e^(m - m') + e^(s - m') v;   out = acc / l;  lse = m + log l.
 * Backward, in two passes that recompute P = exp(s - lse), with
 * D_t = rowsum(dout_t * out_t) computed first (as the CPU device does):
 *   pass 1, block = (query rows, head):  dS = P (dout v^T - D), dq = scale dS k;
 *   pass 2, block = (key rows, kv head): for the heads of the group in order
 *           and the query tiles after the keys, dv += P^T dout,
 *           dk += scale dS^T q.
 * Every output element is written by exactly one block after sums in a
 * fixed order: bit-identical run after run.
 *
 * Shared memory rows are padded to D + 1 floats so that a warp reading one
 * column of 32 rows hits 32 different banks.
 *
 * Requirements (device.h): H % KV == 0, D <= 256; cu_seqlens valid
 * (non-decreasing from 0 to T; the engine builds it) — it cannot be checked
 * without a copy to the host, so invalid offsets are clamped, never read
 * out of bounds.
 */
#include <math.h>
#include <stdlib.h>

#include "cuda_common.cuh"

#define RPW 8          /* rows per warp */
#define MAX_D 256

/* The sequence [ret_start, ret_end) holding position t < T: the largest b
 * with cu[b] <= t (clamped into [0, T]). */
__device__ __forceinline__ void seq_of(const int32_t *cu, int B, int T, int t,
				       int *ret_start, int *ret_end)
{
	int lo = 0, hi = B;

	while (hi - lo > 1) {
		int mid = (lo + hi) >> 1;

		if (cu[mid] <= t)
			lo = mid;
		else
			hi = mid;
	}
	*ret_start = min(max(cu[lo], 0), t);
	*ret_end = max(min(cu[lo + 1], T), t + 1);
}

template <int NW, int CPL>
static size_t fwd_smem(int D)
{
	const int BR = RPW * NW, BC = 32 * CPL, ld = D + 1;

	return sizeof(float) * ((size_t)(BR + 2 * BC) * ld + NW * RPW * BC);
}

template <int NW, int CPL>
static size_t bwd_smem(int D)
{
	const int BR = RPW * NW, BC = 32 * CPL, ld = D + 1;

	return sizeof(float) * ((size_t)(2 * BR + 2 * BC) * ld + 2 * BC + 2 * NW * RPW * BC);
}

/* ---- forward ------------------------------------------------------------ */

template <int NW, int CPL, int DPL>
__global__ void __launch_bounds__(NW * 32)
attn_fwd_kernel(float *out, float *lse, const float *q, const float *k, const float *v,
		const int32_t *cu, int B, int T, int H, int KV, int D, float scale)
{
	constexpr int BR = RPW * NW, BC = 32 * CPL, NT = NW * 32;
	extern __shared__ float sm[];
	__shared__ int rstart[BR];
	const int ld = D + 1;
	float *Qs = sm;                         /* [BR][ld] */
	float *Ks = Qs + BR * ld;               /* [BC][ld] */
	float *Vs = Ks + BC * ld;               /* [BC][ld] */
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, row0 = warp * RPW;
	float *P = Vs + BC * ld + warp * RPW * BC;   /* this warp's [RPW][BC] */
	const int h = blockIdx.y, kvh = h / (H / KV), i0 = blockIdx.x * BR;
	const int kend = min(i0 + BR, T);
	float m[RPW], l[RPW], acc[RPW][DPL];
	int kbeg;

	for (int idx = threadIdx.x; idx < BR * D; idx += NT) {
		int r = idx / D, d = idx - r * D, t = i0 + r;

		Qs[r * ld + d] = t < T ? q[((int64_t)t * H + h) * D + d] : 0.0f;
	}
	for (int r = threadIdx.x; r < BR; r += NT) {
		int t = i0 + r, s = T, e;

		if (t < T)
			seq_of(cu, B, T, t, &s, &e);
		rstart[r] = s;          /* T: a padding row sees no key */
	}
	__syncthreads();
	kbeg = rstart[0];
#pragma unroll
	for (int r = 0; r < RPW; r++) {
		m[r] = -INFINITY;
		l[r] = 0.0f;
#pragma unroll
		for (int i = 0; i < DPL; i++)
			acc[r][i] = 0.0f;
	}
	for (int kt = kbeg; kt < kend; kt += BC) {
		float s[RPW][CPL];

		__syncthreads();        /* the previous tile is no longer read */
		for (int idx = threadIdx.x; idx < BC * D; idx += NT) {
			int j = idx / D, d = idx - j * D, key = kt + j;
			int64_t off = ((int64_t)key * KV + kvh) * D + d;
			bool ok = key < kend;

			Ks[j * ld + d] = ok ? k[off] : 0.0f;
			Vs[j * ld + d] = ok ? v[off] : 0.0f;
		}
		__syncthreads();
#pragma unroll
		for (int r = 0; r < RPW; r++)
#pragma unroll
			for (int c = 0; c < CPL; c++)
				s[r][c] = 0.0f;
		for (int d = 0; d < D; d++) {
			float kd[CPL];

#pragma unroll
			for (int c = 0; c < CPL; c++)
				kd[c] = Ks[(lane + 32 * c) * ld + d];
#pragma unroll
			for (int r = 0; r < RPW; r++) {
				float qd = Qs[(row0 + r) * ld + d];

#pragma unroll
				for (int c = 0; c < CPL; c++)
					s[r][c] = fmaf(qd, kd[c], s[r][c]);
			}
		}
#pragma unroll
		for (int r = 0; r < RPW; r++) {
			const int t = i0 + row0 + r, st = rstart[row0 + r];
			float mx = -INFINITY, ps = 0.0f, mnew, corr;

#pragma unroll
			for (int c = 0; c < CPL; c++) {
				int key = kt + lane + 32 * c;
				bool ok = key >= st && key <= t && key < kend;

				s[r][c] = ok ? s[r][c] * scale : -INFINITY;
				mx = fmaxf(mx, s[r][c]);
			}
			mx = warp_max(mx);
			mnew = fmaxf(m[r], mx);
#pragma unroll
			for (int c = 0; c < CPL; c++) {
				float p = s[r][c] == -INFINITY ? 0.0f : expf(s[r][c] - mnew);

				P[r * BC + lane + 32 * c] = p;
				ps += p;
			}
			ps = warp_sum(ps);
			corr = m[r] == -INFINITY ? 0.0f : expf(m[r] - mnew);
			l[r] = l[r] * corr + ps;
			m[r] = mnew;
#pragma unroll
			for (int i = 0; i < DPL; i++)
				acc[r][i] *= corr;
		}
		__syncwarp();
		for (int j = 0; j < BC; j++) {
			float vd[DPL];

#pragma unroll
			for (int i = 0; i < DPL; i++) {
				int d = lane + 32 * i;

				vd[i] = d < D ? Vs[j * ld + d] : 0.0f;
			}
#pragma unroll
			for (int r = 0; r < RPW; r++) {
				float pr = P[r * BC + j];

#pragma unroll
				for (int i = 0; i < DPL; i++)
					acc[r][i] = fmaf(pr, vd[i], acc[r][i]);
			}
		}
		__syncwarp();
	}
#pragma unroll
	for (int r = 0; r < RPW; r++) {
		const int t = i0 + row0 + r;
		float inv;

		if (t >= T)
			continue;
		inv = 1.0f / l[r];
#pragma unroll
		for (int i = 0; i < DPL; i++) {
			int d = lane + 32 * i;

			if (d < D)
				out[((int64_t)t * H + h) * D + d] = acc[r][i] * inv;
		}
		if (lane == 0)
			lse[(int64_t)h * T + t] = m[r] + logf(l[r]);
	}
}

/* ---- backward: D_t = rowsum(dout * out), [H, T] -------------------------- */

__global__ void attn_drow_kernel(float *drow, const float *dout, const float *out,
				 int T, int H, int D)
{
	int64_t row = blockIdx.x * (int64_t)(blockDim.x >> 5) + (threadIdx.x >> 5);
	int lane = threadIdx.x & 31;
	float s = 0.0f;

	if (row >= (int64_t)T * H)
		return;
	for (int d = lane; d < D; d += 32)
		s += dout[row * D + d] * out[row * D + d];
	s = warp_sum(s);
	if (lane == 0)
		drow[(row % H) * T + row / H] = s;
}

/* ---- backward pass 1: dq ---------------------------------------------------- */

template <int NW, int CPL, int DPL>
__global__ void __launch_bounds__(NW * 32)
attn_dq_kernel(float *dq, const float *dout, const float *q, const float *k, const float *v,
	       const float *lse, const float *drow, const int32_t *cu, int B, int T, int H,
	       int KV, int D, float scale)
{
	constexpr int BR = RPW * NW, BC = 32 * CPL, NT = NW * 32;
	extern __shared__ float sm[];
	__shared__ int rstart[BR];
	const int ld = D + 1;
	float *Qs = sm;                         /* [BR][ld] */
	float *Os = Qs + BR * ld;               /* [BR][ld] dout rows */
	float *Ks = Os + BR * ld;               /* [BC][ld] */
	float *Vs = Ks + BC * ld;               /* [BC][ld] */
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, row0 = warp * RPW;
	float *P = Vs + BC * ld + warp * RPW * BC;   /* dS of this warp's rows */
	const int h = blockIdx.y, kvh = h / (H / KV), i0 = blockIdx.x * BR;
	const int kend = min(i0 + BR, T);
	float ls[RPW], di[RPW], acc[RPW][DPL];

	for (int idx = threadIdx.x; idx < BR * D; idx += NT) {
		int r = idx / D, d = idx - r * D, t = i0 + r;
		int64_t off = ((int64_t)t * H + h) * D + d;

		Qs[r * ld + d] = t < T ? q[off] : 0.0f;
		Os[r * ld + d] = t < T ? dout[off] : 0.0f;
	}
	for (int r = threadIdx.x; r < BR; r += NT) {
		int t = i0 + r, s = T, e;

		if (t < T)
			seq_of(cu, B, T, t, &s, &e);
		rstart[r] = s;
	}
#pragma unroll
	for (int r = 0; r < RPW; r++) {
		int t = i0 + row0 + r;

		ls[r] = t < T ? lse[(int64_t)h * T + t] : 0.0f;
		di[r] = t < T ? drow[(int64_t)h * T + t] : 0.0f;
#pragma unroll
		for (int i = 0; i < DPL; i++)
			acc[r][i] = 0.0f;
	}
	__syncthreads();
	for (int kt = rstart[0]; kt < kend; kt += BC) {
		float s[RPW][CPL], dp[RPW][CPL];

		__syncthreads();
		for (int idx = threadIdx.x; idx < BC * D; idx += NT) {
			int j = idx / D, d = idx - j * D, key = kt + j;
			int64_t off = ((int64_t)key * KV + kvh) * D + d;
			bool ok = key < kend;

			Ks[j * ld + d] = ok ? k[off] : 0.0f;
			Vs[j * ld + d] = ok ? v[off] : 0.0f;
		}
		__syncthreads();
#pragma unroll
		for (int r = 0; r < RPW; r++)
#pragma unroll
			for (int c = 0; c < CPL; c++) {
				s[r][c] = 0.0f;
				dp[r][c] = 0.0f;
			}
		for (int d = 0; d < D; d++) {
			float kd[CPL], vd[CPL];

#pragma unroll
			for (int c = 0; c < CPL; c++) {
				kd[c] = Ks[(lane + 32 * c) * ld + d];
				vd[c] = Vs[(lane + 32 * c) * ld + d];
			}
#pragma unroll
			for (int r = 0; r < RPW; r++) {
				float qd = Qs[(row0 + r) * ld + d], od = Os[(row0 + r) * ld + d];

#pragma unroll
				for (int c = 0; c < CPL; c++) {
					s[r][c] = fmaf(qd, kd[c], s[r][c]);
					dp[r][c] = fmaf(od, vd[c], dp[r][c]);
				}
			}
		}
#pragma unroll
		for (int r = 0; r < RPW; r++) {
			const int t = i0 + row0 + r, st = rstart[row0 + r];

#pragma unroll
			for (int c = 0; c < CPL; c++) {
				int key = kt + lane + 32 * c;
				bool ok = key >= st && key <= t && key < kend;
				float p = ok ? expf(s[r][c] * scale - ls[r]) : 0.0f;

				P[r * BC + lane + 32 * c] = p * (dp[r][c] - di[r]);
			}
		}
		__syncwarp();
		for (int j = 0; j < BC; j++) {
			float kd[DPL];

#pragma unroll
			for (int i = 0; i < DPL; i++) {
				int d = lane + 32 * i;

				kd[i] = d < D ? Ks[j * ld + d] : 0.0f;
			}
#pragma unroll
			for (int r = 0; r < RPW; r++) {
				float ds = P[r * BC + j];

#pragma unroll
				for (int i = 0; i < DPL; i++)
					acc[r][i] = fmaf(ds, kd[i], acc[r][i]);
			}
		}
		__syncwarp();
	}
#pragma unroll
	for (int r = 0; r < RPW; r++) {
		const int t = i0 + row0 + r;

		if (t >= T)
			continue;
#pragma unroll
		for (int i = 0; i < DPL; i++) {
			int d = lane + 32 * i;

			if (d < D)
				dq[((int64_t)t * H + h) * D + d] = scale * acc[r][i];
		}
	}
}

/* ---- backward pass 2: dk, dv -------------------------------------------- */

template <int NW, int CPL, int DPL>
__global__ void __launch_bounds__(NW * 32)
attn_dkv_kernel(float *dk, float *dv, const float *dout, const float *q, const float *k,
		const float *v, const float *lse, const float *drow, const int32_t *cu, int B,
		int T, int H, int KV, int D, float scale)
{
	constexpr int BR = RPW * NW, BC = 32 * CPL, NT = NW * 32;
	extern __shared__ float sm[];
	__shared__ int rend[BR];
	const int ld = D + 1;
	float *Ks = sm;                         /* [BR][ld] own keys */
	float *Vs = Ks + BR * ld;               /* [BR][ld] own values */
	float *Qs = Vs + BR * ld;               /* [BC][ld] query tile */
	float *Os = Qs + BC * ld;               /* [BC][ld] dout tile */
	float *Ls = Os + BC * ld;               /* [BC] lse of the tile's queries */
	float *Ds = Ls + BC;                    /* [BC] D of the tile's queries */
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, row0 = warp * RPW;
	float *P = Ds + BC + warp * RPW * BC;   /* [RPW][BC] */
	float *dS = P + NW * RPW * BC;          /* [RPW][BC] */
	const int kvh = blockIdx.y, G = H / KV, j0 = blockIdx.x * BR;
	float adk[RPW][DPL], adv[RPW][DPL];
	int qend;

	for (int idx = threadIdx.x; idx < BR * D; idx += NT) {
		int r = idx / D, d = idx - r * D, j = j0 + r;
		int64_t off = ((int64_t)j * KV + kvh) * D + d;

		Ks[r * ld + d] = j < T ? k[off] : 0.0f;
		Vs[r * ld + d] = j < T ? v[off] : 0.0f;
	}
	for (int r = threadIdx.x; r < BR; r += NT) {
		int j = j0 + r, s, e = 0;

		if (j < T)
			seq_of(cu, B, T, j, &s, &e);
		rend[r] = e;            /* 0: a padding key is seen by no query */
	}
#pragma unroll
	for (int r = 0; r < RPW; r++)
#pragma unroll
		for (int i = 0; i < DPL; i++) {
			adk[r][i] = 0.0f;
			adv[r][i] = 0.0f;
		}
	__syncthreads();
	qend = rend[min(BR, T - j0) - 1];       /* ends are non-decreasing */
	for (int g = 0; g < G; g++) {
		const int h = kvh * G + g;

		for (int qt = j0; qt < qend; qt += BC) {
			float s[RPW][CPL], dp[RPW][CPL];

			__syncthreads();
			for (int idx = threadIdx.x; idx < BC * D; idx += NT) {
				int c = idx / D, d = idx - c * D, t = qt + c;
				int64_t off = ((int64_t)t * H + h) * D + d;
				bool ok = t < qend;

				Qs[c * ld + d] = ok ? q[off] : 0.0f;
				Os[c * ld + d] = ok ? dout[off] : 0.0f;
			}
			for (int c = threadIdx.x; c < BC; c += NT) {
				int t = qt + c;

				Ls[c] = t < qend ? lse[(int64_t)h * T + t] : 0.0f;
				Ds[c] = t < qend ? drow[(int64_t)h * T + t] : 0.0f;
			}
			__syncthreads();
#pragma unroll
			for (int r = 0; r < RPW; r++)
#pragma unroll
				for (int c = 0; c < CPL; c++) {
					s[r][c] = 0.0f;
					dp[r][c] = 0.0f;
				}
			for (int d = 0; d < D; d++) {
				float qd[CPL], od[CPL];

#pragma unroll
				for (int c = 0; c < CPL; c++) {
					qd[c] = Qs[(lane + 32 * c) * ld + d];
					od[c] = Os[(lane + 32 * c) * ld + d];
				}
#pragma unroll
				for (int r = 0; r < RPW; r++) {
					float kd = Ks[(row0 + r) * ld + d], vd = Vs[(row0 + r) * ld + d];

#pragma unroll
					for (int c = 0; c < CPL; c++) {
						s[r][c] = fmaf(kd, qd[c], s[r][c]);
						dp[r][c] = fmaf(vd, od[c], dp[r][c]);
					}
				}
			}
#pragma unroll
			for (int r = 0; r < RPW; r++) {
				const int j = j0 + row0 + r, e = rend[row0 + r];

#pragma unroll
				for (int c = 0; c < CPL; c++) {
					int col = lane + 32 * c, t = qt + col;
					bool ok = t >= j && t < e;
					float p = ok ? expf(s[r][c] * scale - Ls[col]) : 0.0f;

					P[r * BC + col] = p;
					dS[r * BC + col] = p * (dp[r][c] - Ds[col]);
				}
			}
			__syncwarp();
			for (int c = 0; c < BC; c++) {
				float qd[DPL], od[DPL];

#pragma unroll
				for (int i = 0; i < DPL; i++) {
					int d = lane + 32 * i;

					qd[i] = d < D ? Qs[c * ld + d] : 0.0f;
					od[i] = d < D ? Os[c * ld + d] : 0.0f;
				}
#pragma unroll
				for (int r = 0; r < RPW; r++) {
					float pr = P[r * BC + c], dsr = dS[r * BC + c];

#pragma unroll
					for (int i = 0; i < DPL; i++) {
						adv[r][i] = fmaf(pr, od[i], adv[r][i]);
						adk[r][i] = fmaf(dsr, qd[i], adk[r][i]);
					}
				}
			}
			__syncwarp();
		}
	}
#pragma unroll
	for (int r = 0; r < RPW; r++) {
		const int j = j0 + row0 + r;

		if (j >= T)
			continue;
#pragma unroll
		for (int i = 0; i < DPL; i++) {
			int d = lane + 32 * i;

			if (d < D) {
				int64_t off = ((int64_t)j * KV + kvh) * D + d;

				dk[off] = scale * adk[r][i];
				dv[off] = adv[r][i];
			}
		}
	}
}

/* ---- bf16 tensor-core path ----------------------------------------------
 *
 * With MATMUL_BF16 and D in {64, 128}, the same algorithm (same tiles of
 * the packed batch, same masks, same two-pass deterministic backward) runs
 * its products on the tensor cores through WMMA: Q, K, V, dout and the
 * probabilities P / dS are rounded to bf16 (round to nearest even), the
 * products accumulate in fp32, softmax statistics and everything else stay
 * fp32 — the precision contract of MATMUL_BF16 applied to attention. The
 * normalizer l sums the bf16-rounded p that multiply V, so out is an exact
 * convex combination of the rounded weights.
 *
 * Block: 4 warps, 64 rows (16 per warp), key (or query) tiles of 64.
 * Scores go through shared memory (fp32, WMMA accumulators have no known
 * element layout): a warp stores its 16 x 64 scores, each lane pair owns
 * one row (32 columns per lane) for the softmax, and the output rows are
 * rescaled in shared memory before the next P V product accumulates into
 * them. Backward accumulators (dq; dk, dv) stay in registers: they need no
 * rescaling. ENGINED_CUDA_ATTN=fp32 forces the fp32 kernels (diagnosis).
 */
#include <cuda_bf16.h>
#include <mma.h>

#define TC_BR 64
#define TC_BC 64
#define TC_THREADS 128
#define TC_LDS (TC_BC + 4)      /* fp32 score rows */
#define TC_LDP (TC_BC + 8)      /* bf16 probability rows */

namespace wm = nvcuda::wmma;
typedef wm::fragment<wm::matrix_a, 16, 16, 16, __nv_bfloat16, wm::row_major> frag_a;
typedef wm::fragment<wm::matrix_b, 16, 16, 16, __nv_bfloat16, wm::col_major> frag_bt;
typedef wm::fragment<wm::matrix_b, 16, 16, 16, __nv_bfloat16, wm::row_major> frag_b;
typedef wm::fragment<wm::accumulator, 16, 16, 16, float> frag_c;

/* dst[r][0..D) = bf16(src[(row0 + r) * stride + d]) for r < rows (zeros
 * from r >= valid); D % 4 == 0 and src 16-byte aligned (float4 loads). */
template <int D>
__device__ __forceinline__ void tc_load(__nv_bfloat16 *dst, const float *src, int64_t stride,
					int row0, int rows, int valid)
{
	constexpr int LDH = D + 8, Q4 = D / 4;

	for (int idx = threadIdx.x; idx < rows * Q4; idx += TC_THREADS) {
		int r = idx / Q4, c = (idx - r * Q4) * 4;
		float4 x = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
		__nv_bfloat162 *o = (__nv_bfloat162 *)(dst + r * LDH + c);

		if (r < valid)
			x = *(const float4 *)(src + (int64_t)(row0 + r) * stride + c);
		o[0] = __floats2bfloat162_rn(x.x, x.y);
		o[1] = __floats2bfloat162_rn(x.z, x.w);
	}
}

/* S[16 x 64] (fp32, row stride TC_LDS) = A[16 x D] B[64 x D]^T, A and B
 * bf16 rows of stride D + 8. */
template <int D>
__device__ __forceinline__ void tc_scores(float *S, const __nv_bfloat16 *A,
					  const __nv_bfloat16 *B)
{
	constexpr int LDH = D + 8;

#pragma unroll
	for (int n = 0; n < TC_BC / 16; n++) {
		frag_c acc;

		wm::fill_fragment(acc, 0.0f);
#pragma unroll
		for (int kk = 0; kk < D / 16; kk++) {
			frag_a a;
			frag_bt b;

			wm::load_matrix_sync(a, A + kk * 16, LDH);
			wm::load_matrix_sync(b, B + n * 16 * LDH + kk * 16, LDH);
			wm::mma_sync(acc, a, b, acc);
		}
		wm::store_matrix_sync(S + n * 16, acc, TC_LDS, wm::mem_row_major);
	}
}

template <int D>
static size_t tc_fwd_smem(void)
{
	return (size_t)3 * 64 * (D + 8) * 2 + (size_t)64 * TC_LDP * 2 +
	       (size_t)64 * TC_LDS * 4 + (size_t)64 * (D + 4) * 4;
}

template <int D>
static size_t tc_bwd_smem(void)
{
	return (size_t)4 * 64 * (D + 8) * 2 + (size_t)2 * 64 * TC_LDS * 4 +
	       (size_t)2 * 64 * TC_LDP * 2 + 2 * 64 * 4;
}

template <int D>
__global__ void __launch_bounds__(TC_THREADS)
attn_fwd_tc(float *out, float *lse, const float *q, const float *k, const float *v,
	    const int32_t *cu, int B, int T, int H, int KV, float scale)
{
	constexpr int LDH = D + 8, LDO = D + 4;
	extern __shared__ __align__(128) unsigned char smraw[];
	__shared__ int rstart[TC_BR];
	__nv_bfloat16 *Qs = (__nv_bfloat16 *)smraw;         /* [64][LDH] */
	__nv_bfloat16 *Ks = Qs + TC_BR * LDH;               /* [64][LDH] */
	__nv_bfloat16 *Vs = Ks + TC_BC * LDH;               /* [64][LDH] */
	__nv_bfloat16 *Ps = Vs + TC_BC * LDH;               /* [64][TC_LDP] */
	float *Ss = (float *)(Ps + TC_BR * TC_LDP);         /* [64][TC_LDS] */
	float *Os = Ss + TC_BR * TC_LDS;                    /* [64][LDO] */
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const int h = blockIdx.y, kvh = h / (H / KV), i0 = blockIdx.x * TC_BR;
	const int kend = min(i0 + TC_BR, T);
	const int my = lane >> 1, half = lane & 1, row = warp * 16 + my, t = i0 + row;
	__nv_bfloat16 *Pw = Ps + warp * 16 * TC_LDP;
	float *Sw = Ss + warp * 16 * TC_LDS, *Ow = Os + warp * 16 * LDO;
	float m = -INFINITY, l = 0.0f;
	int st;

	tc_load<D>(Qs, q + (int64_t)h * D, (int64_t)H * D, i0, TC_BR, kend - i0);
	for (int r = threadIdx.x; r < TC_BR; r += TC_THREADS) {
		int tt = i0 + r, s = T, e;

		if (tt < T)
			seq_of(cu, B, T, tt, &s, &e);
		rstart[r] = s;
	}
	for (int idx = threadIdx.x; idx < TC_BR * LDO; idx += TC_THREADS)
		Os[idx] = 0.0f;
	__syncthreads();
	st = rstart[row];
	for (int kt = rstart[0]; kt < kend; kt += TC_BC) {
		float sv[32], mx = -INFINITY, ps = 0.0f, mnew, corr;

		__syncthreads();
		tc_load<D>(Ks, k + (int64_t)kvh * D, (int64_t)KV * D, kt, TC_BC, kend - kt);
		tc_load<D>(Vs, v + (int64_t)kvh * D, (int64_t)KV * D, kt, TC_BC, kend - kt);
		__syncthreads();
		tc_scores<D>(Sw, Qs + warp * 16 * LDH, Ks);
		__syncwarp();
#pragma unroll
		for (int i = 0; i < 32; i++) {
			int c = 32 * half + i, j = kt + c;
			bool ok = t < T && j >= st && j <= t;

			sv[i] = ok ? Sw[my * TC_LDS + c] * scale : -INFINITY;
			mx = fmaxf(mx, sv[i]);
		}
		mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
		mnew = fmaxf(m, mx);
#pragma unroll
		for (int i = 0; i < 32; i++) {
			__nv_bfloat16 pb = __float2bfloat16_rn(sv[i] == -INFINITY ? 0.0f
									: expf(sv[i] - mnew));

			Pw[my * TC_LDP + 32 * half + i] = pb;
			ps += __bfloat162float(pb);
		}
		ps += __shfl_xor_sync(0xffffffffu, ps, 1);
		corr = m == -INFINITY ? 0.0f : expf(m - mnew);
		l = l * corr + ps;
		m = mnew;
		for (int d = half * (D / 2); d < (half + 1) * (D / 2); d++)
			Ow[my * LDO + d] *= corr;
		__syncwarp();
#pragma unroll
		for (int n = 0; n < D / 16; n++) {
			frag_c acc;

			wm::load_matrix_sync(acc, Ow + n * 16, LDO, wm::mem_row_major);
#pragma unroll
			for (int kk = 0; kk < TC_BC / 16; kk++) {
				frag_a a;
				frag_b b;

				wm::load_matrix_sync(a, Pw + kk * 16, TC_LDP);
				wm::load_matrix_sync(b, Vs + kk * 16 * LDH + n * 16, LDH);
				wm::mma_sync(acc, a, b, acc);
			}
			wm::store_matrix_sync(Ow + n * 16, acc, LDO, wm::mem_row_major);
		}
		__syncwarp();
	}
	if (t < T) {
		float inv = 1.0f / l;

		for (int d = half * (D / 2); d < (half + 1) * (D / 2); d++)
			out[((int64_t)t * H + h) * D + d] = Ow[my * LDO + d] * inv;
		if (half == 0)
			lse[(int64_t)h * T + t] = m + logf(l);
	}
}

template <int D>
__global__ void __launch_bounds__(TC_THREADS)
attn_dq_tc(float *dq, const float *dout, const float *q, const float *k, const float *v,
	   const float *lse, const float *drow, const int32_t *cu, int B, int T, int H, int KV,
	   float scale)
{
	constexpr int LDH = D + 8, LDO = D + 4;
	extern __shared__ __align__(128) unsigned char smraw[];
	__shared__ int rstart[TC_BR];
	__nv_bfloat16 *Qs = (__nv_bfloat16 *)smraw;         /* [64][LDH] */
	__nv_bfloat16 *Gs = Qs + TC_BR * LDH;               /* [64][LDH] dout rows */
	__nv_bfloat16 *Ks = Gs + TC_BR * LDH;               /* [64][LDH] */
	__nv_bfloat16 *Vs = Ks + TC_BC * LDH;               /* [64][LDH] */
	float *Ss = (float *)(Vs + TC_BC * LDH);            /* [64][TC_LDS] */
	float *Dp = Ss + TC_BR * TC_LDS;                    /* [64][TC_LDS] */
	__nv_bfloat16 *Ds = (__nv_bfloat16 *)(Dp + TC_BR * TC_LDS);   /* [64][TC_LDP] */
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const int h = blockIdx.y, kvh = h / (H / KV), i0 = blockIdx.x * TC_BR;
	const int kend = min(i0 + TC_BR, T);
	const int my = lane >> 1, half = lane & 1, row = warp * 16 + my, t = i0 + row;
	float *Sw = Ss + warp * 16 * TC_LDS, *Dpw = Dp + warp * 16 * TC_LDS;
	__nv_bfloat16 *Dsw = Ds + warp * 16 * TC_LDP;
	const float ls = t < T ? lse[(int64_t)h * T + t] : 0.0f;
	const float di = t < T ? drow[(int64_t)h * T + t] : 0.0f;
	frag_c acc[D / 16];
	float *stage;
	int st;

	tc_load<D>(Qs, q + (int64_t)h * D, (int64_t)H * D, i0, TC_BR, kend - i0);
	tc_load<D>(Gs, dout + (int64_t)h * D, (int64_t)H * D, i0, TC_BR, kend - i0);
	for (int r = threadIdx.x; r < TC_BR; r += TC_THREADS) {
		int tt = i0 + r, s = T, e;

		if (tt < T)
			seq_of(cu, B, T, tt, &s, &e);
		rstart[r] = s;
	}
#pragma unroll
	for (int n = 0; n < D / 16; n++)
		wm::fill_fragment(acc[n], 0.0f);
	__syncthreads();
	st = rstart[row];
	for (int kt = rstart[0]; kt < kend; kt += TC_BC) {
		__syncthreads();
		tc_load<D>(Ks, k + (int64_t)kvh * D, (int64_t)KV * D, kt, TC_BC, kend - kt);
		tc_load<D>(Vs, v + (int64_t)kvh * D, (int64_t)KV * D, kt, TC_BC, kend - kt);
		__syncthreads();
		tc_scores<D>(Sw, Qs + warp * 16 * LDH, Ks);
		tc_scores<D>(Dpw, Gs + warp * 16 * LDH, Vs);
		__syncwarp();
#pragma unroll 8
		for (int i = 0; i < 32; i++) {
			int c = 32 * half + i, j = kt + c;
			bool ok = t < T && j >= st && j <= t;
			float p = ok ? expf(Sw[my * TC_LDS + c] * scale - ls) : 0.0f;

			Dsw[my * TC_LDP + c] = __float2bfloat16_rn(p * (Dpw[my * TC_LDS + c] - di));
		}
		__syncwarp();
#pragma unroll
		for (int n = 0; n < D / 16; n++) {
#pragma unroll
			for (int kk = 0; kk < TC_BC / 16; kk++) {
				frag_a a;
				frag_b b;

				wm::load_matrix_sync(a, Dsw + kk * 16, TC_LDP);
				wm::load_matrix_sync(b, Ks + kk * 16 * LDH + n * 16, LDH);
				wm::mma_sync(acc[n], a, b, acc[n]);
			}
		}
	}
	/* stage through the (no longer read) K and V tiles: 64 x LDO floats */
	__syncthreads();
	stage = (float *)Ks + warp * 16 * LDO;
#pragma unroll
	for (int n = 0; n < D / 16; n++)
		wm::store_matrix_sync(stage + n * 16, acc[n], LDO, wm::mem_row_major);
	__syncwarp();
	if (t < T)
		for (int d = half * (D / 2); d < (half + 1) * (D / 2); d++)
			dq[((int64_t)t * H + h) * D + d] = scale * stage[my * LDO + d];
}

template <int D>
__global__ void __launch_bounds__(TC_THREADS)
attn_dkv_tc(float *dk, float *dv, const float *dout, const float *q, const float *k,
	    const float *v, const float *lse, const float *drow, const int32_t *cu, int B, int T,
	    int H, int KV, float scale)
{
	constexpr int LDH = D + 8, LDO = D + 4;
	extern __shared__ __align__(128) unsigned char smraw[];
	__shared__ int rend[TC_BR];
	__nv_bfloat16 *Ks = (__nv_bfloat16 *)smraw;         /* [64][LDH] own keys */
	__nv_bfloat16 *Vs = Ks + TC_BR * LDH;               /* [64][LDH] own values */
	__nv_bfloat16 *Qs = Vs + TC_BR * LDH;               /* [64][LDH] query tile */
	__nv_bfloat16 *Gs = Qs + TC_BC * LDH;               /* [64][LDH] dout tile */
	float *Ss = (float *)(Gs + TC_BC * LDH);            /* [64][TC_LDS] S^T */
	float *Dp = Ss + TC_BR * TC_LDS;                    /* [64][TC_LDS] dP^T */
	__nv_bfloat16 *Ps = (__nv_bfloat16 *)(Dp + TC_BR * TC_LDS);   /* [64][TC_LDP] */
	__nv_bfloat16 *Ds = Ps + TC_BR * TC_LDP;            /* [64][TC_LDP] */
	float *Ls = (float *)(Ds + TC_BR * TC_LDP);         /* [64] */
	float *Dq = Ls + TC_BC;                             /* [64] */
	const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
	const int kvh = blockIdx.y, G = H / KV, j0 = blockIdx.x * TC_BR;
	const int my = lane >> 1, half = lane & 1, row = warp * 16 + my, j = j0 + row;
	float *Sw = Ss + warp * 16 * TC_LDS, *Dpw = Dp + warp * 16 * TC_LDS;
	__nv_bfloat16 *Pw = Ps + warp * 16 * TC_LDP, *Dsw = Ds + warp * 16 * TC_LDP;
	frag_c adk[D / 16], adv[D / 16];
	float *stage;
	int e, qend;

	tc_load<D>(Ks, k + (int64_t)kvh * D, (int64_t)KV * D, j0, TC_BR, T - j0);
	tc_load<D>(Vs, v + (int64_t)kvh * D, (int64_t)KV * D, j0, TC_BR, T - j0);
	for (int r = threadIdx.x; r < TC_BR; r += TC_THREADS) {
		int jj = j0 + r, s, en = 0;

		if (jj < T)
			seq_of(cu, B, T, jj, &s, &en);
		rend[r] = en;
	}
#pragma unroll
	for (int n = 0; n < D / 16; n++) {
		wm::fill_fragment(adk[n], 0.0f);
		wm::fill_fragment(adv[n], 0.0f);
	}
	__syncthreads();
	e = rend[row];
	qend = rend[min(TC_BR, T - j0) - 1];
	for (int g = 0; g < G; g++) {
		const int h = kvh * G + g;

		for (int qt = j0; qt < qend; qt += TC_BC) {
			__syncthreads();
			tc_load<D>(Qs, q + (int64_t)h * D, (int64_t)H * D, qt, TC_BC, qend - qt);
			tc_load<D>(Gs, dout + (int64_t)h * D, (int64_t)H * D, qt, TC_BC, qend - qt);
			for (int c = threadIdx.x; c < TC_BC; c += TC_THREADS) {
				int tq = qt + c;

				Ls[c] = tq < qend ? lse[(int64_t)h * T + tq] : 0.0f;
				Dq[c] = tq < qend ? drow[(int64_t)h * T + tq] : 0.0f;
			}
			__syncthreads();
			tc_scores<D>(Sw, Ks + warp * 16 * LDH, Qs);
			tc_scores<D>(Dpw, Vs + warp * 16 * LDH, Gs);
			__syncwarp();
#pragma unroll 8
			for (int i = 0; i < 32; i++) {
				int c = 32 * half + i, tq = qt + c;
				bool ok = tq >= j && tq < e;
				float p = ok ? expf(Sw[my * TC_LDS + c] * scale - Ls[c]) : 0.0f;

				Pw[my * TC_LDP + c] = __float2bfloat16_rn(p);
				Dsw[my * TC_LDP + c] = __float2bfloat16_rn(p * (Dpw[my * TC_LDS + c] -
										Dq[c]));
			}
			__syncwarp();
#pragma unroll
			for (int n = 0; n < D / 16; n++) {
#pragma unroll
				for (int kk = 0; kk < TC_BC / 16; kk++) {
					frag_a a;
					frag_b b;

					wm::load_matrix_sync(a, Pw + kk * 16, TC_LDP);
					wm::load_matrix_sync(b, Gs + kk * 16 * LDH + n * 16, LDH);
					wm::mma_sync(adv[n], a, b, adv[n]);
					wm::load_matrix_sync(a, Dsw + kk * 16, TC_LDP);
					wm::load_matrix_sync(b, Qs + kk * 16 * LDH + n * 16, LDH);
					wm::mma_sync(adk[n], a, b, adk[n]);
				}
			}
		}
	}
	/* stage through the (no longer read) query and dout tiles */
	__syncthreads();
	stage = (float *)Qs + warp * 16 * LDO;
#pragma unroll
	for (int n = 0; n < D / 16; n++)
		wm::store_matrix_sync(stage + n * 16, adk[n], LDO, wm::mem_row_major);
	__syncwarp();
	if (j < T)
		for (int d = half * (D / 2); d < (half + 1) * (D / 2); d++)
			dk[((int64_t)j * KV + kvh) * D + d] = scale * stage[my * LDO + d];
	__syncwarp();
#pragma unroll
	for (int n = 0; n < D / 16; n++)
		wm::store_matrix_sync(stage + n * 16, adv[n], LDO, wm::mem_row_major);
	__syncwarp();
	if (j < T)
		for (int d = half * (D / 2); d < (half + 1) * (D / 2); d++)
			dv[((int64_t)j * KV + kvh) * D + d] = stage[my * LDO + d];
}

/* ---- launchers ---------------------------------------------------------- */

struct attn_args {
	float *out, *lse, *dq, *dk, *dv;
	const float *q, *k, *v, *dout, *lse_in, *drow;
	const int32_t *cu;
	int B, T, H, KV, D;
	float scale;
};

static int smem_optin(void)
{
	int dev = 0, v = 0;

	if (cudaGetDevice(&dev) != cudaSuccess ||
	    cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) {
		(void)cudaGetLastError();
		return 48 << 10;
	}
	return v;
}

/* Launch the forward with tile shape (NW, CPL) and DPL; -ENOSPC when its
 * shared memory does not fit this GPU (the caller tries a smaller shape). */
template <int NW, int CPL, int DPL>
static int fwd_launch(struct device *dev, const struct attn_args *a)
{
	size_t smem = fwd_smem<NW, CPL>(a->D);
	dim3 grid((unsigned int)((a->T + RPW * NW - 1) / (RPW * NW)), (unsigned int)a->H);

	if (smem + RPW * NW * sizeof(int) > (size_t)smem_optin())
		return -ENOSPC;
	if (cudaFuncSetAttribute(attn_fwd_kernel<NW, CPL, DPL>,
				 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
		return cuda_launched(dev);
	attn_fwd_kernel<NW, CPL, DPL><<<grid, NW * 32, smem, cuda_stream(dev)>>>(
		a->out, a->lse, a->q, a->k, a->v, a->cu, a->B, a->T, a->H, a->KV, a->D, a->scale);
	return cuda_launched(dev);
}

template <int NW, int CPL, int DPL>
static int bwd_launch(struct device *dev, const struct attn_args *a)
{
	size_t smem = bwd_smem<NW, CPL>(a->D);
	dim3 gq((unsigned int)((a->T + RPW * NW - 1) / (RPW * NW)), (unsigned int)a->H);
	dim3 gk((unsigned int)((a->T + RPW * NW - 1) / (RPW * NW)), (unsigned int)a->KV);
	int r;

	if (smem + RPW * NW * sizeof(int) > (size_t)smem_optin())
		return -ENOSPC;
	if (cudaFuncSetAttribute(attn_dq_kernel<NW, CPL, DPL>,
				 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess ||
	    cudaFuncSetAttribute(attn_dkv_kernel<NW, CPL, DPL>,
				 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
		return cuda_launched(dev);
	attn_dq_kernel<NW, CPL, DPL><<<gq, NW * 32, smem, cuda_stream(dev)>>>(
		a->dq, a->dout, a->q, a->k, a->v, a->lse_in, a->drow, a->cu, a->B, a->T, a->H,
		a->KV, a->D, a->scale);
	r = cuda_launched(dev);
	if (r)
		return r;
	attn_dkv_kernel<NW, CPL, DPL><<<gk, NW * 32, smem, cuda_stream(dev)>>>(
		a->dk, a->dv, a->dout, a->q, a->k, a->v, a->lse_in, a->drow, a->cu, a->B, a->T,
		a->H, a->KV, a->D, a->scale);
	return cuda_launched(dev);
}

/* The bf16 tensor-core kernels take this call (see above). */
static bool use_tc(struct device *dev, int64_t D)
{
	const char *e = getenv("ENGINED_CUDA_ATTN");

	return dev->prec == MATMUL_BF16 && (D == 64 || D == 128) && !(e && !strcmp(e, "fp32"));
}

template <int D>
static int tc_fwd_launch(struct device *dev, const struct attn_args *a)
{
	size_t smem = tc_fwd_smem<D>();
	dim3 grid((unsigned int)((a->T + TC_BR - 1) / TC_BR), (unsigned int)a->H);

	if (smem + TC_BR * sizeof(int) > (size_t)smem_optin())
		return -ENOSPC;
	if (cudaFuncSetAttribute(attn_fwd_tc<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
				 (int)smem) != cudaSuccess)
		return cuda_launched(dev);
	attn_fwd_tc<D><<<grid, TC_THREADS, smem, cuda_stream(dev)>>>(
		a->out, a->lse, a->q, a->k, a->v, a->cu, a->B, a->T, a->H, a->KV, a->scale);
	return cuda_launched(dev);
}

template <int D>
static int tc_bwd_launch(struct device *dev, const struct attn_args *a)
{
	size_t smem = tc_bwd_smem<D>();
	dim3 gq((unsigned int)((a->T + TC_BR - 1) / TC_BR), (unsigned int)a->H);
	dim3 gk((unsigned int)((a->T + TC_BR - 1) / TC_BR), (unsigned int)a->KV);
	int r;

	if (smem + TC_BR * sizeof(int) > (size_t)smem_optin())
		return -ENOSPC;
	if (cudaFuncSetAttribute(attn_dq_tc<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
				 (int)smem) != cudaSuccess ||
	    cudaFuncSetAttribute(attn_dkv_tc<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
				 (int)smem) != cudaSuccess)
		return cuda_launched(dev);
	attn_dq_tc<D><<<gq, TC_THREADS, smem, cuda_stream(dev)>>>(
		a->dq, a->dout, a->q, a->k, a->v, a->lse_in, a->drow, a->cu, a->B, a->T, a->H,
		a->KV, a->scale);
	r = cuda_launched(dev);
	if (r)
		return r;
	attn_dkv_tc<D><<<gk, TC_THREADS, smem, cuda_stream(dev)>>>(
		a->dk, a->dv, a->dout, a->q, a->k, a->v, a->lse_in, a->drow, a->cu, a->B, a->T,
		a->H, a->KV, a->scale);
	return cuda_launched(dev);
}

static int check(int64_t B, int64_t T, int64_t H, int64_t KV, int64_t D)
{
	if (B < 0 || T < 0 || H <= 0 || KV <= 0 || H % KV || D <= 0 || D > MAX_D ||
	    T > INT32_MAX / 2 || B > INT32_MAX - 1 || H > 65535 || KV > 65535)
		return -EINVAL;
	return 0;
}

extern "C" int cuda_attention_fwd(struct device *dev, float *out, float *lse,
				  const float *q, const float *k, const float *v,
				  const int32_t *cu_seqlens, int64_t B, int64_t T,
				  int64_t H, int64_t KV, int64_t D, float scale)
{
	struct attn_args a = {};
	int r = cuda_alive(dev);

	if (r)
		return r;
	r = check(B, T, H, KV, D);
	if (r || T == 0 || B == 0)
		return r;
	a.out = out;
	a.lse = lse;
	a.q = q;
	a.k = k;
	a.v = v;
	a.cu = cu_seqlens;
	a.B = (int)B;
	a.T = (int)T;
	a.H = (int)H;
	a.KV = (int)KV;
	a.D = (int)D;
	a.scale = scale;
	if (use_tc(dev, D)) {
		r = D == 64 ? tc_fwd_launch<64>(dev, &a) : tc_fwd_launch<128>(dev, &a);
		if (r != -ENOSPC)
			return r;
	}
	if (D <= 64)
		r = fwd_launch<8, 2, 2>(dev, &a);
	else if (D <= 128)
		r = fwd_launch<8, 2, 4>(dev, &a);
	else
		r = -ENOSPC;
	if (r == -ENOSPC)
		r = D <= 128 ? fwd_launch<4, 1, 4>(dev, &a) : fwd_launch<4, 1, 8>(dev, &a);
	return r == -ENOSPC ? -EINVAL : r;
}

extern "C" int cuda_attention_bwd(struct device *dev, float *dq, float *dk, float *dv,
				  const float *dout, const float *q, const float *k,
				  const float *v, const float *out, const float *lse,
				  const int32_t *cu_seqlens, int64_t B, int64_t T,
				  int64_t H, int64_t KV, int64_t D, float scale)
{
	struct attn_args a = {};
	float *drow;
	int64_t rows = T * H;
	int r = cuda_alive(dev);

	if (r)
		return r;
	r = check(B, T, H, KV, D);
	if (r || T == 0 || B == 0)
		return r;
	drow = (float *)cuda_scratch(dev, CUDA_SCRATCH_ROWS, (size_t)rows * sizeof(float));
	if (!drow)
		return -ENOMEM;
	attn_drow_kernel<<<(unsigned int)((rows + 7) / 8), 256, 0, cuda_stream(dev)>>>(
		drow, dout, out, (int)T, (int)H, (int)D);
	r = cuda_launched(dev);
	if (r)
		return r;
	a.dq = dq;
	a.dk = dk;
	a.dv = dv;
	a.dout = dout;
	a.q = q;
	a.k = k;
	a.v = v;
	a.lse_in = lse;
	a.drow = drow;
	a.cu = cu_seqlens;
	a.B = (int)B;
	a.T = (int)T;
	a.H = (int)H;
	a.KV = (int)KV;
	a.D = (int)D;
	a.scale = scale;
	if (use_tc(dev, D)) {
		r = D == 64 ? tc_bwd_launch<64>(dev, &a) : tc_bwd_launch<128>(dev, &a);
		if (r != -ENOSPC)
			return r;
	}
	if (D <= 64)
		r = bwd_launch<8, 2, 2>(dev, &a);
	else if (D <= 128)
		r = bwd_launch<8, 2, 4>(dev, &a);
	else
		r = -ENOSPC;
	if (r == -ENOSPC)
		r = D <= 128 ? bwd_launch<4, 1, 4>(dev, &a) : bwd_launch<4, 1, 8>(dev, &a);
	return r == -ENOSPC ? -EINVAL : r;
}
