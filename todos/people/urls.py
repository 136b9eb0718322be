"""The pages for people (issue 29): the decision page, the inbox, and a login for people who are not
staff (the admin's throttle, without its staff check)."""

from django.urls import path

from todos.people import views

urlpatterns = [
    path("decide/<str:todo_id>/", views.decide, name="people-decide"),
    path("inbox/", views.inbox, name="people-inbox"),
    path("login/", views.login_view, name="people-login"),
]
