"""dp_multi_gpu.py — the data-parallel engine on N GPUs through
EngineGroup (NCCL): 3 SFT steps over the group match one daemon on the
whole batch (tests/gpu/run_multi_gpu.sh starts the daemons; the last
address is the reference). Prints the largest parameter difference and
the step times; exits 1 on a mismatch."""
import sys
import time

import numpy as np

from engined_client import EngineClient, EngineGroup

addrs, ref_addr = sys.argv[1:-1], sys.argv[-1]
init = dict(preset="small", seed=3, device="cuda",
            optimizer={"lr": 1e-4, "weight_decay": 0.0})
rng = np.random.default_rng(0)
lens = [256] * (8 * len(addrs))
ids = rng.integers(0, 1000, sum(lens)).astype(np.int32)
with EngineGroup(addrs, timeout=600) as g, EngineClient(ref_addr, timeout=600) as ref:
    g.initialize(dist_timeout_s=120, **init)
    ref.initialize(replace=True, **init)
    for step in range(3):
        t = time.monotonic()
        g.forward_backward(ids, lens, loss="sft")
        sg = g.optimizer_step()
        dt = time.monotonic() - t
        ref.forward_backward(ids, lens, loss="sft")
        sr = ref.optimizer_step()
        print("step %d: grad norm %.6g (one daemon %.6g), group step %.3f s"
              % (step, sg.grad_norm, sr.grad_norm, dt))
    w_ref = dict(ref.stream_weights())
    worst = 0.0
    for r, c in enumerate(g.clients):
        w = dict(c.stream_weights())
        worst = max(worst, max(float(np.max(np.abs(w[k] - w_ref[k]))) for k in w_ref))
    print("max |param - one daemon| over %d ranks: %.3g" % (len(addrs), worst))
    sys.exit(0 if worst <= 3e-6 else 1)
