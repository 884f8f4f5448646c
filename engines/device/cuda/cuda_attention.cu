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
