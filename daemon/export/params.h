/* params.h — the parameters as the weight exports see them: GetPerTensorParam's
 * stream (stream.c) and ShareWeights' shared memory (share.c). One place
 * for what both need: the dtypes a client may ask for, the tensors asked
 * for (by name or all, in order) looked up once, when to export the
 * engine's bf16 copy as it is, and reading a slice of one in the asked
 * dtype (fp32 host memory copied or converted with the
 * rounding of engines/io, anything else through engine_param_copy).
 *
 * Threads: params_collect and params_read of a set without host memory on
 * the engine thread (they call the engine); params_read of a host set and
 * params_convert from any thread while the job runs (the parameters cannot
 * change: the job is on the engine thread). Knows the engine library and
 * the proto's DType, nothing of the daemon.
 */
#ifndef ENGINED_DAEMON_PARAMS_H
#define ENGINED_DAEMON_PARAMS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine.h"
#include "engined/v1/engine.pb-c.h"
#include "err.h"

/* One tensor of an export. */
struct param_ref {
	int64_t index;                  /* engine parameter index */
	const char *name;               /* engine-owned, valid during the job */
	int ndim;
	int64_t shape[4];
	int64_t numel;
	int64_t bytes;                  /* numel * the set's element size */
	const float *host;              /* fp32 [numel], stable during the job;
					 * NULL: read through engine_param_copy */
	/* The tensor's bytes in the set's dtype, stable during the job, to be
	 * sent or copied as they are: `host` for FLOAT32, the engine's
	 * current bf16 copy for BFLOAT16 (engine_param_view.host_bf16, the
	 * same rounding as params_convert); NULL: converted or read through
	 * the engine. */
	const void *data;
};

/* The tensors asked for, in the order asked (all: engine order). */
struct param_set {
	Engined__V1__DType dtype;       /* FLOAT32, BFLOAT16 or FLOAT16 */
	enum engine_dtype edtype;
	size_t esz;                     /* bytes per element: 4 or 2 */
	bool on_host;                   /* every tensor has `host` */
	bool in_place;                  /* every tensor has `data` */
	struct param_ref *t;            /* [n] */
	int64_t n;
	int64_t total_bytes;            /* sum of t[i].bytes */
};

/* A request's dtype and names, before anything is queued: dtype one of
 * UNSPECIFIED (= FLOAT32), FLOAT32, BFLOAT16, FLOAT16; no empty name.
 * -EINVAL naming the field. */
int params_check_request(int dtype, char *const *names, size_t n_names,
			 struct eng_error *err);

/* Look the tensors up (engine thread). names NULL / n_names 0: all.
 * unique: a name given twice, or more names than parameters, is -EINVAL
 * (else a name given twice is exported twice). An unknown name is -ENOENT
 * naming it. Free with params_set_free. */
int params_collect(struct engine *e, int dtype, char *const *names, size_t n_names,
		   bool unique, struct param_set *ret, struct eng_error *err);
void params_set_free(struct param_set *s);

/* The engine's bf16 copy for the set (engine thread): when the set is
 * BFLOAT16 of host parameters making up at least half of the engine's
 * parameter elements (a smaller set is not worth a copy of all of them),
 * the copy is made current and kept (engine_keep_params_bf16) and every
 * tensor's `data` points into it (in_place). Returns 1 then; 0 when the
 * set is left as it was: by the rule, or because the engine keeps no such
 * copy (then *why holds its reason, else why->code is 0); < 0 on failure
 * (err). `lend`: lend the copy as well (engine_lend_params_bf16,
 * ShareWeights), *ret_file the lent file (the caller's when 1). */
int params_use_bf16_copy(struct engine *e, struct param_set *s, bool lend,
			 struct engine_lent_file *ret_file, struct eng_error *why,
			 struct eng_error *err);

/* Elements [start, start + count) of t in the set's dtype into dst
 * (count * esz bytes): `data` copied, other host tensors converted here,
 * the rest by the engine's device (engine thread only). */
int params_read(struct engine *e, const struct param_set *s, const struct param_ref *t,
		int64_t start, int64_t count, void *dst, struct eng_error *err);

/* The ranks' agreement before an export's first gather (engine thread):
 * where the base engine's group shards its parameters (dist.zero_stage 3)
 * and the export reads them (the base, or an adapter's BASE or MERGED
 * view: an adapter's own tensors are whole on every rank, so its ADAPTER
 * view gathers nothing and one rank may export it alone), every rank makes
 * the call, so every rank comes here, also after a local failure (a rank
 * must not wait in a gather for a peer that gave up), and gets every
 * rank's code (engine_group_agree). The rule reads the request alone, so
 * that every rank decides alike. Any other export: rc. */
int params_export_agree(struct engine *base, const char *adapter, int adapter_view, int rc,
			const char *what, struct eng_error *err);

/* A rank taking part in another rank's export of the set (the requests'
 * gather_only; engine thread): each tensor read in turn, one element of it,
 * which makes an engine that holds a slice of the parameters (ZeRO-3)
 * gather the whole tensor with the other ranks; nothing is kept. */
int params_take_part(struct engine *e, const struct param_set *s, struct eng_error *err);

/* fp32 [n] -> bf16 / f16 [n], rounded to nearest even as the engine's own
 * kernels and the checkpoint writer do (engines/io). */
void params_convert(enum engine_dtype dt, const float *src, uint16_t *dst, int64_t n);

#endif
