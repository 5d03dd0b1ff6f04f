"""Task adapters: one module per task, each declaring its recipe keys and
turning a resolved recipe into data, a compiled model, an evaluation and an
export (see `base.Task`).

`TASKS` is found, not written: every module here except `base` defines one
`Task` subclass, so adding a task is adding its module (and its recipes).
TensorFlow is imported when a task loads its data, never by importing this
package."""

import importlib
import pkgutil

from keras_attn.zoo.tasks.base import Task


def find_tasks():
    """{task name: its `Task` subclass} of every module in this package."""
    tasks = {}
    for module_info in pkgutil.iter_modules(__path__):
        if module_info.name == "base" or module_info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{module_info.name}")
        found = [value for value in vars(module).values()
                 if isinstance(value, type) and issubclass(value, Task) and value is not Task
                 and value.__module__ == module.__name__]
        if len(found) != 1 or found[0].name != module_info.name:
            raise ImportError(f"{module.__name__} must define one Task subclass whose `name` "
                              f"is {module_info.name!r}. Received: {found}")
        tasks[module_info.name] = found[0]
    return dict(sorted(tasks.items()))


TASKS = find_tasks()


def families():
    """{family: [its tasks]} (a task that builds several families is in
    each: `Task.other_families`)."""
    found = {}
    for task in TASKS.values():
        for family in task.family_fields():
            found.setdefault(family, []).append(task.name)
    return {family: sorted(names) for family, names in found.items()}


def make_task(recipe):
    """The task adapter of a resolved recipe (nothing is loaded yet)."""
    return TASKS[recipe["task"]](recipe)
