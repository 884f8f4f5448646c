"""Progress of a long call (initialize, save_checkpoint, load_checkpoint,
stream_weights), shared by the sync and the asyncio client: while the call
runs, the client polls GetStatus (the daemon answers it inline, also while
a job runs) and hands the running job's GetStatusResponse.progress to the
caller's `progress=`:

  - a callable: progress(done, total, phase), called when done, total or
    phase change, done never decreasing; and once more with done == total
    when the call succeeds;
  - an object with update(n) (a tqdm bar): update(n) with each increase of
    done, its `total` set from the daemon's (and refresh() called when it
    has one), set_postfix_str(phase) when it has one.

Only the progress of a job of the call's own method is reported (a call
queued behind another client's job reports nothing until it runs)."""

# Seconds between GetStatus polls (each is one line of the daemon's log).
POLL_S = 0.5


class Reporter:
    """Turns GetStatus replies into calls of `progress` for `method`."""

    def __init__(self, progress, method):
        self._p = progress
        self._method = method
        self._done = 0
        self._total = 0
        self._phase = None

    def feed(self, status):
        """status: a GetStatusResponse (protobuf)."""
        if not status.busy or status.current_job != self._method or \
                not status.HasField("progress"):
            return
        p = status.progress
        if not p.total and not p.phase:
            return
        self._emit(max(p.done, self._done), p.total, p.phase)

    def finish(self):
        """The call succeeded: done reaches total (when one was seen)."""
        if self._total:
            self._emit(self._total, self._total, self._phase or "")

    def _emit(self, done, total, phase):
        if (done, total, phase) == (self._done, self._total, self._phase):
            return
        step, self._done = done - self._done, done
        new_total, self._total, self._phase = total != self._total, total, phase
        update = getattr(self._p, "update", None)
        if update is None:
            self._p(done, total, phase)
            return
        if new_total and hasattr(self._p, "total"):
            self._p.total = total
            if hasattr(self._p, "refresh"):
                self._p.refresh()
        if phase and hasattr(self._p, "set_postfix_str"):
            self._p.set_postfix_str(phase, refresh=False)
        if step > 0:
            update(step)
