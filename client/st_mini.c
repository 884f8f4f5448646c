/* st_mini.c — minimal safetensors writer and reader (see st_mini.h). */
#include "st_mini.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

struct stm_file {
	FILE *f;
	json_t *header;
	uint64_t data_start;
};

int stm_write(const char *path, const struct stm_tensor *t, size_t n)
{
	json_t *h = json_object();
	char *text;
	size_t hlen, pad;
	uint64_t off = 0, le;
	FILE *f;
	int r = 0;

	if (!h)
		return -ENOMEM;
	for (size_t i = 0; i < n; i++) {
		json_t *e = json_object(), *shape = json_array(), *offs = json_array();

		for (int k = 0; k < t[i].ndim; k++)
			json_array_append_new(shape, json_integer(t[i].shape[k]));
		json_array_append_new(offs, json_integer((json_int_t)off));
		json_array_append_new(offs, json_integer((json_int_t)(off + t[i].nbytes)));
		json_object_set_new(e, "dtype", json_string(t[i].dtype));
		json_object_set_new(e, "shape", shape);
		json_object_set_new(e, "data_offsets", offs);
		json_object_set_new(h, t[i].name, e);
		off += t[i].nbytes;
	}
	text = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(h);
	if (!text)
		return -ENOMEM;
	hlen = strlen(text);
	pad = (8 - hlen % 8) % 8;
	f = fopen(path, "wb");
	if (!f) {
		r = -errno;
		free(text);
		return r;
	}
	le = (uint64_t)(hlen + pad);
	if (fwrite(&le, 8, 1, f) != 1 || fwrite(text, 1, hlen, f) != hlen)
		r = -EIO;
	for (size_t i = 0; i < pad && !r; i++)
		if (fputc(' ', f) == EOF)
			r = -EIO;
	for (size_t i = 0; i < n && !r; i++)
		if (t[i].nbytes && fwrite(t[i].data, 1, t[i].nbytes, f) != t[i].nbytes)
			r = -EIO;
	if (fclose(f) != 0 && !r)
		r = -EIO;
	free(text);
	return r;
}

int stm_open(const char *path, struct stm_file **ret)
{
	struct stm_file *sf;
	uint64_t hlen;
	char *text;
	FILE *f = fopen(path, "rb");

	if (!f)
		return -errno;
	if (fread(&hlen, 8, 1, f) != 1 || hlen > (100u << 20)) {
		fclose(f);
		return -EBADMSG;
	}
	text = malloc(hlen + 1);
	if (!text || fread(text, 1, hlen, f) != hlen) {
		free(text);
		fclose(f);
		return text ? -EBADMSG : -ENOMEM;
	}
	text[hlen] = '\0';
	sf = calloc(1, sizeof(*sf));
	if (!sf) {
		free(text);
		fclose(f);
		return -ENOMEM;
	}
	sf->header = json_loads(text, 0, NULL);
	free(text);
	if (!sf->header || !json_is_object(sf->header)) {
		json_decref(sf->header);
		free(sf);
		fclose(f);
		return -EBADMSG;
	}
	sf->f = f;
	sf->data_start = 8 + hlen;
	*ret = sf;
	return 0;
}

void stm_close(struct stm_file *f)
{
	if (!f)
		return;
	json_decref(f->header);
	fclose(f->f);
	free(f);
}

int stm_read(struct stm_file *f, const char *name, char *ret_dtype, size_t dtype_len,
	     uint8_t **ret_data, size_t *ret_len)
{
	json_t *e = json_object_get(f->header, name), *offs;
	json_int_t b, en;
	uint8_t *buf;

	if (!e)
		return -ENOENT;
	offs = json_object_get(e, "data_offsets");
	if (!json_is_array(offs) || json_array_size(offs) != 2 ||
	    !json_is_string(json_object_get(e, "dtype")))
		return -EBADMSG;
	b = json_integer_value(json_array_get(offs, 0));
	en = json_integer_value(json_array_get(offs, 1));
	if (b < 0 || en < b)
		return -EBADMSG;
	buf = malloc(en > b ? (size_t)(en - b) : 1);
	if (!buf)
		return -ENOMEM;
	if (fseeko(f->f, (off_t)(f->data_start + (uint64_t)b), SEEK_SET) != 0 ||
	    fread(buf, 1, (size_t)(en - b), f->f) != (size_t)(en - b)) {
		free(buf);
		return -EIO;
	}
	snprintf(ret_dtype, dtype_len, "%s", json_string_value(json_object_get(e, "dtype")));
	*ret_data = buf;
	*ret_len = (size_t)(en - b);
	return 0;
}
