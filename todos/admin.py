from django.contrib import admin

from todos.models import Agent, Todo


@admin.register(Todo)
class TodoAdmin(admin.ModelAdmin):
    list_display = ("id", "queue", "kind", "title", "state", "attempt", "max_attempts", "owner", "created_at")
    list_filter = ("state", "queue")
    search_fields = ("id", "title", "idempotency_key", "owner")
    readonly_fields = [f.name for f in Todo._meta.fields]
    show_full_result_count = False


@admin.register(Agent)
class AgentAdmin(admin.ModelAdmin):
    list_display = ("name", "owner", "is_active", "claim_scopes", "create_scopes", "created_at")
    exclude = ("token_hash",)
