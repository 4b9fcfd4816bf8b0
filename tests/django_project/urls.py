"""The project's URLs: the duejobs dashboard under /jobs/, for signed-in staff, and a view
that schedules a reminder."""

from django.urls import include, path

from duejobs.contrib.django.dashboard import dashboard_urls
from tests.django_project.shop.views import remind

urlpatterns = [
    path("jobs/", include(dashboard_urls(actions=True))),
    path("orders/<int:order_id>/remind", remind),
]
