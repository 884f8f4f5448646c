/* enginectl_progress.c — the progress of init, save, load and pull-weights
 * on stderr (enginectl.h): on a terminal a bar redrawn in place, otherwise
 * a plain line when the progress changed, at most one a second and none in
 * the first second (a quick call prints nothing), and the last one at the
 * end. The numbers come from GetStatus.progress, polled by
 * the C client's watch thread (ec_watch_start) while the call runs, or
 * from the caller (pull-weights counts the bytes it receives). Off with
 * the global --no-progress. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "enginectl.h"

/* GetStatus polls (each is a line of the daemon's log): often enough for a
 * bar on a terminal, once a line otherwise. */
#define POLL_TTY_MS 200
#define POLL_MS 1000
#define LINE_EVERY_S 1.0

bool ctl_no_progress;

struct ctl_progress {
	const char *label;          /* the command: "save" */
	bool tty;
	double t0, last_print;
	struct ec_watch *watch;
	pthread_mutex_t lock;       /* the fields below: the watch thread writes them */
	char phase[48], unit[16];
	int64_t done, total;
	char printed[160];          /* what the last plain line said */
	bool shown;                 /* something is on stderr (a bar to end) */
};

/* lock held: "model.safetensors 1048576/3145728 bytes (33.3%)". */
static void describe(const struct ctl_progress *p, char *buf, size_t len)
{
	char pct[16] = "";

	if (p->total > 0)
		snprintf(pct, sizeof(pct), " (%.1f%%)", 100.0 * (double)p->done / (double)p->total);
	snprintf(buf, len, "%s %lld/%lld %s%s", p->phase[0] ? p->phase : "-",
		 (long long)p->done, (long long)p->total, p->unit, pct);
}

/* lock held: draw the bar, or print a line when due. */
static void draw(struct ctl_progress *p, bool final)
{
	double now = ctl_now(), frac;
	char what[160], bar[31];
	int fill;

	if (!p->tty) {
		describe(p, what, sizeof(what));
		if (!final && (!strcmp(what, p->printed) || now - p->t0 < LINE_EVERY_S ||
			       (p->shown && now - p->last_print < LINE_EVERY_S)))
			return;
		if (final && !p->shown)
			return;
		fprintf(stderr, "%s: %s, %.1f s\n", p->label, what, now - p->t0);
		snprintf(p->printed, sizeof(p->printed), "%s", what);
		p->last_print = now;
		p->shown = true;
		return;
	}
	if (!final && p->shown && now - p->last_print < 0.1)
		return;
	frac = p->total > 0 ? (double)p->done / (double)p->total : 0;
	if (frac > 1)
		frac = 1;
	fill = (int)(frac * 30);
	for (int i = 0; i < 30; i++)
		bar[i] = i < fill ? '#' : '.';
	bar[30] = '\0';
	if (!strcmp(p->unit, "bytes"))
		snprintf(what, sizeof(what), "%.1f/%.1f MiB", (double)p->done / 1048576.0,
			 (double)p->total / 1048576.0);
	else
		snprintf(what, sizeof(what), "%lld/%lld %s", (long long)p->done,
			 (long long)p->total, p->unit);
	fprintf(stderr, "\r%s [%s] %5.1f%% %s %s %.1f s\033[K%s", p->label, bar, frac * 100,
		p->phase, what, now - p->t0, final ? "\n" : "");
	p->last_print = now;
	p->shown = true;
}

void ctl_progress_update(struct ctl_progress *p, const char *phase, int64_t done,
			 int64_t total, const char *unit)
{
	if (!p)
		return;
	pthread_mutex_lock(&p->lock);
	snprintf(p->phase, sizeof(p->phase), "%s", phase ? phase : "");
	snprintf(p->unit, sizeof(p->unit), "%s", unit ? unit : "");
	if (done > p->done || total != p->total)
		p->done = done;
	p->total = total;
	draw(p, false);
	pthread_mutex_unlock(&p->lock);
}

static void on_progress(void *ctx, const Engined__V1__JobProgress *jp)
{
	if (jp->total > 0 || jp->phase[0])
		ctl_progress_update(ctx, jp->phase, jp->done, jp->total, jp->unit);
}

struct ctl_progress *ctl_progress_start(struct ec_client *c, const char *label,
					const char *method)
{
	struct ctl_progress *p;
	struct ec_status st;

	if (ctl_no_progress || !(p = calloc(1, sizeof(*p))))
		return NULL;
	p->label = label;
	p->tty = isatty(2);
	p->t0 = ctl_now();
	pthread_mutex_init(&p->lock, NULL);
	if (method && ec_watch_start(c, method, p->tty ? POLL_TTY_MS : POLL_MS, on_progress, p,
				     &p->watch, &st))
		p->watch = NULL;        /* no thread: no progress, the call still runs */
	return p;
}

void ctl_progress_end(struct ctl_progress *p, bool ok)
{
	if (!p)
		return;
	ec_watch_stop(p->watch);
	pthread_mutex_lock(&p->lock);
	if (ok && p->total > 0)
		p->done = p->total;
	if (ok || (p->tty && p->shown))
		draw(p, true);
	pthread_mutex_unlock(&p->lock);
	pthread_mutex_destroy(&p->lock);
	free(p);
}
