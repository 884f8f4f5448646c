/* tls.h — the daemon's TLS material: PEM files read and checked with
 * OpenSSL before gRPC sees them, so that a bad file (a key that does not
 * match its certificate, a truncated CA) is refused at start and, on
 * SIGHUP, leaves the certificates in force instead of breaking every new
 * handshake.
 */
#ifndef ENGINED_DAEMON_TLS_H
#define ENGINED_DAEMON_TLS_H

#include "err.h"

struct tls_pem {
	char *cert;        /* PEM chain, malloc'ed, NUL-terminated */
	char *key;         /* PEM private key (wiped on free) */
	char *client_ca;   /* PEM roots or NULL */
	char subject[256]; /* of the leaf certificate, for the log */
	char not_after[64];
};

/* Read and check the files (client_ca may be NULL). Errors name the
 * config key ("tls.key: does not match tls.cert"). *ret is filled only on
 * success. */
int tls_pem_load(const char *cert_file, const char *key_file, const char *ca_file,
		 struct tls_pem *ret, struct eng_error *err);
void tls_pem_free(struct tls_pem *p);

#endif
