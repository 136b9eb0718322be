"""The project's URLs plus two views that only the log tests use: an authenticated endpoint that reads
a JSON body, and one that fails with a 500 (Django logs errors with the request attached)."""

from __future__ import annotations

from django.urls import path
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from switchboard.urls import urlpatterns as project_urlpatterns


class EchoView(APIView):
    def post(self, request: Request) -> Response:
        return Response({"keys": sorted(request.data)}, status=201)


class BoomView(APIView):
    def post(self, request: Request) -> Response:
        raise RuntimeError("the view failed")


urlpatterns = [
    *project_urlpatterns,
    path("test/echo/", EchoView.as_view()),
    path("test/boom/", BoomView.as_view()),
]
