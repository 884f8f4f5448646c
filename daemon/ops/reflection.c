/* reflection.c — gRPC server reflection (grpc.reflection.v1alpha and v1
 * ServerReflectionInfo), answered from the FileDescriptorSet that protoc
 * made at build time (engined.protoset, compiled in by bin2c), so that
 * grpcurl-style tools and grpcio's reflection client build stubs without
 * the .proto files.
 *
 * At start the set is indexed: each FileDescriptorProto's bytes (slices of
 * the embedded array, never copied), its name, dependencies and the
 * fully-qualified symbols it defines (messages and enums, nested ones too,
 * services and their methods). The wire format is read here directly: the
 * few fields needed do not justify compiling descriptor.proto.
 *
 * A call is a bidi stream: each request gets one response, in order
 * (rpc_recv_next delivers the next request once the previous response is
 * out). Everything runs on poller threads and never waits.
 */
#include "reflection.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "reflection.pb-c.h"
#include "wire_check.h"

extern const unsigned char engined_descriptor_set[];
extern const size_t engined_descriptor_set_len;

#define MAX_DEPS 16

struct refl_file {
	const uint8_t *data;      /* FileDescriptorProto bytes (static) */
	size_t len;
	char *name;               /* "engined/v1/engine.proto" */
	int deps[MAX_DEPS];       /* indices of its dependencies */
	int n_deps;
};

struct refl_symbol {
	char *name;               /* "engined.v1.TrainingEngine.GetStatus" */
	int file;
	bool is_message;          /* for all_extension_numbers_of_type */
};

struct reflection {
	struct refl_file *files;
	int n_files;
	struct refl_symbol *syms;
	int n_syms, cap_syms;
	char **services;          /* fully-qualified, the ones the daemon serves */
	int n_services;
};

/* --- a minimal protobuf wire reader --------------------------------------- */

struct rd {
	const uint8_t *p, *end;
};

static int rd_varint(struct rd *r, uint64_t *v)
{
	uint64_t x = 0;

	for (int shift = 0; shift < 64; shift += 7) {
		if (r->p >= r->end)
			return -EBADMSG;
		x |= (uint64_t)(*r->p & 0x7f) << shift;
		if (!(*r->p++ & 0x80)) {
			*v = x;
			return 0;
		}
	}
	return -EBADMSG;
}

/* Next field: number, wire type, and for length-delimited ones the bytes. */
static int rd_field(struct rd *r, uint32_t *num, int *wt, const uint8_t **data, size_t *len)
{
	uint64_t key, v;

	if (rd_varint(r, &key) < 0)
		return -EBADMSG;
	*num = (uint32_t)(key >> 3);
	*wt = (int)(key & 7);
	switch (*wt) {
	case 0:
		return rd_varint(r, &v);
	case 1:
		if (r->end - r->p < 8)
			return -EBADMSG;
		r->p += 8;
		return 0;
	case 2:
		if (rd_varint(r, &v) < 0 || v > (uint64_t)(r->end - r->p))
			return -EBADMSG;
		*data = r->p;
		*len = (size_t)v;
		r->p += v;
		return 0;
	case 5:
		if (r->end - r->p < 4)
			return -EBADMSG;
		r->p += 4;
		return 0;
	default:
		return -EBADMSG;
	}
}

static char *join(const char *prefix, const uint8_t *name, size_t len)
{
	size_t pl = strlen(prefix);
	char *s = malloc(pl + len + 2);

	if (!s)
		return NULL;
	memcpy(s, prefix, pl);
	if (pl)
		s[pl++] = '.';
	memcpy(s + pl, name, len);
	s[pl + len] = '\0';
	return s;
}

static int add_symbol(struct reflection *rf, char *name, int file, bool is_message)
{
	if (!name)
		return -ENOMEM;
	if (rf->n_syms == rf->cap_syms) {
		int cap = rf->cap_syms ? rf->cap_syms * 2 : 64;
		struct refl_symbol *v = realloc(rf->syms, (size_t)cap * sizeof(*v));

		if (!v) {
			free(name);
			return -ENOMEM;
		}
		rf->syms = v;
		rf->cap_syms = cap;
	}
	rf->syms[rf->n_syms++] = (struct refl_symbol){ name, file, is_message };
	return 0;
}

/* Name (field 1) of a DescriptorProto / EnumDescriptorProto / ... */
static int msg_name(const uint8_t *p, size_t len, const uint8_t **name, size_t *nlen)
{
	struct rd r = { p, p + len };
	const uint8_t *d;
	size_t l;
	uint32_t num;
	int wt;

	*name = NULL;
	while (r.p < r.end) {
		if (rd_field(&r, &num, &wt, &d, &l) < 0)
			return -EBADMSG;
		if (num == 1 && wt == 2) {
			*name = d;
			*nlen = l;
		}
	}
	return *name ? 0 : -EBADMSG;
}

/* A DescriptorProto (message) and what it nests: nested_type = 3,
 * enum_type = 4. */
static int index_message(struct reflection *rf, const char *scope, const uint8_t *p,
			 size_t len, int file)
{
	struct rd r = { p, p + len };
	const uint8_t *d, *name;
	size_t l, nlen;
	uint32_t num;
	char *full;
	int wt, e;

	if (msg_name(p, len, &name, &nlen) < 0)
		return -EBADMSG;
	full = join(scope, name, nlen);
	if (!full)
		return -ENOMEM;
	while (r.p < r.end) {
		if (rd_field(&r, &num, &wt, &d, &l) < 0) {
			free(full);
			return -EBADMSG;
		}
		if (wt != 2)
			continue;
		if (num == 3)
			e = index_message(rf, full, d, l, file);
		else if (num == 4)
			e = msg_name(d, l, &name, &nlen) < 0 ? -EBADMSG :
			    add_symbol(rf, join(full, name, nlen), file, false);
		else
			e = 0;
		if (e < 0) {
			free(full);
			return e;
		}
	}
	return add_symbol(rf, full, file, true);
}

/* A ServiceDescriptorProto: the service and each method (field 2). */
static int index_service(struct reflection *rf, const char *pkg, const uint8_t *p,
			 size_t len, int file)
{
	struct rd r = { p, p + len };
	const uint8_t *d, *name;
	size_t l, nlen;
	uint32_t num;
	char *full;
	int wt, e;

	if (msg_name(p, len, &name, &nlen) < 0)
		return -EBADMSG;
	full = join(pkg, name, nlen);
	if (!full)
		return -ENOMEM;
	while (r.p < r.end) {
		if (rd_field(&r, &num, &wt, &d, &l) < 0) {
			free(full);
			return -EBADMSG;
		}
		if (num != 2 || wt != 2)
			continue;
		e = msg_name(d, l, &name, &nlen) < 0 ? -EBADMSG :
		    add_symbol(rf, join(full, name, nlen), file, false);
		if (e < 0) {
			free(full);
			return e;
		}
	}
	return add_symbol(rf, full, file, false);
}

static int find_file(const struct reflection *rf, const char *name, size_t len)
{
	for (int i = 0; i < rf->n_files; i++)
		if (strlen(rf->files[i].name) == len && !memcmp(rf->files[i].name, name, len))
			return i;
	return -1;
}

/* FileDescriptorProto: name = 1, package = 2, dependency = 3,
 * message_type = 4, enum_type = 5, service = 6. */
static int index_file(struct reflection *rf, int fi)
{
	struct refl_file *f = &rf->files[fi];
	struct rd r = { f->data, f->data + f->len };
	const uint8_t *d;
	char pkg[256] = "";
	size_t l;
	uint32_t num;
	int wt, e = 0;

	/* The package first: symbols are qualified by it. */
	while (r.p < r.end) {
		if (rd_field(&r, &num, &wt, &d, &l) < 0)
			return -EBADMSG;
		if (wt != 2)
			continue;
		if (num == 1) {
			f->name = strndup((const char *)d, l);
			if (!f->name)
				return -ENOMEM;
		} else if (num == 2 && l < sizeof(pkg)) {
			memcpy(pkg, d, l);
			pkg[l] = '\0';
		}
	}
	if (!f->name)
		return -EBADMSG;
	r.p = f->data;
	while (r.p < r.end && e == 0) {
		const uint8_t *name;
		size_t nlen;

		if (rd_field(&r, &num, &wt, &d, &l) < 0)
			return -EBADMSG;
		if (wt != 2)
			continue;
		if (num == 3) {
			/* Dependencies come earlier in the set (protoc orders
			 * --include_imports that way). */
			int dep = find_file(rf, (const char *)d, l);

			if (dep < 0 || f->n_deps == MAX_DEPS)
				return -EBADMSG;
			f->deps[f->n_deps++] = dep;
		} else if (num == 4) {
			e = index_message(rf, pkg, d, l, fi);
		} else if (num == 5) {
			e = msg_name(d, l, &name, &nlen) < 0 ? -EBADMSG :
			    add_symbol(rf, join(pkg, name, nlen), fi, false);
		} else if (num == 6) {
			e = index_service(rf, pkg, d, l, fi);
		}
	}
	return e;
}

void reflection_free(struct reflection *rf)
{
	if (!rf)
		return;
	for (int i = 0; i < rf->n_files; i++)
		free(rf->files[i].name);
	for (int i = 0; i < rf->n_syms; i++)
		free(rf->syms[i].name);
	free(rf->files);
	free(rf->syms);
	free(rf->services);
	free(rf);
}

int reflection_new(const char *const *paths, int n_paths, struct reflection **ret,
		   struct eng_error *err)
{
	struct reflection *rf = calloc(1, sizeof(*rf));
	struct rd r = { engined_descriptor_set,
			engined_descriptor_set + engined_descriptor_set_len };
	const uint8_t *data;
	size_t len;
	uint32_t num;
	int wt, e = 0;

	if (!rf)
		return -ENOMEM;
	/* FileDescriptorSet: repeated FileDescriptorProto file = 1. */
	while (r.p < r.end) {
		struct refl_file *v;

		if (rd_field(&r, &num, &wt, &data, &len) < 0) {
			e = -EBADMSG;
			break;
		}
		if (num != 1 || wt != 2)
			continue;
		v = realloc(rf->files, (size_t)(rf->n_files + 1) * sizeof(*v));
		if (!v) {
			e = -ENOMEM;
			break;
		}
		rf->files = v;
		memset(&v[rf->n_files], 0, sizeof(*v));
		v[rf->n_files].data = data;
		v[rf->n_files].len = len;
		rf->n_files++;
		e = index_file(rf, rf->n_files - 1);
		if (e < 0)
			break;
	}
	/* The services listed: every service of the method paths served (the
	 * daemon passes its method table's, so the list cannot drift). */
	rf->services = calloc((size_t)n_paths, sizeof(char *));
	if (e == 0 && !rf->services)
		e = -ENOMEM;
	for (int i = 0; e == 0 && i < n_paths; i++) {
		const char *path = paths[i] + 1;  /* skip '/' */
		const char *slash = strchr(path, '/');
		bool seen = false;

		for (int k = 0; k < rf->n_services; k++)
			seen |= strlen(rf->services[k]) == (size_t)(slash - path) &&
				!strncmp(rf->services[k], path, (size_t)(slash - path));
		if (seen)
			continue;
		for (int k = 0; k < rf->n_syms; k++) {
			if (strlen(rf->syms[k].name) == (size_t)(slash - path) &&
			    !strncmp(rf->syms[k].name, path, (size_t)(slash - path))) {
				rf->services[rf->n_services++] = rf->syms[k].name;
				seen = true;
				break;
			}
		}
		if (!seen) {
			eng_fail(err, -EBADMSG, "service of %s is not in the descriptor set",
				 paths[i]);
			e = -EBADMSG;
		}
	}
	if (e < 0) {
		if (!err->msg[0])
			eng_fail(err, e, "the embedded descriptor set cannot be read");
		reflection_free(rf);
		return e;
	}
	*ret = rf;
	log_msg(LOG_LVL_DEBUG, "reflection: %d files, %d symbols, %d services", rf->n_files,
		rf->n_syms, rf->n_services);
	return 0;
}

/* --- the stream ------------------------------------------------------------ */

struct refl_call {
	const struct reflection *rf;
	struct metrics *metrics;
	const struct method *m;
	char identity[AUTH_NAME_MAX + 300];
	int64_t requests;
};

/* The file and its dependencies, each once (the file first). */
static void collect(const struct reflection *rf, int fi, bool *seen, int *order, int *n)
{
	if (seen[fi])
		return;
	seen[fi] = true;
	order[(*n)++] = fi;
	for (int i = 0; i < rf->files[fi].n_deps; i++)
		collect(rf, rf->files[fi].deps[i], seen, order, n);
}

static const struct refl_symbol *find_symbol(const struct reflection *rf, const char *name)
{
	for (int i = 0; i < rf->n_syms; i++)
		if (!strcmp(rf->syms[i].name, name))
			return &rf->syms[i];
	return NULL;
}

/* Build the packed answer to one request; *ret malloc'ed. */
static int answer(const struct reflection *rf, const Grpc__Reflection__V1__ServerReflectionRequest *q,
		  uint8_t **ret, size_t *ret_len)
{
	Grpc__Reflection__V1__ServerReflectionResponse resp =
		GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__INIT;
	Grpc__Reflection__V1__FileDescriptorResponse fdr =
		GRPC__REFLECTION__V1__FILE_DESCRIPTOR_RESPONSE__INIT;
	Grpc__Reflection__V1__ListServiceResponse lsr =
		GRPC__REFLECTION__V1__LIST_SERVICE_RESPONSE__INIT;
	Grpc__Reflection__V1__ExtensionNumberResponse enr =
		GRPC__REFLECTION__V1__EXTENSION_NUMBER_RESPONSE__INIT;
	Grpc__Reflection__V1__ErrorResponse er = GRPC__REFLECTION__V1__ERROR_RESPONSE__INIT;
	Grpc__Reflection__V1__ServiceResponse svc[16], *svcp[16];
	ProtobufCBinaryData blobs[64];
	bool seen[64];
	int order[64], n = 0, fi = -1;
	char msg[300];
	const struct refl_symbol *sym;
	size_t len;
	uint8_t *buf;

	if (rf->n_files > 64)
		return -E2BIG;
	resp.valid_host = q->host;
	resp.original_request = (Grpc__Reflection__V1__ServerReflectionRequest *)q;
	switch (q->message_request_case) {
	case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_BY_FILENAME:
		fi = find_file(rf, q->file_by_filename, strlen(q->file_by_filename));
		if (fi < 0)
			snprintf(msg, sizeof(msg), "file not found: %.200s", q->file_by_filename);
		break;
	case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_SYMBOL:
		sym = find_symbol(rf, q->file_containing_symbol);
		fi = sym ? sym->file : -1;
		if (fi < 0)
			snprintf(msg, sizeof(msg), "symbol not found: %.200s",
				 q->file_containing_symbol);
		break;
	case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_FILE_CONTAINING_EXTENSION:
		/* None of the served protos declares an extension. */
		snprintf(msg, sizeof(msg), "extension not found: %.200s %d",
			 q->file_containing_extension ? q->file_containing_extension->containing_type : "",
			 q->file_containing_extension ? q->file_containing_extension->extension_number : 0);
		break;
	case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_ALL_EXTENSION_NUMBERS_OF_TYPE:
		sym = find_symbol(rf, q->all_extension_numbers_of_type);
		if (sym && sym->is_message) {
			enr.base_type_name = q->all_extension_numbers_of_type;
			resp.message_response_case =
				GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ALL_EXTENSION_NUMBERS_RESPONSE;
			resp.all_extension_numbers_response = &enr;
			goto pack;
		}
		snprintf(msg, sizeof(msg), "type not found: %.200s",
			 q->all_extension_numbers_of_type);
		break;
	case GRPC__REFLECTION__V1__SERVER_REFLECTION_REQUEST__MESSAGE_REQUEST_LIST_SERVICES:
		for (int i = 0; i < rf->n_services && i < 16; i++) {
			grpc__reflection__v1__service_response__init(&svc[i]);
			svc[i].name = rf->services[i];
			svcp[i] = &svc[i];
		}
		lsr.n_service = (size_t)(rf->n_services < 16 ? rf->n_services : 16);
		lsr.service = svcp;
		resp.message_response_case =
			GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_LIST_SERVICES_RESPONSE;
		resp.list_services_response = &lsr;
		goto pack;
	default:
		snprintf(msg, sizeof(msg), "no request set");
		er.error_code = RPC_INVALID_ARGUMENT;
		er.error_message = msg;
		resp.message_response_case =
			GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ERROR_RESPONSE;
		resp.error_response = &er;
		goto pack;
	}
	if (fi < 0) {
		er.error_code = RPC_NOT_FOUND;
		er.error_message = msg;
		resp.message_response_case =
			GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_ERROR_RESPONSE;
		resp.error_response = &er;
		goto pack;
	}
	memset(seen, 0, sizeof(seen));
	collect(rf, fi, seen, order, &n);
	for (int i = 0; i < n; i++) {
		blobs[i].data = (uint8_t *)rf->files[order[i]].data;
		blobs[i].len = rf->files[order[i]].len;
	}
	fdr.n_file_descriptor_proto = (size_t)n;
	fdr.file_descriptor_proto = blobs;
	resp.message_response_case =
		GRPC__REFLECTION__V1__SERVER_REFLECTION_RESPONSE__MESSAGE_RESPONSE_FILE_DESCRIPTOR_RESPONSE;
	resp.file_descriptor_response = &fdr;
pack:
	len = grpc__reflection__v1__server_reflection_response__get_packed_size(&resp);
	buf = malloc(len ? len : 1);
	if (!buf)
		return -ENOMEM;
	grpc__reflection__v1__server_reflection_response__pack(&resp, buf);
	*ret = buf;
	*ret_len = len;
	return 0;
}

int reflection_answer(const struct reflection *rf, const uint8_t *msg, size_t len,
		      uint8_t **ret, size_t *ret_len, struct eng_error *err)
{
	Grpc__Reflection__V1__ServerReflectionRequest *q;
	int r;

	if (wire_check_strings(&grpc__reflection__v1__server_reflection_request__descriptor, msg,
			       len, err) < 0)
		return -EINVAL;
	q = grpc__reflection__v1__server_reflection_request__unpack(NULL, len, msg);
	if (!q)
		return eng_fail(err, -EINVAL, "request: not a ServerReflectionRequest");
	r = answer(rf, q, ret, ret_len);
	grpc__reflection__v1__server_reflection_request__free_unpacked(q, NULL);
	return r;
}

static void release_buf(void *p)
{
	free(p);
}

/* End the stream with `code`, log it once, free the call's state. */
static void end_call(struct refl_call *rc, struct rpc_call *c, enum rpc_code code,
		     const char *msg)
{
	job_log_rpc(rc->metrics, c, rc->m, rc->identity, code, msg);
	rpc_reply_status(c, code, code == RPC_OK || code == RPC_CANCELLED ? NULL : msg);
	free(rc);
}

static void on_request(void *user, struct rpc_call *c, enum rpc_recv_result res,
		       const uint8_t *msg, size_t len)
{
	struct refl_call *rc = user;
	struct eng_error werr = { 0 };
	struct rpc_piece piece;
	uint8_t *out = NULL;
	size_t out_len = 0;
	int r;

	if (res == RPC_RECV_NO_MEMORY) {
		end_call(rc, c, RPC_RESOURCE_EXHAUSTED, "out of memory reading the request");
		return;
	}
	if (res != RPC_RECV_MESSAGE) {
		bool gone = res == RPC_RECV_GONE || rpc_call_cancelled(c);

		end_call(rc, c, gone ? RPC_CANCELLED : RPC_OK, gone ? "client went away" : NULL);
		return;
	}
	r = reflection_answer(rc->rf, msg, len, &out, &out_len, &werr);
	if (r == -EINVAL) {
		end_call(rc, c, RPC_INVALID_ARGUMENT, werr.msg);
		return;
	}
	rc->requests++;
	if (r < 0) {
		end_call(rc, c, RPC_RESOURCE_EXHAUSTED, "out of memory");
		return;
	}
	piece.data = out;
	piece.len = out_len;
	piece.release = release_buf;
	piece.user = out;
	/* A failed send (call over) shows as the end on the next receive. */
	(void)rpc_stream_send(c, &piece, 1);
	if (rpc_recv_next(c, on_request, rc) < 0)
		end_call(rc, c, RPC_INTERNAL, "reflection: cannot receive");
}

int reflection_serve(const struct reflection *rf, struct job *j, struct eng_error *err)
{
	struct refl_call *rc;
	struct rpc_call *call = j->call;

	if (!rf)
		return eng_fail(err, -ENOSYS, "reflection: not available");
	rc = calloc(1, sizeof(*rc));
	if (!rc)
		return -ENOMEM;
	rc->rf = rf;
	rc->metrics = j->metrics;
	rc->m = j->m;
	memcpy(rc->identity, j->identity, sizeof(rc->identity));
	job_release(j);
	if (rpc_recv_next(call, on_request, rc) < 0)
		end_call(rc, call, RPC_INTERNAL, "reflection: cannot receive");
	return 0;
}
