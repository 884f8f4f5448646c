/* tls.c — read and check PEM files with OpenSSL (see tls.h). */
#include "tls.h"
#include "io/fileio.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#define PEM_MAX (1 << 20)

static int read_file(const char *key, const char *path, char **ret, struct eng_error *err)
{
	struct stat st;
	int r;

	/* Regular files only (a FIFO or device is refused before it is
	 * opened); io_read_file's cap bounds the rest. */
	if (stat(path, &st) == 0 && !S_ISREG(st.st_mode))
		return eng_fail(err, -EINVAL, "%s: %s is not a regular file under 1 MiB", key, path);
	r = io_read_file(path, PEM_MAX, ret, NULL);
	if (r == -EFBIG || r == -EISDIR)
		return eng_fail(err, -EINVAL, "%s: %s is not a regular file under 1 MiB", key, path);
	if (r == -ENOMEM)
		return -ENOMEM;
	if (r < 0)
		return eng_fail(err, r, "%s: cannot open %s: %s", key, path, strerror(-r));
	return 0;
}

static void ssl_reason(char *out, size_t len)
{
	unsigned long e = ERR_get_error();

	if (e)
		ERR_error_string_n(e, out, len);
	else
		snprintf(out, len, "no PEM data");
	ERR_clear_error();
}

/* Every certificate in pem (at least one). */
static int check_certs(const char *key, const char *pem, X509 **ret_first,
		       struct eng_error *err)
{
	BIO *bio = BIO_new_mem_buf(pem, -1);
	X509 *x, *first = NULL;
	char why[256];
	int n = 0;

	if (!bio)
		return -ENOMEM;
	while ((x = PEM_read_bio_X509(bio, NULL, NULL, NULL)) != NULL) {
		if (!first)
			first = x;
		else
			X509_free(x);
		n++;
	}
	/* The loop ends with a "no start line" error at the end of the data. */
	ERR_clear_error();
	BIO_free(bio);
	if (n == 0) {
		ssl_reason(why, sizeof(why));
		return eng_fail(err, -EINVAL, "%s: no certificate could be read (%s)", key, why);
	}
	if (ret_first)
		*ret_first = first;
	else
		X509_free(first);
	return n;
}

int tls_pem_load(const char *cert_file, const char *key_file, const char *ca_file,
		 struct tls_pem *ret, struct eng_error *err)
{
	struct tls_pem p;
	X509 *leaf = NULL;
	EVP_PKEY *pkey = NULL;
	BIO *bio = NULL;
	char why[256];
	int r;

	memset(&p, 0, sizeof(p));
	r = read_file("tls.cert", cert_file, &p.cert, err);
	if (r == 0)
		r = read_file("tls.key", key_file, &p.key, err);
	if (r == 0 && ca_file)
		r = read_file("tls.client_ca", ca_file, &p.client_ca, err);
	if (r < 0)
		goto fail;
	r = check_certs("tls.cert", p.cert, &leaf, err);
	if (r < 0)
		goto fail;
	if (p.client_ca) {
		r = check_certs("tls.client_ca", p.client_ca, NULL, err);
		if (r < 0)
			goto fail;
	}
	bio = BIO_new_mem_buf(p.key, -1);
	if (!bio) {
		r = -ENOMEM;
		goto fail;
	}
	pkey = PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL);
	if (!pkey) {
		ssl_reason(why, sizeof(why));
		r = eng_fail(err, -EINVAL, "tls.key: no private key could be read from %s (%s)",
			     key_file, why);
		goto fail;
	}
	if (X509_check_private_key(leaf, pkey) != 1) {
		ERR_clear_error();
		r = eng_fail(err, -EINVAL, "tls.key: %s does not match the certificate in %s",
			     key_file, cert_file);
		goto fail;
	}
	X509_NAME_oneline(X509_get_subject_name(leaf), p.subject, sizeof(p.subject));
	{
		BIO *mb = BIO_new(BIO_s_mem());

		if (mb) {
			int n;

			ASN1_TIME_print(mb, X509_get0_notAfter(leaf));
			n = BIO_read(mb, p.not_after, sizeof(p.not_after) - 1);
			p.not_after[n > 0 ? n : 0] = '\0';
			BIO_free(mb);
		}
	}
	EVP_PKEY_free(pkey);
	BIO_free(bio);
	X509_free(leaf);
	*ret = p;
	return 0;

fail:
	EVP_PKEY_free(pkey);
	BIO_free(bio);
	X509_free(leaf);
	tls_pem_free(&p);
	return r;
}

void tls_pem_free(struct tls_pem *p)
{
	if (p->key) {
		explicit_bzero(p->key, strlen(p->key));
		free(p->key);
	}
	free(p->cert);
	free(p->client_ca);
	p->key = p->cert = p->client_ca = NULL;
}
