"""The todos API (SPEC "Interfaces"). Each view validates its input serializer, makes one call into
todos/queue/ (or a read cut to the caller's scopes), and renders the output serializer. Views never
write state. Errors are raised and rendered by switchboard.api.exception_handler."""

from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any

from asgiref.sync import async_to_sync
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db.models import Q
from django.http import HttpRequest, HttpResponse, HttpResponseBase, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import exceptions, generics, serializers
from rest_framework.exceptions import PermissionDenied
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.utils.urls import replace_query_param
from rest_framework.views import APIView

from switchboard import executor, ids
from switchboard.api import STATUS_BY_CODE, CreatedCursorPagination, SafeJSONParser, error_body, exception_handler
from todos import auth, budgets, controls, explain, flow, longpoll, queue, results, selectors, states, tracing
from todos.api import schema as docs
from todos.api.batch import batch_parent, valid_batch
from todos.api.serializers import (
    BatchCompleteInput,
    BatchCompleteResultSerializer,
    BatchCreateInput,
    BatchCreateResultSerializer,
    BudgetInput,
    CancelInput,
    ClaimedSerializer,
    ClaimNextInput,
    ClaimOneInput,
    CompleteInput,
    CreatedTodoSerializer,
    FailInput,
    HeartbeatInput,
    LimitInput,
    LimitSerializer,
    QueueControlsSerializer,
    QueueLimitsInput,
    QueueListSerializer,
    ReleaseInput,
    ResolvedSerializer,
    ResolveInput,
    RetryInput,
    ScheduleListSerializer,
    ScheduleSerializer,
    TodoAwaitInput,
    TodoCreateInput,
    TodoListFilter,
    TodoPatchInput,
    TodoSerializer,
    TreeInput,
    TreePageSerializer,
    WaitingTodoSerializer,
    WaitInput,
    WaitpointResolveInput,
    batch_outcomes,
)
from todos.auth import caller_agent
from todos.errors import TodoNotFound
from todos.limits import LONG_POLL_MAX_SECONDS, MAX_COMPLETE_BATCH, MAX_CREATE_BATCH, MAX_TREE_DEPTH, MAX_TREE_PAGE
from todos.models import Agent, Schedule, Todo, hash_token


def _valid(serializer_class: type[serializers.Serializer[Any]], data: Any) -> dict[str, Any]:
    serializer = serializer_class(data=data)
    serializer.is_valid(raise_exception=True)
    return dict(serializer.validated_data)


def _todo_id(todo_id: str) -> str:
    if not ids.is_id(todo_id, ids.TODO):
        raise TodoNotFound(f"No todo {todo_id[:40]!r}.")
    return todo_id


def _render(todo: Todo, status: int = 200) -> Response:
    return Response(TodoSerializer(todo).data, status=status)


CHANGE_TODO_NEEDED = "This needs the todos.change_todo permission, as in the admin."


def _refused(agent: Agent, todo_id: str, detail: str) -> PermissionDenied:
    """404 for a todo the caller cannot see (ids do not leak), else the 403 to raise."""
    if not Todo.objects.visible_to(agent).filter(pk=todo_id).exists():
        raise TodoNotFound(f"No todo {todo_id}.")
    return PermissionDenied(detail)


def _staff_agent(request: Request, todo_id: str) -> Agent:
    """The caller's agent, if the caller is a staff user with the todos.change_todo permission (as the
    admin's actions ask); otherwise 404 for a todo it cannot see and 403 for one it can."""
    agent = caller_agent(request)
    if not auth.is_staff_session(agent):
        raise _refused(agent, todo_id, "Only staff may do this.")
    if not agent.can_retry_dead_letters:
        raise _refused(agent, todo_id, CHANGE_TODO_NEEDED)
    return agent


def _operating_agent(request: Request, todo_id: str) -> Agent:
    """The caller, for what an agent in scope may do to a todo and staff may do as operators (cancel,
    resolve): a staff session needs todos.change_todo, as in the admin."""
    agent = caller_agent(request)
    if auth.is_staff_session(agent) and not agent.can_retry_dead_letters:
        raise _refused(agent, todo_id, CHANGE_TODO_NEEDED)
    return agent


def _creating_agent(request: Request) -> Agent:
    agent = caller_agent(request)
    if auth.is_staff_session(agent) and not agent.create_scopes:
        raise PermissionDenied("Creating todos needs the todos.add_todo permission.")
    return agent


class TodoListCreateApi(generics.GenericAPIView[Todo]):
    serializer_class = TodoSerializer

    def get_queryset(self) -> Any:
        # The caller's scopes cut the queryset before anything else: nothing outside them is listed.
        todos = Todo.objects.visible_to(caller_agent(self.request))
        filters = _valid(TodoListFilter, self.request.query_params)
        for field in ("queue", "state", "kind", "assignee", "fair_key"):
            if field in filters:
                todos = todos.filter(**{field: filters[field]})
        if "root" in filters:  # the root itself (by its primary key) and its descendants (todo_tree)
            todos = todos.filter(Q(pk=filters["root"]) | Q(root_id=filters["root"]))
        if filters.get("dead") is True:
            todos = todos.dead_lettered()
        elif filters.get("dead") is False:
            todos = todos.exclude(states.DEAD_LETTER.q)
        return todos

    @extend_schema(
        operation_id="todos_list",
        summary="List todos",
        description="Todos in the caller's scopes, newest first, with cursor pagination (`next`/`previous`).",
        parameters=[
            OpenApiParameter("queue", str, description="exact queue name"),
            OpenApiParameter("state", str, enum=list(states.TodoState.values)),
            OpenApiParameter("kind", str),
            OpenApiParameter("assignee", str),
            OpenApiParameter("dead", bool, description="true: dead-letters only; false: no dead-letters"),
            OpenApiParameter("root", str, description="a tree: this root and its descendants"),
        ],
        **docs.documented(TodoSerializer(many=True), (400, 401), docs.TODO_LIST_EXAMPLES),
    )
    def get(self, request: Request) -> Response:
        page = self.paginate_queryset(self.get_queryset())
        selectors.show_awaited(page or [])
        selectors.show_blocked(page or [])
        assert isinstance(self.paginator, CreatedCursorPagination)
        # Whole todos are heavy (payload, result, checkpoint, resolution): the page stops at a byte budget.
        return self.get_paginated_response(self.paginator.within_bytes(lambda todo: TodoSerializer(todo).data))

    @extend_schema(
        operation_id="todos_create",
        summary="Create a todo",
        description="201 with `created: true`; or 200 with the existing runnable todo and `created: false` "
        "when one holds the same (queue, idempotency_key). The queue must be in the caller's create scopes.",
        request=TodoCreateInput,
        **docs.documented(
            {201: CreatedTodoSerializer, 200: CreatedTodoSerializer}, (400, 401, 413), docs.CREATE_EXAMPLES
        ),
    )
    def post(self, request: Request) -> Response:
        data = _valid(TodoCreateInput, request.data)
        # W3C Trace Context travels as a header: an instrumented client's current trace, unless the body
        # names one (a malformed header is ignored, as the standard says).
        if data["traceparent"] is None and tracing.parse(header := request.headers.get("traceparent")):
            data["traceparent"] = header
        todo, created = queue.create(agent=_creating_agent(request), **data)
        todo.created = created  # type: ignore[attr-defined]
        return Response(CreatedTodoSerializer(todo).data, status=201 if created else 200)


class _WaitsOnTheLoop(APIView):
    """A view some of whose requests wait (``runs_async``): under ASGI those go to its ``waiting_view``, on
    the event loop (switchboard/asgi.py), outside DRF's sync dispatch, where they wait holding no thread
    and no connection. This is how such a view learns who is calling."""

    @classmethod
    def _for(cls, request: HttpRequest, *args: Any, **kwargs: Any) -> _WaitsOnTheLoop:
        view = cls()
        view.setup(request, *args, **kwargs)
        view.args, view.kwargs = args, kwargs
        view.headers = view.default_response_headers
        return view

    async def _caller(self, request: HttpRequest) -> Agent:
        """A bearer token whose agent is cached costs no query; other callers (a staff session, with its
        CSRF check) go through DRF's own authentication, in the pool."""
        token = auth.bearer_token(request.headers.get("Authorization", "").encode("latin-1"))
        if token is not None:
            cached = auth.token_cache.cached(hash_token(token))
            agent = cached if cached is not None else await executor.run(auth.agent_for_token, token)
            budgets.request_rate.charge(agent)
        else:
            agent = await executor.run(self._session_caller, request)
        request.auth = agent  # type: ignore[attr-defined]  # for the request's log line
        return agent

    def _session_caller(self, request: HttpRequest) -> Agent:
        drf_request = self.initialize_request(request)
        self.initial(drf_request)  # authentication (CSRF for sessions) and permissions
        return caller_agent(drf_request)


class TodoBatchCreateApi(APIView):
    @extend_schema(
        operation_id="todos_create_many",
        summary="Create many todos",
        description=f"Up to {MAX_CREATE_BATCH} creates in one transaction, each item a create's body, plus "
        "`depends_on_index`: earlier items of this batch it depends on. All or nothing: one invalid item (400), "
        "or a dependency you cannot see (404), writes nothing and names the item as `todos.<index>.<field>`. "
        "Otherwise one outcome per item, in order: `status` 201 created, or 200 for the runnable todo that holds "
        "its idempotency key, with the todo's `id` and `state` (GET it for the rest).",
        request=BatchCreateInput,
        **docs.documented(BatchCreateResultSerializer, (400, 401, 404, 413), docs.BATCH_CREATE_EXAMPLES),
    )
    def post(self, request: Request) -> Response:
        items, parent = valid_batch(request.data), batch_parent(request.data)
        outcomes = queue.create_many(items, agent=_creating_agent(request), parent=parent)
        return Response({"outcomes": batch_outcomes(outcomes)})


class TodoDetailApi(_WaitsOnTheLoop):
    @extend_schema(
        operation_id="todos_retrieve",
        summary="One todo",
        description=f"With `wait_seconds` (up to {LONG_POLL_MAX_SECONDS:g}) it awaits the result: it answers when "
        "the todo is finished "
        "(done, a dead-letter or cancelled) or when the time runs out, with the todo as it then is. The wait "
        "holds no thread and no connection.",
        parameters=[
            OpenApiParameter(
                "wait_seconds", float, description=f"0-{LONG_POLL_MAX_SECONDS:g}: await the result this long"
            )
        ],
        **docs.documented(TodoSerializer, (401, 404), docs.TODO_EXAMPLES),
    )
    def get(self, request: Request, todo_id: str) -> Response:
        wait = _valid(TodoAwaitInput, request.query_params)["wait_seconds"]
        todo_id, agent = _todo_id(todo_id), caller_agent(request)
        if wait:
            # Outside an ASGI server an await waits in this request's own thread; under one,
            # switchboard/asgi.py sends it to waiting_view instead.
            todo = async_to_sync(results.await_finished)(agent, todo_id, wait)
        else:
            found = Todo.objects.visible_to(agent).filter(pk=todo_id).first()
            if found is None:
                raise TodoNotFound(f"No todo {todo_id}.")
            todo = found
        selectors.show_awaited([todo])
        selectors.show_blocked([todo])
        return _render(todo)

    @staticmethod
    def runs_async(request: HttpRequest) -> bool:
        """Under ASGI, only an await (GET with wait_seconds) takes waiting_view, on the event loop."""
        return request.method == "GET" and request.GET.get("wait_seconds", "") not in ("", "0")

    @staticmethod
    @csrf_exempt  # a GET; a staff session's checks are DRF's own, in _session_caller
    async def waiting_view(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        """The await, on the event loop (todos/results.py)."""
        try:
            agent = await TodoDetailApi._for(request, *args, **kwargs)._caller(request)
            wait = _valid(TodoAwaitInput, request.GET)["wait_seconds"]
            todo = await results.await_finished(agent, _todo_id(kwargs["todo_id"]), wait)
            await executor.run(selectors.show_awaited, [todo])
            return JsonResponse(TodoSerializer(todo).data)
        except Exception as exc:  # rendered as every API error is; unknown errors propagate
            return await _error(exc)

    @extend_schema(
        operation_id="todos_partial_update",
        summary="Change a todo's priority (staff)",
        description="Staff only: the priority of a pending or scheduled todo (409 with the state otherwise).",
        request=TodoPatchInput,
        **docs.documented(TodoSerializer, (400, 401, 403, 404, 409, 413), docs.PATCH_EXAMPLES),
    )
    def patch(self, request: Request, todo_id: str) -> Response:
        agent = _staff_agent(request, _todo_id(todo_id))
        data = _valid(TodoPatchInput, request.data)
        return _render(queue.set_priority(todo_id, priority=data["priority"], agent=agent))


def _tree_cursor(after: tuple[int, str]) -> str:
    return base64.urlsafe_b64encode(f"{after[0]}:{after[1]}".encode()).decode().rstrip("=")


def _tree_after(cursor: str | None) -> tuple[int, str] | None:
    """A cursor from _tree_cursor back to (depth, id); anything else is 400 naming the cursor."""
    if cursor is None:
        return None
    try:
        depth, _, todo_id = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode().partition(":")
        if depth.isdecimal() and int(depth) <= MAX_TREE_DEPTH and ids.is_id(todo_id, ids.TODO):
            return int(depth), todo_id
    except (ValueError, UnicodeDecodeError):
        pass
    raise exceptions.ValidationError({"cursor": ["Not a cursor this endpoint gave."]})


class TodoTreeApi(APIView):
    @extend_schema(
        operation_id="todos_tree",
        summary="A todo's tree",
        description=f"The todo and its descendants (issue 30), the todo first, then by depth and id, up to "
        f"{MAX_TREE_PAGE} nodes a page (`next`). Nodes outside your scopes are left out; a node's `parent_id` "
        "may name one of them. 404 for a todo you cannot see.",
        parameters=[OpenApiParameter("cursor", str, description="from `next`")],
        **docs.documented(TreePageSerializer, (400, 401, 404), docs.TREE_EXAMPLES),
    )
    def get(self, request: Request, todo_id: str) -> Response:
        after = _tree_after(_valid(TreeInput, request.query_params).get("cursor"))
        page = selectors.tree_page(caller_agent(request), _todo_id(todo_id), after)
        following = None
        if page.after is not None:
            following = replace_query_param(request.build_absolute_uri(), "cursor", _tree_cursor(page.after))
        nodes = [dataclasses.asdict(node) for node in page.nodes]
        return Response(
            {
                "nodes": nodes,
                "next": following,
                "truncated": page.truncated,
                "tree_usage": page.tree_usage,
                "budget": page.budget,
                "budget_exhausted": page.budget_exhausted,
            }
        )


class ExplainInput(serializers.Serializer[Any]):
    queues = serializers.CharField(
        required=False, max_length=2000, help_text="Comma-separated queue names or globs (default: all your scopes)."
    )


_EXPLAIN_ANSWER = inline_serializer(
    "Explanation",
    {
        "id": serializers.CharField(),
        "claimable": serializers.BooleanField(),
        "reasons": serializers.ListField(child=serializers.DictField()),
        "notes": serializers.ListField(child=serializers.DictField()),
    },
)


class TodoExplainApi(APIView):
    @extend_schema(
        operation_id="todos_explain",
        summary="Why isn't this todo running?",
        description="Every reason a claim by you would not take this todo now, in order: its state (waiting and "
        "its dependencies, run_at, a retry's time), its assignee, its queue paused, max_claimed reached, the rate "
        "bucket empty, its fair key at max_claimed_per_key, its tree's budget spent, and no agent whose claim "
        "scopes cover its queue (with when a lease of it was last taken). `claimable` is true when there is "
        "none; `notes` say what may still delay it (a fair queue's turns). 404 for a todo you cannot see.",
        **docs.documented(_EXPLAIN_ANSWER, (401, 404), []),
    )
    def get(self, request: Request, todo_id: str) -> Response:
        return Response(explain.explain_todo(_todo_id(todo_id), agent=caller_agent(request)))


class AgentExplainApi(APIView):
    @extend_schema(
        operation_id="agents_me_explain",
        summary="Why did my claim get nothing?",
        description="Per queue of your claim scopes (narrowed by `queues`), what stops a claim by you now: "
        "paused, max_claimed reached, the rate bucket empty, or nothing claimable by you (trees whose budget is "
        "spent, todos assigned to other agents, todos scheduled later). `outside_scopes`: names you asked for "
        "that no claim scope of yours covers.",
        parameters=[OpenApiParameter("queues", str, description="comma-separated names or globs")],
        **docs.documented(
            inline_serializer(
                "AgentExplanation",
                {
                    "agent": serializers.CharField(),
                    "queues": serializers.ListField(child=serializers.DictField()),
                    "truncated": serializers.BooleanField(),
                    "outside_scopes": serializers.ListField(child=serializers.CharField()),
                },
            ),
            (400, 401),
            [],
        ),
    )
    def get(self, request: Request) -> Response:
        given = _valid(ExplainInput, request.query_params).get("queues")
        wanted = [q.strip() for q in given.split(",") if q.strip()] if given else None
        return Response(explain.explain_agent(caller_agent(request), queues=wanted))


class TodoRunNowApi(APIView):
    @extend_schema(
        operation_id="todos_run_now",
        summary="Run a scheduled todo now (staff)",
        description="Staff only: a scheduled todo becomes pending at once (run_at = now); recorded in `errors`. "
        "409 with the state if it is not scheduled.",
        request=None,
        **docs.documented(TodoSerializer, (401, 403, 404, 409), docs.RUN_NOW_EXAMPLES),
    )
    def post(self, request: Request, todo_id: str) -> Response:
        agent = _staff_agent(request, _todo_id(todo_id))
        return _render(queue.run_now(todo_id, operator=agent.name, agent=agent))


class TodoClaimNextApi(_WaitsOnTheLoop):
    @extend_schema(
        operation_id="todos_claim_next",
        summary="Claim the next todos",
        description="Claims up to `limit` todos in claim order (priority, then run_at), from the caller's claim "
        "scopes (narrowed by `queues`). `wait_seconds` long-polls: the request waits until work becomes "
        "claimable in those queues or the time runs out, then answers 200 with an empty list. Naming a queue "
        "outside the claim scopes is 403 `forbidden` at once, listing them in `queues`.",
        request=ClaimNextInput,
        **docs.documented(ClaimedSerializer, (400, 401, 403, 413), docs.CLAIM_NEXT_EXAMPLES),
    )
    def post(self, request: Request) -> Response:
        data = _valid(ClaimNextInput, request.data)
        agent = auth.working_agent(request)
        wait = data.pop("wait_seconds")
        if wait:
            # Outside an ASGI server (WSGI, the test client, runserver) a long-poll waits in this
            # request's own thread; under one, switchboard/asgi.py sends it to waiting_view instead.
            todos = async_to_sync(longpoll.claim_next_waiting)(agent=agent, wait_seconds=wait, **data)
        else:
            todos = longpoll.claim_now(agent=agent, **data)
        return Response({"todos": TodoSerializer(todos, many=True).data})

    @staticmethod
    def runs_async(request: HttpRequest) -> bool:
        """Under ASGI, only a claim that may wait takes waiting_view, on the event loop
        (switchboard/asgi.py): the others take the sync path, one hop to the pool, which is cheaper.

        It runs before authentication, so it reads only a body of declared length, which request.body
        refuses above DATA_UPLOAD_MAX_MEMORY_SIZE (switchboard/asgi.py declares a chunked body's length
        once it has bounded and spooled it); the sync path answers the rest (413, 400) as usual, after
        authenticating."""
        if not request.META.get("CONTENT_LENGTH", "").isdigit():
            return False
        try:
            body = json.loads(request.body)
        except (ValueError, RecursionError, RequestDataTooBig):
            return False
        return request.method == "POST" and isinstance(body, dict) and bool(body.get("wait_seconds"))

    @staticmethod
    @csrf_exempt  # a staff session's CSRF check is DRF's own, in _session_caller
    async def waiting_view(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
        """The long-poll, outside DRF's sync dispatch: it waits in the event loop (todos/longpoll.py)
        holding no thread and no connection. A bearer token whose agent is cached costs no query; other
        callers (a staff session, with its CSRF check) go through DRF's own authentication, in the pool."""
        try:
            agent = await TodoClaimNextApi._for(request, *args, **kwargs)._caller(request)
            if auth.is_staff_session(agent):
                raise auth.StaffTakesNoWork()
            data = _valid(ClaimNextInput, Request(request, parsers=[SafeJSONParser()]).data)
            todos = await longpoll.claim_next_waiting(agent=agent, **data)
            return JsonResponse({"todos": TodoSerializer(todos, many=True).data})
        except Exception as exc:  # rendered as every API error is; unknown errors propagate
            return await _error(exc)


async def _error(exc: Exception) -> HttpResponse:
    if isinstance(exc, exceptions.NotAuthenticated | exceptions.AuthenticationFailed):
        # DRF's dispatch adds this header to a 401; this view answers outside that dispatch.
        exc.auth_header = auth.BearerTokenAuthentication().authenticate_header(None)  # type: ignore[union-attr,arg-type]
    response = await executor.run(exception_handler, exc, {})
    if response is None:
        raise exc
    body = JsonResponse(response.data, status=response.status_code)
    for header, value in response.headers.items():
        if header.lower() != "content-type":
            body[header] = value
    return body


class TodoClaimApi(APIView):
    @extend_schema(
        operation_id="todos_claim",
        summary="Claim this todo",
        description="409 with the current state if it is not claimable (claimed, done, a dead-letter, "
        "waiting for a retry, or assigned to another agent).",
        request=ClaimOneInput,
        **docs.documented(TodoSerializer, (400, 401, 404, 409, 413), docs.CLAIM_ONE_EXAMPLES),
    )
    def post(self, request: Request, todo_id: str) -> Response:
        data = _valid(ClaimOneInput, request.data)
        return _render(queue.claim(_todo_id(todo_id), agent=auth.working_agent(request), **data))


class TodoHeartbeatApi(APIView):
    @extend_schema(
        operation_id="todos_heartbeat",
        summary="Extend the lease",
        request=HeartbeatInput,
        **docs.documented(TodoSerializer, (400, 401, 404, 409, 413), docs.RECEIPT_EXAMPLES),
    )
    def post(self, request: Request, todo_id: str) -> Response:
        data = _valid(HeartbeatInput, request.data)
        todo = queue.heartbeat(_todo_id(todo_id), agent=auth.working_agent(request), **data)
        # Issue 30: its tree has spent its budget, so the worker should stop (the lease is still extended).
        return Response({**TodoSerializer(todo).data, "budget_exhausted": todo.tree_budget_exhausted})  # type: ignore[attr-defined]


class TodoCompleteApi(APIView):
    @extend_schema(
        operation_id="todos_complete",
        summary="Complete a claimed todo",
        request=CompleteInput,
        **docs.documented(TodoSerializer, (400, 401, 404, 409, 413), docs.COMPLETE_EXAMPLES),
    )
    def post(self, request: Request, todo_id: str) -> Response:
        data = _valid(CompleteInput, request.data)
        return _render(queue.complete(_todo_id(todo_id), agent=auth.working_agent(request), **data))


class TodoBatchCompleteApi(APIView):
    @extend_schema(
        operation_id="todos_complete_many",
        summary="Complete many claimed todos",
        description=f"One statement for up to {MAX_COMPLETE_BATCH} items; one outcome per item, in order, each "
        "with the status "
        "the single complete would have answered (200, 404 or 409).",
        request=BatchCompleteInput,
        **docs.documented(BatchCompleteResultSerializer, (400, 401, 413), docs.BATCH_EXAMPLES),
    )
    def post(self, request: Request) -> Response:
        data = _valid(BatchCompleteInput, request.data)
        items = [(i["id"], i["lease_id"], i["result"]) for i in data["items"]]
        outcomes = []
        for (todo_id, _, _), outcome in zip(
            items, queue.complete_many(items, agent=auth.working_agent(request)), strict=True
        ):
            if isinstance(outcome, Todo):
                outcomes.append({"id": todo_id, "status": 200, "todo": TodoSerializer(outcome).data})
            else:
                body = error_body(outcome.code, outcome.detail, **outcome.extra)
                outcomes.append({"id": todo_id, "status": STATUS_BY_CODE[outcome.code], **body})
        return Response({"outcomes": outcomes})


class TodoFailApi(APIView):
    @extend_schema(
        operation_id="todos_fail",
        summary="Fail a claimed todo",
        description="Below the attempt cap a retry is scheduled (after `retry_in_seconds`, else exponential "
        "backoff with jitter); at the cap the todo becomes a dead-letter.",
        request=FailInput,
        **docs.documented(TodoSerializer, (400, 401, 404, 409, 413), docs.FAIL_EXAMPLES),
    )
    def post(self, request: Request, todo_id: str) -> Response:
        data = _valid(FailInput, request.data)
        if (park := data.pop("park")) is not None:
            data.pop("retry_in_seconds")
            return _render(queue.park(_todo_id(todo_id), agent=auth.working_agent(request), **data, **park))
        return _render(queue.fail(_todo_id(todo_id), agent=auth.working_agent(request), **data))


class TodoReleaseApi(APIView):
    @extend_schema(
        operation_id="todos_release",
        summary="Hand a claimed todo back",
        description="Back to pending at once; the attempt is given back (a release costs no retry budget).",
        request=ReleaseInput,
        **docs.documented(TodoSerializer, (400, 401, 404, 409, 413), docs.RELEASE_EXAMPLES),
    )
    def post(self, request: Request, todo_id: str) -> Response:
        data = _valid(ReleaseInput, request.data)
        if (park := data.pop("park")) is not None:
            return _render(queue.park(_todo_id(todo_id), agent=auth.working_agent(request), **data, **park))
        return _render(queue.release(_todo_id(todo_id), agent=auth.working_agent(request), **data))


class TodoWaitApi(APIView):
    @extend_schema(
        operation_id="todos_wait",
        summary="Wait for something, giving the lease back",
        description="The holder gives the lease back (as release: the attempt is returned) and the todo is "
        "`waiting`, never claimed, until what `for` names resolves it: the listed todos all finish (done, "
        "cancelled or dead-lettered), a verified event of the source whose type and payload match, the "
        "token's resolve (the answer's `waitpoint`, shown this once), or a person's decision (`people`: the "
        "users and groups named decide on /decide/<id>/, never an agent; `resolution` is "
        '`{by: "person", decision, edited, text, decided_by, at}`; 400 naming a user or group that does not '
        "exist). Besides, an operator may resolve any wait, "
        "and the agents `resolvers` names (never the waiting agent; absent, no agent). Then it is pending at "
        "once, and its next claim shows `resolution`. After `timeout_seconds`: pending with "
        '`resolution.timed_out`, or for `on_timeout` "fail" a failure that counts toward the attempts. 404 names '
        "an awaited todo, or an event source, the caller cannot see (an event source is seen when a route of it "
        "reaches the caller's scopes, as for GET /events/). 429 past MAX_OPEN_EVENT_WAITS_PER_AGENT.",
        request=WaitInput,
        **docs.documented(WaitingTodoSerializer, (400, 401, 404, 409, 413, 429), docs.WAIT_EXAMPLES),
    )
    def post(self, request: Request, todo_id: str) -> Response:
        data = _valid(WaitInput, request.data)
        todo, token = queue.wait(
            _todo_id(todo_id),
            agent=auth.working_agent(request),
            lease_id=data["lease_id"],
            wait_for=data["for"],
            timeout_seconds=data["timeout_seconds"],
            on_timeout=data["on_timeout"],
            resolvers=data.get("resolvers"),
        )
        body: dict[str, Any] = dict(TodoSerializer(todo).data)
        if token is not None:
            body["waitpoint"] = {"token": token, "resolve_url": _resolve_url(request, token)}
        return Response(body)


def _resolve_url(request: Request, token: str) -> str:
    """The token's own resolve URL (kept for the clients that post to it; the documented form posts the
    token in the body to /api/v1/waitpoints/resolve/). https when this request came by https as far as
    anyone says: behind a TLS proxy whose X-Forwarded-Proto is not trusted (TRUST_X_FORWARDED_PROTO off),
    request.scheme says http, and a link by http would carry the token in clear. The header may only
    upgrade the caller's own link, never downgrade it, so trusting it here gives a forger nothing."""
    url = request.build_absolute_uri(f"/api/v1/waitpoints/{token}/resolve/")
    said_https = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower() == "https"
    if url.startswith("http://") and (said_https or settings.SECURE_SSL_REDIRECT):
        url = "https://" + url.removeprefix("http://")
    return url


class TodoResolveApi(APIView):
    @extend_schema(
        operation_id="todos_resolve",
        summary="Resolve a waiting todo",
        description="For an operator (staff with `todos.change_todo`) or an agent the wait names in its "
        "`resolvers`, never the waiting agent: whatever it waits for, it becomes pending at once with "
        '`resolution: {by: "agent" or "operator", at, data, resolved_by}`. 403 for anyone else (nothing '
        "changes), 409 with the state if it is not waiting.",
        request=ResolveInput,
        **docs.documented(TodoSerializer, (400, 401, 403, 404, 409, 413), docs.RESOLVE_EXAMPLES),
    )
    def post(self, request: Request, todo_id: str) -> Response:
        agent = _operating_agent(request, _todo_id(todo_id))
        data = _valid(ResolveInput, request.data)
        return _render(queue.resolve(_todo_id(todo_id), by=agent.name, agent=agent, data=data["data"]))


class WaitpointResolveApi(APIView):
    # The token in the path is the credential (it has 192 random bits and resolves once); nothing else is
    # asked, so a CI system or a person's browser form can call it.
    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []

    # Kept working for the clients and links made before issue 28, and left out of the schema: the token in
    # a path reaches access logs and Referer headers. WaitpointResolveByBodyApi is the documented form.
    @extend_schema(exclude=True)
    def post(self, request: Request, token: str) -> Response:
        data = _valid(ResolveInput, request.data)
        if not 1 <= len(token) <= 100:
            raise TodoNotFound("No waitpoint has this token.")
        queue.resolve_token(token, data=data["data"])
        return Response({"resolved": True})


class WaitpointResolveByBodyApi(APIView):
    """The documented form (issue 28): the token travels in the body, so access logs, error logs and
    Referer headers never see it. The credential is the token, as for the path form."""

    authentication_classes: list[Any] = []
    permission_classes: list[Any] = []

    @extend_schema(
        operation_id="waitpoints_resolve",
        summary="Resolve a token wait",
        description="No other credential: the token is one. The waiting todo becomes pending with "
        '`resolution: {by: "token", at, data}`. Once only: a second resolve is 409 (without the todo\'s '
        "state), an unknown token 404. The token travels in the body, so it stays out of URLs and logs (the "
        "older `POST /api/v1/waitpoints/<token>/resolve/` keeps working).",
        request=WaitpointResolveInput,
        auth=[],
        **docs.documented(ResolvedSerializer, (400, 404, 409, 413), docs.WAITPOINT_RESOLVE_EXAMPLES),
    )
    def post(self, request: Request) -> Response:
        data = _valid(WaitpointResolveInput, request.data)
        queue.resolve_token(data["token"], data=data["data"])
        return Response({"resolved": True})


class TodoRetryApi(APIView):
    @extend_schema(
        operation_id="todos_retry",
        summary="Retry a dead-letter (operator)",
        description="Staff, or an agent allowed to retry dead-letters. `reset` grants a full new budget, "
        "`once` exactly one more try; who, when, the mode and the note are recorded in `errors`.",
        request=RetryInput,
        **docs.documented(TodoSerializer, (400, 401, 403, 404, 409, 413), docs.RETRY_EXAMPLES),
    )
    def post(self, request: Request, todo_id: str) -> Response:
        agent = caller_agent(request)
        todo_id = _todo_id(todo_id)
        if not agent.can_retry_dead_letters:
            # Out of scope stays 404 for everyone (ids do not leak); only a visible todo earns the 403.
            detail = CHANGE_TODO_NEEDED if auth.is_staff_session(agent) else "This agent may not retry dead-letters."
            raise _refused(agent, todo_id, detail)
        data = _valid(RetryInput, request.data)
        return _render(queue.retry_dead_letter(todo_id, operator=agent.name, agent=agent, **data))


class TodoCancelApi(APIView):
    @extend_schema(
        operation_id="todos_cancel",
        summary="Cancel a todo",
        description="pending, scheduled, retry-waiting or claimed -> cancelled, a terminal state that frees the "
        "idempotency key. A claimed todo's lease is revoked: its worker's next heartbeat, complete or fail answers 409 "
        'with `"state": "cancelled"`. Who and why are kept in `errors`. For agents whose claim or create scopes cover '
        "the queue, and staff; 409 with the current state if it is done, a dead-letter or already cancelled.",
        request=CancelInput,
        **docs.documented(TodoSerializer, (400, 401, 404, 409, 413), docs.CANCEL_EXAMPLES),
    )
    def post(self, request: Request, todo_id: str) -> Response:
        agent = _operating_agent(request, _todo_id(todo_id))
        data = _valid(CancelInput, request.data)
        todo = queue.cancel(_todo_id(todo_id), operator=agent.name, agent=agent, **data)
        if not data["cascade"]:
            return _render(todo)
        return Response({**TodoSerializer(todo).data, "cascaded": todo.cascaded})  # type: ignore[attr-defined]


class TodoBudgetApi(APIView):
    @extend_schema(
        operation_id="todos_budget",
        summary="Set a tree's budget (operator)",
        description="A root's budget {counter: limit, ...}, replacing its old one; raising it past the tree's "
        "usage unblocks the tree at once. Staff, or an agent made with --can-manage whose scopes cover the "
        "root's queue; 404 outside your scopes, 409 for a todo that is not a root.",
        request=BudgetInput,
        **docs.documented(TodoSerializer, (400, 401, 403, 404, 409, 413), []),
    )
    def patch(self, request: Request, todo_id: str) -> Response:
        agent = caller_agent(request)
        todo_id = _todo_id(todo_id)
        if not agent.can_manage_queues:
            detail = (
                "This needs the todos.change_queue permission, as in the admin."
                if auth.is_staff_session(agent)
                else "This agent may not set budgets (create_agent --can-manage)."
            )
            raise _refused(agent, todo_id, detail)
        data = _valid(BudgetInput, request.data)
        return _render(queue.set_budget(todo_id, budget=data["budget"], agent=agent))


def _managed_queue(request: Request, name: str) -> Agent:
    """The caller, if it may change this queue's controls: staff, or an agent made with --can-manage whose
    scopes cover the queue. Out of scope (or unknown) is 404 for everyone; only a visible queue earns the 403."""
    agent = caller_agent(request)
    if not agent.can_manage_queues:
        controls.get(name, agent=agent)  # QueueNotFound when out of scope
        if auth.is_staff_session(agent):
            raise PermissionDenied("This needs the todos.change_queue permission, as in the admin.")
        raise PermissionDenied("This agent may not manage queues (create_agent --can-manage).")
    return agent


def _render_queue(queue_controls: controls.QueueControls) -> Response:
    return Response(QueueControlsSerializer(queue_controls).data)


QUEUE_ERRORS = (400, 401, 403, 404)


class QueuePauseApi(APIView):
    @extend_schema(
        operation_id="queues_pause",
        summary="Pause a queue",
        description="Claims hand out nothing from it, in every process, from their next claim; creates and "
        "webhooks still land and leases already held run on. Staff or `--can-manage` agents.",
        request=None,
        **docs.documented(QueueControlsSerializer, QUEUE_ERRORS, docs.QUEUE_CONTROL_EXAMPLES),
    )
    def post(self, request: Request, name: str) -> Response:
        return _render_queue(controls.pause(name, agent=_managed_queue(request, name)))


class QueueResumeApi(APIView):
    @extend_schema(
        operation_id="queues_resume",
        summary="Resume a queue",
        description="Claims take from it again; long-polls waiting on it are woken at once.",
        request=None,
        **docs.documented(QueueControlsSerializer, QUEUE_ERRORS, docs.QUEUE_CONTROL_EXAMPLES),
    )
    def post(self, request: Request, name: str) -> Response:
        return _render_queue(controls.resume(name, agent=_managed_queue(request, name)))


class QueueDetailApi(APIView):
    @extend_schema(
        operation_id="queues_retrieve",
        summary="One queue's controls",
        **docs.documented(QueueControlsSerializer, (401, 404), docs.QUEUE_CONTROL_EXAMPLES),
    )
    def get(self, request: Request, name: str) -> Response:
        return _render_queue(controls.get(name, agent=caller_agent(request)))

    @extend_schema(
        operation_id="queues_limit",
        summary="Limit a queue",
        description="`max_claimed`: at most N live leases at once (lapsed ones do not count). `rate_per_second` "
        "and `rate_burst`: a token bucket, at most R claims a second in bursts of B (it starts full). Only the "
        "fields given change; null removes a limit. Enforced by the claim statement in every process from the "
        "next claim; a claim refused by a limit gets what an empty queue gives (an empty list, or a long-poll "
        "that waits for a slot or a token). Staff or `--can-manage` agents.",
        request=QueueLimitsInput,
        **docs.documented(QueueControlsSerializer, QUEUE_ERRORS, docs.QUEUE_CONTROL_EXAMPLES),
    )
    def patch(self, request: Request, name: str) -> Response:
        agent = _managed_queue(request, name)
        data = _valid(QueueLimitsInput, request.data)
        return _render_queue(controls.set_limits(name, agent=agent, **data))


class QueueListApi(APIView):
    @extend_schema(
        operation_id="queues_list",
        summary="Queue health",
        description="For every queue in the caller's scopes: todos by live state (done todos are history and "
        "not counted), retry-waiting, dead-letters, cancelled, the age of the oldest pending todo, and the "
        "queue's controls (paused, max_claimed, rate_per_second, rate_burst).",
        **docs.documented(QueueListSerializer, (401,), docs.QUEUE_EXAMPLES),
    )
    def get(self, request: Request) -> Response:
        stats = selectors.queue_stats(caller_agent(request))
        return Response(
            {
                "queues": [
                    {
                        "queue": s.queue,
                        "pending": s.pending,
                        "claimed": s.claimed,
                        "failed": s.failed,
                        "retry_waiting": s.retry_waiting,
                        "dead_letters": s.dead_letters,
                        "scheduled": s.scheduled,
                        "waiting": s.waiting,
                        "oldest_pending_age_seconds": s.oldest_pending_age_seconds,
                        "cancelled": s.cancelled,
                        "paused": s.paused,
                        "max_claimed": s.max_claimed,
                        "rate_per_second": s.rate_per_second,
                        "rate_burst": s.rate_burst,
                    }
                    for s in stats
                ]
            }
        )


def _managing_agent(request: Request) -> Agent:
    """The caller, if it may define named limits (issue 31): staff, or an agent made with --can-manage. A limit
    holds todos of every queue that names it, so no scope narrows this."""
    agent = caller_agent(request)
    if not agent.can_manage_queues:
        if auth.is_staff_session(agent):
            raise PermissionDenied("This needs the todos.change_queue permission, as in the admin.")
        raise PermissionDenied("This agent may not manage limits (create_agent --can-manage).")
    return agent


class LimitDetailApi(APIView):
    @extend_schema(
        operation_id="limits_retrieve",
        summary="One named limit",
        **docs.documented(LimitSerializer, (401, 404), []),
    )
    def get(self, request: Request, name: str) -> Response:
        caller_agent(request)
        return Response(LimitSerializer(flow.get(name)).data)

    @extend_schema(
        operation_id="limits_put",
        summary="Define a named limit",
        description='A limit shared by every queue and todo that names it (`limits: ["openai"]` on create, '
        "batch items and a queue's PATCH): `max_claimed` live leases of its todos at once, `rate_per_second` / "
        "`rate_burst` a token bucket (it starts full), `per_key` live leases per fair_key times the key's weight. "
        "The whole setting: a field left out is null. A park stays. 201 when created. Staff or `--can-manage`.",
        request=LimitInput,
        **docs.documented({200: LimitSerializer, 201: LimitSerializer}, (400, 401, 403), []),
    )
    def put(self, request: Request, name: str) -> Response:
        _managing_agent(request)
        data = _valid(LimitInput, request.data)
        limit, created = flow.put(name, **data)
        return Response(LimitSerializer(limit).data, status=201 if created else 200)

    @extend_schema(
        operation_id="limits_destroy",
        summary="Remove a named limit",
        description="Its name then limits nothing (todos and queues keep naming it); answers it as it was. "
        "Staff or `--can-manage`.",
        request=None,
        **docs.documented(LimitSerializer, (401, 403, 404), []),
    )
    def delete(self, request: Request, name: str) -> Response:
        _managing_agent(request)
        return Response(LimitSerializer(flow.delete(name)).data)


class LimitParkApi(APIView):
    @extend_schema(
        operation_id="limits_unpark",
        summary="Lift a park",
        description="The limit's todos are claimable again from the next claim. Staff or `--can-manage`.",
        request=None,
        **docs.documented(LimitSerializer, (401, 403, 404), []),
    )
    def delete(self, request: Request, name: str) -> Response:
        _managing_agent(request)
        return Response(LimitSerializer(flow.unpark(name)).data)


class ScheduleListApi(APIView):
    @extend_schema(
        operation_id="schedules_list",
        summary="Recurring schedules",
        description="Staff see every schedule; an agent sees those whose queue is in its create scopes. Each "
        "with its next run (UTC), the last tick the reapers dealt with and the last todo a tick made.",
        **docs.documented(ScheduleListSerializer, (401,), docs.SCHEDULE_EXAMPLES),
    )
    def get(self, request: Request) -> Response:
        agent = caller_agent(request)
        schedules = Schedule.objects.order_by("name")
        if not (auth.is_staff_session(agent) and request.user.has_perm("todos.view_schedule")):
            schedules = schedules.filter(queue__like_any=agent.create_like_patterns())
        return Response({"schedules": ScheduleSerializer(schedules, many=True).data})
