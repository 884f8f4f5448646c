/* cuda_embedding.cu — the embedding backward on the GPU, deterministic:
 * dwte[V, C] += scatter of dout[T, C] by ids[T].
 *
 * Without atomics: the pairs (id, position) are packed into 64-bit keys
 * id << 32 | t — unique, so any correct sort orders them the same way —
 * and sorted by a bitonic sort (shared-memory stages for spans up to
 * SORT_TILE, global passes above). Then one block per run of equal ids sums
 * the run's dout rows in ascending position and adds the sum to its dwte
 * row. Each dwte row is written by exactly one block, and the order of
 * every sum depends only on ids, so the bits are the same run after run.
 * (The CPU device adds the rows into dwte one at a time; the roundings
 * differ, the values agree to fp32 accuracy.)
 *
 * CUB's radix sort would do, but its headers pull <iostream>, whose static
 * initializer needs libstdc++ in every binary linking the engine; a bitonic
 * sort of at most a few hundred thousand keys per micro-batch costs tens of
 * microseconds.
 *
 * ids outside [0, V) are skipped (the caller checks them; device.h).
 */
#include "cuda_common.cuh"

#define SORT_TILE 1024            /* keys per block in the shared stages */
#define EMB_THREADS 256

/* keys[i] = ids[i] << 32 | i for i < T, all ones (sorts last) up to N. */
__global__ void pack_kernel(uint64_t *keys, const int32_t *ids, int64_t T, int64_t N)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N;
	     i += (int64_t)gridDim.x * blockDim.x)
		keys[i] = i < T ? ((uint64_t)(uint32_t)ids[i] << 32) | (uint64_t)i : ~0ull;
}

__device__ __forceinline__ void cmp_swap(uint64_t *a, uint64_t *b, bool up)
{
	uint64_t x = *a, y = *b;

	if ((x > y) == up) {
		*a = y;
		*b = x;
	}
}

/* Stages k = k_lo .. SORT_TILE (all j < k) inside each tile of SORT_TILE
 * keys (or the whole array when it is shorter); with k_lo = 0 the tile is
 * sorted from scratch, else only merged for stage k_lo (j < SORT_TILE).
 * Directions follow the global index, so tiles compose into the global
 * network. */
__global__ void sort_tile_kernel(uint64_t *keys, int64_t N, int64_t k_merge)
{
	__shared__ uint64_t s[SORT_TILE];
	int64_t base = blockIdx.x * (int64_t)SORT_TILE;
	int n = (int)(N - base < SORT_TILE ? N - base : SORT_TILE);

	for (int i = threadIdx.x; i < n; i += blockDim.x)
		s[i] = keys[base + i];
	__syncthreads();
	for (int64_t k = k_merge ? k_merge : 2; k <= (k_merge ? k_merge : n); k <<= 1) {
		for (int64_t j = (k_merge ? (n >> 1) : (k >> 1)); j > 0; j >>= 1) {
			for (int i = threadIdx.x; i < n; i += blockDim.x) {
				int p = i ^ (int)j;

				if (p > i)
					cmp_swap(&s[i], &s[p], ((base + i) & k) == 0);
			}
			__syncthreads();
		}
	}
	for (int i = threadIdx.x; i < n; i += blockDim.x)
		keys[base + i] = s[i];
}

/* One compare-exchange step (k, j) with j >= SORT_TILE over the array. */
__global__ void sort_global_kernel(uint64_t *keys, int64_t N, int64_t k, int64_t j)
{
	for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < N;
	     i += (int64_t)gridDim.x * blockDim.x) {
		int64_t p = i ^ j;

		if (p > i)
			cmp_swap(&keys[i], &keys[p], (i & k) == 0);
	}
}

/* Block b handles sorted position b when it starts a run of equal ids. */
__global__ void embedding_runs_kernel(float *dwte, const float *dout, const uint64_t *keys,
				      int64_t T, int64_t C, int64_t V, int64_t skip)
{
	int64_t b = blockIdx.x, e;
	uint32_t id = (uint32_t)(keys[b] >> 32);

	if ((b > 0 && (uint32_t)(keys[b - 1] >> 32) == id) || (int64_t)id >= V ||
	    (int64_t)id == skip)
		return;
	for (e = b + 1; e < T && (uint32_t)(keys[e] >> 32) == id; e++)
		;
	for (int64_t c = threadIdx.x; c < C; c += blockDim.x) {
		float acc = 0.0f;

		for (int64_t i = b; i < e; i++)
			acc += dout[(int64_t)(uint32_t)keys[i] * C + c];
		dwte[(int64_t)id * C + c] += acc;
	}
}

extern "C" int cuda_embedding_bwd(struct device *dev, float *dwte, const float *dout,
				  const int32_t *ids, int64_t T, int64_t C, int64_t V,
				  int64_t skip)
{
	cudaStream_t s = cuda_stream(dev);
	uint64_t *keys;
	int64_t N = 1, tiles;
	int r = cuda_alive(dev);

	if (r)
		return r;
	if (T < 0 || C < 0 || V < 0 || T > INT32_MAX)
		return -EINVAL;
	if (T == 0 || C == 0)
		return 0;
	while (N < T)
		N <<= 1;
	keys = (uint64_t *)cuda_scratch(dev, CUDA_SCRATCH_SORT, (size_t)N * sizeof(uint64_t));
	if (!keys)
		return -ENOMEM;
	tiles = (N + SORT_TILE - 1) / SORT_TILE;
	pack_kernel<<<ew_blocks(dev, N), EW_THREADS, 0, s>>>(keys, ids, T, N);
	sort_tile_kernel<<<(unsigned int)tiles, SORT_TILE / 2, 0, s>>>(keys, N, 0);
	for (int64_t k = 2 * SORT_TILE; k <= N; k <<= 1) {
		for (int64_t j = k >> 1; j >= SORT_TILE; j >>= 1)
			sort_global_kernel<<<ew_blocks(dev, N), EW_THREADS, 0, s>>>(keys, N, k, j);
		sort_tile_kernel<<<(unsigned int)tiles, SORT_TILE / 2, 0, s>>>(keys, N, k);
	}
	embedding_runs_kernel<<<(unsigned int)T, EMB_THREADS, 0, s>>>(dwte, dout, keys, T, C, V,
								      skip);
	return cuda_launched(dev);
}
