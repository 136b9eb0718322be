from django.apps import AppConfig


class IngestConfig(AppConfig):
    name = "ingest"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from events import router
        from ingest.routing import IngestRouter

        # Replay and the events' scope rule reach ingest through this one seam only.
        router.register(IngestRouter())
