"""lm-evaluation-harness integration: the ``hf-gaac`` model (:mod:`.model`), the ``gaac-lm-eval``
command (:mod:`.cli`) and the offline tasks shipped as package data (``tasks/``).

Importing this package does not import lm-eval; importing :mod:`.model` does, and registers ``hf-gaac``.
"""
from pathlib import Path

#: the shipped task folder (YAML + ``gaac_tasks.py``), for lm-eval's ``--include_path``
TASKS_DIR = Path(__file__).resolve().parent / "tasks"


def tasks_dir() -> Path:
    return TASKS_DIR



def only_shipped(tasks) -> bool:
    """Whether every name in ``tasks`` is a task of the shipped folder (then lm-eval's own index of
    ~14k YAML files, 15 s or more to build on a small CPU, is not needed). Imports lm-eval."""
    from lm_eval.tasks import TaskManager

    shipped = TaskManager(include_path=str(TASKS_DIR), include_defaults=False).all_tasks
    return all(t in shipped for t in tasks)


def task_manager(tasks=()):
    """An lm-eval ``TaskManager`` that finds the shipped tasks, and lm-eval's own ones only when one of
    ``tasks`` is not shipped, so ``lm_eval.simple_evaluate(model=..., tasks=["gaac_piqa"],
    task_manager=task_manager(["gaac_piqa"]))`` starts at once. (Imports lm-eval.)"""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=str(TASKS_DIR), include_defaults=not only_shipped(tasks))
