/* lifecycle.c — the daemon's lifecycle: init (the method table, auth,
 * reflection, the replay table, the share table), start (the engine thread,
 * the share socket, the gRPC server, the metrics endpoint), the graceful
 * stop, SIGHUP's reload and fini. What runs between start and stop is
 * dispatch.c's. */
#include "lifecycle.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"
#include "log.h"
#include "methods.h"
#include "reflection.h"
#include "replay.h"
#include "tls.h"

bool daemon_serving(struct daemon *d)
{
	bool serving;

	pthread_mutex_lock(&d->lock);
	serving = !d->stopping && !d->engine_failed;
	pthread_mutex_unlock(&d->lock);
	return serving;
}

static bool health_serving(void *ctx)
{
	return daemon_serving(ctx);
}

/* The metrics page's view of the daemon (the endpoint's thread). */
static void metrics_sample(void *ctx, struct metrics_sample *out)
{
	struct daemon *d = ctx;
	struct timespec now;

	out->job_seconds = daemon_job_seconds(d);
	pthread_mutex_lock(&d->lock);
	out->st = d->snap;
	out->queued = d->queued;
	out->in_flight = d->in_flight;
	out->busy = d->busy;
	pthread_mutex_unlock(&d->lock);
	clock_gettime(CLOCK_MONOTONIC, &now);
	out->uptime_seconds = (double)(now.tv_sec - d->started.tv_sec) +
			      (double)(now.tv_nsec - d->started.tv_nsec) * 1e-9;
	out->bytes_streamed = d->rpc ? rpc_server_bytes_streamed(d->rpc) : 0;
	out->inflight_request_bytes = d->rpc ? rpc_server_inflight_bytes(d->rpc) : 0;
	if (d->shares)
		share_table_counts(d->shares, &out->pending_shares, &out->pending_share_bytes);
}

int daemon_init(struct daemon *d, const struct daemon_config *cfg,
		char *errbuf, size_t errlen)
{
	struct eng_error err;
	int r;

	memset(d, 0, sizeof(*d));
	d->cfg = *cfg;
	clock_gettime(CLOCK_MONOTONIC, &d->started);
	pthread_mutex_init(&d->lock, NULL);
	pthread_cond_init(&d->cond, NULL);
	pthread_mutex_init(&d->zc_lock, NULL);
	pthread_cond_init(&d->zc_cond, NULL);
	eng_error_clear(&err);
	r = methods_init(&err);
	if (r < 0) {
		snprintf(errbuf, errlen, "%s", err.msg);
		return r;
	}
	metrics_init(&d->metrics, daemon_method_labels, daemon_n_methods);
	health_init(&d->health, health_serving, d);
	r = auth_init(&d->auth, cfg->token_file, &err);
	if (r < 0) {
		snprintf(errbuf, errlen, "auth.token_file: %s", err.msg[0] ? err.msg :
			 eng_strerror(r));
		return r;
	}
	r = reflection_new(daemon_method_paths, daemon_n_methods, &d->refl, &err);
	if (r < 0) {
		snprintf(errbuf, errlen, "reflection: %s", err.msg);
		return r;
	}
	r = replay_new(cfg->replay_entries, cfg->replay_bytes, dispatch_replay_requeue, d, &d->replay);
	if (r < 0) {
		snprintf(errbuf, errlen, "replay: out of memory");
		return r;
	}
	r = adapters_init(&d->adapters, cfg->max_adapters, cfg->max_adapter_bytes);
	if (r == 0 && cfg->max_adapters > 0) {
		d->adapter_snap = calloc((size_t)cfg->max_adapters, sizeof(*d->adapter_snap));
		d->adapter_work = calloc((size_t)cfg->max_adapters, sizeof(*d->adapter_work));
		if (!d->adapter_snap || !d->adapter_work)
			r = -ENOMEM;
	}
	if (r < 0) {
		snprintf(errbuf, errlen, "lora.max_adapters: out of memory");
		return r;
	}
	if (cfg->share_socket) {
		struct share_limits lim = { cfg->max_shares, cfg->max_share_bytes,
					    cfg->share_ttl_ms };

		r = share_table_new(&lim, &d->shares);
		if (r < 0) {
			snprintf(errbuf, errlen, "server.share_socket: %s", r == -EINVAL ?
				 "max_shares, max_share_bytes and share_ttl_s must be positive" :
				 "out of memory");
			return r;
		}
	}
	return 0;
}

/* A start that failed after the engine thread began: stop and join it. */
static void stop_engine_thread(struct daemon *d)
{
	pthread_mutex_lock(&d->lock);
	d->stopping = true;
	pthread_cond_broadcast(&d->cond);
	pthread_mutex_unlock(&d->lock);
	pthread_join(d->engine_thread, NULL);
	d->engine_thread_started = false;
}

int daemon_start(struct daemon *d, char *errbuf, size_t errlen)
{
	static struct rpc_method_reg regs[32];
	struct rpc_server_config rc;
	int r;

	if (pthread_create(&d->engine_thread, NULL, dispatch_engine_thread, d) != 0) {
		snprintf(errbuf, errlen, "cannot start the engine thread");
		return -EAGAIN;
	}
	d->engine_thread_started = true;
	if (d->shares) {
		struct eng_error err;

		eng_error_clear(&err);
		r = share_socket_start(d->cfg.share_socket, d->shares, &d->share_sock, &err);
		if (r < 0) {
			snprintf(errbuf, errlen, "%s", err.msg);
			stop_engine_thread(d);
			return r;
		}
	}
	for (int i = 0; i < daemon_n_methods; i++) {
		regs[i].path = daemon_methods[i].path;
		regs[i].server_streaming = daemon_methods[i].server_streaming;
		regs[i].client_streaming = daemon_methods[i].client_streaming;
	}
	memset(&rc, 0, sizeof(rc));
	rc.listen = (const char *const *)d->cfg.listen;
	rc.n_listen = d->cfg.n_listen;
	rc.max_recv_bytes = d->cfg.max_request_bytes;
	rc.max_inflight_recv_bytes = d->cfg.max_inflight_request_bytes;
	rc.max_send_bytes = d->cfg.max_send_bytes;
	rc.pollers = d->cfg.pollers;
	rc.max_concurrent_streams = d->cfg.max_concurrent_streams;
	rc.default_deadline_ms = d->cfg.default_deadline_ms;
	rc.tls_cert = d->tls_cert;
	rc.tls_key = d->tls_key;
	rc.tls_client_ca = d->tls_client_ca;
	rc.tls_require_client_cert = d->cfg.tls_require_client_cert;
	r = rpc_server_start(&rc, regs, daemon_n_methods, dispatch_on_call, d, &d->rpc,
			     errbuf, errlen);
	if (r < 0) {
		stop_engine_thread(d);
		share_socket_stop(d->share_sock);
		d->share_sock = NULL;
		return r;
	}
	if (d->cfg.metrics_listen) {
		r = metrics_start(&d->metrics, d->cfg.metrics_listen,
				  d->cfg.metrics_idle_timeout_s, metrics_sample, d,
				  errbuf, errlen);
		if (r < 0) {
			(void)daemon_stop(d);
			return r;
		}
	}
	return 0;
}

int daemon_stop(struct daemon *d)
{
	struct timespec until;
	char job[48];
	bool done;

	/* New calls: gRPC refuses them once shut down; calls racing with us
	 * see `stopping`. The running job finishes, queued ones are refused. */
	pthread_mutex_lock(&d->lock);
	d->stopping = true;
	pthread_cond_broadcast(&d->cond);
	pthread_mutex_unlock(&d->lock);
	health_broadcast(&d->health, false);
	if (d->rpc)
		rpc_server_shutdown(d->rpc);
	if (d->engine_thread_started) {
		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += d->cfg.grace_ms / 1000;
		until.tv_nsec += (d->cfg.grace_ms % 1000) * 1000000L;
		if (until.tv_nsec >= 1000000000L) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000L;
		}
		pthread_mutex_lock(&d->lock);
		while (!d->engine_done &&
		       pthread_cond_timedwait(&d->cond, &d->lock, &until) != ETIMEDOUT)
			;
		done = d->engine_done;
		snprintf(job, sizeof(job), "%s", d->current_job ? d->current_job : "?");
		pthread_mutex_unlock(&d->lock);
		if (!done) {
			log_msg(LOG_LVL_ERROR,
				"shutdown: the running job (%s) did not finish within shutdown.grace_s = %.1f s",
				job, (double)d->cfg.grace_ms / 1e3);
			return -ETIMEDOUT;
		}
		pthread_join(d->engine_thread, NULL);
		d->engine_thread_started = false;
	}
	/* No job makes shares any more: the socket goes (its file removed);
	 * the shares still pending are closed by daemon_fini. */
	share_socket_stop(d->share_sock);
	d->share_sock = NULL;
	health_broadcast(&d->health, true);
	metrics_fini(&d->metrics);
	if (d->rpc) {
		rpc_server_destroy(d->rpc, 2000);
		d->rpc = NULL;
	}
	return 0;
}

int daemon_reload(struct daemon *d, struct eng_error *err)
{
	struct tls_pem pem;
	int r, first = 0;

	r = auth_reload(&d->auth, err);
	if (r < 0) {
		log_msg(LOG_LVL_ERROR, "reload: auth.token_file: %s; the old tokens stay in force",
			err->msg);
		first = r;
	} else if (auth_enabled(&d->auth)) {
		log_msg(LOG_LVL_INFO, "reload: %d tokens from %s", r, d->cfg.token_file);
	}
	if (d->cfg.tls_cert && d->rpc) {
		struct eng_error e2;

		eng_error_clear(&e2);
		r = tls_pem_load(d->cfg.tls_cert, d->cfg.tls_key, d->cfg.tls_client_ca, &pem, &e2);
		if (r == 0)
			r = rpc_server_set_tls(d->rpc, pem.cert, pem.key, pem.client_ca);
		if (r < 0) {
			log_msg(LOG_LVL_ERROR, "reload: %s; the old certificates stay in force",
				e2.msg[0] ? e2.msg : eng_strerror(r));
			if (!first) {
				*err = e2;
				first = r;
			}
		} else {
			log_msg(LOG_LVL_INFO,
				"reload: TLS certificate %s (until %s) for new connections",
				pem.subject, pem.not_after);
			tls_pem_free(&pem);
		}
	}
	return first;
}

void daemon_fini(struct daemon *d)
{
	/* The engine thread destroyed the adapters before their base. */
	adapters_fini(&d->adapters);
	free(d->adapter_snap);
	free(d->adapter_work);
	d->adapter_snap = d->adapter_work = NULL;
	reflection_free(d->refl);
	replay_free(d->replay);
	d->replay = NULL;
	share_table_free(d->shares);
	d->shares = NULL;
	d->refl = NULL;
	health_fini(&d->health);
	auth_fini(&d->auth);
	pthread_cond_destroy(&d->zc_cond);
	pthread_mutex_destroy(&d->zc_lock);
	pthread_cond_destroy(&d->cond);
	pthread_mutex_destroy(&d->lock);
}
