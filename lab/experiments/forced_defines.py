"""Lab helper: kernel defines forced into a launcher's plans (the product never imports lab/)."""


def force_defines(module, defines: dict) -> dict:
    """Wrap ``module.plan`` so each plan it returns carries ``defines`` on top of its own. Returns ``defines`` itself:
    a script that mutates it between launches changes what the next plan forces."""
    orig = module.plan

    def plan(*a, **kw):
        p = orig(*a, **kw)
        p["defines"].update(defines)
        return p

    module.plan = plan
    return defines


def write_ab(out: str, rows: list, repo) -> None:
    """An A/B file (rows of shape, batch, context, variant, us, bit_identical) with its commit, command and GPU, as
    ab_verdict.py reads it; the commit is $GAAC_COMMIT where a device script set it."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    import torch

    commit = os.environ.get("GAAC_COMMIT") or subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True,
                                                             text=True, cwd=repo).stdout.strip()
    Path(out).write_text(json.dumps(dict(commit=commit, command=" ".join(sys.argv), gpu=torch.cuda.get_device_name(),
                                         versions=dict(torch=torch.__version__), rows=rows), indent=1))
    print("wrote", out)
