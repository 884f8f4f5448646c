/* cuda_kv.cu — the paged key/value cache's kernels on the GPU (device.h:
 * kv_write, attention_paged).
 *
 * attention_paged: one block per (token, head), the sequence's positions
 * in chunks of KV_CHUNK keys (flash-decoding's online softmax, in a fixed
 * order): each thread scores keys of the chunk into shared memory, the
 * chunk's max rescales the running sum and output, then thread d adds
 * sum_j e_j v_j[d] over the chunk in ascending j. Deterministic: every sum
 * is in an order fixed by the positions alone.
 */
#include "cuda_common.cuh"

#define KV_CHUNK 1024
#define KV_THREADS 256

__global__ void kv_write_kernel(float *kc, float *vc, const float *k, const float *v,
				const int32_t *slots, int64_t T, int64_t row)
{
	int64_t n = T * row;

	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
	     i += (int64_t)gridDim.x * blockDim.x) {
		int64_t t = i / row, e = i % row, at = (int64_t)slots[t] * row + e;

		kc[at] = k[i];
		vc[at] = v[i];
	}
}

extern "C" int cuda_kv_write(struct device *dev, float *kcache, float *vcache, const float *k,
			     const float *v, const int32_t *slots, int64_t T, int64_t KV,
			     int64_t D)
{
	int r = cuda_alive(dev);

	if (r)
		return r;
	if (T < 0 || KV < 0 || D < 0)
		return -EINVAL;
	if (T == 0 || KV == 0 || D == 0)
		return 0;
	kv_write_kernel<<<ew_blocks(dev, T * KV * D), EW_THREADS, 0, cuda_stream(dev)>>>(
		kcache, vcache, k, v, slots, T, KV * D);
	return cuda_launched(dev);
}

/* A block-wide max (is_max) or sum of one float per thread (blockDim.x a
 * multiple of 32, at most 1024), in a fixed order; every thread gets it. */
__device__ float block_reduce(float v, float *red, bool is_max)
{
	int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;

	v = is_max ? warp_max(v) : warp_sum(v);
	__syncthreads();
	if (lane == 0)
		red[w] = v;
	__syncthreads();
	v = lane < nw ? red[lane] : is_max ? -INFINITY : 0.0f;
	return is_max ? warp_max(v) : warp_sum(v);
}

__global__ void attention_paged_kernel(float *out, const float *q, const float *kc,
				       const float *vc, const int32_t *tables,
				       const int32_t *table_off, const int32_t *pos, int64_t H, int64_t KV, int64_t D,
				       int64_t block, float scale)
{
	__shared__ float s[KV_CHUNK];
	__shared__ float red[32];
	const int64_t t = blockIdx.x / H, h = blockIdx.x % H, kvh = h / (H / KV);
	const int64_t n = (int64_t)pos[t] + 1, row = KV * D;
	const int32_t *table = tables + table_off[t];
	const float *qp = q + (t * H + h) * D;
	float m = -INFINITY, sum = 0.0f, acc = 0.0f;

	for (int64_t c0 = 0; c0 < n; c0 += KV_CHUNK) {
		int64_t cn = n - c0 < KV_CHUNK ? n - c0 : KV_CHUNK;
		float cm = -INFINITY, cs = 0.0f, nm, alpha;

		for (int64_t j = threadIdx.x; j < cn; j += blockDim.x) {
			int64_t p = c0 + j;
			const float *kj = kc + ((int64_t)table[p / block] * block + p % block) * row +
					  kvh * D;
			float dot = 0.0f;

			for (int64_t d = 0; d < D; d++)
				dot += qp[d] * kj[d];
			s[j] = scale * dot;
			cm = fmaxf(cm, s[j]);
		}
		cm = block_reduce(cm, red, true);
		nm = fmaxf(m, cm);
		alpha = expf(m - nm);          /* 0 on the first chunk (m = -inf) */
		for (int64_t j = threadIdx.x; j < cn; j += blockDim.x) {
			s[j] = expf(s[j] - nm);
			cs += s[j];
		}
		cs = block_reduce(cs, red, false);   /* its barriers make s[] visible */
		sum = sum * alpha + cs;
		acc *= alpha;
		if (threadIdx.x < D) {
			for (int64_t j = 0; j < cn; j++) {
				int64_t p = c0 + j;
				const float *vj = vc + ((int64_t)table[p / block] * block +
							p % block) * row + kvh * D;

				acc += s[j] * vj[threadIdx.x];
			}
		}
		m = nm;
		__syncthreads();               /* s[] is rewritten by the next chunk */
	}
	if (threadIdx.x < D)
		out[(t * H + h) * D + threadIdx.x] = acc / sum;
}

extern "C" int cuda_attention_paged(struct device *dev, float *out, const float *q,
				    const float *kcache, const float *vcache,
				    const int32_t *tables, const int32_t *table_off,
				    const int32_t *pos, int64_t T, int64_t H, int64_t KV,
				    int64_t D, int64_t block, float scale)
{
	int r = cuda_alive(dev);

	if (r)
		return r;
	if (T < 0 || H <= 0 || KV <= 0 || D <= 0 || D > KV_THREADS || H % KV || block <= 0 ||
	    T * H > INT32_MAX)
		return -EINVAL;
	if (T == 0)
		return 0;
	attention_paged_kernel<<<(unsigned int)(T * H), KV_THREADS, 0, cuda_stream(dev)>>>(
		out, q, kcache, vcache, tables, table_off, pos, H, KV, D, block, scale);
	return cuda_launched(dev);
}
