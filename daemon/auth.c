/* auth.c — bearer tokens (see auth.h). */
#include "auth.h"

#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "engine.h"

#define TOKEN_MIN 16
#define TOKEN_MAX 1024

struct token {
	char name[AUTH_NAME_MAX];
	char *secret;      /* owned */
	size_t len;
	enum auth_level level;
	char adapters[AUTH_ADAPTERS_MAX];  /* "" = not limited */
};

struct auth_tokens {
	struct token *v;
	int n;
};

void auth_tokens_free(struct auth_tokens *t)
{
	if (!t)
		return;
	for (int i = 0; i < t->n; i++) {
		/* Do not leave secrets in freed memory. */
		explicit_bzero(t->v[i].secret, t->v[i].len);
		free(t->v[i].secret);
	}
	free(t->v);
	free(t);
}

int auth_tokens_count(const struct auth_tokens *t)
{
	return t ? t->n : 0;
}

static bool name_ok(const char *s, size_t n)
{
	if (n == 0 || n >= AUTH_NAME_MAX)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!isalnum((unsigned char)s[i]) && s[i] != '_' && s[i] != '.' && s[i] != '-')
			return false;
	return true;
}

static bool secret_ok(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!isgraph((unsigned char)s[i]) || s[i] == ':')
			return false;
	return true;
}

/* Constant time in la (the presented length); no early exit. */
static bool ct_equal(const char *a, size_t la, const char *b, size_t lb)
{
	volatile unsigned char d = 0;

	for (size_t i = 0; i < la; i++)
		d |= (unsigned char)a[i] ^ (unsigned char)b[lb ? i % lb : 0];
	return (d == 0) & (la == lb) & (lb > 0);
}

/* adapters=A,B: each an adapter name (engine.h's characters and length),
 * none empty. */
static int parse_adapters(const char *v, int lineno, const char *path, struct token *t,
			  struct eng_error *err)
{
	size_t len = strlen(v);

	if (len == 0 || len >= sizeof(t->adapters))
		return eng_fail(err, -EINVAL, "%s:%d: adapters= takes 1 to %d characters",
				path, lineno, AUTH_ADAPTERS_MAX - 1);
	for (const char *p = v; *p;) {
		size_t n = strcspn(p, ",");

		if (n == 0 || n > ENGINE_ADAPTER_NAME_MAX || !name_ok(p, n) || p[0] == '.')
			return eng_fail(err, -EINVAL,
					"%s:%d: adapters=: '%.*s' is not an adapter name (1-%d "
					"characters of [A-Za-z0-9_.-], not starting with '.')",
					path, lineno, (int)n, p, ENGINE_ADAPTER_NAME_MAX);
		p += n;
		if (*p == ',' && !*++p)
			return eng_fail(err, -EINVAL, "%s:%d: adapters=: ends with ','",
					path, lineno);
	}
	memcpy(t->adapters, v, len + 1);
	return 0;
}

static int parse_line(char *line, int lineno, const char *path, struct token *t,
		      struct eng_error *err)
{
	char *f[3], *save = NULL, *p, *colon;
	int n = 0, r;

	for (p = strtok_r(line, " \t\r\n", &save); p; p = strtok_r(NULL, " \t\r\n", &save)) {
		if (n == 3)  /* a further field must never be skipped: it could hide a scope */
			return eng_fail(err, -EINVAL, "%s:%d: too many fields (expected [NAME:]TOKEN "
					"[full|read-only] [adapters=A,B])", path, lineno);
		f[n++] = p;
	}
	if (n == 0)
		return 0;  /* blank */
	/* At most one scope: a third field is adapters=. */
	if (n == 3 && strncmp(f[1], "adapters=", 9) && strncmp(f[2], "adapters=", 9))
		return eng_fail(err, -EINVAL, "%s:%d: too many fields (expected "
				"[NAME:]TOKEN [full|read-only] [adapters=A,B])", path, lineno);
	memset(t, 0, sizeof(*t));
	t->level = AUTH_FULL;
	for (int i = 1; i < n; i++) {
		if (!strncmp(f[i], "adapters=", 9)) {
			if (t->adapters[0])
				return eng_fail(err, -EINVAL, "%s:%d: adapters= given twice",
						path, lineno);
			r = parse_adapters(f[i] + 9, lineno, path, t, err);
			if (r < 0)
				return r;
			continue;
		}
		if (!strcmp(f[i], "full"))
			t->level = AUTH_FULL;
		else if (!strcmp(f[i], "read-only"))
			t->level = AUTH_READ;
		else
			return eng_fail(err, -EINVAL,
					"%s:%d: scope '%s' is not full or read-only", path, lineno,
					f[i]);
	}
	colon = strchr(f[0], ':');
	if (colon) {
		if (!name_ok(f[0], (size_t)(colon - f[0])))
			return eng_fail(err, -EINVAL,
					"%s:%d: token name must be 1-%d characters of [A-Za-z0-9_.-]",
					path, lineno, AUTH_NAME_MAX - 1);
		memcpy(t->name, f[0], (size_t)(colon - f[0]));
		p = colon + 1;
	} else {
		snprintf(t->name, sizeof(t->name), "line-%d", lineno);
		p = f[0];
	}
	t->len = strlen(p);
	if (t->len < TOKEN_MIN || t->len > TOKEN_MAX)
		return eng_fail(err, -EINVAL,
				"%s:%d: token of %zu characters (%d to %d required; e.g. openssl rand -hex 32)",
				path, lineno, t->len, TOKEN_MIN, TOKEN_MAX);
	if (!secret_ok(p, t->len))
		return eng_fail(err, -EINVAL, "%s:%d: token has a space, ':' or a control character",
				path, lineno);
	t->secret = strdup(p);
	if (!t->secret)
		return -ENOMEM;
	return 1;
}

int auth_tokens_load(const char *path, struct auth_tokens **ret, struct eng_error *err)
{
	struct auth_tokens *set;
	struct stat st;
	char line[TOKEN_MAX + 2 * AUTH_NAME_MAX + AUTH_ADAPTERS_MAX + 48];
	FILE *f;
	int lineno = 0, r = 0;

	f = fopen(path, "r");
	if (!f)
		return eng_fail(err, -errno, "%s: cannot open: %s", path, strerror(errno));
	if (fstat(fileno(f), &st) < 0 || !S_ISREG(st.st_mode)) {
		fclose(f);
		return eng_fail(err, -EINVAL, "%s: not a regular file", path);
	}
	if (st.st_mode & 0007) {
		fclose(f);
		return eng_fail(err, -EPERM,
				"%s: readable or writable by others (mode %03o); chmod o-rwx it",
				path, (unsigned)(st.st_mode & 0777));
	}
	set = calloc(1, sizeof(*set));
	if (!set) {
		fclose(f);
		return -ENOMEM;
	}
	while (fgets(line, sizeof(line), f)) {
		struct token t, *v;
		size_t len = strlen(line);

		lineno++;
		if (len == sizeof(line) - 1 && line[len - 1] != '\n' && !feof(f)) {
			r = eng_fail(err, -EINVAL, "%s:%d: line too long", path, lineno);
			break;
		}
		{
			char *p = line;

			while (*p == ' ' || *p == '\t')
				p++;
			if (*p == '#')
				continue;
		}
		r = parse_line(line, lineno, path, &t, err);
		explicit_bzero(line, sizeof(line));
		if (r < 0)
			break;
		if (r == 0)
			continue;
		r = 0;
		for (int i = 0; i < set->n; i++) {
			if (ct_equal(t.secret, t.len, set->v[i].secret, set->v[i].len)) {
				r = eng_fail(err, -EINVAL, "%s:%d: same token as '%s'", path,
					     lineno, set->v[i].name);
				break;
			}
		}
		if (r < 0) {
			free(t.secret);
			break;
		}
		v = realloc(set->v, (size_t)(set->n + 1) * sizeof(*v));
		if (!v) {
			free(t.secret);
			r = -ENOMEM;
			break;
		}
		set->v = v;
		set->v[set->n++] = t;
	}
	if (r == 0 && ferror(f))
		r = eng_fail(err, -EIO, "%s: read error", path);
	fclose(f);
	if (r == 0 && set->n == 0)
		r = eng_fail(err, -EINVAL, "%s: no token (an empty file would refuse every call)",
			     path);
	if (r < 0) {
		auth_tokens_free(set);
		return r;
	}
	*ret = set;
	return 0;
}

int auth_init(struct auth *a, const char *path, struct eng_error *err)
{
	int r;

	memset(a, 0, sizeof(*a));
	pthread_rwlock_init(&a->lock, NULL);
	if (!path)
		return 0;
	a->path = strdup(path);
	if (!a->path)
		return -ENOMEM;
	r = auth_tokens_load(path, &a->tokens, err);
	return r < 0 ? r : 0;
}

void auth_fini(struct auth *a)
{
	auth_tokens_free(a->tokens);
	a->tokens = NULL;
	free(a->path);
	a->path = NULL;
	pthread_rwlock_destroy(&a->lock);
}

bool auth_enabled(struct auth *a)
{
	return a->path != NULL;
}

int auth_reload(struct auth *a, struct eng_error *err)
{
	struct auth_tokens *t = NULL, *old;
	int r;

	if (!a->path)
		return 0;
	r = auth_tokens_load(a->path, &t, err);
	if (r < 0)
		return r;
	pthread_rwlock_wrlock(&a->lock);
	old = a->tokens;
	a->tokens = t;
	pthread_rwlock_unlock(&a->lock);
	auth_tokens_free(old);
	return t->n;
}

enum auth_level auth_check(struct auth *a, const char *header, char ret_name[AUTH_NAME_MAX])
{
	char adapters[AUTH_ADAPTERS_MAX];

	return auth_check_tenant(a, header, ret_name, adapters);
}

bool auth_adapter_allowed(const char *adapters, const char *name)
{
	size_t len = strlen(name);

	if (!adapters[0])
		return true;
	for (const char *p = adapters; *p;) {
		size_t n = strcspn(p, ",");

		if (n == len && !memcmp(p, name, n))
			return true;
		p += n;
		if (*p == ',')
			p++;
	}
	return false;
}

enum auth_level auth_check_tenant(struct auth *a, const char *header,
				  char ret_name[AUTH_NAME_MAX],
				  char ret_adapters[AUTH_ADAPTERS_MAX])
{
	enum auth_level level = AUTH_NONE;
	const char *tok;
	size_t len;
	int match = -1;

	ret_name[0] = '\0';
	ret_adapters[0] = '\0';
	if (!a->path)
		return AUTH_FULL;
	if (!header || strncasecmp(header, "Bearer ", 7) != 0)
		return AUTH_NONE;
	tok = header + 7;
	while (*tok == ' ')
		tok++;
	len = strlen(tok);
	if (len == 0 || len > TOKEN_MAX)
		return AUTH_NONE;
	pthread_rwlock_rdlock(&a->lock);
	if (a->tokens) {
		for (int i = 0; i < a->tokens->n; i++) {
			const struct token *t = &a->tokens->v[i];
			bool eq = ct_equal(tok, len, t->secret, t->len);

			/* Branch-free select: every token is compared. */
			match = eq ? i : match;
		}
		if (match >= 0) {
			level = a->tokens->v[match].level;
			snprintf(ret_name, AUTH_NAME_MAX, "%s", a->tokens->v[match].name);
			snprintf(ret_adapters, AUTH_ADAPTERS_MAX, "%s",
				 a->tokens->v[match].adapters);
		}
	}
	pthread_rwlock_unlock(&a->lock);
	return level;
}
