/* st_mini.h — just enough safetensors for enginectl: write a file from
 * whole tensors (pull-weights) and find one tensor's bytes in a file (the
 * demo's check against a checkpoint). */
#ifndef ENGINED_CLIENT_ST_MINI_H
#define ENGINED_CLIENT_ST_MINI_H

#include <stddef.h>
#include <stdint.h>

struct stm_tensor {
	char *name;            /* owned */
	const char *dtype;     /* "F32", "BF16", "F16" */
	int ndim;
	int64_t shape[8];
	uint8_t *data;         /* owned */
	size_t nbytes;
};

/* Write tensors[0..n) to path (header in the given order). 0 or -errno. */
int stm_write(const char *path, const struct stm_tensor *t, size_t n);

struct stm_file;
/* Open and parse the header; 0 or -errno (-EBADMSG for a bad header). */
int stm_open(const char *path, struct stm_file **ret);
void stm_close(struct stm_file *f);
/* Read tensor `name`: its dtype name and bytes (*ret_data malloc'ed).
 * -ENOENT when absent. */
int stm_read(struct stm_file *f, const char *name, char *ret_dtype, size_t dtype_len,
	     uint8_t **ret_data, size_t *ret_len);

#endif
