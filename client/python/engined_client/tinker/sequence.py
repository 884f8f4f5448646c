"""sequence.py — one training model's requests, run in seq_id order.

The SDK numbers a TrainingClient's requests 1, 2, ... (forward_backward
chunks, optim_step, saves and loads alike) and may POST them out of order
(docs/TINKER.md 5.2); they must run in order, each once. A submission
names its seq_id and a key of its content: the same seq_id with the same
key is the same call (a retry: the same future); with another key it is
refused. An id the gateway refused at submission is consumed (the SDK goes
on with the next). A missing id that may never come (its body could not
be parsed, so its number is unknown) is waited for `gap_wait_s` while a
later one waits, then skipped."""
import asyncio
import contextlib
import logging

from .wire import UserError

log = logging.getLogger("engined_tinker")
WINDOW = 4096  # seq_ids kept for deduplication behind the next one to run


class Sequencer:
    def __init__(self, name, gap_wait_s=10.0):
        self.name = name
        self.gap_wait_s = gap_wait_s
        self.next = 1                 # the next seq_id to run
        self._entries = {}            # seq_id -> (key, record or None, start)
        self._wake = asyncio.Event()
        self._task = None
        self.closed = False

    def submit(self, seq_id, key, make):
        """Queue a call as seq_id; returns the record of the call (an
        earlier one for a retry). make(): (record, start) for a new call,
        start a coroutine function run in seq_id order."""
        if not isinstance(seq_id, int) or seq_id < 1:
            raise UserError("seq_id: %r (an integer from 1)" % (seq_id,))
        if seq_id in self._entries:
            k, rec, _ = self._entries[seq_id]
            if k != key:
                raise UserError("seq_id %d of %s was already used for another request"
                                % (seq_id, self.name))
            if rec is None:
                raise UserError("seq_id %d of %s was refused before" % (seq_id, self.name))
            return rec
        if seq_id < self.next:
            raise UserError("seq_id %d of %s is behind the requests already run (next %d)"
                            % (seq_id, self.name, self.next))
        record, start = make()
        self._entries[seq_id] = (key, record, start)
        self._wake.set()
        if self._task is None:
            self._task = asyncio.ensure_future(self._loop())
        return record

    def refuse(self, seq_id):
        """A request refused at submission: its seq_id (when it names a
        new one) is used up without running, so later ones do not wait."""
        if isinstance(seq_id, int) and seq_id >= self.next and seq_id not in self._entries:
            self.submit(seq_id, "<refused>", lambda: (None, None))

    @contextlib.contextmanager
    def refusing(self, seq_id):
        """Checks of a submission: a UserError they raise refuses seq_id."""
        try:
            yield
        except UserError:
            self.refuse(seq_id)
            raise

    async def _loop(self):
        while not self.closed:
            entry = self._entries.get(self.next)
            if entry is not None:
                _, rec, start = entry
                if start is not None:
                    await start()
                self._entries[self.next] = (entry[0], rec, None)
                self.next += 1
                for s in [s for s in self._entries if s < self.next - WINDOW]:
                    del self._entries[s]
                continue
            self._wake.clear()
            later = any(s > self.next for s in self._entries)
            try:
                await asyncio.wait_for(self._wake.wait(),
                                       timeout=self.gap_wait_s if later else None)
            except asyncio.TimeoutError:
                log.warning("%s: seq_id %d never arrived in %.0f s; running seq_id %d",
                            self.name, self.next, self.gap_wait_s, self.next + 1)
                self._entries[self.next] = ("<skipped>", None, None)

    def close(self):
        self.closed = True
        self._wake.set()
