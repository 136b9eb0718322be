"""The decision page and the inbox (issue 29): small server-rendered pages for people, not the admin.

``/decide/<todo_id>/`` shows one wait's question (its markdown rendered safely, todos/people/markdown.py),
the todo's payload and the asking agent, and the decisions it allows as buttons and forms (edit: one input
per field of its schema); a POST decides through queue.decide (CSRF-protected). Who is deciding: a signed
link's person (``?t=``: its GET shows a button whose POST spends the link, todos/people/links.py), for this
one todo only (a session flag, not a login), else the signed-in user; nobody else gets past the login.
Staff with todos.change_todo also get a reassignment form.

``/inbox/`` lists what waits for the signed-in person or their groups, oldest first, with its age and SLA
state; ``?format=json`` (or ``Accept: application/json``) answers the same list as JSON.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.contrib.auth.models import User
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import render
from django.utils import timezone
from django.utils.http import urlencode
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_protect
from django.views.decorators.http import require_http_methods

from todos import limits, queue, sql
from todos.admin.login import ThrottledAdminLoginForm
from todos.errors import AlreadyDecided, InvalidTransitionInput, NotAResolver, QueueError
from todos.models import Todo, Waitpoint
from todos.people import links, markdown
from todos.queue.people import is_operator, may_decide
from todos.rows import fetchall

GRANTS = "people_grants"  # session key: {todo_id: [user id, the wait's created_at]} from spent links


class PeopleLoginForm(ThrottledAdminLoginForm):
    """The admin's throttled login (todos/admin/login.py), for anyone active: deciders need not be staff."""

    error_messages = {
        **ThrottledAdminLoginForm.error_messages,
        "invalid_login": AuthenticationForm.error_messages["invalid_login"],
    }

    def confirm_login_allowed(self, user: Any) -> None:
        AuthenticationForm.confirm_login_allowed(self, user)


login_view = auth_views.LoginView.as_view(
    template_name="people/login.html", authentication_form=PeopleLoginForm, next_page="/inbox/"
)


def _page(request: HttpRequest, template: str, context: dict[str, Any], status: int = 200) -> HttpResponse:
    # The pages keep the project's same-origin Referrer-Policy: with no-referrer a browser sends
    # "Origin: null" on the form's POST, which CSRF's origin check rightly refuses. Only the link's own page
    # has a token in its address, and it loads and posts to nothing but this site; spending it redirects
    # the token away (with no-referrer).
    return render(request, template, context, status=status)


def _to_login(request: HttpRequest) -> HttpResponse:
    return HttpResponseRedirect("/login/?" + urlencode({"next": request.path}))


def _granted(request: HttpRequest, wait: Waitpoint) -> User | None:
    """The person a spent link let in for this wait (and only this one), if any."""
    grant = request.session.get(GRANTS, {}).get(wait.todo_id)
    if not grant or grant[1] != wait.created_at.isoformat():
        return None
    return User.objects.filter(pk=grant[0], is_active=True).first()


_LINK_GONE = {
    "heading": "This link no longer works",
    "message": "It was used already, it expired, or its question was answered. Sign in to see your inbox.",
    "login": True,
}


def _link_page(request: HttpRequest, todo_id: str, token: str) -> HttpResponse:
    """A link's GET spends nothing: mail scanners and link previews fetch links before the person does, and
    would spend a one-time link. It shows one button that POSTs the token (CSRF-protected); that spends it.
    The page names no question and no person, so a scanner learns nothing either."""
    if not links.usable(todo_id, token):
        return _page(request, "people/message.html", _LINK_GONE, status=403)
    return _page(request, "people/open_link.html", {"token": token, "todo_id": todo_id})


def _spend(request: HttpRequest, todo_id: str, token: str) -> HttpResponse:
    user_id = links.spend(todo_id, token)
    wait = Waitpoint.objects.filter(pk=todo_id, people__isnull=False).first()
    if user_id is None or wait is None:
        return _page(request, "people/message.html", _LINK_GONE, status=403)
    # A fresh session key: whatever session this browser had cannot be fixed onto the grant.
    request.session.cycle_key()
    grants = dict(request.session.get(GRANTS, {}))
    grants[todo_id] = [user_id, wait.created_at.isoformat()]
    request.session[GRANTS] = grants
    response = HttpResponseRedirect(links.decide_path(todo_id))  # the token leaves the address bar
    response["Referrer-Policy"] = "no-referrer"
    return response


def _edited(request: HttpRequest, schema: dict[str, Any]) -> dict[str, Any]:
    """The edit form's fields as the schema's types; a value that is not of its type is a 400 naming it."""
    edited: dict[str, Any] = {}
    for name, spec in schema["properties"].items():
        raw = request.POST.get(f"f_{name}")
        kind = spec["type"]
        if kind == "boolean":
            edited[name] = raw == "on"
            continue
        if raw is None or (raw == "" and kind != "string"):
            continue
        if kind == "string":
            edited[name] = raw
            continue
        try:
            number = float(raw)
            edited[name] = int(number) if kind == "integer" and number.is_integer() else number
        except ValueError:
            raise InvalidTransitionInput(f"{name!r} must be a {kind}.", field=f"edited.{name}") from None
        if kind == "integer" and not float(edited[name]).is_integer():
            raise InvalidTransitionInput(f"{name!r} must be a whole number.", field=f"edited.{name}")
    return edited


def _fields(schema: dict[str, Any] | None, values: dict[str, Any], order: list[str]) -> list[dict[str, Any]]:
    if not schema:
        return []
    required = set(schema.get("required", []))
    properties = schema["properties"]
    names = [n for n in order if n in properties] + [n for n in properties if n not in order]
    return [
        {
            "name": name,
            "input": f"f_{name}",
            "label": spec.get("title") or name,
            "help": spec.get("description", ""),
            "type": spec["type"],
            "enum": spec.get("enum"),
            "required": name in required,
            "max_length": spec.get("maxLength"),
            "minimum": spec.get("minimum"),
            "maximum": spec.get("maximum"),
            "value": values.get(name, ""),
        }
        for name, spec in ((n, properties[n]) for n in names)
    ]


def _shown(value: Any) -> str:
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True)
    top = limits.PEOPLE_SHOWN_JSON_CHARS
    return text if len(text) <= top else text[:top] + "\n… (truncated)"


@never_cache
@csrf_protect
@require_http_methods(["GET", "POST"])
def decide(request: HttpRequest, todo_id: str) -> HttpResponse:
    if request.method == "GET" and "t" in request.GET:
        return _link_page(request, todo_id, request.GET["t"])
    if request.method == "POST" and request.POST.get("action") == "open_link":
        return _spend(request, todo_id, request.POST.get("t", ""))
    wait = Waitpoint.objects.filter(pk=todo_id, people__isnull=False).first()
    person: Any = _granted(request, wait) if wait is not None else None
    by_link = person is not None
    if person is None:
        if not request.user.is_authenticated:
            return _to_login(request)
        person = request.user
    if wait is None or not may_decide(person, wait):
        # The same answer for a todo that does not exist: ids do not leak to people it does not ask.
        refusal = {"heading": "Not yours to decide", "message": "This question does not ask you, or is gone."}
        return _page(request, "people/message.html", refusal, status=403)
    todo = Todo.objects.get(pk=todo_id)
    people = wait.people or {}
    context: dict[str, Any] = {"wait": wait, "todo": todo, "person": person, "people": people, "by_link": by_link}
    status, values, error = 200, dict(people.get("arguments") or {}), None
    if request.method == "POST":
        action = request.POST.get("action", "decide")
        try:
            if action == "reassign":
                if by_link or not is_operator(request.user):
                    raise NotAResolver("Only an operator may reassign a question.")
                queue.reassign(
                    todo_id,
                    by=request.user.get_username(),
                    users=[n.strip() for n in request.POST.get("users", "").split(",") if n.strip()],
                    groups=[n.strip() for n in request.POST.get("groups", "").split(",") if n.strip()],
                )
                context.update(heading="Reassigned", message="The new people were told.")
                return _page(request, "people/message.html", context)
            decision = request.POST.get("decision", "")
            edited = _edited(request, people["edit_schema"]) if decision == "edit" else None
            if edited is not None:
                values = edited
            decided = queue.decide(
                todo_id, user=person, decision=decision, edited=edited, text=request.POST.get("text", "")
            )
        except AlreadyDecided as exc:
            context.update(heading="Already decided", message=exc.detail)
            return _page(request, "people/message.html", context, status=409)
        except NotAResolver as exc:
            context.update(heading="Not yours to decide", message=exc.detail)
            return _page(request, "people/message.html", context, status=403)
        except InvalidTransitionInput as exc:
            status, error = 400, exc.detail
        except QueueError as exc:
            context.update(heading="This question has ended", message=exc.detail)
            return _page(request, "people/message.html", context, status=409)
        else:
            if by_link:  # the link was for this one decision
                grants = dict(request.session.get(GRANTS, {}))
                grants.pop(todo_id, None)
                request.session[GRANTS] = grants
            resolution = decided.resolution or {}
            context.update(heading="Thank you", message=f"Decided: {resolution.get('decision')}.")
            return _page(request, "people/message.html", context)
    context.update(
        body=markdown.render(str(people.get("body", ""))),
        payload=_shown(todo.payload),
        arguments=_shown(people.get("arguments") or {}),
        fields=_fields(people.get("edit_schema"), values, list(people.get("field_order") or [])),
        decisions=people.get("decisions", []),
        error=error,
        operator=not by_link and is_operator(request.user),
        text_max=limits.PEOPLE_TEXT_MAX_CHARS,
        closed=wait.resolved_at is not None,
    )
    return _page(request, "people/decide.html", context, status=status)


def _age(seconds: int) -> str:
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    if days:
        return f"{days} d {hours} h"
    return f"{hours} h {rest // 60} min" if hours else f"{rest // 60} min"


def _wants_json(request: HttpRequest) -> bool:
    accept = request.headers.get("Accept", "")
    return request.GET.get("format") == "json" or accept.split(",")[0].strip() == "application/json"


@never_cache
@require_http_methods(["GET"])
def inbox(request: HttpRequest) -> HttpResponse:
    """What waits for the signed-in person (a real login: a link's grant opens its one decision only)."""
    if not request.user.is_authenticated:
        if _wants_json(request):
            return JsonResponse({"error": {"code": "unauthorized", "detail": "Sign in first."}}, status=401)
        return _to_login(request)
    user = request.user
    rows = fetchall(
        sql.INBOX,
        {
            "operator": False,  # an operator's inbox is what asks them; the admin lists every wait
            "user_id": user.pk,
            "groups": list(user.groups.values_list("pk", flat=True)),
            "limit": limits.PEOPLE_INBOX_MAX,
        },
    )
    now = timezone.now()
    items = []
    for todo_id, created_at, timeout_at, people, reminded_at, escalated_at, waiter, queue_name, title in rows:
        asked = json.loads(people) if isinstance(people, str) else people
        items.append(
            {
                "todo": todo_id,
                "title": asked.get("title") or title,
                "queue": queue_name,
                "asked_by": waiter,
                "asked_at": created_at.isoformat(),
                "age_seconds": int((now - created_at).total_seconds()),
                "timeout_at": timeout_at.isoformat(),
                "sla": "escalated" if escalated_at else "reminded" if reminded_at else "open",
                "reminded_at": reminded_at.isoformat() if reminded_at else None,
                "escalated_at": escalated_at.isoformat() if escalated_at else None,
                "decisions": asked.get("decisions", []),
                "url": links.decide_path(todo_id),
            }
        )
    if _wants_json(request):
        return JsonResponse({"waiting": items})
    for item in items:
        item["age"] = _age(int(item["age_seconds"]))
    return _page(request, "people/inbox.html", {"items": items, "person": user})
