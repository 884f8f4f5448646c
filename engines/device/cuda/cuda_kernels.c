/* cuda_kernels.c — the CUDA device's kernel table (see device/device.h for
 * the contract of each entry and cuda_*.cu / cuda_gemm.c for the
 * implementations). */
#include "cuda_device.h"

const struct kernel_table cuda_kernel_table = {
	.gemm = cuda_gemm,
	.embedding_fwd = cuda_embedding_fwd,
	.embedding_bwd = cuda_embedding_bwd,
	.rmsnorm_fwd = cuda_rmsnorm_fwd,
	.rmsnorm_bwd = cuda_rmsnorm_bwd,
	.rope = cuda_rope,
	.attention_fwd = cuda_attention_fwd,
	.attention_bwd = cuda_attention_bwd,
	.swiglu_fwd = cuda_swiglu_fwd,
	.swiglu_bwd = cuda_swiglu_bwd,
	.bias_add = cuda_bias_add,
	.bias_bwd = cuda_bias_bwd,
	.axpby = cuda_axpby,
	.logprob_fwd = cuda_logprob_fwd,
	.logprob_bwd = cuda_logprob_bwd,
	.logprob_chunk_fwd = cuda_logprob_chunk_fwd,
	.logprob_chunk_finish = cuda_logprob_chunk_finish,
	.logprob_chunk_bwd = cuda_logprob_chunk_bwd,
	.sumsq = cuda_sumsq,
	.all_finite = cuda_all_finite,
	.adamw = cuda_adamw,
	.to_bf16 = cuda_to_bf16,
	.to_f16 = cuda_to_f16,
};
