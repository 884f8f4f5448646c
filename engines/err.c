/* err.c — error recording helpers (see err.h). */
#include "err.h"

#include <stdio.h>
#include <string.h>

int eng_fail(struct eng_error *err, int code, const char *fmt, ...)
{
	va_list ap;

	if (!err || err->code)
		return code;
	err->code = code;
	va_start(ap, fmt);
	vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
	va_end(ap);
	return code;
}

void eng_error_clear(struct eng_error *err)
{
	if (!err)
		return;
	err->code = 0;
	err->msg[0] = '\0';
}

#define ENG_CODE_ROW(e, st, doc) { -(e), #e, #st, doc },
const struct eng_code eng_codes[] = { ENG_ERROR_CODES(ENG_CODE_ROW) };
#undef ENG_CODE_ROW
const int eng_n_codes = sizeof(eng_codes) / sizeof(eng_codes[0]);

const char *eng_strerror(int code)
{
	if (code == 0)
		return "OK";
	for (int i = 0; i < eng_n_codes; i++)
		if (eng_codes[i].code == code)
			return eng_codes[i].name;
	return "E?";
}

int eng_errno_code(int e)
{
	switch (e) {
	case ENOENT:
		return -ENOENT;
	case ENOMEM:
		return -ENOMEM;
	case ENOSPC:
	case EDQUOT:
	case EFBIG:
		return -ENOSPC;
	case EMFILE:
	case ENFILE:
		return -EMFILE;
	case EACCES:
	case EPERM:
	case ELOOP:
	case EXDEV:
		return -EPERM;
	case EROFS:
		return -EALREADY;
	case ENAMETOOLONG:
	case ENOTDIR:
	case EISDIR:
		return -EINVAL;
	default:
		return -EIO;
	}
}

const char *eng_errno_text(int e)
{
	switch (e) {
	case ELOOP:
		return "a symlink, refused (such files are never opened through a symlink)";
	case EXDEV:
		return "outside its directory, refused";
	default:
		return strerror(e);
	}
}
