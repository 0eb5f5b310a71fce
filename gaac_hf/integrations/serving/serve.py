"""``gaac-serve``: ``transformers serve --continuous-batching`` with GAAC pages.

    gaac-serve --calibration smollm2-135m --kv-budget-gb 8 -- <transformers serve arguments>
    gaac-serve --calibration my-table.safetensors --kv-budget-gb 8 -- Qwen/Qwen3-8B --dtype bfloat16

The server loads its model when the first request comes and then builds its continuous-batching
manager with ``model.init_continuous_batching``. For the life of this process that method is wrapped
(:func:`gaac_server`): the manager it builds gets the GAAC serving config for that model (the budget
and limits given here, ``--cb-max-batch-tokens`` from the server's flags) inside
:func:`~gaac_hf.integrations.serving.gaac_serving`, so its paged cache keeps GAAC pages. Patched, and
restored when the server exits: ``ContinuousMixin.init_continuous_batching`` and what ``gaac_serving``
patches (``continuous_api.PagedAttentionCache``).

From transformers 5.25 the server loads each model in a process of its own (``multiprocessing`` spawn,
``transformers.cli.serving.model_manager.EngineClient.start_process``), which imports transformers afresh:
a wrap made in the server's process never reaches it. So :func:`gaac_server` also replaces the model
process's entry ``EngineClient.run_engine`` with :func:`_engine_under_gaac` (a picklable partial holding
the GAAC settings), which opens the same wrap inside the model's process before the engine runs.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import logging
import sys

import transformers

from . import DEFAULT_MAX_BATCH_TOKENS, DEFAULT_MAX_REQUESTS, DEFAULT_SLOT_FRACTION, gaac_serving

logger = logging.getLogger("gaac_hf.serving")


@contextlib.contextmanager
def gaac_server(calibration, *, kv_budget_bytes: int, slot_fraction: float = DEFAULT_SLOT_FRACTION,
                open_pages: int | None = None, max_requests_per_batch: int = DEFAULT_MAX_REQUESTS):
    """While open, every ``model.init_continuous_batching(...)`` builds a GAAC-paged manager (the
    server's entry); yields the list of :class:`~gaac_hf.integrations.serving.ServingSession`."""
    from transformers.generation.continuous_batching.continuous_api import ContinuousMixin

    original = ContinuousMixin.init_continuous_batching
    sessions, stack = [], contextlib.ExitStack()

    def init_continuous_batching(self, generation_config=None, continuous_batching_config=None, **kwargs):
        tokens = getattr(continuous_batching_config, "max_batch_tokens", None) or DEFAULT_MAX_BATCH_TOKENS
        session = stack.enter_context(gaac_serving(
            self, calibration, kv_budget_bytes=kv_budget_bytes, slot_fraction=slot_fraction, open_pages=open_pages,
            max_batch_tokens=tokens, max_requests_per_batch=max_requests_per_batch))
        sessions.append(session)
        logger.info("GAAC pages for %s: %d blocks of %d tokens, %d open BF16 pages, %d-byte slots", type(self).__name__,
                    session.config.num_blocks, session.page_size, session.open_pages, session.slot_bytes)
        return original(self, generation_config, session.config, **kwargs)

    engine_cls = _model_process_entry()
    if engine_cls is None and _serves_in_model_processes():
        raise RuntimeError(f"gaac-serve: this transformers ({transformers.__version__}) serves each model in a process of its "
                           f"own, but its entry {'.'.join(_ENGINE_ENTRY)} was not found, so GAAC pages would not reach it "
                           "(the server would run BF16 pages). Use a transformers release gaac-serve supports.")
    ContinuousMixin.init_continuous_batching = init_continuous_batching
    settings = dict(calibration=calibration, kv_budget_bytes=kv_budget_bytes, slot_fraction=slot_fraction,
                    open_pages=open_pages, max_requests_per_batch=max_requests_per_batch)
    if engine_cls is not None:
        original_entry = engine_cls.__dict__["run_engine"]
        engine_cls.run_engine = staticmethod(functools.partial(_engine_under_gaac, settings))
    try:
        with stack:
            yield sessions
    finally:
        ContinuousMixin.init_continuous_batching = original
        if engine_cls is not None:
            engine_cls.run_engine = original_entry


#: where transformers 5.25+ keeps the entry of a served model's own process (module, class, staticmethod)
_ENGINE_ENTRY = ("transformers.cli.serving.model_manager", "EngineClient", "run_engine")


def _model_process_entry():
    """The class whose ``run_engine`` a spawned model process runs (5.25+), or None where the server
    keeps its models in its own process (5.17-5.24; the server extras absent)."""
    module, cls, name = _ENGINE_ENTRY
    try:
        engine_cls = getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError):
        return None
    return engine_cls if isinstance(engine_cls.__dict__.get(name), staticmethod) else None


def _serves_in_model_processes() -> bool:
    """Whether this transformers' server loads models in processes of their own (5.25 on)."""
    return tuple(int(x) for x in transformers.__version__.split(".")[:2]) >= (5, 25)


def _engine_under_gaac(settings: dict, *args) -> None:
    """A served model's process (5.25+): the GAAC wrap of :func:`gaac_server` opened here, in the process
    that builds the manager, then transformers' own entry (looked up here, where nothing patched it)."""
    _log_to_stderr()
    module, cls, name = _ENGINE_ENTRY
    entry = getattr(getattr(importlib.import_module(module), cls), name)
    if isinstance(entry, functools.partial):  # the spawn re-imported nothing of ours: never expected
        raise RuntimeError("gaac-serve: the model process's engine entry is still wrapped")
    with gaac_server(**settings):
        entry(*args)


def _log_to_stderr() -> None:
    """The ``[gaac-serve]`` lines (the pool each manager gets) on stderr, once per process."""
    if not any(getattr(h, "_gaac", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[gaac-serve] %(message)s"))
        handler._gaac = True
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)


def _run_transformers_serve(argv: list[str]) -> None:
    """``transformers serve <argv>`` in this process (its own CLI application)."""
    from transformers.cli.transformers import app

    app(["serve", *argv], standalone_mode=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="gaac-serve", description=__doc__.split("\n\n")[0],
                                 epilog="Arguments after -- go to `transformers serve` (--continuous-batching is added).")
    ap.add_argument("--calibration", required=True, help="the model's calibration table: a shipped name or a path")
    ap.add_argument("--kv-budget-gb", type=float, required=True, help="GiB of the GAAC KV pool (slots, open pages, entries)")
    ap.add_argument("--slot-fraction", type=float, default=DEFAULT_SLOT_FRACTION)
    ap.add_argument("--open-pages", type=int, default=None)
    ap.add_argument("--max-requests-per-batch", type=int, default=DEFAULT_MAX_REQUESTS)
    argv = sys.argv[1:] if argv is None else argv
    ours, rest = (argv[: argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    args = ap.parse_args(ours)
    if args.kv_budget_gb <= 0:
        ap.error("--kv-budget-gb must be positive")
    _log_to_stderr()
    if "--continuous-batching" not in rest:
        rest = ["--continuous-batching", *rest]
    with gaac_server(args.calibration, kv_budget_bytes=int(args.kv_budget_gb * (1 << 30)), slot_fraction=args.slot_fraction,
                     open_pages=args.open_pages, max_requests_per_batch=args.max_requests_per_batch):
        _run_transformers_serve(rest)


if __name__ == "__main__":
    main()
