from django.apps import AppConfig


class TodosConfig(AppConfig):
    name = "todos"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from switchboard.metrics import register_scrape_collector
        from todos import tracing
        from todos.metrics import queue_state_collector

        register_scrape_collector(queue_state_collector())
        tracing.configure()  # off unless the OTEL_* variables ask for it
