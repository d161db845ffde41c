"""Flow definitions in Python: steps, map steps, dependencies and options.

A :class:`Flow` is the Python counterpart of a pgflow flow definition. Its
:meth:`Flow.shape` is the JSON document a worker sends to the database at startup
(``ensure_flow_compiled``), so the database can create, verify or refuse the
definition (spec "Startup compilation"). Handlers are plain Python callables.

Handler input (same rules as the database builds them):

* a root single step receives the run input;
* a dependent single step receives ``{dependency_slug: dependency_output, ...}`` of its
  completed dependencies (skipped dependencies are absent);
* a map step receives one element of its array (the run input for a root map, else the
  output of its single dependency).

Every handler is called as ``handler(input, context)`` with a :class:`TaskContext` (a handler
that takes a single argument is called as ``handler(input)``) and must return a JSON-serialisable
value (the task output). A handler is a plain function
(run in one of the worker's threads) or an ``async def`` function (run on the worker's event
loop); both kinds may be mixed in one flow and share the worker's ``max_concurrent`` slots.

A flow is immutable: ``.step()`` and ``.map()`` return a new flow with one more step, so a flow
another module holds (a worker's, a ``with_step_queues()`` deployment's) never changes under it.
Definition errors raise :class:`~pgflow_cli.worker.errors.DefinitionError` before any database
access.

Manual steps (``manual=True``, no handler; docs/manual-tasks.md) have no queue and no worker:
when one becomes ready the database creates its task rows (one for a single step, one per item
for a map step) and trusted server code finishes them with ``pgflow.complete_manual_task`` /
``pgflow.fail_manual_task`` (:mod:`pgflow_cli.operations.manual_tasks`). A manual single step
whose output is an array can feed a map step (an "array" step). The shape marks such a step
``"executionMode": "manual"``; switching a step between manual and queue-backed is a shape change
(a new concrete flow slug in production).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar, Generic

from typing_extensions import TypeVar

from pgflow_cli import naming
from pgflow_cli.errors import UsageError
from pgflow_cli.worker.context import TaskContext
from pgflow_cli.worker.errors import DefinitionError

WHEN_VALUES = ("fail", "skip", "skip-cascade")

StepSlug = TypeVar("StepSlug", bound=str, default=str)
"""The step slugs of a flow as a type: ``str`` by default, or a ``Literal[...]`` union the
author declares (``Flow[Literal["fetch", "parse"]]("scrape")``) so a type checker rejects a
misspelt step in ``.step()``, ``depends_on``, ``with_step_queues`` and ``step_worker``."""


Handler = Callable[[Any, TaskContext], Any] | Callable[[Any], Any]
"""``handler(input, context) -> output``, or ``handler(input) -> output`` for a handler that needs
no context; an ``async def`` handler returns a coroutine of the output."""


def is_async_handler(handler: object) -> bool:
    """Whether ``handler`` is an ``async def`` function (also through ``functools.partial``, or a
    callable object whose ``__call__`` is one)."""
    if inspect.iscoroutinefunction(handler):
        return True
    call = type(handler).__dict__.get("__call__") if not inspect.isroutine(handler) else None
    return inspect.iscoroutinefunction(call)


def takes_context(handler: object) -> bool:
    """Whether the worker calls ``handler(input, context)`` (True) or ``handler(input)``: the second
    form only for a handler whose signature takes exactly one argument. A callable whose signature
    cannot be read gets the context."""
    try:
        signature = inspect.signature(handler)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return True
    try:
        signature.bind(None, None)
        return True
    except TypeError:
        return False


def _check_handler(where: str, handler: object) -> None:
    """Refuse, at definition, a handler the worker could never call or whose result it could never store.

    Raises:
        DefinitionError: not callable; a generator or async generator function (its result is an
            iterator, not an output); a signature that takes neither ``(input, context)`` nor ``(input)``.
    """
    if not callable(handler):
        raise DefinitionError(f"{where}: the handler must be callable, got {type(handler).__name__}")
    if inspect.isasyncgenfunction(handler) or inspect.isgeneratorfunction(handler):
        raise DefinitionError(f"{where}: the handler is a generator function; a handler returns its output",
                              hint="return a list (or build the output) instead of yielding items")
    try:
        signature = inspect.signature(handler)
    except (TypeError, ValueError):  # a builtin or extension callable without a readable signature
        return
    for arguments in ((None, None), (None,)):
        try:
            signature.bind(*arguments)
            return
        except TypeError:
            continue
    raise DefinitionError(f"{where}: the handler must accept (input, context) or (input); its signature is {signature}",
                          hint="e.g. def handler(value, ctx): ...; ctx is the TaskContext")


@dataclass(frozen=True)
class StepDefinition:
    """One step of a flow (immutable once added). ``handler`` is ``None`` exactly for a manual step."""

    slug: str
    handler: Handler | None
    step_type: str
    dependencies: tuple[str, ...]
    max_attempts: int | None = None
    base_delay: int | None = None
    timeout: int | None = None
    start_delay: int | None = None
    required_input_pattern: Mapping[str, Any] | None = None
    forbidden_input_pattern: Mapping[str, Any] | None = None
    when_unmet: str = "skip"
    when_exhausted: str = "fail"
    manual: bool = False

    @cached_property
    def is_async(self) -> bool:
        """Whether the handler is an ``async def`` function (run on the worker's event loop)."""
        return is_async_handler(self.handler)

    @cached_property
    def takes_context(self) -> bool:
        """Whether the handler is called with the context as its second argument (see :func:`takes_context`)."""
        return takes_context(self.handler)

    def call(self, value: Any, context: TaskContext) -> Any:
        """Call the handler with ``value`` (and ``context`` when it takes one); the coroutine of an
        ``async def`` handler.

        Raises:
            DefinitionError: a manual step (no handler).
        """
        if self.handler is None:
            raise DefinitionError(f"step {self.slug!r} is manual: it has no handler")
        if self.takes_context:
            return self.handler(value, context)  # type: ignore[call-arg]
        return self.handler(value)  # type: ignore[call-arg]

    def shape(self) -> dict[str, Any]:
        """The step's part of the startup shape document."""
        options = {
            key: value
            for key, value in (
                ("maxAttempts", self.max_attempts),
                ("baseDelay", self.base_delay),
                ("timeout", self.timeout),
                ("startDelay", self.start_delay),
            )
            if value is not None
        }
        shape = {
            "slug": self.slug,
            "stepType": self.step_type,
            "dependencies": sorted(self.dependencies),
            "options": options,
            "whenUnmet": self.when_unmet,
            "whenExhausted": self.when_exhausted,
            "requiredInputPattern": _pattern(self.required_input_pattern),
            "forbiddenInputPattern": _pattern(self.forbidden_input_pattern),
        }
        if self.manual:  # queue-backed steps keep the released shape (the database's _get_flow_shape)
            shape["executionMode"] = "manual"
        return shape


def _pattern(value: Mapping[str, Any] | None) -> dict[str, Any]:
    return {"defined": False} if value is None else {"defined": True, "value": dict(value)}


@dataclass(frozen=True)
class Flow(Generic[StepSlug]):
    """A flow definition: an ordered list of steps forming a DAG. Immutable: ``.step()`` and
    ``.map()`` return a new flow.

    A plain flow runs every step from one queue, ``lower(slug)``, served by whole-flow
    workers. :func:`with_step_queues` turns a finished flow into a :class:`StepQueuedFlow`
    (one private queue per step). The optional type parameter is the union of the step
    slugs (``Flow[Literal["a", "b"]]``); without it step slugs are plain ``str``.

    Args:
        slug: the concrete flow slug (checked against the slug rules unless
            ``legacy_slugs`` is set, which allows names the released baseline accepted).
        max_attempts: total attempts per task (flow default; database default 3).
        base_delay: seconds; retry n waits ``base_delay * 2**attempts`` (database default 5).
        timeout: seconds a task may run before its message becomes visible again
            (database default 60).
        legacy_slugs: accept slugs that only the pre-upgrade rule allows (sandbox demo).
        steps: the steps so far (``.step()`` and ``.map()`` add to a copy).

    Raises:
        DefinitionError: invalid slugs, duplicate or unknown dependencies, bad options or handlers.
    """

    slug: str
    max_attempts: int | None = None
    base_delay: int | None = None
    timeout: int | None = None
    legacy_slugs: bool = False
    steps: tuple[StepDefinition, ...] = ()

    queue_mode: ClassVar[str] = "flow"
    """``flow``: every step on the default queue ``lower(slug)`` (spec "Compatibility defaults")."""

    def __post_init__(self) -> None:
        self._check_slug(self.slug, "flow slug")
        object.__setattr__(self, "steps", tuple(self.steps))
        _check_options(self.slug, max_attempts=self.max_attempts, base_delay=self.base_delay, timeout=self.timeout)

    # building ----------------------------------------------------------------
    def step(
        self,
        slug: StepSlug,
        handler: Handler | None = None,
        *,
        manual: bool = False,
        depends_on: Iterable[StepSlug] = (),
        max_attempts: int | None = None,
        base_delay: int | None = None,
        timeout: int | None = None,
        start_delay: int | None = None,
        if_: Mapping[str, Any] | None = None,
        if_not: Mapping[str, Any] | None = None,
        when_unmet: str = "skip",
        when_exhausted: str = "fail",
    ) -> Flow[StepSlug]:
        """A new flow with one more single step (one task per run); this flow is unchanged.

        ``manual=True`` declares a manual step: no handler (``handler`` must be omitted), no queue,
        its one task (index 0) is completed by trusted code; options other than the conditions and
        ``when_*`` policies have no effect on it. Otherwise ``handler`` is required.
        """
        return self._add(
            StepDefinition(
                slug=slug,
                handler=handler,
                manual=manual,
                step_type="single",
                dependencies=tuple(depends_on),
                max_attempts=max_attempts,
                base_delay=base_delay,
                timeout=timeout,
                start_delay=start_delay,
                required_input_pattern=if_,
                forbidden_input_pattern=if_not,
                when_unmet=when_unmet,
                when_exhausted=when_exhausted,
            )
        )

    def map(
        self,
        slug: StepSlug,
        handler: Handler | None = None,
        *,
        manual: bool = False,
        array: StepSlug | None = None,
        max_attempts: int | None = None,
        base_delay: int | None = None,
        timeout: int | None = None,
        start_delay: int | None = None,
        when_unmet: str = "skip",
        when_exhausted: str = "fail",
    ) -> Flow[StepSlug]:
        """A new flow with one more map step: one task per element of ``array`` (a dependency slug) or
        of the run input; this flow is unchanged.

        ``manual=True``: no handler; one manual task per element (task_index = element index), the
        step's output is the task outputs in task_index order.
        """
        return self._add(
            StepDefinition(
                slug=slug,
                handler=handler,
                manual=manual,
                step_type="map",
                dependencies=(array,) if array else (),
                max_attempts=max_attempts,
                base_delay=base_delay,
                timeout=timeout,
                start_delay=start_delay,
                when_unmet=when_unmet,
                when_exhausted=when_exhausted,
            )
        )

    def _add(self, step: StepDefinition) -> Flow[StepSlug]:
        self._check_slug(step.slug, "step slug")
        if step.manual and step.handler is not None:
            raise DefinitionError(f"flow {self.slug!r}: manual step {step.slug!r} has no handler (trusted code completes it)",
                             hint="drop the handler, or drop manual=True for a queue-backed step")
        if not step.manual and step.handler is None:
            raise DefinitionError(f"flow {self.slug!r}: step {step.slug!r} needs a handler, or manual=True")
        if not step.manual:
            _check_handler(f"flow {self.slug!r}: step {step.slug!r}", step.handler)
        existing = {s.slug for s in self.steps}
        if step.slug in existing:
            raise DefinitionError(f"flow {self.slug!r}: step {step.slug!r} is defined twice")
        if not self.legacy_slugs:
            folded = {naming.normalized_slug(s) for s in existing}
            if naming.normalized_slug(step.slug) in folded:
                raise DefinitionError(f"flow {self.slug!r}: step {step.slug!r} differs from another step only by case")
        unknown = [dep for dep in step.dependencies if dep not in existing]
        if unknown:
            raise DefinitionError(
                f"flow {self.slug!r}: step {step.slug!r} depends on undefined step(s) {', '.join(map(repr, unknown))}",
                hint="define dependencies before the steps that use them",
            )
        if len(set(step.dependencies)) != len(step.dependencies):
            raise DefinitionError(f"flow {self.slug!r}: step {step.slug!r} lists a dependency twice")
        for value, what in ((step.when_unmet, "when_unmet"), (step.when_exhausted, "when_exhausted")):
            if value not in WHEN_VALUES:
                raise DefinitionError(f"flow {self.slug!r}: step {step.slug!r}: {what} must be one of {', '.join(WHEN_VALUES)}")
        _check_options(f"{self.slug}.{step.slug}", max_attempts=step.max_attempts, base_delay=step.base_delay,
                       timeout=step.timeout, start_delay=step.start_delay)
        return dataclasses.replace(self, steps=(*self.steps, step))

    def _check_slug(self, slug: str, what: str) -> None:
        if self.legacy_slugs:
            reasons = [r for r in naming.slug_violations(slug) if r not in naming.NEW_RULE_REASONS]
            if reasons:
                raise DefinitionError(f"{what} {slug!r} is not valid even under the released rule: {naming.describe_reasons(reasons)}")
        else:
            try:
                naming.validate_slug(slug, what=what)
            except UsageError as exc:
                raise DefinitionError.from_usage(exc) from None

    # reading -----------------------------------------------------------------
    def get_step(self, slug: str) -> StepDefinition:
        """The step called ``slug``.

        Raises:
            KeyError: no such step.
        """
        for step in self.steps:
            if step.slug == slug:
                return step
        raise KeyError(slug)

    @property
    def step_slugs(self) -> Sequence[str]:
        """Step slugs in definition order (the order of ``step_index``)."""
        return [s.slug for s in self.steps]

    def shape(self) -> dict[str, Any]:
        """The structural definition sent at worker startup (options included but not compared)."""
        if not self.steps:
            raise DefinitionError(f"flow {self.slug!r} has no steps")
        options = {
            key: value
            for key, value in (("maxAttempts", self.max_attempts), ("baseDelay", self.base_delay), ("timeout", self.timeout))
            if value is not None
        }
        return {"steps": [step.shape() for step in self.steps], "options": options}


def _check_options(where: str, **values: int | None) -> None:
    for name, value in values.items():
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            raise DefinitionError(f"{where}: {name} must be a whole number of seconds/attempts, got {value!r}")
        if name == "timeout" and value <= 0:
            raise DefinitionError(f"{where}: timeout must be at least 1 second, got {value}")
        if value < 0:
            raise DefinitionError(f"{where}: {name} must not be negative, got {value}")


class StepQueuedFlow(Generic[StepSlug]):
    """A flow deployed with one private generated queue per step (spec "Stage 2").

    Made only by :func:`with_step_queues`. It has exactly the steps, handlers and shape of
    the (immutable) flow it was made from, plus the complete route map ``{step_slug: queue_name}``, checked
    whole by :func:`pgflow_cli.naming.step_queue_routes` before any database is contacted.
    Every worker of it serves exactly one step (:func:`pgflow_cli.worker.step_worker`).

    It deliberately is not a :class:`Flow` subclass, so a type checker refuses it where a
    plain flow is expected (``flow_worker``) and the reverse.

    Attributes:
        slug: the concrete flow slug.
        steps: the step definitions in definition order (index = ``step_index``).
        routes: ``{step_slug: queue_name}`` in definition order, for the queue-backed steps (a
            manual step has no queue and no worker; the route map lists it with queueName null).
    """

    queue_mode: ClassVar[str] = "step"
    """``step``: each step on its own generated queue; there is no default queue."""

    def __init__(self, flow: Flow[StepSlug], routes: Mapping[str, str]) -> None:
        self._flow = flow
        self.slug = flow.slug
        self.steps: tuple[StepDefinition, ...] = tuple(flow.steps)
        self.routes: dict[str, str] = dict(routes)

    def __repr__(self) -> str:
        return f"StepQueuedFlow({self.slug!r}, steps={list(self.routes)!r})"

    @property
    def step_slugs(self) -> Sequence[str]:
        """Step slugs in definition order (the order of ``step_index``)."""
        return [s.slug for s in self.steps]

    def get_step(self, slug: str) -> StepDefinition:
        """The step called ``slug``.

        Raises:
            KeyError: no such step.
        """
        return self._flow.get_step(slug)

    def queue_for(self, step_slug: StepSlug) -> str:
        """The private queue of one step.

        Raises:
            DefinitionError: the flow has no such step, or the step is manual (no queue, no worker;
                exit 2), naming the steps a worker can serve.
        """
        if step_slug in self.step_slugs and step_slug not in self.routes:
            raise DefinitionError(
                f"step {step_slug!r} of flow {self.slug!r} is manual: it has no queue and no worker",
                hint="trusted code completes its tasks (docs/manual-tasks.md); a step worker serves one of: "
                + ", ".join(self.routes),
            )
        try:
            return self.routes[step_slug]
        except KeyError:
            raise DefinitionError(
                f"flow {self.slug!r} has no step {step_slug!r}",
                hint="a step worker serves one of: " + ", ".join(self.routes),
            ) from None

    def route_map(self) -> list[dict[str, str | None]]:
        """The ordered route map sent at startup: ``[{"stepSlug", "queueName"}, ...]`` (every step in
        definition order; ``queueName`` is ``None`` for a manual step, as the database derives it)."""
        return [{"stepSlug": step, "queueName": self.routes.get(step)} for step in self.step_slugs]

    def shape(self) -> dict[str, Any]:
        """The structural definition sent at worker startup, the same as the plain flow's."""
        return self._flow.shape()


def with_step_queues(flow: Flow[StepSlug]) -> StepQueuedFlow[StepSlug]:
    """Opt a finished flow into private per-step queues (spec "Compatibility defaults").

    Args:
        flow: a flow with at least one step, built under the current slug rules.

    Returns:
        A :class:`StepQueuedFlow` with exactly the same step slugs (and the same step-slug
        type) whose every step gets the generated queue ``lower(flow__step)``, or
        ``lower(flow__<index>)`` when that does not fit 47 characters; manual steps get none.

    Raises:
        DefinitionError: the flow has no steps, was built with ``legacy_slugs``, or any step
            cannot get a queue name; every problem is listed and nothing is partial (exit 2).
            This check runs here, before any database access; SQL repeats it at startup.
    """
    if not isinstance(flow, Flow):
        raise DefinitionError(f"with_step_queues() takes a Flow, got {type(flow).__name__}")
    if flow.legacy_slugs:
        raise DefinitionError(f"flow {flow.slug!r} was built with legacy_slugs; private step queues need the current slug rules")
    if not flow.steps:
        raise DefinitionError(f"flow {flow.slug!r} has no steps", hint="add its steps before with_step_queues()")
    manual = {s.slug for s in flow.steps if s.manual}
    try:
        routes = naming.step_queue_routes(flow.slug, flow.step_slugs, manual)
    except UsageError as exc:
        raise DefinitionError.from_usage(exc) from None
    return StepQueuedFlow(flow, routes)


FlowDefinition = Flow[Any] | StepQueuedFlow[Any]
"""What a worker can serve: a plain flow or a step-queued flow."""
