"""cli.py — `engined-tinker`: the Tinker gateway's command line.

  engined-tinker --listen HOST:PORT --engined ADDR[,ADDR...] --api-keys FILE
                 --model PATH [options]

--engined names one engine: a daemon, or the ranks of a data-parallel group
(comma-separated); repeat it for several engines (engines.py: LoRA models
share an engine, each full fine-tune takes one). --api-keys: a file of
accepted keys, one a line ('#' comments; the SDK wants keys starting with
"tml-"), re-read when it changes. --model: the base model's Hugging Face
directory as the daemons see it (under their --model-root); --model-dir:
the same directory as this host sees it, for the model's name, context
length and end-of-sequence ids (config.json, generation_config.json) and
its tokenizer (tokenizer.json: stop strings)."""
import argparse
import json
import logging
import os
import sys

from .engines import Engines
from .futures import FutureStore
from .gateway import Gateway


def _host_port(s):
    host, sep, port = s.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError("%r: HOST:PORT" % s)
    return host.strip("[]") or "0.0.0.0", int(port)


class KeyFile:
    """The accepted keys, re-read when the file's mtime or size changes."""

    def __init__(self, path):
        self.path = path
        self._stamp = None
        self._keys = frozenset()
        self()
        if not self._keys:
            raise SystemExit("engined-tinker: %s holds no keys" % path)

    def __call__(self):
        st = os.stat(self.path)
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            with open(self.path) as f:
                self._keys = frozenset(
                    ln.strip() for ln in f if ln.strip() and not ln.lstrip().startswith("#"))
            self._stamp = stamp
        return self._keys


def _tokenizer(model_dir):
    """The model's tokenizer (tokenizer.json in --model-dir), for stop
    strings; None without one."""
    path = os.path.join(model_dir, "tokenizer.json") if model_dir else None
    if not path or not os.path.exists(path):
        return None
    from tokenizers import Tokenizer
    return Tokenizer.from_file(path)


def _model_facts(model_dir):
    """(arch, max context, eos ids) from a Hugging Face directory."""
    arch, ctx, eos = "llama", None, []
    if not model_dir:
        return arch, ctx, eos
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    arch = cfg.get("model_type", arch)
    ctx = cfg.get("max_position_embeddings")
    e = cfg.get("eos_token_id")
    gen = os.path.join(model_dir, "generation_config.json")
    if os.path.exists(gen):
        with open(gen) as f:
            e = json.load(f).get("eos_token_id", e)
    if e is not None:
        eos = e if isinstance(e, list) else [e]
    return arch, ctx, [int(x) for x in eos]


def parser():
    p = argparse.ArgumentParser(prog="engined-tinker", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--listen", type=_host_port, required=True, metavar="HOST:PORT")
    p.add_argument("--engined", action="append", required=True, metavar="ADDR[,ADDR...]",
                   help="one engine: a daemon or a data-parallel group; repeatable")
    p.add_argument("--api-keys", required=True, metavar="FILE")
    p.add_argument("--model", required=True, metavar="PATH",
                   help="the base model's directory under the daemons' model root")
    p.add_argument("--model-dir", metavar="DIR",
                   help="the same directory on this host (config.json, generation_config.json)")
    p.add_argument("--model-name", help="the name clients use (default: --model's last part)")
    p.add_argument("--tokenizer", help="get_info's tokenizer_id (default: --model-dir, else "
                                       "the model name)")
    p.add_argument("--eos-token-ids", help="comma-separated ids that end a sample when the "
                                           "client sets no stop (default: the model's)")
    p.add_argument("--checkpoint-root", metavar="DIR",
                   help="the daemons' checkpoint root on this host (to delete checkpoints)")
    p.add_argument("--token", help="engined's bearer token, if the daemons require one")
    p.add_argument("--max-adapters", type=int, default=8,
                   help="LoRA models and snapshots per engine (the daemon's [lora] bound)")
    p.add_argument("--lora-alpha", type=float, default=32.0)
    p.add_argument("--kv-cache-bytes", type=int, default=0)
    p.add_argument("--seq-gap-wait", type=float, default=10.0, metavar="S",
                   help="how long a later request waits for a missing seq_id")
    p.add_argument("--poll", type=float, default=25.0, metavar="S",
                   help="how long retrieve_future holds a pending future")
    p.add_argument("--result-ttl", type=float, default=3600.0, metavar="S")
    p.add_argument("--session-timeout", type=float, default=300.0, metavar="S",
                   help="end a session (unloading its models) after S seconds without a "
                        "heartbeat or request (the SDK heartbeats every 10 s)")
    p.add_argument("--seed", type=int, metavar="N",
                   help="derive the seeds a client leaves unset (samples, LoRA "
                        "initializations) from N, so that a run repeats (default: random)")
    p.add_argument("--log-level", default="info")
    return p


def build(args):
    """The ASGI app for parsed arguments."""
    from .app import make_app
    arch, ctx, eos = _model_facts(args.model_dir)
    if args.eos_token_ids:
        eos = [int(x) for x in args.eos_token_ids.split(",") if x.strip()]
    name = args.model_name or os.path.basename(os.path.normpath(args.model))
    groups = [[a.strip() for a in e.split(",") if a.strip()] for e in args.engined]
    init = {"model_path": args.model, "kv_cache_bytes": args.kv_cache_bytes}
    engines = Engines(groups, init, args.max_adapters,
                      {"token": args.token} if args.token else {})
    g = Gateway(engines, FutureStore(args.result_ttl), model_name=name,
                tokenizer_id=args.tokenizer or (os.path.abspath(args.model_dir)
                                                if args.model_dir else name),
                arch=arch, eos_token_ids=eos, max_context_length=ctx,
                lora_alpha=args.lora_alpha, checkpoint_root=args.checkpoint_root,
                gap_wait_s=args.seq_gap_wait, seed=args.seed,
                tokenizer=_tokenizer(args.model_dir), session_timeout_s=args.session_timeout)
    return make_app(g, KeyFile(args.api_keys), poll_s=args.poll)


def main(argv=None):
    args = parser().parse_args(argv)
    try:
        import uvicorn
    except ImportError:
        sys.exit("engined-tinker: needs the gateway's extra: pip install 'engined-client[tinker]'")
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    host, port = args.listen
    uvicorn.run(build(args), host=host, port=port, log_level=args.log_level.lower())


if __name__ == "__main__":
    main()
