"""The shop's tasks, for Django's Tasks framework on duejobs."""

from typing import Any

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task


@task
def add(a: int, b: int) -> int:
    return a + b


@task(queue_name="reports")
def report(name: str) -> dict[str, Any]:
    return {"report": name, "rows": [1, 2, 3]}


@task
def explode() -> None:
    raise RuntimeError("the task failed on purpose")


@task
def too_big() -> str:
    return "x" * 5000


@task(takes_context=True)
def which_attempt(context: Any) -> int:
    return int(context.attempt)


@task
async def add_later(a: int, b: int) -> int:
    return a + b
