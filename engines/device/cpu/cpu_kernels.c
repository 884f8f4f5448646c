/* cpu_kernels.c — the CPU device's kernel table (see device/device.h for
 * the contract of each entry and cpu_*.c for the implementations). */
#include "cpu_device.h"

const struct kernel_table cpu_kernel_table = {
	.gemm = cpu_gemm,
	.embedding_fwd = cpu_embedding_fwd,
	.embedding_bwd = cpu_embedding_bwd,
	.rmsnorm_fwd = cpu_rmsnorm_fwd,
	.rmsnorm_bwd = cpu_rmsnorm_bwd,
	.rope = cpu_rope,
	.attention_fwd = cpu_attention_fwd,
	.attention_bwd = cpu_attention_bwd,
	.swiglu_fwd = cpu_swiglu_fwd,
	.swiglu_bwd = cpu_swiglu_bwd,
	.bias_add = cpu_bias_add,
	.bias_bwd = cpu_bias_bwd,
	.axpby = cpu_axpby,
	.logprob_fwd = cpu_logprob_fwd,
	.logprob_bwd = cpu_logprob_bwd,
	.logprob_chunk_fwd = cpu_logprob_chunk_fwd,
	.logprob_chunk_finish = cpu_logprob_chunk_finish,
	.logprob_chunk_bwd = cpu_logprob_chunk_bwd,
	.sumsq = cpu_sumsq,
	.all_finite = cpu_all_finite,
	.adamw = cpu_adamw,
	.to_bf16 = cpu_to_bf16,
	.to_f16 = cpu_to_f16,
};
