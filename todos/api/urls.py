"""/api/v1/ paths of the todos API, in SPEC.md's order."""

from __future__ import annotations

from django.urls import path

from todos.api import views

urlpatterns = [
    path("todos/", views.TodoListCreateApi.as_view(), name="todo-list"),
    path("todos/claim/", views.TodoClaimNextApi.as_view(), name="todo-claim-next"),
    path("todos/complete/", views.TodoBatchCompleteApi.as_view(), name="todo-complete-many"),
    path("todos/batch/", views.TodoBatchCreateApi.as_view(), name="todo-create-many"),
    path("todos/<str:todo_id>/", views.TodoDetailApi.as_view(), name="todo-detail"),
    path("todos/<str:todo_id>/claim/", views.TodoClaimApi.as_view(), name="todo-claim"),
    path("todos/<str:todo_id>/heartbeat/", views.TodoHeartbeatApi.as_view(), name="todo-heartbeat"),
    path("todos/<str:todo_id>/complete/", views.TodoCompleteApi.as_view(), name="todo-complete"),
    path("todos/<str:todo_id>/fail/", views.TodoFailApi.as_view(), name="todo-fail"),
    path("todos/<str:todo_id>/release/", views.TodoReleaseApi.as_view(), name="todo-release"),
    path("todos/<str:todo_id>/wait/", views.TodoWaitApi.as_view(), name="todo-wait"),
    path("todos/<str:todo_id>/resolve/", views.TodoResolveApi.as_view(), name="todo-resolve"),
    path("waitpoints/resolve/", views.WaitpointResolveByBodyApi.as_view(), name="waitpoint-resolve-token"),
    path("waitpoints/<str:token>/resolve/", views.WaitpointResolveApi.as_view(), name="waitpoint-resolve"),
    path("todos/<str:todo_id>/retry/", views.TodoRetryApi.as_view(), name="todo-retry"),
    path("todos/<str:todo_id>/run-now/", views.TodoRunNowApi.as_view(), name="todo-run-now"),
    path("todos/<str:todo_id>/tree/", views.TodoTreeApi.as_view(), name="todo-tree"),
    path("todos/<str:todo_id>/budget/", views.TodoBudgetApi.as_view(), name="todo-budget"),
    path("todos/<str:todo_id>/explain/", views.TodoExplainApi.as_view(), name="todo-explain"),
    path("agents/me/explain/", views.AgentExplainApi.as_view(), name="agent-explain"),
    path("queues/", views.QueueListApi.as_view(), name="queue-list"),
    path("schedules/", views.ScheduleListApi.as_view(), name="schedule-list"),
    path("limits/<str:name>/", views.LimitDetailApi.as_view(), name="limit-detail"),
    path("limits/<str:name>/park/", views.LimitParkApi.as_view(), name="limit-park"),
    path("todos/<str:todo_id>/cancel/", views.TodoCancelApi.as_view(), name="todo-cancel"),
    # Queue names may hold "/": the action routes come before the detail route that would swallow them.
    path("queues/<path:name>/pause/", views.QueuePauseApi.as_view(), name="queue-pause"),
    path("queues/<path:name>/resume/", views.QueueResumeApi.as_view(), name="queue-resume"),
    path("queues/<path:name>/", views.QueueDetailApi.as_view(), name="queue-detail"),
]
