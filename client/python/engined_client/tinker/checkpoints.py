"""checkpoints.py — the checkpoints the gateway saved, by tinker:// path:
tinker://<model_id>/<kind>/<name>, kind "weights" (save_state: model and
optimizer), "sampler_weights" (weights only) or "external_weights"
(weights only, for download), each a directory under the daemons'
checkpoint root (tinker/<model_id with ':' as '_'>/<kind>/<name>: engined's
SaveCheckpoint writes it, a PEFT directory for a LoRA model, Hugging Face
files for a full one). Their TTLs (ttl_seconds, PUT .../ttl) are kept:
an expired checkpoint is deleted. Downloads: signed URLs (a random token
per signing, valid an hour) under /api/v1/files/, which need no API key,
as the SDK's CLI fetches them with a bare HTTP GET.

Reading, deleting and serving files needs --checkpoint-root (the root as
this host sees it); saving and loading do not (the daemons do those).
With it, the registry also survives a gateway restart: each training run's
records are kept in tinker/<run>/gateway-checkpoints.json (written whole,
then renamed) and read back at start for the directories still there, so
that a script restarted after the gateway resumes from its checkpoints."""
import contextlib
import glob
import json
import os
import re
import secrets
import shutil
import time

from .wire import UserError

URL_TTL_S = 3600.0
KINDS = {"weights": "training", "sampler_weights": "sampler", "external_weights": "external"}


def safe(s):
    return re.sub(r"[^A-Za-z0-9._-]", "_", s)


def iso(t):
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


RECORDS = "gateway-checkpoints.json"


class Checkpoints:
    def __init__(self, root):
        self.root = root
        self.by_path = {}
        self._tokens = {}                 # token -> (directory, files, expires)
        if root is not None:
            self._read_back()

    @staticmethod
    def rel(model_id, kind, name):
        return "tinker/%s/%s/%s" % (safe(model_id), kind, name)

    def add(self, m, kind, name, size, optimizer, ttl_s=None):
        path = "tinker://%s/%s/%s" % (m.model_id, kind, name)
        self.by_path[path] = {
            "path": path, "model_id": m.model_id, "kind": kind, "name": name,
            "rel": self.rel(m.model_id, kind, name), "time": time.time(), "lora": m.lora,
            "version": m.version, "generation": m.generation, "size_bytes": size,
            "optimizer": optimizer, "expires": self._expiry(ttl_s)}
        self._write(m.model_id)
        return self.by_path[path]

    @staticmethod
    def check_ttl(ttl_s):
        """ttl_seconds as the SDK sends it: null, or seconds > 0; returned."""
        if ttl_s is not None and (isinstance(ttl_s, bool) or not isinstance(ttl_s, (int, float))
                                  or not ttl_s > 0):
            raise UserError("ttl_seconds: %r (a positive number of seconds, or null)" % (ttl_s,))
        return ttl_s

    @classmethod
    def _expiry(cls, ttl_s):
        cls.check_ttl(ttl_s)
        return None if ttl_s is None else time.time() + float(ttl_s)

    def _write(self, model_id):
        """Keep a run's records beside its checkpoints (none left: removed)."""
        if self.root is None:
            return
        run = os.path.join(self.root, "tinker", safe(model_id))
        records = [c for c in self.by_path.values() if c["model_id"] == model_id]
        target = os.path.join(run, RECORDS)
        if not records:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(target)
            return
        os.makedirs(run, exist_ok=True)
        tmp = target + ".tmp"
        with open(tmp, "w") as f:
            json.dump(records, f)
        os.replace(tmp, target)

    def _read_back(self):
        for records in glob.glob(os.path.join(self.root, "tinker", "*", RECORDS)):
            try:
                with open(records) as f:
                    for c in json.load(f):
                        if os.path.isdir(os.path.join(self.root, c["rel"])):
                            self.by_path[c["path"]] = c
            except (OSError, ValueError, KeyError, TypeError):
                continue  # not ours, or damaged: its checkpoints stay unknown

    def get(self, path):
        c = self.by_path.get(path)
        if c is None:
            raise UserError("%r is not a checkpoint this gateway saved" % (path,))
        return c

    def find(self, model_id, checkpoint_id):
        c = self.by_path.get("tinker://%s/%s" % (model_id, checkpoint_id))
        if c is None:
            raise LookupError("tinker://%s/%s is not a checkpoint this gateway saved"
                              % (model_id, checkpoint_id))
        return c

    def _dir(self, c):
        if self.root is None:
            raise UserError("this needs the gateway's --checkpoint-root (the daemons' "
                            "checkpoint root as the gateway's host sees it)")
        return os.path.join(self.root, c["rel"])

    def delete(self, c):
        self._remove(self._dir(c))
        self.by_path.pop(c["path"], None)
        self._write(c["model_id"])

    @staticmethod
    def _remove(d):
        """A checkpoint's directory, and its parent once no checkpoint is
        left in it (engined keeps a `latest` file there)."""
        shutil.rmtree(d, ignore_errors=True)
        parent = os.path.dirname(d)
        with contextlib.suppress(FileNotFoundError):
            if not any(e.is_dir() for e in os.scandir(parent)):
                shutil.rmtree(parent, ignore_errors=True)

    def set_ttl(self, c, ttl_s):
        c["expires"] = self._expiry(ttl_s)
        self._write(c["model_id"])

    def expire(self):
        """Delete the checkpoints past their TTL (and forget old URLs)."""
        now = time.time()
        for c in [c for c in self.by_path.values() if c["expires"] and c["expires"] < now]:
            if self.root is not None:
                self._remove(self._dir(c))
            self.by_path.pop(c["path"], None)
            self._write(c["model_id"])
        for t in [t for t, v in self._tokens.items() if v[2] < now]:
            del self._tokens[t]

    @staticmethod
    def json(c):
        out = {"checkpoint_id": "%s/%s" % (c["kind"], c["name"]),
               "checkpoint_type": KINDS[c["kind"]], "time": iso(c["time"]),
               "tinker_path": c["path"], "size_bytes": c["size_bytes"], "public": False}
        if c["expires"]:
            out["expires_at"] = iso(c["expires"])
        return out

    def list(self, model_id=None):
        self.expire()
        cs = [c for c in self.by_path.values() if model_id is None or c["model_id"] == model_id]
        return [self.json(c) for c in sorted(cs, key=lambda c: c["time"])]

    def signed_urls(self, c, base_url):
        """{"urls": {file: url}, "expires"} for an external_weights checkpoint."""
        if c["kind"] != "external_weights":
            raise UserError("%s: download URLs are for external_weights checkpoints "
                            "(save_weights_external)" % c["path"])
        d = self._dir(c)
        files = sorted(f for f in os.listdir(d) if os.path.isfile(os.path.join(d, f)))
        token = secrets.token_urlsafe(24)
        expires = time.time() + URL_TTL_S
        self._tokens[token] = (d, frozenset(files), expires)
        base = base_url.rstrip("/")
        return {"urls": {f: "%s/api/v1/files/%s/%s" % (base, token, f) for f in files},
                "expires": iso(expires)}

    def file(self, token, name):
        """The file a signed URL names (LookupError when the URL is not valid)."""
        entry = self._tokens.get(token)
        if entry is None or entry[2] < time.time() or name not in entry[1]:
            raise LookupError("no such file, or its URL expired")
        return os.path.join(entry[0], name)
