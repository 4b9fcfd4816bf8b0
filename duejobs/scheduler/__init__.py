"""The scheduler: each pass materializes the recurring occurrences that enter the window
(:mod:`.occurrences`), then claims the rows due within it and pushes them to RQ
(:mod:`.loop`, over :mod:`duejobs.delivery`)."""
