"""The project's URLs: the duejobs dashboard under /jobs/, for signed-in staff."""

from django.urls import include, path

from duejobs.contrib.django.dashboard import dashboard_urls

urlpatterns = [path("jobs/", include(dashboard_urls(actions=True)))]
