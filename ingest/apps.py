from django.apps import AppConfig


class IngestConfig(AppConfig):
    name = "ingest"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from events import router
        from ingest.routing import IngestRouter
        from todos import event_sources

        # Replay and the events' scope rule reach ingest through this one seam only; event waits ask
        # the same rule through todos' seam.
        router.register(IngestRouter())
        event_sources.register(IngestRouter())
