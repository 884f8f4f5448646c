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

const char *eng_strerror(int code)
{
	switch (-code) {
	case 0: return "OK";
	case EINVAL: return "EINVAL";
	case ENOENT: return "ENOENT";
	case ENOMEM: return "ENOMEM";
	case EPERM: return "EPERM";
	case EBADMSG: return "EBADMSG";
	case ENODEV: return "ENODEV";
	case EALREADY: return "EALREADY";
	case EIO: return "EIO";
	case ECANCELED: return "ECANCELED";
	case ELIBACC: return "ELIBACC";
	default: return "E?";
	}
}
