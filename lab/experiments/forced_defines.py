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
