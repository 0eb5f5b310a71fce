"""Lab probe (session 39): the device time one kernel boundary costs inside a replayed CUDA graph.

    python lab/experiments/graph_gaps/probe.py --out FILE.json

Graphs of N launches of two trivial kernels (probe.cu): all `small` (no shared memory), all `big` (one CTA per SM
with ~200 KB of dynamic shared memory each, as our attention kernel and cuBLAS's TMA GEMMs take), `big` launched in
clusters of 2 (cuBLAS's nvjet GEMMs in the e2e tables are 2x1-cluster kernels), alternating
(a shared-memory carveout change at every boundary, if the driver reconfigures), alternating with the small
kernel's preferred carveout set to the maximum (no change needed), and each again with programmatic dependent
launch (GAAC_PDL=1 builds; launched early, wait in-kernel). Per graph: median replay time over N (CUDA events
around each replay) -> microseconds per launch; with the kernels' own duration nearly zero this is the boundary
cost. Answers issue 15's open question: are the 1-2.4 us per kernel of the e2e graphs launch latency (PDL hides
it), carveout changes (the alternating rows), or neither (then they are the kernels' own tails)."""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))
SOURCE = "../../lab/experiments/graph_gaps/probe.cu"  # relative to kernels/cuda (runtime.HERE)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=400, help="launches per graph")
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--smem", type=int, default=200 * 1024)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    from gaac_hf.kernels.cuda import runtime

    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    x = torch.zeros(1, dtype=torch.int32, device=dev)
    rows = []

    def carveout(kernel, percent):
        runtime.set_kernel_attribute(kernel, "CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT", percent, dev.index or 0)

    for pdl in (0, 1):
        mod = runtime.load(SOURCE, {"GAAC_PDL": pdl} if pdl else {}, dev)

        def small():
            runtime.launch(mod, "probe_small", (1,), (32,), 0, x, device=dev)

        def big():
            runtime.launch(mod, "probe_big", (sms,), (256,), args.smem, x, np.int32(args.smem), device=dev)

        def big_cluster():  # cuBLAS's nvjet GEMMs of the e2e tables run in 2x1 clusters: does a cluster launch cost more?
            stream = runtime._stream_for(torch.cuda.current_stream(dev).cuda_stream, dev.index or 0)
            kernel = mod.kernel("probe_big")
            runtime._set_max_dynamic_smem(kernel, args.smem, dev.index or 0)
            cfg = runtime._cc.LaunchConfig(grid=(sms // 2,), cluster=(2,), block=(256,), shmem_size=args.smem,
                                           programmatic_stream_serialization=bool(pdl))
            runtime._cc.launch(stream, cfg, kernel, x.data_ptr(), np.int32(args.smem))

        patterns = {"small": [small], "big": [big], "alternating": [big, small], "cluster2": [big_cluster],
                    "alternating_cluster2": [big_cluster, small]}
        for carve in ("default", "max"):
            if carve == "max":
                carveout(mod.kernel("probe_small"), 100)
            for name, seq in patterns.items():
                if carve == "max" and name != "alternating":
                    continue
                fns = [seq[i % len(seq)] for i in range(args.n)]
                for f in fns[:4]:
                    f()
                torch.cuda.synchronize()
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    for f in fns:
                        f()
                x.zero_()
                t = []
                for _ in range(args.reps):
                    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    a.record()
                    g.replay()
                    b.record()
                    b.synchronize()
                    t.append(a.elapsed_time(b) * 1e3)
                ok = int(x.item()) == args.reps * args.n  # every launch ran, in order, once per replay (block 0 adds 1)
                rows.append({"pattern": name, "carveout_small": carve, "pdl": bool(pdl), "launches": args.n,
                             "us_per_launch": round(statistics.median(t) / args.n, 3), "count_ok": ok})
                print(f"pdl={pdl} {name:12s} carveout={carve:7s} {rows[-1]['us_per_launch']:.3f} us/launch ok={ok}")
                del g
            carveout(mod.kernel("probe_small"), -1)
    out = {"gpu": torch.cuda.get_device_name(), "commit": os.environ.get("GAAC_COMMIT"), "torch": torch.__version__,
           "command": "python " + " ".join(sys.argv), "smem_bytes": args.smem, "sms": sms, "rows": rows}
    Path(args.out).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
