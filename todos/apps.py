from django.apps import AppConfig


class TodosConfig(AppConfig):
    name = "todos"
    default_auto_field = "django.db.models.BigAutoField"
