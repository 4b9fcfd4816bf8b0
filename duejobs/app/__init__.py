"""The public API: :class:`~duejobs.app.application.App` and
:class:`~duejobs.app.async_application.AsyncApp` with what they stand on — the checks every
request passes (:mod:`.checks`), the tenant scope (:mod:`.scope`), the reads (:mod:`.reads`),
recurring definitions (:mod:`.recurring`), quotas (:mod:`.quotas`) and task objects
(:mod:`.tasks`).

Application code imports ``App``, ``AsyncApp`` and ``Task`` from :mod:`duejobs`; nothing
else in the package imports the App (the services take the :class:`~duejobs.core.Core` an
App hands them)."""
