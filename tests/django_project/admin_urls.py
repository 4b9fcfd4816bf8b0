"""A new project's URLs: its admin's sign-in page routed (as ``startproject`` routes the
admin; here that page alone, by the admin's own names) and no ``accounts/login/``, the
dashboard under /jobs/."""

from django.http import HttpRequest, HttpResponse
from django.urls import include, path

from duejobs.contrib.django.dashboard import dashboard_urls


def sign_in(request: HttpRequest) -> HttpResponse:
    return HttpResponse("the admin's sign-in page")


urlpatterns = [
    path("admin/", include(([path("login/", sign_in, name="login")], "admin"))),
    path("jobs/", include(dashboard_urls())),
]
